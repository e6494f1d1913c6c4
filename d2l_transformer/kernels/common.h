// What the d2l_transformer kernels share: float32 tensor access, the attribute and type
// functions of a one-output float32 operator, and dropout's random draws (MXNet 1.9's
// custom-operator library API).
#ifndef D2L_TRANSFORMER_KERNELS_COMMON_H_
#define D2L_TRANSFORMER_KERNELS_COMMON_H_

#include <cstdint>
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

// The cache rows a decoding step at position p keeps from the last step (d2t_shift_in,
// d2t_take_shift_in): p of them, at most the L - 1 that fit behind the new one.
inline int64_t positions_kept(const float* position, int64_t L) {
  const int64_t p = static_cast<int64_t>(position[0]);
  return p < 0 ? 0 : (p < L - 1 ? p : L - 1);
}

template <int NUM_IN>
MXReturnValue parse_attrs(const Attrs& attrs, int* num_in, int* num_out) {
  *num_in = NUM_IN;
  *num_out = 1;
  return mxnet::ext::MX_SUCCESS;
}

// Every input float32 (the model's dtype); the output float32.
inline MXReturnValue float32_only(const Attrs& attrs, std::vector<int>* in_types,
                                  std::vector<int>* out_types) {
  for (int t : *in_types) {
    if (t != mxnet::ext::kFloat32) {
      MX_ERROR_MSG << "d2l_transformer kernels: float32 inputs only";
      return mxnet::ext::MX_FAIL;
    }
  }
  (*out_types)[0] = mxnet::ext::kFloat32;
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
