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
#include "memkern/fusion.h"
#include "memkern/parallel.h"
#include "memkern/store.h"
#include "memkern/util.h"

namespace memkern {

namespace {
// One record's current version (the caller holds mu_ shared).
template <class S>
void fill_view(const S& s, const Record& r, int64_t id, size_t dim, RecordView& v) {
  v.rec = r;
  v.rec.history.clear();
  v.ns_name = s[r.ns]->name;
  v.embedding.resize(dim);
  s[r.ns]->index[r.level]->vector(id, v.embedding.data());
}
}  // namespace

RecordView Store::get(int64_t id) const {
  std::shared_lock<std::shared_mutex> lk(mu_);
  check_open();
  RecordView v;
  fill_view(ns_, rec_or_throw(id, "id"), id, dim_, v);
  return v;
}

bool Store::try_get(int64_t id, RecordView& out) const {
  std::shared_lock<std::shared_mutex> lk(mu_, std::try_to_lock);
  if (!lk.owns_lock()) return false;
  check_open();
  fill_view(ns_, rec_or_throw(id, "id"), id, dim_, out);
  return true;
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

void Store::check_result_size(size_t B, size_t k, size_t ef) {
  // Every size is bounded before anything is allocated; B * k is checked without overflow.
  if (k > kMaxK) throw ValueError("k: expected 1.." + std::to_string(kMaxK) + ", got " + std::to_string(k));
  if (ef > kMaxEf) throw ValueError("ef: expected 1.." + std::to_string(kMaxEf) + ", got " + std::to_string(ef));
  if (k != 0 && B > kMaxResults / k)
    throw ValueError("k: expected B * k <= " + std::to_string(kMaxResults) + " result slots, got B=" +
                     std::to_string(B) + ", k=" + std::to_string(k));
}

void Store::check_query(const float* q, size_t B, size_t k, size_t ef) const {
  check_result_size(B, k, ef);
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
    if (!norm_within_bound(s))
      throw ValueError("queries: expected an L2 norm <= 1e18 (scores must stay finite in float32), got " +
                       num(std::sqrt(s)) + " in row " + std::to_string(b));
  }
}

const float* Store::query_row(const float* q, size_t b, std::vector<float>& buf) const {
  const float* row = q + b * dim_;
  if (metric_ != Metric::Cos) return row;
  buf.resize(dim_);
  prepare_vector(row, buf.data());
  return buf.data();
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

}  // namespace

SearchResult Store::search(const std::string& ns_name, const float* q, size_t B, size_t k, size_t ef,
                           bool include_invalidated, uint8_t level) const {
  check_result_size(B, k, ef);
  SearchResult res;
  res.ids.resize(B * k);
  res.scores.resize(B * k);
  search_into(ns_name, q, B, k, ef, include_invalidated, level, res.ids.data(), res.scores.data());
  return res;
}

void Store::search_into(const std::string& ns_name, const float* q, size_t B, size_t k, size_t ef,
                        bool include_invalidated, uint8_t level, int64_t* ids, float* scores) const {
  std::shared_lock<std::shared_mutex> lk(mu_);
  search_locked(ns_name, q, B, k, ef, include_invalidated, level, ids, scores);
}

bool Store::try_search_into(const std::string& ns_name, const float* q, size_t B, size_t k, size_t ef,
                            bool include_invalidated, uint8_t level, int64_t* ids, float* scores) const {
  std::shared_lock<std::shared_mutex> lk(mu_, std::try_to_lock);
  if (!lk.owns_lock()) return false;
  search_locked(ns_name, q, B, k, ef, include_invalidated, level, ids, scores);
  return true;
}

void Store::search_locked(const std::string& ns_name, const float* q, size_t B, size_t k, size_t ef,
                          bool include_invalidated, uint8_t level, int64_t* ids, float* scores) const {
  check_open();
  if (level >= kNumLevels) throw ValueError("level: expected topic or turn");
  check_query(q, B, k, ef);
  std::fill(ids, ids + B * k, int64_t{-1});
  std::fill(scores, scores + B * k, kPadScore);
  const Namespace* ns = find_ns(ns_name);
  if (!ns || !ns->index[level] || k == 0) return;
  const VectorIndex& idx = *ns->index[level];
  ExcludeFilter filter(&ns->invalidated[level]);
  hnswlib::BaseFilterFunctor* f = (!include_invalidated && !ns->invalidated[level].empty()) ? &filter : nullptr;
  parallel_rows(B, threads_, query_cost(idx, k, ef), [&](size_t b) {
    std::vector<float> qv;
    const float* qq = query_row(q, b, qv);
    auto hits = idx.knn(qq, k, ef, f);
    for (size_t j = 0; j < hits.size(); ++j) {
      ids[b * k + j] = hits[j].second;
      scores[b * k + j] = finite_score(space_->score(hits[j].first));
    }
  });
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
    std::vector<float> qv, tv(dim_);
    const float* qq = query_row(q, b, qv);
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


namespace {

inline float finite_score_d(double s) {
  if (std::isnan(s)) return kPadScore;
  return static_cast<float>(std::max<double>(kPadScore, std::min<double>(s, -kPadScore)));
}

inline double time_of(const Record& r, TimeField f) { return record_time(r, f); }

using Scored = std::pair<double, int64_t>;

inline bool better(const Scored& a, const Scored& b) {
  return a.first > b.first || (a.first == b.first && a.second < b.second);
}

}  // namespace

SearchResult Store::search_ex(const std::string& ns_name, const float* q, const std::vector<std::string>& texts,
                              size_t B, size_t k, size_t ef, bool include_invalidated, uint8_t level,
                              const SearchSpec& spec) const {
  std::shared_lock<std::shared_mutex> lk(mu_);
  check_open();
  if (level >= kNumLevels) throw ValueError("level: expected topic or turn");
  ensure_derived();
  if (spec.mode > 2) throw ValueError("mode: expected dense, lexical or hybrid");
  if (spec.fusion > 2) throw ValueError("fusion: expected rrf, weighted or coverage");
  check_query(q, B, k, ef);
  if (spec.candidates > kMaxCandidates)
    throw ValueError("candidates: expected 1.." + std::to_string(kMaxCandidates) + ", got " +
                     std::to_string(spec.candidates));
  if (!(spec.lexical_weight >= 0.0 && spec.lexical_weight <= 1.0))
    throw ValueError("lexical_weight: expected a real in [0, 1]");
  if (!(spec.half_life >= 0.0 && spec.half_life <= kMaxTime)) throw ValueError("recency: expected a half-life in (0, 253402300799]");
  if (!std::isfinite(spec.recency_weight) || !std::isfinite(spec.now))
    throw ValueError("recency_weight: expected a finite real");
  const SearchFilter& flt = spec.filter;
  if (flt.clauses.size() > kMaxFilterKeys)
    throw ValueError("filter: expected at most " + std::to_string(kMaxFilterKeys) + " keys");
  size_t n_values = 0;
  for (const auto& c : flt.clauses) n_values += c.values.size();
  if (n_values > kMaxFilterValues) throw ValueError("filter: expected at most " + std::to_string(kMaxFilterValues) + " values");
  if (flt.has_time && (std::isnan(flt.t_lo) || std::isnan(flt.t_hi) || flt.t_lo > flt.t_hi))
    throw ValueError("time_range: expected start <= end");
  std::vector<std::vector<std::string>> qterms;
  if (spec.mode != 0) qterms = lexical::tokenize_queries(texts, B, kMaxQueryTextBytes);
  SearchResult res;
  res.ids.assign(B * k, -1);
  res.scores.assign(B * k, kPadScore);
  const Namespace* ns = find_ns(ns_name);
  if (!ns || k == 0) return res;
  const VectorIndex* idx = ns->index[level].get();
  const lexical::LexicalIndex& lex = ns->lex[level];
  const std::unordered_set<int64_t>& inval = ns->invalidated[level];
  const bool check_inval = !include_invalidated && !inval.empty();
  const bool has_meta = !flt.clauses.empty();
  auto allow = [&](int64_t id) -> bool {
    if (check_inval && inval.count(id)) return false;
    if (flt.empty()) return true;
    const Record& r = records_.at(id);
    if (flt.has_time && !flt.time_ok(time_of(r, flt.time_field))) return false;
    return !has_meta || meta_matches(r, flt);
  };
  PredicateFunctor<decltype(allow)> functor(&allow);
  hnswlib::BaseFilterFunctor* f = (check_inval || !flt.empty()) ? &functor : nullptr;
  // Bitmap over [bits_lo, bits_hi] (ids of a store need not start at 0 nor be dense: a shard's
  // range, imported records); a hash set when that span is too sparse for a bitmap.
  std::vector<uint64_t> allowed_bits;
  int64_t bits_lo = 0, bits_hi = -1;
  std::unordered_set<int64_t> allowed_set;
  auto allowed_bit = [&](int64_t id) -> bool {
    return id >= bits_lo && id <= bits_hi && ((allowed_bits[static_cast<size_t>(id - bits_lo) >> 6] >> ((id - bits_lo) & 63)) & 1);
  };
  PredicateFunctor<decltype(allowed_bit)> bit_functor(&allowed_bit);
  auto allowed_in_set = [&](int64_t id) -> bool { return allowed_set.count(id) > 0; };
  PredicateFunctor<decltype(allowed_in_set)> set_functor(&allowed_in_set);
  const bool rescore = spec.half_life > 0;
  const size_t depth = (spec.mode == 2 || rescore) ? std::max(k, spec.candidates) : k;
  const bool dense = spec.mode != 1 && idx != nullptr;

  // A selective filter: enumerate its matches (from the meta index, or the time index for a time
  // range) and scan them exactly, when that costs less than a graph search that must walk past the
  // non-matching points: |matches|^2 < max(depth, ef) * M * live (the functor search visits about
  // max(depth, ef) * M * live / |matches| points).
  std::vector<int64_t> scan;
  bool use_scan = false;
  if (dense && (has_meta || flt.has_time) && derived_indexes()) {
    double width = static_cast<double>(std::max(depth, ef));
    double live = static_cast<double>(std::max<size_t>(idx->live(), 1));
    size_t limit = static_cast<size_t>(std::sqrt(width * M_ * live));
    const FilterClause* best = nullptr;
    size_t best_n = SIZE_MAX;
    for (const auto& c : flt.clauses) {
      size_t n = ns->meta[level].count(c);
      if (level == kTurn) {  // turns also match through their topic's meta
        for (const auto& v : c.values)
          if (auto* s = ns->meta[kTopic].find(c.key, v))
            for (int64_t t : *s) n += records_.at(t).children.size();
      }
      if (n < best_n) best_n = n, best = &c;
    }
    size_t time_n = SIZE_MAX;
    if (flt.has_time) {
      time_n = ns->times[level].count(flt.time_field, flt.t_lo, flt.t_hi, best_n == SIZE_MAX ? SIZE_MAX : best_n + 1);
    }
    // The matches of the most selective enumerable part (time range or one meta clause); the
    // full predicate is checked on each.
    if (time_n <= best_n) {
      scan = ns->times[level].ids(flt.time_field, flt.t_lo, flt.t_hi);
    } else {
      scan.reserve(best_n);
      for (const auto& v : best->values) {
        if (auto* s = ns->meta[level].find(best->key, v)) scan.insert(scan.end(), s->begin(), s->end());
        if (level == kTurn)
          if (auto* s = ns->meta[kTopic].find(best->key, v))
            for (int64_t t : *s) {
              const auto& ch = records_.at(t).children;
              scan.insert(scan.end(), ch.begin(), ch.end());
            }
      }
    }
    if (std::min(time_n, best_n) <= limit) {
      use_scan = true;
      std::sort(scan.begin(), scan.end());
      scan.erase(std::unique(scan.begin(), scan.end()), scan.end());
      scan.erase(std::remove_if(scan.begin(), scan.end(), [&](int64_t id) { return !allow(id); }), scan.end());
    } else {
      // Many matches: the graph search with a bitmap of the allowed ids as its filter functor
      // (built once per call; the per-visit check is then one bit, not a record lookup).
      scan.erase(std::remove_if(scan.begin(), scan.end(), [&](int64_t id) { return id < 0 || !allow(id); }), scan.end());
      if (scan.empty()) {
        // Every match of that part fails another clause (or is invalidated): no record at this
        // level passes, so the exact scan of nothing answers (padding; the lexical list is empty
        // too, its candidates pass the same predicate).
        use_scan = true;
      } else {
        auto mm = std::minmax_element(scan.begin(), scan.end());
        bits_lo = *mm.first;
        bits_hi = *mm.second;
        uint64_t words = static_cast<uint64_t>(bits_hi - bits_lo) / 64 + 1;  // span of the matches, >= 1
        if (words <= 8 * scan.size() + 1024) {
          allowed_bits.assign(static_cast<size_t>(words), 0);
          for (int64_t id : scan) allowed_bits[static_cast<size_t>(id - bits_lo) >> 6] |= uint64_t(1) << ((id - bits_lo) & 63);
          f = &bit_functor;
        } else {
          allowed_set.insert(scan.begin(), scan.end());
          f = &set_functor;
        }
        scan.clear();
      }
    }
  }
  auto dist = space_->get_dist_func();
  void* param = space_->get_dist_func_param();
  size_t cost = use_scan ? std::max<size_t>(scan.size(), 1)
                         : (dense ? std::max<size_t>(1, std::min(idx->live(), 16 * std::max(depth, ef))) : 64);
  const double w = spec.lexical_weight;
  parallel_rows(B, threads_, cost, [&](size_t b) {
    std::vector<Scored> dl;  // dense list, best first
    if (dense) {
      std::vector<float> qv;
      const float* qq = query_row(q, b, qv);
      if (use_scan) {
        std::vector<float> v(dim_);
        dl.reserve(scan.size());
        for (int64_t id : scan) {
          idx->vector(id, v.data());
          dl.emplace_back(space_->score(dist(qq, v.data(), param)), id);
        }
        size_t m = std::min(depth, dl.size());
        std::partial_sort(dl.begin(), dl.begin() + m, dl.end(), better);
        dl.resize(m);
      } else {
        for (auto& h : idx->knn(qq, depth, ef, f)) dl.emplace_back(space_->score(h.first), h.second);
        std::stable_sort(dl.begin(), dl.end(), better);
      }
    }
    std::vector<Scored> ll;  // lexical list, best first
    if (spec.mode == 2 && spec.fusion == fusion::kFusionCoverage)
      ll = lex.coverage(qterms[b], depth, allow);
    else if (spec.mode != 0)
      ll = lex.search(qterms[b], depth, allow);
    std::vector<Scored> out;
    if (spec.mode == 0) {
      out = std::move(dl);
    } else if (spec.mode == 1) {
      out = std::move(ll);
    } else {
      out = fusion::fuse(dl, ll, spec.fusion, w);  // memkern/fusion.h
    }
    if (rescore) {
      for (auto& e : out) {
        double age = std::max(0.0, spec.now - time_of(records_.at(e.second), flt.time_field));
        e.first += spec.recency_weight * std::exp2(-age / spec.half_life);
      }
    }
    size_t m = std::min(k, out.size());
    std::partial_sort(out.begin(), out.begin() + m, out.end(), better);
    for (size_t j = 0; j < m; ++j) {
      res.ids[b * k + j] = out[j].second;
      res.scores[b * k + j] = finite_score_d(out[j].first);
    }
  });
  return res;
}

}  // namespace memkern
