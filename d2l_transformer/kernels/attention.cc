// Fused multi-head scaled dot-product attention for MXNet 1.9's custom-operator library API
// (fast path): transpose_qkv, the scores, d2l's masked softmax, dropout on the
// weights, the weighted sum and transpose_output of the chapter's MultiHeadAttention, forward
// and backward, in one operator that reads the heads in place (no transposes).
//
//   d2t_attention(q, k, v, valid_length[, train]; num_heads, scale[, dropout])
//     -> out (batch, Tq, H * d)[, keep (batch, H, Tq, Tk) uint8 when dropout > 0]
//
// q: (batch, Tq, H * d), k and v: (batch, Tk, H * d) — head h is columns h*d .. h*d + d, the
// layout transpose_qkv splits. valid_length: (batch,) or (batch, Tq) (the decoder's causal
// lengths), float32. Query i of an example sees keys j < L, L its valid length clamped to Tk.
// Scores are dot(q_i, k_j) / scale (the chapter's / sqrt(d)); masked keys get weight 0 (d2l
// fills -1e6, whose exp is 0 in float32); L <= 0 gives d2l's uniform weights 1 / Tk and no
// gradient to q or k. float32 only.
//
// dropout = p > 0 (d2l 9.1's Dropout on the attention weights): one more input, `train`
// (1,), nonzero when MXNet is training (the caller derives it in the graph from a Dropout op,
// which knows), and one more output, `keep`: 1 where a weight was kept. In training each
// weight the query sees is kept with probability 1 - p and scaled by 1 / (1 - p), as MXNet's
// Dropout does (draws: `d2t::Dropout`, one stream per example and head); otherwise every
// weight is kept unscaled. Backward reads `keep`, so it applies the forward's mask.
//
// The (example, head) pairs are shared between OpenMP threads (each writes its own columns).
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

// Below this much work (multiply-adds of the scores) one thread: a parallel region costs more.
constexpr int64_t kParallelWork = 1 << 18;

struct Dims {
  int64_t batch, tq, tk, heads, d, width;  // width = heads * d
  bool length_per_query;
  float scale, dropout;
};

Dims dims_of(const std::unordered_map<std::string, std::string>& attrs, const MXTensor& q,
             const MXTensor& k, const MXTensor& length) {
  Dims s;
  s.batch = q.shape[0];
  s.tq = q.shape[1];
  s.tk = k.shape[1];
  s.width = q.shape[2];
  s.heads = std::stoi(attr(attrs, "num_heads", "1"));
  s.d = s.width / s.heads;
  s.scale = std::stof(attr(attrs, "scale", "1"));
  s.length_per_query = length.shape.size() == 2;
  s.dropout = dropout_of(attrs);
  return s;
}


// The number of keys query i of example b sees (0: d2l's fully masked row).
inline int64_t keys_seen(const Dims& s, const float* length, int64_t b, int64_t i) {
  const float v = s.length_per_query ? length[b * s.tq + i] : length[b];
  return std::max<int64_t>(std::min<int64_t>(s.tk, static_cast<int64_t>(v)), 0);
}

inline float dot(const float* a, const float* b, int64_t n) {
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  int64_t c = 0;
  for (; c + 4 <= n; c += 4)
    for (int u = 0; u < 4; ++u) acc[u] += a[c + u] * b[c + u];
  float r = (acc[0] + acc[2]) + (acc[1] + acc[3]);
  for (; c < n; ++c) r += a[c] * b[c];
  return r;
}

inline void axpy(float alpha, const float* x, float* y, int64_t n) {
  for (int64_t c = 0; c < n; ++c) y[c] += alpha * x[c];
}

// Row i's attention weights over the Tk keys into p; returns L.
inline int64_t weights_row(const Dims& s, const float* qi, const float* kh, const float* length,
                           int64_t b, int64_t i, float* p) {
  const int64_t L = keys_seen(s, length, b, i);
  if (L == 0) {
    std::fill(p, p + s.tk, 1.f / s.tk);
    return 0;
  }
  float m = -INFINITY;
  for (int64_t j = 0; j < L; ++j) {
    p[j] = dot(qi, kh + j * s.width, s.d) / s.scale;
    m = std::max(m, p[j]);
  }
  float sum = 0.f;
  for (int64_t j = 0; j < L; ++j) sum += (p[j] = std::exp(p[j] - m));
  for (int64_t j = 0; j < L; ++j) p[j] /= sum;
  std::fill(p + L, p + s.tk, 0.f);
  return L;
}

// Row i's dropout: keep[j] for the n keys with weight (1 draw each in training, all kept
// otherwise), 0 after them; returns the scale of a kept weight.
inline float dropout_row(const Dims& s, bool train, d2t::Dropout* draws, uint8_t* keep,
                         int64_t n) {
  for (int64_t j = 0; j < n; ++j) keep[j] = train ? draws->keep() : 1;
  std::fill(keep + n, keep + s.tk, 0);
  return train ? 1.f / (1.f - s.dropout) : 1.f;
}

// inputs: q, k, v, length[, train]; outputs: out[, keep]. One (example, head) per task.
MXReturnValue forward(const std::unordered_map<std::string, std::string>& attrs,
                      std::vector<MXTensor>* inputs, std::vector<MXTensor>* outputs,
                      const OpResource& res) {
  const MXTensor &q = (*inputs)[0], &k = (*inputs)[1], &v = (*inputs)[2];
  const float* length = in((*inputs)[3]);
  const Dims s = dims_of(attrs, q, k, (*inputs)[3]);
  const bool dropout = s.dropout > 0.f;
  const bool train = dropout && in((*inputs)[4])[0] != 0.f;
  uint8_t* keep = dropout ? static_cast<uint8_t*>((*outputs)[1].data_ptr) : nullptr;
  const uint64_t seed = train ? d2t::dropout_seed(res) : 0;
  float* o = out((*outputs)[0]);
  const float *qp = in(q), *kp = in(k), *vp = in(v);
#pragma omp parallel for schedule(static) \
    if (s.batch * s.heads * s.tq * s.tk * s.d > kParallelWork)
  for (int64_t bh = 0; bh < s.batch * s.heads; ++bh) {
    const int64_t b = bh / s.heads, h = bh % s.heads;
    std::vector<float> p(s.tk);
    d2t::Dropout draws(seed, bh, s.dropout);
    const float* kh = kp + b * s.tk * s.width + h * s.d;  // key j: kh + j * width
    const float* vh = vp + b * s.tk * s.width + h * s.d;
    for (int64_t i = 0; i < s.tq; ++i) {
      const int64_t off = (b * s.tq + i) * s.width + h * s.d;
      std::fill(o + off, o + off + s.d, 0.f);
      const int64_t L = weights_row(s, qp + off, kh, length, b, i, p.data());
      const int64_t n = L ? L : s.tk;
      if (!dropout) {
        for (int64_t j = 0; j < n; ++j) axpy(p[j], vh + j * s.width, o + off, s.d);
        continue;
      }
      uint8_t* kr = keep + (bh * s.tq + i) * s.tk;  // (batch, H, Tq, Tk)
      const float scale = dropout_row(s, train, &draws, kr, n);
      for (int64_t j = 0; j < n; ++j)
        if (kr[j]) axpy(p[j] * scale, vh + j * s.width, o + off, s.d);
    }
  }
  return MX_SUCCESS;
}

// inputs: dout[, dkeep], q, k, v, length[, train], out[, keep];
// outputs: dq, dk, dv, dlength[, dtrain] (the last two: zeros). One (example, head) per task.
MXReturnValue backward(const std::unordered_map<std::string, std::string>& attrs,
                       std::vector<MXTensor>* inputs, std::vector<MXTensor>* outputs,
                       const OpResource& res) {
  const bool dropout = dropout_of(attrs) > 0.f;
  const int num_out = 1 + dropout, num_in = 4 + dropout;
  const MXTensor &dout = (*inputs)[0], &q = (*inputs)[num_out], &k = (*inputs)[num_out + 1],
                 &v = (*inputs)[num_out + 2];
  const float* length = in((*inputs)[num_out + 3]);
  const Dims s = dims_of(attrs, q, k, (*inputs)[num_out + 3]);
  const bool train = dropout && in((*inputs)[num_out + 4])[0] != 0.f;
  const uint8_t* keep =
      dropout ? static_cast<const uint8_t*>((*inputs)[num_out + num_in + 1].data_ptr) : nullptr;
  const float kept = train ? 1.f / (1.f - s.dropout) : 1.f;  // a kept weight's scale
  float *dq = out((*outputs)[0]), *dk = out((*outputs)[1]), *dv = out((*outputs)[2]);
  for (size_t o = 3; o < outputs->size(); ++o)  // lengths and the train flag get no gradient
    if ((*outputs)[o].data_ptr != nullptr)
      std::fill(out((*outputs)[o]), out((*outputs)[o]) + (*outputs)[o].size(), 0.f);
  const float *qp = in(q), *kp = in(k), *vp = in(v), *dop = in(dout);
#pragma omp parallel for schedule(static) \
    if (s.batch * s.heads * s.tq * s.tk * s.d > kParallelWork)
  for (int64_t bh = 0; bh < s.batch * s.heads; ++bh) {
    const int64_t b = bh / s.heads, h = bh % s.heads;
    std::vector<float> p(s.tk), g(s.tk);
    const int64_t kv_off = b * s.tk * s.width + h * s.d;  // key/value j: + j * width
    const float *kh = kp + kv_off, *vh = vp + kv_off;
    float *dkh = dk + kv_off, *dvh = dv + kv_off;
    for (int64_t j = 0; j < s.tk; ++j) {
      std::fill(dkh + j * s.width, dkh + j * s.width + s.d, 0.f);
      std::fill(dvh + j * s.width, dvh + j * s.width + s.d, 0.f);
    }
    for (int64_t i = 0; i < s.tq; ++i) {
      const int64_t off = (b * s.tq + i) * s.width + h * s.d;
      const float *qi = qp + off, *doi = dop + off;
      float* dqi = dq + off;
      std::fill(dqi, dqi + s.d, 0.f);
      const uint8_t* kr = dropout ? keep + (bh * s.tq + i) * s.tk : nullptr;
      const int64_t L = weights_row(s, qi, kh, length, b, i, p.data());
      const int64_t n = L ? L : s.tk;
      float pg = 0.f;  // sum_j p_j g_j
      for (int64_t j = 0; j < n; ++j) {
        const float m = dropout ? (kr[j] ? kept : 0.f) : 1.f;  // the dropout's factor
        if (m == 0.f) {
          g[j] = 0.f;
          continue;
        }
        g[j] = m * dot(doi, vh + j * s.width, s.d);  // d weight_j = m_j dout_i . v_j
        pg += p[j] * g[j];
        axpy(m * p[j], doi, dvh + j * s.width, s.d);  // dv_j += m_j weight_j dout_i
      }
      for (int64_t j = 0; j < L; ++j) {  // a fully masked row (L == 0) has constant scores
        const float ds = p[j] * (g[j] - pg) / s.scale;  // d score_j, through / scale
        axpy(ds, kh + j * s.width, dqi, s.d);
        axpy(ds, qi, dkh + j * s.width, s.d);
      }
    }
  }
  return MX_SUCCESS;
}

MXReturnValue infer_shape(const std::unordered_map<std::string, std::string>& attrs,
                          std::vector<std::vector<unsigned int>>* in_shapes,
                          std::vector<std::vector<unsigned int>>* out_shapes) {
  const auto &q = (*in_shapes)[0], &k = (*in_shapes)[1], &v = (*in_shapes)[2];
  const unsigned heads = std::stoi(attr(attrs, "num_heads", "1"));
  if (q.size() != 3 || k.size() != 3 || k != v || q[0] != k[0] || q[2] != k[2]) {
    MX_ERROR_MSG << "d2t attention: q (batch, Tq, H*d), k and v (batch, Tk, H*d) expected";
    return MX_FAIL;
  }
  if (heads == 0 || q[2] % heads) {
    MX_ERROR_MSG << "d2t attention: width " << q[2] << " is not divisible by num_heads";
    return MX_FAIL;
  }
  const auto& len = (*in_shapes)[3];
  if (len.empty() || len.size() > 2 || len[0] != q[0] || (len.size() == 2 && len[1] != q[1])) {
    MX_ERROR_MSG << "d2t attention: valid_length must be (batch,) or (batch, Tq)";
    return MX_FAIL;
  }
  (*out_shapes)[0] = q;
  if (out_shapes->size() == 2) {  // dropout: the train flag (1,), the keep mask
    if (!d2t::train_flag_ok(*in_shapes, 4, "d2t attention")) return MX_FAIL;
    (*out_shapes)[1] = {q[0], heads, q[1], k[1]};  // (batch, H, Tq, Tk)
  }
  return MX_SUCCESS;
}

}  // namespace

REGISTER_OP(d2t_attention)
.setForward(forward, "cpu")
.setBackward(backward, "cpu")
.setParseAttrs(d2t::parse_attrs_dropout<4>)  // q, k, v, valid_length[, train]
.setInferType(d2t::float32_and_keep)
.setInferShape(infer_shape);
