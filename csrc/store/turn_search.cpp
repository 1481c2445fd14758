// Two-level search with a hybrid first stage and context terms (Store::search_turn_topic_ex; the
// scoring is specified beside TurnSearchSpec in store.h). One call per batch of queries: the
// first-stage lists (dense index search and BM25, filtered inside the search), their fusion
// (fusion.h), the neighbour / group terms and the topic term are all computed here.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "memkern/errors.h"
#include "memkern/fusion.h"
#include "memkern/parallel.h"
#include "memkern/store.h"
#include "memkern/util.h"

namespace memkern {

namespace {

using Scored = std::pair<double, int64_t>;

inline bool better(const Scored& a, const Scored& b) {
  return a.first > b.first || (a.first == b.first && a.second < b.second);
}

inline float finite_f32(double s) {
  if (std::isnan(s)) return kPadScore;
  return static_cast<float>(std::max<double>(kPadScore, std::min<double>(s, -kPadScore)));
}

std::string fmt(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.6g", v);
  return b;
}

void check_weight(const char* name, double v) {
  if (!std::isfinite(v) || std::fabs(v) > kMaxAlpha)
    throw ValueError(std::string(name) + ": expected a finite float in [-100, 100], got " + fmt(v));
}

// The checks search_ex makes of its spec, for the first stage of the turn search.
void check_first_stage(const SearchSpec& spec) {
  if (spec.mode > 2) throw ValueError("mode: expected dense, lexical or hybrid");
  if (spec.fusion > 2) throw ValueError("fusion: expected rrf, weighted or coverage");
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
}

const std::string* meta_value(const MetaScalars& m, const std::string& key) {
  auto it = std::lower_bound(m.begin(), m.end(), key,
                             [](const std::pair<std::string, std::string>& kv, const std::string& k) { return kv.first < k; });
  return (it != m.end() && it->first == key) ? &it->second : nullptr;
}

}  // namespace

void Store::parents(const int64_t* ids, size_t n, int64_t* out) const {
  std::shared_lock<std::shared_mutex> lk(mu_);
  check_open();
  for (size_t i = 0; i < n; ++i) rec_or_throw(ids[i], "ids");
  for (size_t i = 0; i < n; ++i) out[i] = records_.at(ids[i]).parent;
}

SearchResult Store::search_turn_topic_ex(const std::string& ns_name, const float* q, const std::vector<std::string>& texts,
                                         size_t B, size_t k, size_t ef, bool include_invalidated,
                                         const TurnSearchSpec& spec) const {
  std::shared_lock<std::shared_mutex> lk(mu_);
  check_open();
  ensure_derived();
  const SearchSpec& first = spec.first;
  check_first_stage(first);
  check_query(q, B, k, ef);
  check_weight("alpha", spec.alpha);
  check_weight("neighbour_weight", spec.neighbour_weight);
  check_weight("group_weight", spec.group_weight);
  if (spec.group_key.size() > 4 * 4096) throw ValueError("group_key: expected at most 4096 characters");
  std::vector<std::vector<std::string>> qterms;
  if (first.mode != 0) qterms = lexical::tokenize_queries(texts, B, kMaxQueryTextBytes);
  SearchResult res;
  res.ids.assign(B * k, -1);
  res.scores.assign(B * k, kPadScore);
  const Namespace* ns = find_ns(ns_name);
  if (!ns || k == 0 || !ns->index[kTurn] || ns->n[kTurn] == 0) return res;
  const VectorIndex& turns = *ns->index[kTurn];
  const VectorIndex* topics = ns->index[kTopic].get();
  const lexical::LexicalIndex& lex = ns->lex[kTurn];
  const SearchFilter& flt = first.filter;
  const std::unordered_set<int64_t>& inval = ns->invalidated[kTurn];
  const bool check_inval = !include_invalidated && !inval.empty();
  const bool has_meta = !flt.clauses.empty();
  auto allow = [&](int64_t id) -> bool {
    if (check_inval && inval.count(id)) return false;
    if (flt.empty()) return true;
    const Record& r = records_.at(id);
    if (flt.has_time && !flt.time_ok(record_time(r, flt.time_field))) return false;
    return !has_meta || meta_matches(r, flt);
  };
  PredicateFunctor<decltype(allow)> functor(&allow);
  hnswlib::BaseFilterFunctor* f_turn = (check_inval || !flt.empty()) ? &functor : nullptr;
  ExcludeFilter fp(&ns->invalidated[kTopic]);
  hnswlib::BaseFilterFunctor* f_topic = (!include_invalidated && !ns->invalidated[kTopic].empty()) ? &fp : nullptr;
  const size_t C = std::max(first.candidates, k);
  const bool dense = first.mode != 1;
  const bool topic_children = first.mode == 0 && spec.alpha != 0.0 && topics != nullptr;
  const bool context = spec.neighbour_weight != 0.0 || spec.group_weight != 0.0;
  const bool rescore = first.half_life > 0;
  auto dist = space_->get_dist_func();
  void* param = space_->get_dist_func_param();
  size_t cost = std::max<size_t>(1, std::min(turns.live(), 16 * std::max(C, ef))) * (topic_children ? 2 : 1);

  parallel_rows(B, threads_, cost, [&](size_t b) {
    std::vector<float> qv, tv(dim_);
    const float* qq = query_row(q, b, qv);
    auto sim = [&](const VectorIndex& idx, int64_t id) -> double {
      idx.vector(id, tv.data());
      return space_->score(dist(qq, tv.data(), param));
    };
    // ---- first stage: S0 and its base scores
    std::vector<Scored> dl, ll;
    if (dense)
      for (auto& h : turns.knn(qq, C, ef, f_turn)) dl.emplace_back(space_->score(h.first), h.second);
    if (first.mode != 0) {
      if (first.mode == 2 && first.fusion == fusion::kFusionCoverage)
        ll = lex.coverage(qterms[b], C, allow);
      else
        ll = lex.search(qterms[b], C, allow);
    }
    std::vector<Scored> s0;
    if (first.mode == 0) s0 = std::move(dl);
    else if (first.mode == 1) s0 = std::move(ll);
    else s0 = fusion::fuse(dl, ll, first.fusion, first.lexical_weight);
    // The candidates: S0 (in_s0), then the neighbours the context adds; slot: id -> index.
    struct Cand {
      int64_t id, parent, group;
      double base, nb;  // nb: best base of its neighbours in S0 (>= 0)
      bool in_s0;
    };
    std::vector<Cand> cands;
    cands.reserve(s0.size() * 2 + 16);
    std::unordered_map<int64_t, uint32_t> slot;
    slot.reserve(s0.size() * 4 + 32);
    auto add = [&](int64_t id, double base, bool in_s0) -> uint32_t {
      auto ins = slot.emplace(id, static_cast<uint32_t>(cands.size()));
      if (ins.second) cands.push_back(Cand{id, records_.at(id).parent, 0, base, 0.0, in_s0});
      return ins.first->second;
    };
    for (const auto& e : s0) add(e.second, e.first, true);
    std::unordered_map<int64_t, double> topic_sim;  // topic id -> sim(q, topic)
    if (topic_children) {
      for (auto& h : topics->knn(qq, C, ef, f_topic)) {
        topic_sim[h.second] = space_->score(h.first);
        for (int64_t c : records_.at(h.second).children)
          if (!slot.count(c) && allow(c)) add(c, sim(turns, c), true);
      }
    }
    const size_t n_s0 = cands.size();
    // ---- groups (only when a context term needs them). A group is an int64: a meta[group_key]
    // value interned for this query (>= 0), or -2 - topic id for turns grouped by their topic.
    std::unordered_map<std::string_view, int64_t> interned;
    std::vector<std::string_view> group_value;          // interned id -> canonical value
    std::unordered_map<int64_t, int64_t> topic_group;   // topic id -> group of its key-less turns
    auto intern = [&](const std::string& v) -> int64_t {
      auto it = interned.find(std::string_view(v));
      if (it != interned.end()) return it->second;
      int64_t g = static_cast<int64_t>(group_value.size());
      group_value.emplace_back(v);  // a view into meta_scalars_: stable under the reader lock
      interned.emplace(group_value.back(), g);
      return g;
    };
    auto key_value = [&](int64_t id) -> const std::string* {
      auto m = meta_scalars_.find(id);
      return m == meta_scalars_.end() ? nullptr : meta_value(m->second, spec.group_key);
    };
    // Whether any turn record of the namespace carries group_key itself (else a turn's group is
    // its topic's, and the per-turn lookups are skipped): the distinct (key, value) pairs of the
    // turns' meta index are few, so this is cheap.
    const bool own_keys = context && !spec.group_key.empty() && !ns->meta[kTurn].values(spec.group_key).empty();
    auto group_of_parent = [&](int64_t parent) -> int64_t {
      auto it = topic_group.find(parent);
      if (it != topic_group.end()) return it->second;
      const std::string* v = spec.group_key.empty() ? nullptr : key_value(parent);
      int64_t g = v ? intern(*v) : -2 - parent;
      topic_group.emplace(parent, g);
      return g;
    };
    auto group_of = [&](int64_t id, int64_t parent) -> int64_t {
      if (own_keys)
        if (const std::string* v = key_value(id)) return intern(*v);
      return group_of_parent(parent);
    };
    // The group's allowed turns in id order (built once per group and query).
    std::unordered_map<int64_t, std::vector<int64_t>> members;
    auto members_of = [&](int64_t g) -> const std::vector<int64_t>& {
      auto it = members.find(g);
      if (it != members.end()) return it->second;
      std::vector<int64_t> m;
      auto take_topic = [&](int64_t topic) {
        for (int64_t c : records_.at(topic).children)
          if (allow(c) && (!own_keys || group_of(c, topic) == g)) m.push_back(c);
      };
      if (g < 0) {
        take_topic(-2 - g);
      } else {
        std::string v(group_value[static_cast<size_t>(g)]);
        if (own_keys)
          if (auto* ts = ns->meta[kTurn].find(spec.group_key, v))
            for (int64_t t : *ts)
              if (allow(t) && group_of(t, records_.at(t).parent) == g) m.push_back(t);
        if (auto* ps = ns->meta[kTopic].find(spec.group_key, v))
          for (int64_t tp : *ps) take_topic(tp);
      }
      std::sort(m.begin(), m.end());
      m.erase(std::unique(m.begin(), m.end()), m.end());
      return members.emplace(g, std::move(m)).first->second;
    };
    // ---- context: neighbours (prev / next in the group) and the group's best base score
    std::unordered_map<int64_t, double> gbest;  // group -> best base of S0's turns in it (>= 0)
    if (context) {
      std::vector<uint32_t> order(n_s0);
      for (uint32_t i = 0; i < n_s0; ++i) order[i] = i;
      std::sort(order.begin(), order.end(),  // a deterministic order of the group builds
                [&](uint32_t a, uint32_t b2) { return cands[a].id < cands[b2].id; });
      for (uint32_t i : order) {
        const int64_t t = cands[i].id;
        const double bt = cands[i].base;
        const int64_t g = cands[i].group = group_of(t, cands[i].parent);
        if (spec.group_weight != 0.0) {
          double& best = gbest[g];  // starts at 0: context never lowers a score
          best = std::max(best, bt);
        }
        if (spec.neighbour_weight == 0.0) continue;
        const std::vector<int64_t>& m = members_of(g);
        auto pos = std::lower_bound(m.begin(), m.end(), t);
        if (pos == m.end() || *pos != t) continue;
        // t's base reaches both its neighbours (candidates from here on: a neighbour is in t's
        // group); a neighbour's own base reaches t the same way when it is in S0.
        if (pos != m.begin()) {
          Cand& pc = cands[add(*(pos - 1), 0.0, false)];
          pc.group = g;
          pc.nb = std::max(pc.nb, bt);
        }
        if (pos + 1 != m.end()) {
          Cand& nc = cands[add(*(pos + 1), 0.0, false)];
          nc.group = g;
          nc.nb = std::max(nc.nb, bt);
        }
      }
    }
    // ---- final scores over S0 and the neighbours
    std::vector<Scored> out;
    out.reserve(cands.size());
    auto topic_of = [&](int64_t parent) -> double {
      auto it = topic_sim.find(parent);
      if (it != topic_sim.end()) return it->second;
      double s = topics != nullptr && topics->contains(parent) ? sim(*topics, parent) : 0.0;
      topic_sim.emplace(parent, s);
      return s;
    };
    for (const Cand& c : cands) {
      double s = c.in_s0 ? c.base : (first.mode == 0 ? sim(turns, c.id) : 0.0);
      if (spec.alpha != 0.0) s += spec.alpha * topic_of(c.parent);
      s += spec.neighbour_weight * c.nb;
      if (spec.group_weight != 0.0) {
        auto it = gbest.find(c.group);
        if (it != gbest.end()) s += spec.group_weight * it->second;
      }
      if (rescore) {
        double age = std::max(0.0, first.now - record_time(records_.at(c.id), flt.time_field));
        s += first.recency_weight * std::exp2(-age / first.half_life);
      }
      out.emplace_back(s, c.id);
    }
    size_t m = std::min(k, out.size());
    std::partial_sort(out.begin(), out.begin() + m, out.end(), better);
    for (size_t j = 0; j < m; ++j) {
      res.ids[b * k + j] = out[j].second;
      res.scores[b * k + j] = finite_f32(out[j].first);
    }
  });
  return res;
}

}  // namespace memkern
