// The reranker's fused CPU path (memkern.score.ops.native): residual-adapter scores, Gumbel-top-M
// selection with its log-probabilities, and the stable trainer's REINFORCE step (closed-form
// gradient, advantages, clip, SGD, decay, max-norm projection, replay ring write), in float32 on
// raw row-major buffers. The math is that of memkern.score.ops.functional and memkern.score.trainer.
//   q' = q + Wq q,  r = q' + Wm^T q',  s_i = m_i . r
#pragma once
#include <cstdint>

namespace memkern {
namespace rerank {

// Candidate embeddings of B rows of K: dense [B, K, d], or rows of table [N, d] named by ids
// [B, K] (id < 0 = padding; a padding slot reads row 0, as torch's gather of ids.clamp_min(0)).
struct Cands {
  const float* dense = nullptr;
  const float* table = nullptr;
  const int64_t* ids = nullptr;
  int64_t n_table = 0;
  const uint8_t* mask = nullptr;  // [B, K] bool, 0 = padding; null = all valid
};

struct SelectArgs {
  int64_t B = 0, K = 0, d = 0, m = 0;
  const float* q = nullptr;   // [B, d]
  const float* Wq = nullptr;  // [d, d]
  const float* Wm = nullptr;  // [d, d]
  Cands c;
  const float* prior = nullptr;  // [B, K] or null: draw from prior + m . (r - q)
  float tau = 0.5f;
  uint64_t seed = 0;
  uint64_t offset = 0;  // Philox counter of row b, candidate i: offset + b * K + i
  bool greedy = false;
  bool plackett_luce = false;
  float* qp = nullptr;      // out [B, d]
  float* scores = nullptr;  // out [B, K] adapter scores (-inf = padding)
  float* drawn = nullptr;   // out [B, K] scores drawn from (only read when prior is set)
  int64_t* idx = nullptr;   // out [B, m] (-1 = no item)
  float* logp = nullptr;    // out [B, m]
  double* w_sq = nullptr;   // out |Wq|^2 + |Wm|^2 (read on the way), when set
};

// Ids out of [-1, N) throw memkern::ValueError.
void select(const SelectArgs& a);

struct StepArgs {
  int64_t d = 0, K = 0, M = 0;
  float* Wq = nullptr;  // [d, d], updated in place when apply
  float* Wm = nullptr;
  // the selection's rows
  int64_t Bn = 0;
  const float* q = nullptr;  // [Bn, d]
  Cands c;
  const int64_t* idx = nullptr;        // [Bn, M]
  const float* R = nullptr;            // [Bn, M]
  const float* prior = nullptr;        // [Bn, K] or null
  const float* qp_cached = nullptr;    // [Bn, d] q' at these adapters (from select) or null
  const float* s_cached = nullptr;     // [Bn, K] adapter scores at these adapters or null
  double w_sq_cached = -1;             // select's |Wq|^2 + |Wm|^2 at these adapters (< 0: unknown)
  // replay rows: ring rows pick[0..Br), or (replay_size > 0) drawn here as the trainer's _draw does
  int64_t Br = 0;
  const int64_t* pick = nullptr;
  int64_t replay_size = 0, replay_len = 0;
  uint64_t replay_seed = 0, replay_draws = 0;
  int64_t cap = 0;
  float* ring_q = nullptr;        // [cap, d]
  float* ring_C = nullptr;        // [cap, K, d]
  uint8_t* ring_valid = nullptr;  // [cap, K]
  int64_t* ring_idx = nullptr;    // [cap, M]
  float* ring_R = nullptr;        // [cap, M]
  float* ring_P = nullptr;        // [cap, K]
  bool use_P = false;             // policy scores = adapter scores + prior offsets (new and ring rows)
  bool write_ring = false;        // write the selection's rows at (rpos + i) % cap afterwards
  int64_t rpos = 0;
  // advantages
  int baseline_mode = 0;  // 0: fixed `baseline`; 1: batch mean; 2: running mean in *running
  float baseline = 0.f;
  float* running = nullptr;
  bool running_first = false;  // *running is set to the batch mean (first update)
  float momentum = 0.99f;
  bool normalize = false;
  float tau = 0.5f;
  bool plackett_luce = false;
  // the gradient and the step
  float* gWq = nullptr;  // out [d, d] gradient (zero on a non-finite step)
  float* gWm = nullptr;
  bool apply = false;    // plain SGD: W -= lr * min(1, clip / |g|) * g, then W *= factor
  float clip = 0.f;      // <= 0: no clipping
  float lr = 0.f;
  float decay = 1.f;     // f = 1 - lr * weight_decay (in [0, 1])
  float max_norm = 0.f;  // <= 0: no projection
  bool scale = false;    // a decay or a projection follows the step
  float* win = nullptr;  // [3] guard window sums (positives, slots, non-finite steps) or null
};

struct StepResult {
  double loss = 0, grad_norm = 0, adapter_norm = 0, baseline = 0, n_pos = 0, n_valid = 0;
  bool finite = true;
  bool grads_written = true;  // gWq / gWm hold the gradient (false: the one-pass update did not store it)
};

StepResult step(const StepArgs& a);

// Philox4x32-10 uniform in [0, 1) at counter `offset` under `seed` (triton.language.rand's bits).
float philox_uniform(uint64_t seed, uint64_t offset);

// The instruction set the kernels run with ("avx512", "avx2+fma" or "scalar"; MEMKERN_SIMD caps it).
const char* kernel_name();

}  // namespace rerank
}  // namespace memkern
