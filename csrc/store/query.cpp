// The store's read paths: record lookups (get, get_batch, history, embeddings), the vector
// searches (search, and the turn+topic query search_turn_topic) and the namespace listings.
#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "memkern/errors.h"
#include "memkern/store.h"
#include "memkern/util.h"

namespace memkern {

RecordView Store::get(int64_t id) const {
  std::shared_lock<std::shared_mutex> lk(mu_);
  check_open();
  const Record& r = rec_or_throw(id, "id");
  RecordView v;
  v.rec = r;
  v.rec.history.clear();
  v.ns_name = ns_[r.ns]->name;
  v.embedding.resize(dim_);
  ns_[r.ns]->index[r.level]->vector(id, v.embedding.data());
  return v;
}

std::vector<RecordView> Store::get_batch(const std::vector<int64_t>& ids) const {
  std::shared_lock<std::shared_mutex> lk(mu_);
  check_open();
  for (int64_t id : ids) rec_or_throw(id, "ids");
  std::vector<RecordView> out(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const Record& r = records_.at(ids[i]);
    out[i].rec = r;
    out[i].rec.history.clear();
    out[i].ns_name = ns_[r.ns]->name;
    out[i].embedding.resize(dim_);
    ns_[r.ns]->index[r.level]->vector(ids[i], out[i].embedding.data());
  }
  return out;
}

std::vector<Version> Store::history(int64_t id) const {
  std::shared_lock<std::shared_mutex> lk(mu_);
  check_open();
  const Record& r = rec_or_throw(id, "id");
  std::vector<Version> out = r.history;
  out.push_back(current_version(r));
  return out;
}

void Store::embeddings(const int64_t* ids, size_t n, float* out) const {
  std::shared_lock<std::shared_mutex> lk(mu_);
  check_open();
  for (size_t i = 0; i < n; ++i) rec_or_throw(ids[i], "ids");
  for (size_t i = 0; i < n; ++i) {
    const Record& r = records_.at(ids[i]);
    ns_[r.ns]->index[r.level]->vector(ids[i], out + i * dim_);
  }
}

void Store::check_query(const float* q, size_t B, size_t k, size_t ef) const {
  // Every size is bounded before anything is allocated; B * k is checked without overflow.
  if (k > kMaxK) throw ValueError("k: expected 1.." + std::to_string(kMaxK) + ", got " + std::to_string(k));
  if (ef > kMaxEf) throw ValueError("ef: expected 1.." + std::to_string(kMaxEf) + ", got " + std::to_string(ef));
  if (k != 0 && B > kMaxResults / k)
    throw ValueError("k: expected B * k <= " + std::to_string(kMaxResults) + " result slots, got B=" +
                     std::to_string(B) + ", k=" + std::to_string(k));
  auto dist = space_->get_dist_func();
  void* param = space_->get_dist_func_param();
  for (size_t b = 0; b < B; ++b) {
    const float* qq = q + b * dim_;
    // Fast path: <q, q> with the SIMD kernel (ip distance is 1 - <a, b>); NaN, inf and a norm
    // above kMaxNorm all fail `n2 <= kMaxNorm^2` (1e36 is a finite float32).
    float n2 = metric_ == Metric::L2 ? dist(qq, zeros_.data(), param) : 1.0f - dist(qq, qq, param);
    if (n2 <= static_cast<float>(kMaxNorm * kMaxNorm)) continue;
    double s = 0;
    for (uint32_t j = 0; j < dim_; ++j) {
      if (!std::isfinite(qq[j])) throw ValueError("queries: expected finite values, got a NaN/inf in row " + std::to_string(b));
      s += static_cast<double>(qq[j]) * qq[j];
    }
    if (std::sqrt(s) > kMaxNorm)
      throw ValueError("queries: expected an L2 norm <= 1e18 (scores must stay finite in float32), got " +
                       num(std::sqrt(s)) + " in row " + std::to_string(b));
  }
}

namespace {

// A score that can be neither NaN nor inf (a guard for vectors stored before the norm bound).
inline float finite_score(float s) {
  if (std::isnan(s)) return kPadScore;
  return std::max(kPadScore, std::min(s, -kPadScore));
}

// Distance evaluations one query costs in `idx` (about): a flat index scans everything, a graph
// search visits a few times its beam width.
size_t query_cost(const VectorIndex& idx, size_t k, size_t ef) {
  size_t width = std::max(k, ef);
  return std::max<size_t>(1, std::min(idx.live(), width > (SIZE_MAX >> 5) ? SIZE_MAX : 16 * width));
}

// Below this many distance evaluations in one call, starting threads costs more than it saves.
constexpr size_t kParallelMinWork = 1u << 15;

// Runs body(b) for b in [0, B) on up to `threads` threads (the caller's included), when the
// call's work (B * cost_per_row distance evaluations) is worth it; results do not depend on it.
template <typename F>
void parallel_rows(size_t B, int threads, size_t cost_per_row, F body) {
  size_t T = std::min<size_t>(static_cast<size_t>(std::max(threads, 1)), B);
  if (cost_per_row == 0 || B < kParallelMinWork / cost_per_row + 1) T = 1;
  if (T <= 1) {
    for (size_t b = 0; b < B; ++b) body(b);
    return;
  }
  std::atomic<size_t> next{0};
  std::exception_ptr error;
  std::mutex error_mu;
  auto work = [&]() {
    for (size_t b = next++; b < B; b = next++) {
      try {
        body(b);
      } catch (...) {
        std::lock_guard<std::mutex> g(error_mu);
        if (!error) error = std::current_exception();
      }
    }
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < T; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace

SearchResult Store::search(const std::string& ns_name, const float* q, size_t B, size_t k, size_t ef,
                           bool include_invalidated, uint8_t level) const {
  std::shared_lock<std::shared_mutex> lk(mu_);
  check_open();
  if (level >= kNumLevels) throw ValueError("level: expected topic or turn");
  check_query(q, B, k, ef);
  SearchResult res;
  res.ids.assign(B * k, -1);
  res.scores.assign(B * k, kPadScore);
  const Namespace* ns = find_ns(ns_name);
  if (!ns || !ns->index[level] || k == 0) return res;
  const VectorIndex& idx = *ns->index[level];
  ExcludeFilter filter(&ns->invalidated[level]);
  hnswlib::BaseFilterFunctor* f = (!include_invalidated && !ns->invalidated[level].empty()) ? &filter : nullptr;
  parallel_rows(B, threads_, query_cost(idx, k, ef), [&](size_t b) {
    std::vector<float> qv;
    const float* qq = q + b * dim_;
    if (metric_ == Metric::Cos) {
      qv.resize(dim_);
      prepare_vector(qq, qv.data());
      qq = qv.data();
    }
    auto hits = idx.knn(qq, k, ef, f);
    for (size_t j = 0; j < hits.size(); ++j) {
      res.ids[b * k + j] = hits[j].second;
      res.scores[b * k + j] = finite_score(space_->score(hits[j].first));
    }
  });
  return res;
}

SearchResult Store::search_turn_topic(const std::string& ns_name, const float* q, size_t B, size_t k, size_t ef,
                                      bool include_invalidated, float alpha, size_t candidates) const {
  std::shared_lock<std::shared_mutex> lk(mu_);
  check_open();
  check_query(q, B, k, ef);
  if (candidates > kMaxCandidates)
    throw ValueError("candidates: expected 1.." + std::to_string(kMaxCandidates) + ", got " + std::to_string(candidates));
  if (!std::isfinite(alpha) || std::fabs(alpha) > kMaxAlpha)
    throw ValueError("alpha: expected a finite float in [-100, 100], got " + num(alpha));
  SearchResult res;
  res.ids.assign(B * k, -1);
  res.scores.assign(B * k, kPadScore);
  const Namespace* ns = find_ns(ns_name);
  if (!ns || !ns->index[kTurn] || !ns->index[kTopic] || k == 0) return res;
  const VectorIndex& turns = *ns->index[kTurn];
  const VectorIndex& topics = *ns->index[kTopic];
  ExcludeFilter ft(&ns->invalidated[kTurn]), fp(&ns->invalidated[kTopic]);
  hnswlib::BaseFilterFunctor* f_turn = (!include_invalidated && !ns->invalidated[kTurn].empty()) ? &ft : nullptr;
  hnswlib::BaseFilterFunctor* f_topic = (!include_invalidated && !ns->invalidated[kTopic].empty()) ? &fp : nullptr;
  auto dist = space_->get_dist_func();
  void* param = space_->get_dist_func_param();
  size_t C = std::max(candidates, k);
  size_t cost = query_cost(turns, C, ef) + query_cost(topics, C, ef);
  parallel_rows(B, threads_, cost, [&](size_t b) {
    std::vector<float> qv(dim_), tv(dim_);
    const float* qq = q + b * dim_;
    if (metric_ == Metric::Cos) {
      prepare_vector(qq, qv.data());
      qq = qv.data();
    }
    std::unordered_map<int64_t, float> topic_sim;  // topic id -> sim(q, topic)
    for (auto& h : topics.knn(qq, C, ef, f_topic)) topic_sim[h.second] = space_->score(h.first);
    std::unordered_map<int64_t, float> turn_sim;  // turn id -> sim(q, turn)
    for (auto& h : turns.knn(qq, C, ef, f_turn)) turn_sim[h.second] = space_->score(h.first);
    for (auto& kv : topic_sim) {
      const Record& t = records_.at(kv.first);
      for (int64_t c : t.children) {
        if (turn_sim.count(c)) continue;
        const Record& cr = records_.at(c);
        if (!include_invalidated && cr.status == Status::Invalidated) continue;
        turns.vector(c, tv.data());
        turn_sim[c] = space_->score(dist(qq, tv.data(), param));
      }
    }
    std::vector<std::pair<float, int64_t>> scored;
    scored.reserve(turn_sim.size());
    for (auto& kv : turn_sim) {
      int64_t parent = records_.at(kv.first).parent;
      float ps;
      auto it = topic_sim.find(parent);
      if (it != topic_sim.end()) {
        ps = it->second;
      } else {
        topics.vector(parent, tv.data());
        ps = space_->score(dist(qq, tv.data(), param));
      }
      scored.emplace_back(finite_score(kv.second + alpha * ps), kv.first);
    }
    size_t m = std::min(k, scored.size());
    std::partial_sort(scored.begin(), scored.begin() + m, scored.end(),
                      [](const auto& a, const auto& b2) { return a.first > b2.first || (a.first == b2.first && a.second < b2.second); });
    for (size_t j = 0; j < m; ++j) {
      res.ids[b * k + j] = scored[j].second;
      res.scores[b * k + j] = scored[j].first;
    }
  });
  return res;
}

std::vector<std::string> Store::namespaces() const {
  std::shared_lock<std::shared_mutex> lk(mu_);
  check_open();
  std::vector<std::string> out;
  for (const auto& ns : ns_)
    if (ns->n[kTopic] + ns->n[kTurn] > 0) out.push_back(ns->name);
  std::sort(out.begin(), out.end());
  return out;
}

size_t Store::count(const std::string& name, bool include_invalidated, uint8_t level) const {
  std::shared_lock<std::shared_mutex> lk(mu_);
  check_open();
  if (level >= kNumLevels) throw ValueError("level: expected topic or turn");
  const Namespace* ns = find_ns(name);
  if (!ns) return 0;
  return include_invalidated ? ns->n[level] : ns->n[level] - ns->invalidated[level].size();
}

std::vector<int64_t> Store::ids(const std::string& name, bool include_invalidated, uint8_t level) const {
  std::shared_lock<std::shared_mutex> lk(mu_);
  check_open();
  if (level >= kNumLevels) throw ValueError("level: expected topic or turn");
  std::vector<int64_t> out;
  auto it = ns_by_name_.find(name);
  if (it == ns_by_name_.end()) return out;
  for (const auto& kv : records_) {
    const Record& r = kv.second;
    if (r.ns == it->second && r.level == level && (include_invalidated || r.status == Status::Active))
      out.push_back(kv.first);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace memkern
