// The key/value cache of the cached decoding step (model.DecoderStep), MXNet 1.9's
// custom-operator library API:
//
//   d2t_shift_in(new, cache) -> out
//
// new: (rows, 1, hidden), the newest position's keys (or values); cache: (rows, L, hidden),
// newest position first. out = concatenate([new, cache[:, :-1]], axis=1): one copy, where
// MXNet's slice + concatenate make two passes over the cache (~16% of a greedy step at batch
// 64). float32.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common.h"

using namespace mxnet::ext;

namespace {

MXReturnValue forward(const d2t::Attrs& attrs, std::vector<MXTensor>* inputs,
                      std::vector<MXTensor>* outputs, const OpResource& res) {
  const MXTensor &fresh = (*inputs)[0], &cache = (*inputs)[1];
  const int64_t rows = cache.shape[0], L = cache.shape[1], H = cache.shape[2];
  const float *f = d2t::in(fresh), *c = d2t::in(cache);
  float* o = d2t::out((*outputs)[0]);
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(o + r * L * H, f + r * H, H * sizeof(float));
    std::memcpy(o + r * L * H + H, c + r * L * H, (L - 1) * H * sizeof(float));
  }
  return MX_SUCCESS;
}

// Gradients (MXNet's graphs ask for them even when nothing trains): the output's first row
// goes to `new`, the others to the cache's first L - 1 rows; its last row gets 0.
MXReturnValue backward(const d2t::Attrs& attrs, std::vector<MXTensor>* inputs,
                       std::vector<MXTensor>* outputs, const OpResource& res) {
  const MXTensor& dout = (*inputs)[0];  // then new, cache
  const int64_t rows = dout.shape[0], L = dout.shape[1], H = dout.shape[2];
  const float* g = d2t::in(dout);
  float *dnew = d2t::out((*outputs)[0]), *dcache = d2t::out((*outputs)[1]);
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(dnew + r * H, g + r * L * H, H * sizeof(float));
    std::memcpy(dcache + r * L * H, g + r * L * H + H, (L - 1) * H * sizeof(float));
    std::memset(dcache + r * L * H + (L - 1) * H, 0, H * sizeof(float));
  }
  return MX_SUCCESS;
}

MXReturnValue infer_shape(const d2t::Attrs& attrs,
                          std::vector<std::vector<unsigned int>>* in_shapes,
                          std::vector<std::vector<unsigned int>>* out_shapes) {
  const auto &fresh = (*in_shapes)[0], &cache = (*in_shapes)[1];
  if (fresh.size() != 3 || cache.size() != 3 || fresh[0] != cache[0] || fresh[1] != 1 ||
      fresh[2] != cache[2] || cache[1] < 1) {
    MX_ERROR_MSG << "d2t_shift_in: new (rows, 1, hidden) and cache (rows, L, hidden) expected";
    return MX_FAIL;
  }
  (*out_shapes)[0] = cache;
  return MX_SUCCESS;
}

}  // namespace

REGISTER_OP(d2t_shift_in)
.setForward(forward, "cpu")
.setBackward(backward, "cpu")
.setParseAttrs(d2t::parse_attrs<2>)
.setInferType(d2t::float32_only)
.setInferShape(infer_shape);
