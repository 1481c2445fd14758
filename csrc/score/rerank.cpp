// The reranker's fused CPU path (memkern/rerank.h): select (scores, Gumbel-top-M, log-probs) and the
// trainer's step, each one call with no temporaries beyond [rows, d] / [rows, K] work arrays.
#include "memkern/rerank.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "memkern/errors.h"
#include "memkern/simd.h"

#if defined(__x86_64__) || defined(_M_X64)
#define MEMKERN_RK_X86 1
#endif

namespace memkern {
namespace rerank {

namespace generic {
#define RK_VW 4
#define RK_NT_R 2
#define RK_NT_J 4
#define RK_AX_R 4
#define RK_AX_NV 2
#include "rerank_kernels.inc"
}  // namespace generic

#ifdef MEMKERN_RK_X86
#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace avx2 {
#define RK_VW 8
#define RK_NT_R 2
#define RK_NT_J 4
#define RK_AX_R 4
#define RK_AX_NV 2
#include "rerank_kernels.inc"
}  // namespace avx2
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx512vl,avx2,fma")
namespace avx512 {
#define RK_VW 16
#define RK_NT_R 4
#define RK_NT_J 4
#define RK_AX_R 4
#define RK_AX_NV 4
#include "rerank_kernels.inc"
}  // namespace avx512
#pragma GCC pop_options
#endif

namespace {

struct Kernels {
  float (*dot)(const float*, const float*, int64_t);
  void (*axpy)(float, const float*, float*, int64_t);
  void (*nt_add)(const float*, int64_t, int64_t, const float*, float*, double*);
  void (*ax)(const float*, int64_t, int64_t, int64_t, const float*, int64_t, int64_t, int64_t, float*, int64_t, int,
             float, float, double*, double*);
  double (*sub_scaled)(float*, const float*, float, int64_t);
  double (*sum_sq)(const float*, int64_t);
  void (*scale)(float*, float, int64_t);
  const char* name;
};

#define RK_KERNELS(ns, label) \
  Kernels { ns::dot, ns::axpy, ns::nt_add, ns::ax, ns::sub_scaled, ns::sum_sq, ns::scale, label }

// Picked once (memkern/simd.h: the best set the CPU runs, capped by MEMKERN_SIMD, as the store's).
const Kernels& kernels() {
  static const Kernels k = [] {
#ifdef MEMKERN_RK_X86
    switch (simd_level(/*avx512_dq_vl=*/true)) {
      case Simd::Avx512: return RK_KERNELS(avx512, "avx512");
      case Simd::Avx2: return RK_KERNELS(avx2, "avx2+fma");
      case Simd::Scalar: break;
    }
#endif
    return RK_KERNELS(generic, "scalar");
  }();
  return k;
}

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The SGD step's scale min(1, clip / |g|) (1 without clipping).
inline double clip_coef(double clip, double gnorm) { return clip > 0 ? std::min(1.0, clip / (gnorm + 1e-12)) : 1.0; }

// The decay-and-projection factor of the adapters after the step, whose norm is `nrm`:
// decay * min(1, max_norm / (decay * nrm)) (no projection when max_norm <= 0; 1 on a skipped step).
inline double decay_factor(double nrm, double decay, double max_norm, bool finite) {
  if (!finite) return 1.0;
  if (max_norm <= 0) return decay;
  double c = max_norm / (nrm * decay + 1e-30);
  if (std::isnan(c)) c = 1.0;
  return std::min(1.0, c) * decay;
}
constexpr float kUMin = 1e-10f;  // uniforms are clamped to [kUMin, 1) before the Gumbel transform
// Up to this many rows the step's gradient norms come from [n, n] Gram matrices and the adapters are
// updated in one pass without storing the gradient; above, the gradient is stored first.
constexpr int64_t kGramRows = 32;

// Candidate i of row b (padding ids read table row 0) and whether it is valid.
inline const float* cand_row(const Cands& c, int64_t b, int64_t i, int64_t K, int64_t d) {
  if (c.dense) return c.dense + (b * K + i) * d;
  const int64_t id = c.ids[b * K + i];
  return c.table + (id < 0 ? 0 : id) * d;
}
inline bool cand_valid(const Cands& c, int64_t b, int64_t i, int64_t K) {
  if (c.mask && !c.mask[b * K + i]) return false;
  return !c.ids || c.ids[b * K + i] >= 0;
}

void check_ids(const Cands& c, int64_t B, int64_t K) {
  if (!c.ids) return;
  for (int64_t t = 0; t < B * K; ++t) {
    const int64_t id = c.ids[t];
    if (id >= c.n_table || (id < 0 && c.n_table == 0))
      throw ValueError("ids: expected values in [-1, " + std::to_string(c.n_table) + ") (table rows), got " +
                       std::to_string(id));
  }
}

// NaN ranks above everything (torch.topk's order); ties go to the lower index.
inline bool key_before(float a, int64_t ia, float b, int64_t ib) {
  const bool na = std::isnan(a), nb = std::isnan(b);
  if (na != nb) return na;
  if (!na && a != b) return a > b;
  return ia < ib;
}

// Top-m of keys [K] in decreasing order into idx [m]; -1 where the key is -inf or NaN.
void top_m(const float* keys, int64_t K, int64_t m, int64_t* idx, std::vector<uint8_t>& taken) {
  taken.assign(static_cast<size_t>(K), 0);
  for (int64_t j = 0; j < m; ++j) {
    int64_t best = -1;
    for (int64_t i = 0; i < K; ++i) {
      if (taken[i]) continue;
      if (best < 0 || key_before(keys[i], i, keys[best], best)) best = i;
    }
    taken[best] = 1;
    idx[j] = keys[best] > kNegInf ? best : -1;
  }
}

// log-sum-exp of z over the entries with keep != 0 (all when keep is null); -inf when none is finite
double lse(const float* z, int64_t K, const uint8_t* removed) {
  float mx = kNegInf;
  bool nan = false;
  for (int64_t i = 0; i < K; ++i) {
    if (removed && removed[i]) continue;
    if (std::isnan(z[i])) nan = true;
    else mx = std::max(mx, z[i]);
  }
  if (nan) return std::numeric_limits<double>::quiet_NaN();
  if (mx == kNegInf) return -std::numeric_limits<double>::infinity();
  if (std::isinf(mx)) return mx;
  double s = 0;
  for (int64_t i = 0; i < K; ++i) {
    if (removed && removed[i]) continue;
    s += std::exp(static_cast<double>(z[i]) - mx);
  }
  return mx + std::log(s);
}

// Log-probabilities [m] of the draw idx under z [K] (0 on -1 slots).
void draw_logp(const float* z, int64_t K, const int64_t* idx, int64_t m, bool pl, float* out,
               std::vector<uint8_t>& removed) {
  removed.assign(static_cast<size_t>(K), 0);
  const double full = pl ? 0.0 : lse(z, K, nullptr);
  for (int64_t j = 0; j < m; ++j) {
    const int64_t i = idx[j];
    const double l = pl ? lse(z, K, removed.data()) : full;
    out[j] = i < 0 ? 0.f : static_cast<float>(z[i] - l);
    if (i >= 0) removed[i] = 1;
  }
}

inline float nan_to_num(float x) {
  if (std::isnan(x)) return 0.f;
  if (std::isinf(x)) return x > 0 ? std::numeric_limits<float>::max() : -std::numeric_limits<float>::max();
  return x;
}

// g [K] = dL/ds of one row and its loss term sum_j A_j logp_j; `scale` = -1 / (B tau).
double score_grad_row(const float* z, int64_t K, const int64_t* idx, const float* adv, int64_t M, bool pl,
                      float scale, float* g, std::vector<uint8_t>& removed, std::vector<double>& work) {
  work.assign(static_cast<size_t>(K), 0.0);  // gpos
  double loss = 0;
  removed.assign(static_cast<size_t>(K), 0);
  if (!pl) {
    const double l = lse(z, K, nullptr);
    double asum = 0;
    for (int64_t j = 0; j < M; ++j) {
      asum += adv[j];
      if (idx[j] >= 0) work[idx[j]] += adv[j];
      else work[0] += adv[j];  // (0 on -1 slots)
      const float lp = idx[j] < 0 ? 0.f : static_cast<float>(z[idx[j]] - l);
      loss += static_cast<double>(adv[j]) * lp;
    }
    for (int64_t i = 0; i < K; ++i) {
      const double p = std::isinf(l) && l < 0 ? std::numeric_limits<double>::quiet_NaN() : std::exp(z[i] - l);
      work[i] -= p * asum;
    }
  } else {
    for (int64_t j = 0; j < M; ++j) {
      const double l = lse(z, K, removed.data());
      const int64_t s = idx[j];
      const float lp = s < 0 ? 0.f : static_cast<float>(z[s] - l);
      loss += static_cast<double>(adv[j]) * lp;
      for (int64_t i = 0; i < K; ++i) {
        double p = removed[i] ? 0.0 : std::exp(z[i] - l);
        if (std::isnan(p)) p = 0.0;
        work[i] += adv[j] * ((s >= 0 && i == s ? 1.0 : 0.0) - p);
      }
      if (s >= 0) removed[s] = 1;
    }
  }
  for (int64_t i = 0; i < K; ++i) g[i] = nan_to_num(static_cast<float>(work[i]) * scale);
  return loss;
}

// splitmix64 keys of one replay draw (memkern.score.replay._replay_keys) over the `len` filled rows; the
// rows of the `size` largest, largest first.
std::vector<int64_t> replay_pick(uint64_t seed, uint64_t draws, int64_t cap, int64_t len, int64_t size) {
  const uint64_t seed_u = seed * 1000003ull + 7ull;
  std::vector<int64_t> keys(static_cast<size_t>(len)), order(static_cast<size_t>(len));
  for (int64_t i = 0; i < len; ++i) {
    uint64_t z = (static_cast<uint64_t>(i) + draws * static_cast<uint64_t>(cap)) * 0x9E3779B97F4A7C15ull + seed_u;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z = z ^ (z >> 31);
    keys[i] = static_cast<int64_t>(z >> 1);
    order[i] = i;
  }
  size = std::min(size, len);
  std::partial_sort(order.begin(), order.begin() + size, order.end(), [&](int64_t x, int64_t y) {
    return keys[x] != keys[y] ? keys[x] > keys[y] : x < y;
  });
  order.resize(static_cast<size_t>(size));
  return order;
}

inline bool all_finite(const float* p, int64_t n) {
  uint32_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, p + i, 4);
    bad |= static_cast<uint32_t>((u & 0x7f800000u) == 0x7f800000u);
  }
  return bad == 0;
}

}  // namespace

const char* kernel_name() { return kernels().name; }

float philox_uniform(uint64_t seed, uint64_t offset) {
  uint32_t c0 = static_cast<uint32_t>(offset), c1 = static_cast<uint32_t>(offset >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int r = 0; r < 10; ++r) {
    const uint64_t pb = static_cast<uint64_t>(0xCD9E8D57u) * c2, pa = static_cast<uint64_t>(0xD2511F53u) * c0;
    const uint32_t n0 = static_cast<uint32_t>(pb >> 32) ^ c1 ^ k0, n2 = static_cast<uint32_t>(pa >> 32) ^ c3 ^ k1;
    c1 = static_cast<uint32_t>(pb);
    c3 = static_cast<uint32_t>(pa);
    c0 = n0;
    c2 = n2;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  int32_t x;
  std::memcpy(&x, &c0, 4);
  if (x < 0) x = ~x;
  return static_cast<float>(x) * 4.6566127342e-10f;
}

void select(const SelectArgs& a) {
  const Kernels& k = kernels();
  const int64_t B = a.B, K = a.K, d = a.d;
  check_ids(a.c, B, K);
  std::vector<float> r(static_cast<size_t>(B * d)), dq, z(static_cast<size_t>(K)), keys(static_cast<size_t>(K));
  std::vector<uint8_t> taken;
  double wq2 = 0, wm2 = 0;
  k.nt_add(a.q, B, d, a.Wq, a.qp, &wq2);                                    // q' = q + q Wq^T
  std::memcpy(r.data(), a.qp, sizeof(float) * B * d);
  k.ax(a.qp, d, 1, B, a.Wm, d, d, d, r.data(), d, 1, 1.f, 1.f, nullptr, &wm2);  // r = q' + q' Wm
  if (a.w_sq) *a.w_sq = wq2 + wm2;
  if (a.prior) dq.resize(static_cast<size_t>(d));
  for (int64_t b = 0; b < B; ++b) {
    const float* rb = r.data() + b * d;
    float* s = a.scores + b * K;
    for (int64_t i = 0; i < K; ++i) s[i] = cand_valid(a.c, b, i, K) ? k.dot(cand_row(a.c, b, i, K, d), rb, d) : kNegInf;
    const float* drawn = s;
    if (a.prior) {  // prior + m . (r - q): exactly the prior for zero adapters
      for (int64_t t = 0; t < d; ++t) dq[t] = rb[t] - a.q[b * d + t];
      float* p = a.drawn + b * K;
      for (int64_t i = 0; i < K; ++i)
        p[i] = a.prior[b * K + i] + (std::isfinite(s[i]) ? k.dot(cand_row(a.c, b, i, K, d), dq.data(), d) : s[i]);
      drawn = p;
    }
    for (int64_t i = 0; i < K; ++i) z[i] = drawn[i] / a.tau;
    for (int64_t i = 0; i < K; ++i) {
      if (a.greedy) {
        keys[i] = z[i];
      } else {
        const float u = std::max(philox_uniform(a.seed, a.offset + static_cast<uint64_t>(b * K + i)), kUMin);
        keys[i] = z[i] + (-std::log(-std::log(u)));
      }
    }
    top_m(keys.data(), K, a.m, a.idx + b * a.m, taken);
    draw_logp(z.data(), K, a.idx + b * a.m, a.m, a.plackett_luce, a.logp + b * a.m, taken);
  }
}

StepResult step(const StepArgs& a) {
  const Kernels& k = kernels();
  check_ids(a.c, a.Bn, a.K);
  StepResult res;
  std::vector<int64_t> picks;
  if (a.replay_size > 0) {  // the replay draw: rows of the replay_size largest splitmix64 keys
    picks = replay_pick(a.replay_seed, a.replay_draws, a.cap, a.replay_len, a.replay_size);
    const_cast<StepArgs&>(a).pick = picks.data();
    const_cast<StepArgs&>(a).Br = static_cast<int64_t>(picks.size());
  }
  const int64_t d = a.d, K = a.K, M = a.M, Bn = a.Bn, Br = a.Br, n = Bn + Br;
  std::vector<float> Q(n * d), Qp(n * d), S(n * K), G(n * K), U(n * d), V(n * d), A(n * M), P;
  std::vector<int64_t> I(n * M);
  std::vector<uint8_t> valid(n * K), removed;
  std::vector<double> work;
  // row b's candidate i (the selection's rows, then the ring's picks)
  auto row = [&](int64_t b, int64_t i) -> const float* {
    return b < Bn ? cand_row(a.c, b, i, K, d) : a.ring_C + (a.pick[b - Bn] * K + i) * d;
  };
  for (int64_t b = 0; b < n; ++b) {
    const int64_t src = b < Bn ? b : a.pick[b - Bn];
    std::memcpy(Q.data() + b * d, b < Bn ? a.q + b * d : a.ring_q + src * d, sizeof(float) * d);
    std::memcpy(I.data() + b * M, b < Bn ? a.idx + b * M : a.ring_idx + src * M, sizeof(int64_t) * M);
    for (int64_t i = 0; i < K; ++i)
      valid[b * K + i] = b < Bn ? cand_valid(a.c, b, i, K) : a.ring_valid[src * K + i] != 0;
  }
  // ---- forward of the rows select() did not score at these adapters
  const int64_t f0 = (a.qp_cached && a.s_cached) ? Bn : 0;
  if (f0 == Bn && Bn > 0) {
    std::memcpy(Qp.data(), a.qp_cached, sizeof(float) * Bn * d);
    std::memcpy(S.data(), a.s_cached, sizeof(float) * Bn * K);
  }
  double wq2 = std::numeric_limits<double>::quiet_NaN(), wm2 = 0;  // |Wq|^2, |Wm|^2 (read on the way)
  if (f0 == Bn && Bn > 0 && a.w_sq_cached >= 0) wq2 = a.w_sq_cached;  // select's |Wq|^2 + |Wm|^2
  bool wm_in_wq2 = !std::isnan(wq2);
  if (n > f0) {
    std::vector<float> r((n - f0) * d);
    double q2 = 0;
    k.nt_add(Q.data() + f0 * d, n - f0, d, a.Wq, Qp.data() + f0 * d, &q2);
    wq2 = q2;
    wm_in_wq2 = false;
    std::memcpy(r.data(), Qp.data() + f0 * d, sizeof(float) * (n - f0) * d);
    k.ax(Qp.data() + f0 * d, d, 1, n - f0, a.Wm, d, d, d, r.data(), d, 1, 1.f, 1.f, nullptr, nullptr);
    for (int64_t b = f0; b < n; ++b)
      for (int64_t i = 0; i < K; ++i)
        S[b * K + i] = valid[b * K + i] ? k.dot(row(b, i), r.data() + (b - f0) * d, d) : kNegInf;
  }
  // ---- prior offsets: the selection's prior - q . m (0 on padding), the ring's stored ones
  if (a.use_P) {
    P.assign(Bn * K, 0.f);
    if (a.prior)
      for (int64_t b = 0; b < Bn; ++b)
        for (int64_t i = 0; i < K; ++i)
          if (valid[b * K + i]) P[b * K + i] = a.prior[b * K + i] - k.dot(row(b, i), Q.data() + b * d, d);
    for (int64_t b = 0; b < n; ++b)
      for (int64_t i = 0; i < K; ++i)
        S[b * K + i] += b < Bn ? P[b * K + i] : a.ring_P[a.pick[b - Bn] * K + i];
  }
  // ---- advantages (double sums; rewards of -1 slots are ignored, even NaN)
  double n_slot = 0, r_sum = 0;
  for (int64_t b = 0; b < n; ++b)
    for (int64_t j = 0; j < M; ++j)
      if (I[b * M + j] >= 0) {
        n_slot += 1;
        r_sum += b < Bn ? a.R[b * M + j] : a.ring_R[a.pick[b - Bn] * M + j];
      }
  const double n1 = std::max(n_slot, 1.0);
  double base;
  if (a.baseline_mode == 0) {
    base = a.baseline;
  } else {
    const float mean_now = static_cast<float>(r_sum / n1);
    if (a.baseline_mode == 1) {
      base = mean_now;
    } else if (a.running_first) {
      base = mean_now;
      *a.running = mean_now;
    } else {
      base = *a.running;
      *a.running = *a.running * a.momentum + mean_now * (1.0f - a.momentum);
    }
  }
  res.baseline = base;
  const float base_f = static_cast<float>(base);
  double a_sum = 0;
  for (int64_t b = 0; b < n; ++b)
    for (int64_t j = 0; j < M; ++j) {
      const float Rv = b < Bn ? a.R[b * M + j] : a.ring_R[a.pick[b - Bn] * M + j];
      const float v = I[b * M + j] >= 0 ? Rv - base_f : 0.f;
      A[b * M + j] = v;
      a_sum += v;
    }
  if (a.normalize && n_slot > 1) {  // population std of the slots' advantages
    const double mu = a_sum / n1;
    double sq = 0;
    for (int64_t t = 0; t < n * M; ++t)
      if (I[t] >= 0) sq += (A[t] - mu) * (A[t] - mu);
    const float inv = static_cast<float>(1.0 / (std::sqrt(sq / n1) + 1e-6));
    for (int64_t t = 0; t < n * M; ++t) A[t] *= inv;
  }
  // ---- g = dL/ds, loss, U = sum_i g_i m_i, V = U + U Wm^T
  const float gscale = static_cast<float>(-1.0 / (static_cast<double>(n) * a.tau));
  std::vector<float> z(K);
  double loss = 0;
  std::fill(U.begin(), U.end(), 0.f);
  for (int64_t b = 0; b < n; ++b) {
    for (int64_t i = 0; i < K; ++i) z[i] = S[b * K + i] / a.tau;
    loss += score_grad_row(z.data(), K, I.data() + b * M, A.data() + b * M, M, a.plackett_luce, gscale,
                           G.data() + b * K, removed, work);
    for (int64_t i = 0; i < K; ++i) k.axpy(G[b * K + i], row(b, i), U.data() + b * d, d);
  }
  loss *= -1.0 / static_cast<double>(n);
  res.loss = loss;
  k.nt_add(U.data(), n, d, a.Wm, V.data(), &wm2);
  if (std::isnan(wq2)) wq2 = k.sum_sq(a.Wq, d * d);
  const double w_sq = wm_in_wq2 ? wq2 : wq2 + wm2;  // |(Wq, Wm)|^2 before the step
  const bool finite = std::isfinite(loss) && all_finite(U.data(), n * d) && all_finite(V.data(), n * d) &&
                      all_finite(Qp.data(), n * d) && all_finite(Q.data(), n * d);
  res.finite = finite;
  res.adapter_norm = std::numeric_limits<double>::quiet_NaN();
  if (a.apply && n <= kGramRows) {
    // ---- small n: the step in one pass per adapter, W <- f (W - lr coef G), G never stored. |G|^2 and
    // |W - a G|^2 come from [n, n] Gram matrices: |Q'^T U|^2 = sum_ab (q'_a.q'_b)(u_a.u_b),
    // <Wm, Q'^T U> = sum_a q'_a . (Wm u_a) = sum_a q'_a . (v_a - u_a), <Wq, V^T Q> = sum_a v_a . (q'_a - q_a)
    double gm2 = 0, gq2 = 0, wg_m = 0, wg_q = 0;
    if (finite) {
      for (int64_t x = 0; x < n; ++x) {
        for (int64_t y = x; y < n; ++y) {
          const double w = x == y ? 1.0 : 2.0;
          gm2 += w * k.dot(Qp.data() + x * d, Qp.data() + y * d, d) * k.dot(U.data() + x * d, U.data() + y * d, d);
          gq2 += w * k.dot(V.data() + x * d, V.data() + y * d, d) * k.dot(Q.data() + x * d, Q.data() + y * d, d);
        }
        for (int64_t t = 0; t < d; ++t) {
          wg_m += static_cast<double>(Qp[x * d + t]) * (V[x * d + t] - U[x * d + t]);
          wg_q += static_cast<double>(V[x * d + t]) * (Qp[x * d + t] - Q[x * d + t]);
        }
      }
    }
    gm2 = std::max(gm2, 0.0);
    gq2 = std::max(gq2, 0.0);
    const double gnorm = std::sqrt(gq2 + gm2);
    res.grad_norm = gnorm;
    const float stp = finite ? static_cast<float>(a.lr * clip_coef(a.clip, gnorm)) : 0.f;
    double factor = 1.0;
    if (a.scale) {
      const double al = stp;
      const double w2 = std::max(0.0, w_sq - 2.0 * al * (wg_m + wg_q) + al * al * (gm2 + gq2));
      factor = decay_factor(std::sqrt(w2), a.decay, a.max_norm, finite);
    }
    const float ff = static_cast<float>(factor);
    if (stp != 0.f || ff != 1.0f) {
      double s2 = 0;
      k.ax(Qp.data(), 1, d, d, U.data(), d, n, d, a.Wm, d, 2, -stp, ff, &s2, nullptr);
      k.ax(V.data(), 1, d, d, Q.data(), d, n, d, a.Wq, d, 2, -stp, ff, &s2, nullptr);
      if (a.scale) res.adapter_norm = std::sqrt(s2);
    } else if (a.scale) {
      res.adapter_norm = std::sqrt(w_sq);
    }
    res.grads_written = false;
  } else {
    // ---- dWm = Q'^T U, dWq = V^T Q into the gradient buffers (zero on a non-finite step)
    double sq_q = 0, sq_m = 0;
    if (finite) {
      k.ax(Qp.data(), 1, d, d, U.data(), d, n, d, a.gWm, d, 0, 1.f, 1.f, &sq_m, nullptr);
      k.ax(V.data(), 1, d, d, Q.data(), d, n, d, a.gWq, d, 0, 1.f, 1.f, &sq_q, nullptr);
    } else {
      std::memset(a.gWq, 0, sizeof(float) * d * d);
      std::memset(a.gWm, 0, sizeof(float) * d * d);
    }
    const double gnorm = std::sqrt(sq_q + sq_m);
    res.grad_norm = gnorm;
    if (a.apply) {  // plain SGD with clipping, then decay and the max-norm projection (one factor)
      const float stp = static_cast<float>(a.lr * clip_coef(a.clip, gnorm));
      double w2 = w_sq;
      if (finite) w2 = k.sub_scaled(a.Wq, a.gWq, stp, d * d) + k.sub_scaled(a.Wm, a.gWm, stp, d * d);
      if (a.scale) {
        const double nrm = std::sqrt(w2);
        const float ff = static_cast<float>(decay_factor(nrm, a.decay, a.max_norm, finite));
        if (ff != 1.0f) {
          k.scale(a.Wq, ff, d * d);
          k.scale(a.Wm, ff, d * d);
        }
        res.adapter_norm = nrm * ff;
      }
    }
  }
  // ---- guard counts of the selection's rows, ring write
  double n_pos = 0, n_valid = 0;
  for (int64_t t = 0; t < Bn * M; ++t)
    if (a.idx[t] >= 0) {
      n_valid += 1;
      if (a.R[t] > 0) n_pos += 1;
    }
  res.n_pos = n_pos;
  res.n_valid = n_valid;
  if (a.win) {
    a.win[0] += static_cast<float>(n_pos);
    a.win[1] += static_cast<float>(n_valid);
    a.win[2] += finite ? 0.f : 1.f;
  }
  if (a.write_ring) {
    for (int64_t b = 0; b < Bn; ++b) {
      const int64_t pos = (a.rpos + b) % a.cap;
      std::memcpy(a.ring_q + pos * d, a.q + b * d, sizeof(float) * d);
      for (int64_t i = 0; i < K; ++i) {
        std::memcpy(a.ring_C + (pos * K + i) * d, cand_row(a.c, b, i, K, d), sizeof(float) * d);
        a.ring_valid[pos * K + i] = valid[b * K + i];
      }
      std::memcpy(a.ring_idx + pos * M, a.idx + b * M, sizeof(int64_t) * M);
      std::memcpy(a.ring_R + pos * M, a.R + b * M, sizeof(float) * M);
      if (a.use_P) std::memcpy(a.ring_P + pos * K, P.data() + b * K, sizeof(float) * K);
    }
  }
  return res;
}

}  // namespace rerank
}  // namespace memkern
