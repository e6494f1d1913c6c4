// What the d2l_transformer kernels share: float32 tensor access and the attribute and type
// functions of a one-output float32 operator (MXNet 1.9's custom-operator library API).
#ifndef D2L_TRANSFORMER_KERNELS_COMMON_H_
#define D2L_TRANSFORMER_KERNELS_COMMON_H_

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

}  // namespace d2t

#endif  // D2L_TRANSFORMER_KERNELS_COMMON_H_
