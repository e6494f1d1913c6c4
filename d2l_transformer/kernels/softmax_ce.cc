// The masked softmax cross-entropy of 9.3.7 (training/loss.py's MaskedSoftmaxCELoss, label
// smoothing included) in one operator for MXNet 1.9's custom-operator library API.
//
//   d2t_softmax_ce(pred, label, valid_length; smoothing, per_token) -> (loss, lse)
//
// pred: (batch, T, V) logits; label: (batch, T) ids (float32, clipped to 0..V-1 as pick
// does); valid_length: (batch,). Position t of sentence b counts when t < valid_length[b].
// loss (batch,): the sum of the counted positions' cross-entropy -log softmax(pred)[label],
// divided by T unless per_token (d2l's mean over the padded width, or the "token" sum).
// lse (batch, T): each position's log-sum-exp, kept for the backward pass.
//
// Backward: the gradient of the label-smoothed objective (smoothing = eps; Szegedy et al.
// 2016, the paper's 5.4): per counted position, softmax - (1 - eps) one_hot(label) - eps / V,
// times the loss's output gradient (and / T); 0 at the other positions. With eps = 0 that is
// the cross-entropy's own gradient. The loss VALUE stays the plain cross-entropy, as in
// MaskedSoftmaxCELoss.
//
// MXNet's log_softmax backward is slow on a CPU at the full presets' sizes; this is two
// passes over the logits forward and one backward. float32 only; the
// sentences (forward) and positions (backward) are shared between OpenMP threads.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common.h"

using namespace mxnet::ext;
using d2t::attr;
using d2t::in;
using d2t::out;

namespace {

constexpr int64_t kParallelWork = 1 << 16;  // below this many logits, one thread

struct Dims {
  int64_t batch, T, V;
  float smoothing;
  bool per_token;
};

Dims dims_of(const d2t::Attrs& attrs, const MXTensor& pred) {
  return {pred.shape[0], pred.shape[1], pred.shape[2],
          std::stof(attr(attrs, "smoothing", "0")), attr(attrs, "per_token", "0") == "1"};
}

// Positions of sentence b that count: t < valid_length (as sequence_mask compares).
inline int64_t counted(const Dims& s, const float* valid_length, int64_t b) {
  const float n = std::ceil(valid_length[b]);  // the first t with t >= valid_length
  return n <= 0.f ? 0 : std::min<int64_t>(s.T, static_cast<int64_t>(n));
}

inline int64_t label_of(const Dims& s, float label) {
  const int64_t y = static_cast<int64_t>(label);
  return std::min<int64_t>(std::max<int64_t>(y, 0), s.V - 1);
}

// inputs: pred, label, valid_length; outputs: loss, lse
MXReturnValue forward(const d2t::Attrs& attrs, std::vector<MXTensor>* inputs,
                      std::vector<MXTensor>* outputs, const OpResource& res) {
  const MXTensor &pred = (*inputs)[0], &label = (*inputs)[1], &length = (*inputs)[2];
  const Dims s = dims_of(attrs, pred);
  float *loss = out((*outputs)[0]), *lse = out((*outputs)[1]);
  std::fill(lse, lse + s.batch * s.T, 0.f);
#pragma omp parallel for schedule(static) if (s.batch * s.T * s.V > kParallelWork)
  for (int64_t b = 0; b < s.batch; ++b) {
    const int64_t n = counted(s, in(length), b);
    float sum = 0.f;
    for (int64_t t = 0; t < n; ++t) {
      const int64_t row = b * s.T + t;
      const float* z = in(pred) + row * s.V;
      lse[row] = d2t::log_sum_exp(z, s.V);
      sum += lse[row] - z[label_of(s, in(label)[row])];
    }
    loss[b] = s.per_token ? sum : sum / s.T;
  }
  return MX_SUCCESS;
}

// inputs: dloss, dlse, pred, label, valid_length, loss, lse; outputs: dpred, dlabel, dlength
MXReturnValue backward(const d2t::Attrs& attrs, std::vector<MXTensor>* inputs,
                       std::vector<MXTensor>* outputs, const OpResource& res) {
  const MXTensor &dloss = (*inputs)[0], &pred = (*inputs)[2], &label = (*inputs)[3],
                 &length = (*inputs)[4], &lse = (*inputs)[6];
  const Dims s = dims_of(attrs, pred);
  float* dpred = out((*outputs)[0]);
  for (size_t o = 1; o < outputs->size(); ++o)  // labels and lengths get no gradient
    if ((*outputs)[o].data_ptr != nullptr)
      std::fill(out((*outputs)[o]), out((*outputs)[o]) + (*outputs)[o].size(), 0.f);
  const float uniform = s.smoothing / s.V;
#pragma omp parallel for schedule(static) if (s.batch * s.T * s.V > kParallelWork)
  for (int64_t row = 0; row < s.batch * s.T; ++row) {
    const int64_t b = row / s.T, t = row % s.T, n = counted(s, in(length), b);
    const float g = s.per_token ? in(dloss)[b] : in(dloss)[b] / s.T;
    float* d = dpred + row * s.V;
    if (t >= n) {
      std::fill(d, d + s.V, 0.f);
      continue;
    }
    const float* z = in(pred) + row * s.V;
    const float m = in(lse)[row];
    for (int64_t v = 0; v < s.V; ++v) d[v] = g * (d2t::exp_nonpositive(z[v] - m) - uniform);
    d[label_of(s, in(label)[row])] -= g * (1.f - s.smoothing);
  }
  return MX_SUCCESS;
}

MXReturnValue parse_attrs(const d2t::Attrs& attrs, int* num_in, int* num_out) {
  *num_in = 3;
  *num_out = 2;
  return MX_SUCCESS;
}

MXReturnValue infer_shape(const d2t::Attrs& attrs,
                          std::vector<std::vector<unsigned int>>* in_shapes,
                          std::vector<std::vector<unsigned int>>* out_shapes) {
  const auto &pred = (*in_shapes)[0], &label = (*in_shapes)[1], &length = (*in_shapes)[2];
  if (pred.size() != 3 || label.size() != 2 || label[0] != pred[0] || label[1] != pred[1] ||
      length.size() != 1 || length[0] != pred[0]) {
    MX_ERROR_MSG << "d2t softmax cross-entropy: pred (batch, T, V), label (batch, T) and "
                    "valid_length (batch,) expected";
    return MX_FAIL;
  }
  (*out_shapes)[0] = {pred[0]};
  (*out_shapes)[1] = {pred[0], pred[1]};
  return MX_SUCCESS;
}

}  // namespace

REGISTER_OP(d2t_softmax_ce)
.setForward(forward, "cpu")
.setBackward(backward, "cpu")
.setParseAttrs(parse_attrs)
.setInferType(d2t::float32_only)
.setInferShape(infer_shape);
