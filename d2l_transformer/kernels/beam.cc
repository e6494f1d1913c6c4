// Beam search's two per-step operations on the device (the translator's beam step graph),
// MXNet 1.9's custom-operator library API:
//
//   d2t_take_shift_in(new, cache, rows, position) -> out
//       out[r, :p + 1] = concatenate([new[r], cache[rows[r], :-1]])[:p + 1]: the self-attention
//       cache of the beam row r continues (take), with its newest position in front
//       (shift_in), in one copy of the p positions the step reads (cache.cc's d2t_shift_in:
//       the rows after p are left as they are) instead of take + shift of the whole cache.
//       new: (R, 1, H); cache: (R, L, H); rows: (R,) as float32; position: (1,), p.
//   d2t_row_topk(x, bias, k, log_softmax=0) -> out (R, 2k)
//       the k largest entries of each row of x + bias, best first: out[:, :k] their values
//       (x + bias in float32), out[:, k:] their column ids (as float32, exact below 2^24); ties
//       go to the lower id, as NumPy's repeated argmax does. x: (R, V); bias: (1, V). One pass
//       over the row with a k-entry insertion list, so the host reads (R, 2k) instead of (R, V).
//       log_softmax=1: of log_softmax(x) + bias, x being logits: each row's log-sum-exp
//       (vectorized, summed in double) is subtracted from the entries as they are ranked, so
//       that the (R, V) log-probabilities are never written (MXNet's log_softmax wrote them,
//       then MXNet's argmax or this operator read them).
//   d2t_beam_update(top, state, info, limits, k, eos) -> state'
//       one step of the translator's beam bookkeeping (`translator._beam_update`, gluonnlp's
//       ``_BeamSearchStepUpdate``), the same float32 arithmetic and order, so that the next step
//       starts without the host: top (B*k, 2k) from d2t_row_topk; state (B, k, 6): per beam
//       its score, alive (0/1), word (-1: a finished beam kept), parent, the next step's token
//       and cache row; info (3,): t, lp(t - 1), lp(t); limits (B,): each sentence's most tokens.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common.h"

using namespace mxnet::ext;

namespace {

MXReturnValue take_shift_forward(const d2t::Attrs& attrs, std::vector<MXTensor>* inputs,
                                 std::vector<MXTensor>* outputs, const OpResource& res) {
  const MXTensor &fresh = (*inputs)[0], &cache = (*inputs)[1], &rows_t = (*inputs)[2];
  const int64_t R = cache.shape[0], L = cache.shape[1], H = cache.shape[2];
  const int64_t n = d2t::positions_kept(d2t::in((*inputs)[3]), L);
  const float *f = d2t::in(fresh), *c = d2t::in(cache), *rows = d2t::in(rows_t);
  float* o = d2t::out((*outputs)[0]);
  for (int64_t r = 0; r < R; ++r) {
    const int64_t src = static_cast<int64_t>(rows[r]);
    std::memcpy(o + r * L * H, f + r * H, H * sizeof(float));
    std::memcpy(o + r * L * H + H, c + src * L * H, n * H * sizeof(float));
  }
  return MX_SUCCESS;
}

// Gradients (MXNet's graphs ask for them even when nothing trains): the output's first row to
// `new`, the next p summed into the cache rows they came from; none to `rows` or `position`.
MXReturnValue take_shift_backward(const d2t::Attrs& attrs, std::vector<MXTensor>* inputs,
                                  std::vector<MXTensor>* outputs, const OpResource& res) {
  // inputs: dout, then new, cache, rows, position
  const MXTensor &dout = (*inputs)[0], &rows_t = (*inputs)[3];
  const int64_t R = dout.shape[0], L = dout.shape[1], H = dout.shape[2];
  const int64_t n = d2t::positions_kept(d2t::in((*inputs)[4]), L);
  const float *g = d2t::in(dout), *rows = d2t::in(rows_t);
  float *dnew = d2t::out((*outputs)[0]), *dcache = d2t::out((*outputs)[1]);
  std::memset(dcache, 0, R * L * H * sizeof(float));
  std::memset(d2t::out((*outputs)[2]), 0, R * sizeof(float));
  d2t::out((*outputs)[3])[0] = 0.f;
  for (int64_t r = 0; r < R; ++r) {
    const int64_t src = static_cast<int64_t>(rows[r]);
    std::memcpy(dnew + r * H, g + r * L * H, H * sizeof(float));
    for (int64_t i = 0; i < n * H; ++i) dcache[src * L * H + i] += g[r * L * H + H + i];
  }
  return MX_SUCCESS;
}

MXReturnValue take_shift_shape(const d2t::Attrs& attrs,
                               std::vector<std::vector<unsigned int>>* in_shapes,
                               std::vector<std::vector<unsigned int>>* out_shapes) {
  const auto &fresh = (*in_shapes)[0], &cache = (*in_shapes)[1], &rows = (*in_shapes)[2],
             &position = (*in_shapes)[3];
  if (fresh.size() != 3 || cache.size() != 3 || fresh[0] != cache[0] || fresh[1] != 1 ||
      fresh[2] != cache[2] || cache[1] < 1 || rows.size() != 1 || rows[0] != cache[0] ||
      position.size() != 1 || position[0] != 1) {
    MX_ERROR_MSG << "d2t_take_shift_in: new (R, 1, H), cache (R, L, H), rows (R,), "
                    "position (1,) expected";
    return MX_FAIL;
  }
  (*out_shapes)[0] = cache;
  return MX_SUCCESS;
}

int top_k_of(const d2t::Attrs& attrs) { return std::stoi(d2t::attr(attrs, "k", "1")); }

constexpr int64_t kParallelTopk = 1 << 15;  // below this many entries, one thread

// exp(x) for x <= 0 (x - the row's maximum): Cephes' expf (x = n ln2 + r, |r| <= ln2 / 2,
// a degree-5 polynomial: relative error < 1e-7), without a library call, so that the loop
// vectorizes; below -87 (exp < 2e-38) 0. Not common.h's exp_nonpositive: its rounding by
// truncation does not vectorize for AVX2 (measured ~5x slower than this one there), and the
// training loss keeps that one, so that the fast path's figures do not move.
D2T_ALWAYS_INLINE float exp_nonpositive5(float x) {
  const float t = x > -87.f ? x : -87.f;  // value selects: they vectorize
  const float magic = 12582912.f;  // 1.5 * 2^23: adding it rounds to an integer
  const float n = (t * 1.44269504f + magic) - magic;
  const float r = (t - n * 0.693359375f) + n * 2.12194440e-4f;  // ln2 = hi - lo, exact n * hi
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;  // 2^n, n in -126..0
  float two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  return x < -87.f ? 0.f : p * two_n;
}

// One row of d2t_row_topk: the k largest of v[j] = ((row[j] - m) - ls) + bias[j], best first,
// into val/id (an equal value never displaces an earlier id). With log_softmax, m is the
// row's maximum and ls = log sum_j exp(row[j] - m), the exponentials summed in double (8
// partial sums), so that v is within a few float32 roundings of the exact log-probability
// (MXNet's float32 log_softmax is up to ~4e-6 off); else m = ls = 0: x + bias exactly.
// v is computed into buf (V floats) in one vectorized pass; then a block of 16 whose maximum
// cannot enter a full list is passed over whole (after the first blocks, nearly all are), the
// others are inserted entry by entry.
D2T_ALWAYS_INLINE void top_k_row_body(const float* row, const float* bias, bool log_softmax,
                                      int64_t V, int k, float* val, int64_t* id, float* buf) {
  float m = 0.f, ls = 0.f;
  if (log_softmax) {
    m = d2t::row_max(row, V);
    ls = static_cast<float>(std::log(d2t::sum_exp<double, exp_nonpositive5>(row, V, m)));
  }
  for (int64_t j = 0; j < V; ++j) buf[j] = ((row[j] - m) - ls) + bias[j];
  constexpr int64_t kBlock = 16;
  int n = 0;
  for (int64_t start = 0; start < V; start += kBlock) {
    const int64_t end = start + kBlock < V ? start + kBlock : V;
    if (n == k) {
      float block_max = -INFINITY;
      for (int64_t j = start; j < end; ++j) block_max = buf[j] > block_max ? buf[j] : block_max;
      if (!(block_max > val[k - 1])) continue;
    }
    for (int64_t j = start; j < end; ++j) {
      const float v = buf[j];
      if (n == k && !(v > val[k - 1])) continue;
      int i = n < k ? n++ : k - 1;
      while (i > 0 && v > val[i - 1]) {
        val[i] = val[i - 1];
        id[i] = id[i - 1];
        --i;
      }
      val[i] = v;
      id[i] = j;
    }
  }
}

// The same row compiled twice: for any x86-64 (SSE2, 4 lanes) and for AVX2 + FMA (8 lanes,
// ~1.8x faster here; FMA rounds the polynomial once per step: the values may differ from the
// other build's in the last bit), the second chosen at run time where the CPU has both.
void top_k_row_generic(const float* row, const float* bias, bool log_softmax, int64_t V, int k,
                       float* val, int64_t* id, float* buf) {
  top_k_row_body(row, bias, log_softmax, V, k, val, id, buf);
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2,fma"))) void top_k_row_avx2(const float* row, const float* bias,
                                                         bool log_softmax, int64_t V, int k,
                                                         float* val, int64_t* id, float* buf) {
  top_k_row_body(row, bias, log_softmax, V, k, val, id, buf);
}

// D2L_TRANSFORMER_KERNELS_ISA=generic (read once) keeps to the generic build on any CPU, so
// that the tests run the same checks on both builds (tests/test_kernels.py).
bool has_avx2_fma() {
  static const bool yes = [] {
    const char* isa = std::getenv("D2L_TRANSFORMER_KERNELS_ISA");
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           !(isa && std::string(isa) == "generic");
  }();
  return yes;
}
#endif

void top_k_row(const float* row, const float* bias, bool log_softmax, int64_t V, int k,
               float* val, int64_t* id, float* buf) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (has_avx2_fma()) return top_k_row_avx2(row, bias, log_softmax, V, k, val, id, buf);
#endif
  top_k_row_generic(row, bias, log_softmax, V, k, val, id, buf);
}

MXReturnValue topk_forward(const d2t::Attrs& attrs, std::vector<MXTensor>* inputs,
                           std::vector<MXTensor>* outputs, const OpResource& res) {
  const MXTensor &x_t = (*inputs)[0], &bias_t = (*inputs)[1];
  const int64_t R = x_t.shape[0], V = x_t.shape[1];
  const int k = top_k_of(attrs);
  const bool log_softmax = d2t::attr(attrs, "log_softmax", "0") == "1";
  const float *x = d2t::in(x_t), *bias = d2t::in(bias_t);
  float* o = d2t::out((*outputs)[0]);
#pragma omp parallel if (R * V > kParallelTopk)
  {
    std::vector<float> val(k), buf(V);
    std::vector<int64_t> id(k);
#pragma omp for
    for (int64_t r = 0; r < R; ++r) {
      top_k_row(x + r * V, bias, log_softmax, V, k, val.data(), id.data(), buf.data());
      for (int i = 0; i < k; ++i) {
        o[r * 2 * k + i] = val[i];
        o[r * 2 * k + k + i] = static_cast<float>(id[i]);
      }
    }
  }
  return MX_SUCCESS;
}

MXReturnValue topk_backward(const d2t::Attrs& attrs, std::vector<MXTensor>* inputs,
                            std::vector<MXTensor>* outputs, const OpResource& res) {
  const MXTensor& x_t = (*inputs)[1];  // dout, x, bias: no gradient (a selection)
  std::memset(d2t::out((*outputs)[0]), 0, x_t.shape[0] * x_t.shape[1] * sizeof(float));
  std::memset(d2t::out((*outputs)[1]), 0, x_t.shape[1] * sizeof(float));
  return MX_SUCCESS;
}

MXReturnValue topk_shape(const d2t::Attrs& attrs,
                         std::vector<std::vector<unsigned int>>* in_shapes,
                         std::vector<std::vector<unsigned int>>* out_shapes) {
  const auto &x = (*in_shapes)[0], &bias = (*in_shapes)[1];
  const int k = top_k_of(attrs);
  if (x.size() != 2 || bias.size() != 2 || bias[0] != 1 || bias[1] != x[1] || k < 1 ||
      static_cast<unsigned int>(k) > x[1]) {
    MX_ERROR_MSG << "d2t_row_topk: x (R, V), bias (1, V) and 1 <= k <= V expected";
    return MX_FAIL;
  }
  (*out_shapes)[0] = {x[0], static_cast<unsigned int>(2 * k)};
  return MX_SUCCESS;
}

MXReturnValue update_forward(const d2t::Attrs& attrs, std::vector<MXTensor>* inputs,
                             std::vector<MXTensor>* outputs, const OpResource& res) {
  const MXTensor& state_t = (*inputs)[1];
  const float *top = d2t::in((*inputs)[0]), *state = d2t::in(state_t);
  const float *info = d2t::in((*inputs)[2]), *limits = d2t::in((*inputs)[3]);
  const int64_t B = state_t.shape[0];
  const int k = top_k_of(attrs), kk = k * k;
  const float eos = std::stof(d2t::attr(attrs, "eos", "0"));
  const float t = info[0], prev_lp = info[1], lp = info[2];
  const float NEG = -1e18f;  // translator.NEG
  float* o = d2t::out((*outputs)[0]);
  std::vector<float> all(kk + k);
  std::vector<char> used(kk + k);
  for (int64_t b = 0; b < B; ++b) {
    const float* s = state + b * k * 6;
    for (int i = 0; i < k; ++i) {
      const bool alive = s[i * 6 + 1] > 0.5f;
      const float base = s[i * 6] * prev_lp;  // (scores * prev_lp)
      for (int j = 0; j < k; ++j)  // (values + base) / lp, NEG for a finished beam
        all[i * k + j] = alive ? (top[(b * k + i) * 2 * k + j] + base) / lp : NEG;
      all[kk + i] = alive ? NEG : s[i * 6];  // a finished beam competes with its score
    }
    std::fill(used.begin(), used.end(), 0);
    for (int slot = 0; slot < k; ++slot) {  // a stable sort, best first: ties to the lower pos
      int best = -1;
      for (int p = 0; p < kk + k; ++p)
        if (!used[p] && (best < 0 || all[p] > all[best])) best = p;
      used[best] = 1;
      const bool kept = best >= kk;
      const int parent = kept ? best - kk : best / k;
      const float word = kept ? -1.0f : top[(b * k + parent) * 2 * k + k + best % k];
      const bool alive = s[parent * 6 + 1] > 0.5f && word != eos && limits[b] > t;
      float* q = o + (b * k + slot) * 6;
      q[0] = all[best];
      q[1] = alive ? 1.0f : 0.0f;
      q[2] = word;
      q[3] = static_cast<float>(parent);
      q[4] = word < 0 ? 0.0f : word;  // the next step's token (a finished beam: any)
      q[5] = static_cast<float>(b * k + parent);  // the cache row it continues
    }
  }
  return MX_SUCCESS;
}

MXReturnValue update_backward(const d2t::Attrs& attrs, std::vector<MXTensor>* inputs,
                              std::vector<MXTensor>* outputs, const OpResource& res) {
  for (int i = 0; i < 4; ++i) {  // no gradient (bookkeeping)
    const MXTensor& x = (*inputs)[1 + i];
    std::memset(d2t::out((*outputs)[i]), 0, x.size() * sizeof(float));
  }
  return MX_SUCCESS;
}

MXReturnValue update_shape(const d2t::Attrs& attrs,
                           std::vector<std::vector<unsigned int>>* in_shapes,
                           std::vector<std::vector<unsigned int>>* out_shapes) {
  const auto &top = (*in_shapes)[0], &state = (*in_shapes)[1], &info = (*in_shapes)[2],
             &limits = (*in_shapes)[3];
  const unsigned int k = top_k_of(attrs);
  if (top.size() != 2 || state.size() != 3 || state[1] != k || state[2] != 6 ||
      top[0] != state[0] * k || top[1] != 2 * k || info.size() != 1 || info[0] != 3 ||
      limits.size() != 1 || limits[0] != state[0]) {
    MX_ERROR_MSG << "d2t_beam_update: top (B*k, 2k), state (B, k, 6), info (3,), limits (B,)";
    return MX_FAIL;
  }
  (*out_shapes)[0] = state;
  return MX_SUCCESS;
}

}  // namespace

// Which build `top_k_row` runs: 1 for AVX2 + FMA, 0 for the generic one (tests, via ctypes).
extern "C" int d2t_row_topk_avx2() {
#if defined(__x86_64__) && defined(__GNUC__)
  return has_avx2_fma();
#else
  return 0;
#endif
}

REGISTER_OP(d2t_beam_update)
.setForward(update_forward, "cpu")
.setBackward(update_backward, "cpu")
.setParseAttrs(d2t::parse_attrs<4>)
.setInferType(d2t::float32_only)
.setInferShape(update_shape);

REGISTER_OP(d2t_take_shift_in)
.setForward(take_shift_forward, "cpu")
.setBackward(take_shift_backward, "cpu")
.setParseAttrs(d2t::parse_attrs<4>)
.setInferType(d2t::float32_only)
.setInferShape(take_shift_shape);

REGISTER_OP(d2t_row_topk)
.setForward(topk_forward, "cpu")
.setBackward(topk_backward, "cpu")
.setParseAttrs(d2t::parse_attrs<2>)
.setInferType(d2t::float32_only)
.setInferShape(topk_shape);
