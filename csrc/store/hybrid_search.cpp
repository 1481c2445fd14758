// Store::search_ex (lexical / hybrid search, metadata filters, time ranges, recency prior) and the
// derived per-record state it reads: the BM25 index and the filterable meta of each
// (namespace, level), maintained by apply() on every write and rebuilt from the records on open.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <mutex>
#include <thread>

#include "memkern/errors.h"
#include "memkern/store.h"

namespace memkern {

namespace {

std::atomic<bool> g_derived{true};

inline float finite_score_d(double s) {
  if (std::isnan(s)) return kPadScore;
  return static_cast<float>(std::max<double>(kPadScore, std::min<double>(s, -kPadScore)));
}

// Runs body(b) for b in [0, B) on up to `threads` threads when the work is worth it.
template <typename F>
void parallel_queries(size_t B, int threads, size_t cost_per_row, F body) {
  constexpr size_t kMinWork = 1u << 15;
  size_t T = std::min<size_t>(static_cast<size_t>(std::max(threads, 1)), B);
  if (cost_per_row == 0 || B < kMinWork / cost_per_row + 1) T = 1;
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

inline double time_of(const Record& r, TimeField f) {
  switch (f) {
    case TimeField::Created: return r.created_at;
    case TimeField::Updated: return r.updated_at;
    case TimeField::Event: break;
  }
  return std::isnan(r.event_time) ? r.created_at : r.event_time;
}

using Scored = std::pair<double, int64_t>;

inline bool better(const Scored& a, const Scored& b) {
  return a.first > b.first || (a.first == b.first && a.second < b.second);
}

}  // namespace

void set_derived_indexes(bool on) { g_derived = on; }
bool derived_indexes() { return g_derived; }

void Store::index_derived(const Record& r) {
  if (!g_derived) return;
  Namespace& ns = *ns_[r.ns];
  ns.lex[r.level].put(r.id, r.summary);
  MetaScalars m = parse_meta_scalars(r.meta_json);
  if (m.empty()) {
    meta_scalars_.erase(r.id);
    return;
  }
  ns.meta[r.level].put(r.id, m);
  meta_scalars_[r.id] = std::move(m);
}

void Store::unindex_derived(const Record& r) {
  Namespace& ns = *ns_[r.ns];
  ns.lex[r.level].remove(r.id);
  auto it = meta_scalars_.find(r.id);
  if (it == meta_scalars_.end()) return;
  ns.meta[r.level].remove(r.id, it->second);
  meta_scalars_.erase(it);
}

// Every clause holds on the record's own meta, or (turn records) on its topic's where its own
// meta lacks the key.
bool Store::meta_matches(const Record& r, const SearchFilter& f) const {
  static const MetaScalars kEmpty;
  auto own_it = meta_scalars_.find(r.id);
  const MetaScalars& own = own_it == meta_scalars_.end() ? kEmpty : own_it->second;
  const MetaScalars* parent = nullptr;
  if (r.level == kTurn) {
    auto p = meta_scalars_.find(r.parent);
    if (p != meta_scalars_.end()) parent = &p->second;
  }
  auto lookup = [](const MetaScalars& m, const std::string& key) -> const std::string* {
    auto it = std::lower_bound(m.begin(), m.end(), key,
                               [](const std::pair<std::string, std::string>& kv, const std::string& k) {
                                 return kv.first < k;
                               });
    return (it != m.end() && it->first == key) ? &it->second : nullptr;
  };
  for (const auto& c : f.clauses) {
    const std::string* v = lookup(own, c.key);
    if (!v && parent) v = lookup(*parent, c.key);
    if (!v || !std::binary_search(c.values.begin(), c.values.end(), *v)) return false;
  }
  return true;
}

SearchResult Store::search_ex(const std::string& ns_name, const float* q, const std::vector<std::string>& texts,
                              size_t B, size_t k, size_t ef, bool include_invalidated, uint8_t level,
                              const SearchSpec& spec) const {
  std::shared_lock<std::shared_mutex> lk(mu_);
  check_open();
  if (level >= kNumLevels) throw ValueError("level: expected topic or turn");
  if (spec.mode > 2) throw ValueError("mode: expected dense, lexical or hybrid");
  if (spec.fusion > 1) throw ValueError("fusion: expected rrf or weighted");
  check_query(q, B, k, ef);
  if (spec.candidates > kMaxCandidates)
    throw ValueError("candidates: expected 1.." + std::to_string(kMaxCandidates) + ", got " +
                     std::to_string(spec.candidates));
  if (!(spec.lexical_weight >= 0.0 && spec.lexical_weight <= 1.0))
    throw ValueError("lexical_weight: expected a real in [0, 1]");
  if (!(spec.half_life >= 0.0 && spec.half_life <= kMaxTime)) throw ValueError("recency: expected a half-life in (0, 1e12]");
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
  if (spec.mode != 0) {
    if (texts.size() != B)
      throw ValueError("texts: expected " + std::to_string(B) + " texts (one per query), got " + std::to_string(texts.size()));
    qterms.resize(B);
    for (size_t b = 0; b < B; ++b) {
      if (texts[b].size() > kMaxQueryTextBytes)
        throw ValueError("texts[" + std::to_string(b) + "]: expected at most " + std::to_string(kMaxQueryTextBytes) +
                         " bytes, got " + std::to_string(texts[b].size()));
      std::string what = "texts[" + std::to_string(b) + "]";
      qterms[b] = lexical::tokenize(texts[b], what.c_str());
    }
  }
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
  const bool rescore = spec.half_life > 0;
  const size_t depth = (spec.mode == 2 || rescore) ? std::max(k, spec.candidates) : k;
  const bool dense = spec.mode != 1 && idx != nullptr;

  // A selective meta filter: enumerate its matches (from the meta index) and scan them exactly,
  // when that costs less than a graph search that must walk past the non-matching points.
  std::vector<int64_t> scan;
  bool use_scan = false;
  if (dense && has_meta && g_derived) {
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
    double width = static_cast<double>(std::max(depth, ef));
    double live = static_cast<double>(std::max<size_t>(idx->live(), 1));
    if (best && static_cast<double>(best_n) * best_n < width * M_ * live) {
      use_scan = true;
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
      std::sort(scan.begin(), scan.end());
      scan.erase(std::unique(scan.begin(), scan.end()), scan.end());
      scan.erase(std::remove_if(scan.begin(), scan.end(), [&](int64_t id) { return !allow(id); }), scan.end());
    }
  }
  auto dist = space_->get_dist_func();
  void* param = space_->get_dist_func_param();
  size_t cost = use_scan ? std::max<size_t>(scan.size(), 1)
                         : (dense ? std::max<size_t>(1, std::min(idx->live(), 16 * std::max(depth, ef))) : 64);
  const double w = spec.lexical_weight;
  parallel_queries(B, threads_, cost, [&](size_t b) {
    std::vector<Scored> dl;  // dense list, best first
    if (dense) {
      std::vector<float> qv;
      const float* qq = q + b * dim_;
      if (metric_ == Metric::Cos) {
        qv.resize(dim_);
        prepare_vector(qq, qv.data());
        qq = qv.data();
      }
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
    if (spec.mode != 0) ll = lex.search(qterms[b], depth, allow);
    std::vector<Scored> out;
    if (spec.mode == 0) {
      out = std::move(dl);
    } else if (spec.mode == 1) {
      out = std::move(ll);
    } else {
      std::unordered_map<int64_t, double> fused;
      auto add_list = [&](const std::vector<Scored>& L, double weight) {
        if (L.empty()) return;
        if (spec.fusion == 0) {
          for (size_t r = 0; r < L.size(); ++r) fused[L[r].second] += weight / (60.0 + static_cast<double>(r + 1));
        } else {
          double lo = L[0].first, hi = L[0].first;
          for (const auto& e : L) lo = std::min(lo, e.first), hi = std::max(hi, e.first);
          for (const auto& e : L) fused[e.second] += weight * (hi == lo ? 1.0 : (e.first - lo) / (hi - lo));
        }
      };
      add_list(dl, 1.0 - w);
      add_list(ll, w);
      out.reserve(fused.size());
      for (const auto& kv : fused) out.emplace_back(kv.second, kv.first);
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
