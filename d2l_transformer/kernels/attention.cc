// Fused multi-head scaled dot-product attention for MXNet 1.9's custom-operator library API
// (issue 4's fast path): transpose_qkv, the scores, d2l's masked softmax, the weighted sum
// and transpose_output of the chapter's MultiHeadAttention, forward and backward, in one
// operator that reads the heads in place (no transposes).
//
//   d2t_attention(q, k, v[, valid_length]; num_heads, causal, scale) -> (batch, Tq, H * d)
//
// q: (batch, Tq, H * d), k and v: (batch, Tk, H * d) — head h is columns h*d .. h*d + d, the
// layout transpose_qkv splits. valid_length: (batch,) or (batch, Tq), float32. Query i of an
// example sees keys j < L with L = min(valid length, Tk - Tq + i + 1 if causal); L is clamped
// to Tk. Scores are dot(q_i, k_j) / scale (the chapter's / sqrt(d)); masked keys get weight 0
// (d2l fills -1e6, whose exp is 0 in float32); L <= 0 gives d2l's uniform weights 1 / Tk and
// no gradient to q or k. Dropout on the weights is not implemented: the caller uses the kernel
// only when that rate is 0. float32 only.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "common.h"

using namespace mxnet::ext;
using d2t::attr;
using d2t::in;
using d2t::out;

namespace {

struct Dims {
  int64_t batch, tq, tk, heads, d, width;  // width = heads * d
  bool causal, has_length, length_per_query;
  float scale;
};

Dims dims_of(const std::unordered_map<std::string, std::string>& attrs, const MXTensor& q,
             const MXTensor& k, const MXTensor* length) {
  Dims s;
  s.batch = q.shape[0];
  s.tq = q.shape[1];
  s.tk = k.shape[1];
  s.width = q.shape[2];
  s.heads = std::stoi(attr(attrs, "num_heads", "1"));
  s.d = s.width / s.heads;
  s.causal = attr(attrs, "causal", "0") == "1";
  s.scale = std::stof(attr(attrs, "scale", "1"));
  s.has_length = length != nullptr;
  s.length_per_query = s.has_length && length->shape.size() == 2;
  return s;
}


// The number of keys query i of example b sees (0: d2l's fully masked row).
inline int64_t keys_seen(const Dims& s, const float* length, int64_t b, int64_t i) {
  int64_t L = s.tk;
  if (s.has_length) {
    const float v = s.length_per_query ? length[b * s.tq + i] : length[b];
    L = std::min<int64_t>(L, static_cast<int64_t>(v));
  }
  if (s.causal) L = std::min<int64_t>(L, s.tk - s.tq + i + 1);
  return std::max<int64_t>(L, 0);
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

template <bool HAS_LENGTH>
MXReturnValue forward(const std::unordered_map<std::string, std::string>& attrs,
                      std::vector<MXTensor>* inputs, std::vector<MXTensor>* outputs,
                      const OpResource& res) {
  const MXTensor &q = (*inputs)[0], &k = (*inputs)[1], &v = (*inputs)[2];
  const float* length = HAS_LENGTH ? in((*inputs)[3]) : nullptr;
  const Dims s = dims_of(attrs, q, k, HAS_LENGTH ? &(*inputs)[3] : nullptr);
  float* o = out((*outputs)[0]);
  std::fill(o, o + q.size(), 0.f);
  std::vector<float> p(s.tk);
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.heads; ++h) {
      const float* kh = in(k) + b * s.tk * s.width + h * s.d;  // key j: kh + j * width
      const float* vh = in(v) + b * s.tk * s.width + h * s.d;
      for (int64_t i = 0; i < s.tq; ++i) {
        const int64_t off = (b * s.tq + i) * s.width + h * s.d;
        const int64_t L = weights_row(s, in(q) + off, kh, length, b, i, p.data());
        for (int64_t j = 0, n = L ? L : s.tk; j < n; ++j) axpy(p[j], vh + j * s.width, o + off, s.d);
      }
    }
  }
  return MX_SUCCESS;
}

// inputs: dout, q, k, v[, length], out; outputs: dq, dk, dv[, dlength (zeros)]
template <bool HAS_LENGTH>
MXReturnValue backward(const std::unordered_map<std::string, std::string>& attrs,
                       std::vector<MXTensor>* inputs, std::vector<MXTensor>* outputs,
                       const OpResource& res) {
  const MXTensor &dout = (*inputs)[0], &q = (*inputs)[1], &k = (*inputs)[2], &v = (*inputs)[3];
  const float* length = HAS_LENGTH ? in((*inputs)[4]) : nullptr;
  const Dims s = dims_of(attrs, q, k, HAS_LENGTH ? &(*inputs)[4] : nullptr);
  float *dq = out((*outputs)[0]), *dk = out((*outputs)[1]), *dv = out((*outputs)[2]);
  std::fill(dq, dq + q.size(), 0.f);
  std::fill(dk, dk + k.size(), 0.f);
  std::fill(dv, dv + v.size(), 0.f);
  if (HAS_LENGTH && (*outputs)[3].data_ptr != nullptr)  // lengths get no gradient
    std::fill(out((*outputs)[3]), out((*outputs)[3]) + (*outputs)[3].size(), 0.f);
  std::vector<float> p(s.tk), dp(s.tk);
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.heads; ++h) {
      const int64_t kv_off = b * s.tk * s.width + h * s.d;  // key/value j: + j * width
      const float *kh = in(k) + kv_off, *vh = in(v) + kv_off;
      float *dkh = dk + kv_off, *dvh = dv + kv_off;
      for (int64_t i = 0; i < s.tq; ++i) {
        const int64_t off = (b * s.tq + i) * s.width + h * s.d;
        const float *qi = in(q) + off, *doi = in(dout) + off;
        const int64_t L = weights_row(s, qi, kh, length, b, i, p.data());
        const int64_t n = L ? L : s.tk;
        float pdp = 0.f;  // sum_j p_j dp_j
        for (int64_t j = 0; j < n; ++j) {
          dp[j] = dot(doi, vh + j * s.width, s.d);  // d weight_j = dout_i . v_j
          pdp += p[j] * dp[j];
          axpy(p[j], doi, dvh + j * s.width, s.d);  // dv_j += weight_j dout_i
        }
        for (int64_t j = 0; j < L; ++j) {  // a fully masked row (L == 0) has constant scores
          const float ds = p[j] * (dp[j] - pdp) / s.scale;  // d score_j, through / scale
          axpy(ds, kh + j * s.width, dq + off, s.d);
          axpy(ds, qi, dkh + j * s.width, s.d);
        }
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
  if (in_shapes->size() == 4) {
    const auto& len = (*in_shapes)[3];
    if (len.empty() || len.size() > 2 || len[0] != q[0] || (len.size() == 2 && len[1] != q[1])) {
      MX_ERROR_MSG << "d2t attention: valid_length must be (batch,) or (batch, Tq)";
      return MX_FAIL;
    }
  }
  (*out_shapes)[0] = q;
  return MX_SUCCESS;
}

}  // namespace

REGISTER_OP(d2t_attention)
.setForward(forward<false>, "cpu")
.setBackward(backward<false>, "cpu")
.setParseAttrs(d2t::parse_attrs<3>)
.setInferType(d2t::float32_only)
.setInferShape(infer_shape);

REGISTER_OP(d2t_attention_masked)
.setForward(forward<true>, "cpu")
.setBackward(backward<true>, "cpu")
.setParseAttrs(d2t::parse_attrs<4>)
.setInferType(d2t::float32_only)
.setInferShape(infer_shape);
