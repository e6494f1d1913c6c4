// The fused add & norm kernel for MXNet 1.9's custom-operator library API (fast path).
//
// MXNet 1.9's CPU LayerNorm backward runs its reductions through the generic broadcast
// reducer, a large part of a training step at the chapter's sizes (docs/benchmarks.md). This
// operator computes the chapter's AddNorm in one pass over the rows:
//
//   d2t_add_layer_norm(x, y, gamma, beta[, train]; eps[, dropout])
//       = LayerNorm(dropout(x) + y) over the last axis
//
// y = (x - mean) / sqrt(var + eps) * gamma + beta, var the biased variance (as MXNet's).
// Backward, per row with xhat = (x - mean) * rstd and g = dy * gamma:
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),
//   dgamma = sum over rows of dy * xhat, dbeta = sum over rows of dy.
//
// dropout = p > 0 (AddNorm's Dropout on the sublayer's output, d2l 9.3.3): one more input,
// `train` (1,), nonzero when MXNet is training (see attention.cc), and one more output,
// `keep` (x's shape, uint8): in training each element of x is kept with probability 1 - p and
// scaled by 1 / (1 - p), as MXNet's Dropout does (`d2t::Dropout`, one stream per row);
// otherwise x is used as it is. Backward reads `keep`.
//
// float32 only (the model's dtype). Rows are shared between OpenMP threads in blocks of
// `kBlock`; dgamma and dbeta are summed per block, then over the blocks in order, so the
// result does not depend on the number of threads.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "common.h"

using namespace mxnet::ext;
using d2t::attr;
using d2t::dropout_of;
using d2t::in;
using d2t::out;

namespace {

constexpr int64_t kBlock = 64;
constexpr int64_t kParallelWork = 1 << 16;  // below this many elements, one thread

float eps_of(const d2t::Attrs& attrs) { return std::stof(attr(attrs, "eps", "1e-5")); }

// Sum of a[0:n] in 8 independent partial sums: no add-latency chain, and the compiler
// vectorizes it (a single accumulator made the kernel latency-bound).
inline float sum8(const float* a, int64_t n) {
  float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int k = 0; k < 8; ++k) acc[k] += a[j + k];
  float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  for (; j < n; ++j) s += a[j];
  return s;
}

// One row: xhat = (x - mean) * rstd into `xhat`, returns rstd = 1 / sqrt(var + eps).
inline float normalize_row(const float* x, int64_t D, float eps, float* xhat) {
  const float mean = sum8(x, D) / D;
  for (int64_t j = 0; j < D; ++j) xhat[j] = (x[j] - mean) * (x[j] - mean);
  const float rstd = 1.f / std::sqrt(sum8(xhat, D) / D + eps);
  for (int64_t j = 0; j < D; ++j) xhat[j] = (x[j] - mean) * rstd;
  return rstd;
}

// The dropout of AddNorm's x: `keep` (uint8, x's shape) and the scale of a kept element.
struct RowDropout {
  uint8_t* keep;  // nullptr: no dropout
  float scale;
};

// The row's input: x + y written into `sum` (AddNorm's sum, in that order), x times its keep
// mask and scale first with dropout.
inline const float* row_input(const float* x, const float* y, const uint8_t* keep, float scale,
                              int64_t D, float* sum) {
  if (keep == nullptr) {
    for (int64_t j = 0; j < D; ++j) sum[j] = x[j] + y[j];
  } else {
    for (int64_t j = 0; j < D; ++j) sum[j] = (keep[j] ? x[j] * scale : 0.f) + y[j];
  }
  return sum;
}

// out = LayerNorm(dropout(x) + y); x, y, out: (rows, D). With `drop.keep` and `draws`
// (training), the row's keep mask is drawn first; with `drop.keep` alone, every element kept.
void ln_forward(const float* x, const float* y, const float* gamma, const float* beta, float* out,
                int64_t rows, int64_t D, float eps, RowDropout drop, uint64_t seed, float p,
                bool train) {
#pragma omp parallel for schedule(static) if (rows * D > kParallelWork)
  for (int64_t r0 = 0; r0 < rows; r0 += kBlock) {
    std::vector<float> sum(D), xhat(D);
    for (int64_t r = r0; r < std::min(rows, r0 + kBlock); ++r) {
      uint8_t* keep = drop.keep ? drop.keep + r * D : nullptr;
      if (keep != nullptr) {
        d2t::Dropout draws(seed, r, p);
        for (int64_t j = 0; j < D; ++j) keep[j] = train ? draws.keep() : 1;
      }
      const float* in = row_input(x + r * D, y + r * D, keep, drop.scale, D, sum.data());
      normalize_row(in, D, eps, xhat.data());
      float* o = out + r * D;
      for (int64_t j = 0; j < D; ++j) o[j] = xhat[j] * gamma[j] + beta[j];
    }
  }
}

// dx, dy, dgamma, dbeta from dout; dy == dx before x's dropout.
void ln_backward(const float* dout, const float* x, const float* y, const float* gamma,
                 float* dx, float* dy, float* dgamma, float* dbeta, int64_t rows, int64_t D,
                 float eps, RowDropout drop) {
  const int64_t blocks = (rows + kBlock - 1) / kBlock;
  std::vector<float> partial(blocks * 2 * D, 0.f);  // per block: dgamma, dbeta
#pragma omp parallel for schedule(static) if (rows * D > kParallelWork)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    std::vector<float> sum(D), xhat(D), g(D), gx(D);
    float *pg = partial.data() + blk * 2 * D, *pb = pg + D;
    for (int64_t r = blk * kBlock; r < std::min(rows, (blk + 1) * kBlock); ++r) {
      const uint8_t* keep = drop.keep ? drop.keep + r * D : nullptr;
      const float* in = row_input(x + r * D, y + r * D, keep, drop.scale, D, sum.data());
      const float rstd = normalize_row(in, D, eps, xhat.data());
      const float* dyr = dout + r * D;
      for (int64_t j = 0; j < D; ++j) {
        g[j] = dyr[j] * gamma[j];
        gx[j] = g[j] * xhat[j];
        pg[j] += dyr[j] * xhat[j];
        pb[j] += dyr[j];
      }
      const float mg = sum8(g.data(), D) / D, mgx = sum8(gx.data(), D) / D;
      float* d = dx + r * D;
      for (int64_t j = 0; j < D; ++j) d[j] = rstd * (g[j] - mg - xhat[j] * mgx);
      std::copy(d, d + D, dy + r * D);  // d(x + y)/dy == d(x + y)/dx
      if (keep != nullptr)
        for (int64_t j = 0; j < D; ++j) d[j] = keep[j] ? d[j] * drop.scale : 0.f;
    }
  }
  std::fill(dgamma, dgamma + D, 0.f);
  std::fill(dbeta, dbeta + D, 0.f);
  for (int64_t blk = 0; blk < blocks; ++blk) {
    for (int64_t j = 0; j < D; ++j) {
      dgamma[j] += partial[blk * 2 * D + j];
      dbeta[j] += partial[blk * 2 * D + D + j];
    }
  }
}

int64_t last_dim(const MXTensor& t) { return t.shape.back(); }


// inputs: x, y, gamma, beta[, train]; outputs: out[, keep]
MXReturnValue forward(const std::unordered_map<std::string, std::string>& attrs,
                      std::vector<MXTensor>* inputs, std::vector<MXTensor>* outputs,
                      const OpResource& res) {
  const MXTensor& x = (*inputs)[0];
  const int64_t D = last_dim(x), rows = x.size() / D;
  const float p = dropout_of(attrs);
  const bool train = p > 0.f && in((*inputs)[4])[0] != 0.f;
  RowDropout drop{p > 0.f ? static_cast<uint8_t*>((*outputs)[1].data_ptr) : nullptr,
                  train ? 1.f / (1.f - p) : 1.f};
  ln_forward(in(x), in((*inputs)[1]), in((*inputs)[2]), in((*inputs)[3]), out((*outputs)[0]),
             rows, D, eps_of(attrs), drop, train ? d2t::dropout_seed(res) : 0, p, train);
  return MX_SUCCESS;
}

// inputs: dout[, dkeep], then the forward's inputs, then its outputs;
// outputs: dx, dy, dgamma, dbeta[, dtrain (zeros)]
MXReturnValue backward(const std::unordered_map<std::string, std::string>& attrs,
                       std::vector<MXTensor>* inputs, std::vector<MXTensor>* outputs,
                       const OpResource& res) {
  const float p = dropout_of(attrs);
  const int num_out = 1 + (p > 0.f), num_in = 4 + (p > 0.f);
  const MXTensor& x = (*inputs)[num_out];
  const int64_t D = last_dim(x), rows = x.size() / D;
  const bool train = p > 0.f && in((*inputs)[num_out + 4])[0] != 0.f;
  RowDropout drop{p > 0.f ? static_cast<uint8_t*>((*inputs)[num_out + num_in + 1].data_ptr)
                          : nullptr,
                  train ? 1.f / (1.f - p) : 1.f};
  ln_backward(in((*inputs)[0]), in(x), in((*inputs)[num_out + 1]), in((*inputs)[num_out + 2]),
              out((*outputs)[0]), out((*outputs)[1]), out((*outputs)[2]), out((*outputs)[3]),
              rows, D, eps_of(attrs), drop);
  if (p > 0.f && (*outputs)[4].data_ptr != nullptr) out((*outputs)[4])[0] = 0.f;  // dtrain
  return MX_SUCCESS;
}

MXReturnValue infer_shape(const std::unordered_map<std::string, std::string>& attrs,
                          std::vector<std::vector<unsigned int>>* in_shapes,
                          std::vector<std::vector<unsigned int>>* out_shapes) {
  const auto& data = (*in_shapes)[0];
  if (data.empty()) {
    MX_ERROR_MSG << "d2t add layer norm: x needs at least one axis";
    return MX_FAIL;
  }
  if ((*in_shapes)[1] != data) {
    MX_ERROR_MSG << "d2t add layer norm: x and y must have the same shape";
    return MX_FAIL;
  }
  for (int i = 2; i < 4; ++i) {
    auto& p = (*in_shapes)[i];
    // unknown (deferred initialisation): numpy-shape semantics pass -1, seen here as unsigned
    if (p.empty() || (p.size() == 1 && (p[0] == 0 || p[0] == static_cast<unsigned>(-1))))
      p = {data.back()};
    if (p.size() != 1 || p[0] != data.back()) {
      MX_ERROR_MSG << "d2t add layer norm: gamma and beta must have shape (" << data.back() << ",)";
      return MX_FAIL;
    }
  }
  (*out_shapes)[0] = data;
  if (out_shapes->size() == 2) {  // dropout: the train flag (1,), the keep mask
    if (!d2t::train_flag_ok(*in_shapes, 4, "d2t add layer norm")) return MX_FAIL;
    (*out_shapes)[1] = data;
  }
  return MX_SUCCESS;
}

}  // namespace

REGISTER_OP(d2t_add_layer_norm)
.setForward(forward, "cpu")
.setBackward(backward, "cpu")
.setParseAttrs(d2t::parse_attrs_dropout<4>)  // x, y, gamma, beta[, train]
.setInferType(d2t::float32_and_keep)
.setInferShape(infer_shape);

MXReturnValue initialize(int version) {
  return version >= 10900 ? MX_SUCCESS : MX_FAIL;
}
