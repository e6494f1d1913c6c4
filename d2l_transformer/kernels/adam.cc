// Adam's update of every parameter in one operator (MXNet 1.9's custom-operator library API),
// for training/optim.py's ClipAdam: the arithmetic of MXNet's multi_adamw_update, element for
// element, with each tensor's elements in one contiguous pass.
//
//   d2t_adam(w_0..w_n-1, g_0.., m_0.., v_0.., rescale; num, lrs, wds, beta1, beta2, epsilon)
//       -> (1,) float32: the rescale the update used
//
// w, m, v are updated in place (mutable inputs); g is read; rescale (1,) multiplies every
// gradient. lrs, wds: n comma-separated numbers (Python's repr of a double, read as a double
// and rounded to float32, as MXNet reads multi_adamw_update's). Per element, in float32 and
// in this order (multi_adamw_update's MultiMPAdamWKernel with eta 1 and no clipping):
//   g' = rescale * g;  m = beta1 * (m - g') + g';  v = beta2 * (v - g'^2) + g'^2;
//   w = w - 1 * (lr * m / (sqrt(v) + epsilon) + wd * w)
// A rescale that is not finite, or 0, updates nothing (multi_adamw_update skips it too).
//
// multi_adamw_update walks all its tensors at each index (50 at most per call), up to the
// largest tensor's size: ~200 interleaved streams that defeat the prefetchers, twice as slow
// on one thread as a pass per tensor (docs/benchmarks.md, "bfloat16"). Here: one parallel
// region, each tensor split between the threads in turn (no barrier between tensors).
#ifdef _OPENMP
#include <omp.h>
#endif

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "common.h"

using namespace mxnet::ext;
using d2t::attr;

namespace {

constexpr int64_t kParallelWork = 1 << 16;  // below this many elements in all, one thread

int num_of(const d2t::Attrs& attrs) { return std::stoi(attr(attrs, "num", "0")); }

// n numbers from "a,b,c": each read as a double and rounded to float32.
std::vector<float> floats(const std::string& text, int n) {
  std::vector<float> values;
  const char* p = text.c_str();
  while (*p && static_cast<int>(values.size()) < n) {
    char* end = nullptr;
    values.push_back(static_cast<float>(std::strtod(p, &end)));
    p = *end == ',' ? end + 1 : end;
  }
  values.resize(n, 0.f);
  return values;
}

struct Tensor {
  float *w, *m, *v;
  const float* g;
  int64_t size;
  float lr, wd;
};

void update(const Tensor& t, int64_t begin, int64_t end, float rescale, float beta1, float beta2,
            float epsilon) {
  for (int64_t i = begin; i < end; ++i) {
    const float g = rescale * t.g[i];
    const float m = beta1 * (t.m[i] - g) + g;
    const float adj = g * g;
    const float v = beta2 * (t.v[i] - adj) + adj;
    t.m[i] = m;
    t.v[i] = v;
    const float w = t.w[i];
    t.w[i] = w - 1.f * (t.lr * m / (std::sqrt(v) + epsilon) + t.wd * w);
  }
}

MXReturnValue forward(const d2t::Attrs& attrs, std::vector<MXTensor>* inputs,
                      std::vector<MXTensor>* outputs, const OpResource& res) {
  const int n = num_of(attrs);
  const float rescale = d2t::in((*inputs)[4 * n])[0];
  d2t::out((*outputs)[0])[0] = rescale;
  if (!std::isfinite(rescale) || rescale == 0.f) return MX_SUCCESS;  // as multi_adamw_update
  const std::vector<float> lrs = floats(attr(attrs, "lrs", ""), n);
  const std::vector<float> wds = floats(attr(attrs, "wds", ""), n);
  const float beta1 = static_cast<float>(std::strtod(attr(attrs, "beta1", "0.9").c_str(), nullptr));
  const float beta2 = static_cast<float>(std::strtod(attr(attrs, "beta2", "0.999").c_str(), nullptr));
  const float epsilon = static_cast<float>(std::strtod(attr(attrs, "epsilon", "1e-8").c_str(), nullptr));
  std::vector<Tensor> tensors;
  int64_t total = 0;
  for (int k = 0; k < n; ++k) {
    MXTensor& w = (*inputs)[k];
    Tensor t{d2t::out(w), d2t::out((*inputs)[2 * n + k]), d2t::out((*inputs)[3 * n + k]),
             d2t::in((*inputs)[n + k]), w.size(), lrs[k], wds[k]};
    tensors.push_back(t);
    total += t.size;
  }
#pragma omp parallel if (total >= kParallelWork)
  {
    int threads = 1, me = 0;
#ifdef _OPENMP
    threads = omp_get_num_threads();
    me = omp_get_thread_num();
#endif
    for (const Tensor& t : tensors) {  // this thread's share of each tensor, no barrier
      const int64_t per = (t.size + threads - 1) / threads;
      const int64_t begin = std::min<int64_t>(t.size, per * me);
      update(t, begin, std::min<int64_t>(t.size, begin + per), rescale, beta1, beta2, epsilon);
    }
  }
  return MX_SUCCESS;
}

MXReturnValue parse_attrs(const d2t::Attrs& attrs, int* num_in, int* num_out) {
  *num_in = 4 * num_of(attrs) + 1;
  *num_out = 1;
  return MX_SUCCESS;
}

MXReturnValue infer_shape(const d2t::Attrs& attrs,
                          std::vector<std::vector<unsigned int>>* in_shapes,
                          std::vector<std::vector<unsigned int>>* out_shapes) {
  const int n = num_of(attrs);
  for (int k = 0; k < n; ++k) {
    for (int j = 1; j < 4; ++j) {
      if ((*in_shapes)[j * n + k] != (*in_shapes)[k]) {
        MX_ERROR_MSG << "d2t_adam: parameter " << k << "'s gradient and moments must have its shape";
        return MX_FAIL;
      }
    }
  }
  (*out_shapes)[0] = {1};
  return MX_SUCCESS;
}

MXReturnValue mutate_inputs(const d2t::Attrs& attrs, std::vector<int>* input_indices) {
  const int n = num_of(attrs);
  for (int k = 0; k < n; ++k) {
    input_indices->push_back(k);          // the weights
    input_indices->push_back(2 * n + k);  // the first moments
    input_indices->push_back(3 * n + k);  // the second moments
  }
  return MX_SUCCESS;
}

}  // namespace

REGISTER_OP(d2t_adam)
.setForward(forward, "cpu")
.setParseAttrs(parse_attrs)
.setInferType(d2t::float32_only)
.setInferShape(infer_shape)
.setMutateInputs(mutate_inputs);
