// The key/value cache of the cached decoding step (model.DecoderStep), MXNet 1.9's
// custom-operator library API:
//
//   d2t_shift_in(new, cache, position) -> out
//
// new: (rows, 1, hidden), the newest position's keys (or values); cache: (rows, L, hidden),
// newest position first; position: (1,), the step's position p (the cache holds p positions).
// out[:, :p + 1] = concatenate([new, cache[:, :-1]], axis=1)[:, :p + 1]: one copy of the p
// positions the step's self-attention reads (it reads the first p + 1 rows: `DecoderStep`),
// where MXNet's slice + concatenate make two passes over the whole cache (~16% of a greedy
// step at batch 64). The rows after p are left as they are (never read). float32.
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
  const int64_t n = d2t::positions_kept(d2t::in((*inputs)[2]), L);
  const float *f = d2t::in(fresh), *c = d2t::in(cache);
  float* o = d2t::out((*outputs)[0]);
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(o + r * L * H, f + r * H, H * sizeof(float));
    std::memcpy(o + r * L * H + H, c + r * L * H, n * H * sizeof(float));
  }
  return MX_SUCCESS;
}

// Gradients (MXNet's graphs ask for them even when nothing trains): the output's first row
// goes to `new`, the next p to the cache's first p rows; the cache's other rows and the
// position get 0.
MXReturnValue backward(const d2t::Attrs& attrs, std::vector<MXTensor>* inputs,
                       std::vector<MXTensor>* outputs, const OpResource& res) {
  const MXTensor& dout = (*inputs)[0];  // then new, cache, position
  const int64_t rows = dout.shape[0], L = dout.shape[1], H = dout.shape[2];
  const int64_t n = d2t::positions_kept(d2t::in((*inputs)[3]), L);
  const float* g = d2t::in(dout);
  float *dnew = d2t::out((*outputs)[0]), *dcache = d2t::out((*outputs)[1]);
  std::memset(dcache, 0, rows * L * H * sizeof(float));
  d2t::out((*outputs)[2])[0] = 0.f;
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(dnew + r * H, g + r * L * H, H * sizeof(float));
    std::memcpy(dcache + r * L * H, g + r * L * H + H, n * H * sizeof(float));
  }
  return MX_SUCCESS;
}

MXReturnValue infer_shape(const d2t::Attrs& attrs,
                          std::vector<std::vector<unsigned int>>* in_shapes,
                          std::vector<std::vector<unsigned int>>* out_shapes) {
  const auto &fresh = (*in_shapes)[0], &cache = (*in_shapes)[1], &position = (*in_shapes)[2];
  if (fresh.size() != 3 || cache.size() != 3 || fresh[0] != cache[0] || fresh[1] != 1 ||
      fresh[2] != cache[2] || cache[1] < 1 || position.size() != 1 || position[0] != 1) {
    MX_ERROR_MSG << "d2t_shift_in: new (rows, 1, hidden), cache (rows, L, hidden) and "
                    "position (1,) expected";
    return MX_FAIL;
  }
  (*out_shapes)[0] = cache;
  return MX_SUCCESS;
}

}  // namespace

REGISTER_OP(d2t_shift_in)
.setForward(forward, "cpu")
.setBackward(backward, "cpu")
.setParseAttrs(d2t::parse_attrs<3>)
.setInferType(d2t::float32_only)
.setInferShape(infer_shape);
