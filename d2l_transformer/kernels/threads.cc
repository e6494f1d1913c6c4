// The OpenMP thread count of the MXNet engine thread that runs this operator (MXNet 1.9's
// custom-operator library API), for `kernels.use_threads` (see d2l_transformer/_threads.py).
//
//   d2t_omp_threads(x; threads) -> (1,) float32: the thread count now in force
//
// With OMP_NUM_THREADS set in the environment, MXNet 1.9's operators (and oneDNN's) ask
// OpenMP for the calling thread's count at every call (omp_get_max_threads), so setting it
// from an operator — which the engine runs on its CPU worker thread, in order with the others
// — changes how many threads the operators after it use. threads = 0 only reads the count.
#ifdef _OPENMP
#include <omp.h>
#endif

#include <string>
#include <vector>

#include "common.h"

using namespace mxnet::ext;

namespace {

MXReturnValue forward(const d2t::Attrs& attrs, std::vector<MXTensor>* inputs,
                      std::vector<MXTensor>* outputs, const OpResource& res) {
  const int threads = std::stoi(d2t::attr(attrs, "threads", "0"));
  float count = 1.f;
#ifdef _OPENMP
  if (threads > 0) omp_set_num_threads(threads);
  count = static_cast<float>(omp_get_max_threads());
#endif
  d2t::out((*outputs)[0])[0] = count;
  return MX_SUCCESS;
}

MXReturnValue infer_type(const d2t::Attrs& attrs, std::vector<int>* in_types,
                         std::vector<int>* out_types) {
  (*out_types)[0] = kFloat32;
  return MX_SUCCESS;
}

MXReturnValue infer_shape(const d2t::Attrs& attrs,
                          std::vector<std::vector<unsigned int>>* in_shapes,
                          std::vector<std::vector<unsigned int>>* out_shapes) {
  (*out_shapes)[0] = {1};
  return MX_SUCCESS;
}

}  // namespace

REGISTER_OP(d2t_omp_threads)
.setForward(forward, "cpu")
.setParseAttrs(d2t::parse_attrs<1>)
.setInferType(infer_type)
.setInferShape(infer_shape);
