// What the d2l_transformer kernels share: float32 tensor access, attributes, the type
// function of the operators with a keep mask, a vectorizable log-sum-exp over a row, and
// dropout's random draws (MXNet 1.9's custom-operator library API).
#ifndef D2L_TRANSFORMER_KERNELS_COMMON_H_
#define D2L_TRANSFORMER_KERNELS_COMMON_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include "mxnet/lib_api.h"

namespace d2t {

using Attrs = std::unordered_map<std::string, std::string>;
using mxnet::ext::MXReturnValue;
using mxnet::ext::MXTensor;

inline const float* in(const MXTensor& t) { return static_cast<const float*>(t.data_ptr); }
inline float* out(MXTensor& t) { return static_cast<float*>(t.data_ptr); }

inline std::string attr(const Attrs& attrs, const char* key, const char* fallback) {
  auto it = attrs.find(key);
  return it == attrs.end() ? fallback : it->second;
}

// exp(x) for x <= 0 (softmax's shifted scores) without a library call, so that the loops
// below vectorize: x = n ln2 + r with |r| <= ln2 / 2, exp(r) by its degree-6 Taylor
// polynomial (relative error < 2e-7 on that range), times 2^n through the exponent bits.
// Below -87 (exp < 2e-38, nothing next to the row's maximum's 1) it returns 0.
inline float exp_nonpositive(float x) {
  const float t = x > -87.f ? x : -87.f;  // value selects, not std::max: they vectorize
  const float n = static_cast<float>(static_cast<int32_t>(t * 1.44269504f - 0.5f));  // round
  const float r = (t - n * 0.693145752f) - n * 1.42860677e-6f;  // ln2 = hi + lo, exact n * hi
  float p = 1.f / 720.f;
  p = p * r + 1.f / 120.f;
  p = p * r + 1.f / 24.f;
  p = p * r + 1.f / 6.f;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;  // 2^n, n in -126..0
  float two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  return x < -87.f ? 0.f : p * two_n;
}

// The row's maximum, with 8 partial maxima (vectorizable).
inline float row_max(const float* z, int64_t V) {
  float m8[8];
  std::fill(m8, m8 + 8, -INFINITY);
  int64_t v = 0;
  for (; v + 8 <= V; v += 8)
    for (int u = 0; u < 8; ++u) m8[u] = z[v + u] > m8[u] ? z[v + u] : m8[u];
  float m = *std::max_element(m8, m8 + 8);
  for (; v < V; ++v) m = z[v] > m ? z[v] : m;
  return m;
}

// sum_v exp(z_v - m), with 8 partial sums (vectorizable, no latency chain), always added in
// this order.
inline float sum_exp(const float* z, int64_t V, float m) {
  float s8[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t v = 0;
  for (; v + 8 <= V; v += 8)
    for (int u = 0; u < 8; ++u) s8[u] += exp_nonpositive(z[v + u] - m);
  float s = ((s8[0] + s8[4]) + (s8[1] + s8[5])) + ((s8[2] + s8[6]) + (s8[3] + s8[7]));
  for (; v < V; ++v) s += exp_nonpositive(z[v] - m);
  return s;
}

// log sum_v exp(z_v) in float32.
inline float log_sum_exp(const float* z, int64_t V) {
  const float m = row_max(z, V);
  return m + std::log(sum_exp(z, V, m));
}

template <int NUM_IN>
MXReturnValue parse_attrs(const Attrs& attrs, int* num_in, int* num_out) {
  *num_in = NUM_IN;
  *num_out = 1;
  return mxnet::ext::MX_SUCCESS;
}

// Whether every type is float32 (the model's dtype): each operator's inputs.
inline bool all_float32(const std::vector<int>& types) {
  for (int t : types)
    if (t != mxnet::ext::kFloat32) return false;
  return true;
}

// Every input float32; every output float32 (the Adam update, the softmax cross-entropy).
inline MXReturnValue float32_only(const Attrs& attrs, std::vector<int>* in_types,
                                  std::vector<int>* out_types) {
  if (!all_float32(*in_types)) {
    MX_ERROR_MSG << "d2l_transformer kernels: float32 inputs only";
    return mxnet::ext::MX_FAIL;
  }
  std::fill(out_types->begin(), out_types->end(), mxnet::ext::kFloat32);
  return mxnet::ext::MX_SUCCESS;
}

// Every input float32; the output float32 and, with dropout, the keep mask uint8 (the
// attention and add & norm operators).
inline MXReturnValue float32_and_keep(const Attrs& attrs, std::vector<int>* in_types,
                                      std::vector<int>* out_types) {
  if (!all_float32(*in_types)) {
    MX_ERROR_MSG << "d2l_transformer kernels: float32 inputs only";
    return mxnet::ext::MX_FAIL;
  }
  (*out_types)[0] = mxnet::ext::kFloat32;
  if (out_types->size() == 2) (*out_types)[1] = mxnet::ext::kUint8;
  return mxnet::ext::MX_SUCCESS;
}

// With dropout, the train flag (input `index`) must be (1,); else the error, for `op`.
inline bool train_flag_ok(const std::vector<std::vector<unsigned int>>& in_shapes, size_t index,
                          const char* op) {
  const auto& train = in_shapes[index];
  if (train.size() == 1 && train[0] == 1) return true;
  MX_ERROR_MSG << op << ": the train flag must have shape (1,)";
  return false;
}

// The ``dropout`` attribute p (0: no dropout, no `train` input, no keep mask).
inline float dropout_of(const Attrs& attrs) { return std::stof(attr(attrs, "dropout", "0")); }

// NUM_IN inputs and one output; with dropout one more of each: the train flag (1,) and the
// keep mask (the attention and add & norm operators).
template <int NUM_IN>
MXReturnValue parse_attrs_dropout(const Attrs& attrs, int* num_in, int* num_out) {
  const bool dropout = dropout_of(attrs) > 0.f;
  *num_in = NUM_IN + dropout;
  *num_out = 1 + dropout;
  return mxnet::ext::MX_SUCCESS;
}

// Dropout's draws (keep with probability 1 - p, as MXNet's Dropout). `dropout_seed` takes one
// 64-bit seed from MXNet's seeded CPU random states (`OpResource::get_cpu_rand_states`,
// reseeded by ``mx.random.seed``) per operator call; `Dropout(seed, stream, p)` is then an
// independent splitmix64 stream for each part of the work (a row, a head), so that the draws
// do not depend on how the parts are shared between threads. Two 32-bit draws per step; a
// draw u keeps when u >= p * 2^32.
inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

inline uint64_t dropout_seed(const mxnet::ext::OpResource& res) {
  mxnet::ext::mx_cpu_rand_t& gen = res.get_cpu_rand_states()[0];
  return (static_cast<uint64_t>(gen()) << 32) ^ static_cast<uint64_t>(gen());
}

class Dropout {
 public:
  Dropout(uint64_t seed, uint64_t stream, float p)
      : threshold_(static_cast<uint64_t>(static_cast<double>(p) * 4294967296.0)),
        state_(mix64(seed ^ mix64(stream + 0x9E3779B97F4A7C15ull))) {}

  bool keep() {
    if (!have_) {
      bits_ = mix64(state_ += 0x9E3779B97F4A7C15ull);
      have_ = true;
      return (bits_ & 0xFFFFFFFFull) >= threshold_;
    }
    have_ = false;
    return (bits_ >> 32) >= threshold_;
  }

 private:
  uint64_t threshold_, state_, bits_ = 0;
  bool have_ = false;
};

}  // namespace d2t

#endif  // D2L_TRANSFORMER_KERNELS_COMMON_H_
