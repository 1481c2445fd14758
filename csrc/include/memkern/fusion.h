// Fusion of a hybrid search's two first-stage lists (the dense list and the lexical list of one
// query), the exact twin of memkern.lexical.rrf / weighted_fusion / coverage_fusion (the Python
// reference; tests/store/test_lexical.py checks the store against it). Kept apart from the dense search
// path (query.cpp) on purpose.
//
// Lists hold (score, id) pairs, best first. With w the lexical weight:
//   kFusionRrf (0):      (1 - w) / (60 + rank_dense) + w / (60 + rank_lexical), ranks from 1;
//   kFusionWeighted (1): (1 - w) * minmax(dense) + w * minmax(lexical), each list min-max
//                        normalised over its own results (all equal -> 1);
//   kFusionCoverage (2): (1 - w) * minmax(dense) + w * coverage / max(coverage), the lexical
//                        list scored by LexicalIndex::coverage and divided by its best score
//                        (not min-max: a record holding only the query's name keeps its share).
// A record missing from a list gets 0 from it. The result is unordered (the caller ranks it).
#pragma once
#include <algorithm>
#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

namespace memkern {
namespace fusion {

constexpr uint8_t kFusionRrf = 0, kFusionWeighted = 1, kFusionCoverage = 2;
constexpr double kRrfK0 = 60.0;

using Scored = std::pair<double, int64_t>;

// Adds `weight * normalised score` of each entry of `L` to `fused`.
inline void add_minmax(std::unordered_map<int64_t, double>& fused, const std::vector<Scored>& L, double weight) {
  if (L.empty()) return;
  double lo = L[0].first, hi = L[0].first;
  for (const auto& e : L) lo = std::min(lo, e.first), hi = std::max(hi, e.first);
  for (const auto& e : L) fused[e.second] += weight * (hi == lo ? 1.0 : (e.first - lo) / (hi - lo));
}

inline std::vector<Scored> fuse(const std::vector<Scored>& dense, const std::vector<Scored>& lexical,
                                uint8_t method, double w) {
  std::unordered_map<int64_t, double> fused;
  if (method == kFusionRrf) {
    for (const auto* L : {&dense, &lexical}) {
      double weight = L == &dense ? 1.0 - w : w;
      for (size_t r = 0; r < L->size(); ++r)
        fused[(*L)[r].second] += weight / (kRrfK0 + static_cast<double>(r + 1));
    }
  } else {
    add_minmax(fused, dense, 1.0 - w);
    if (method == kFusionWeighted) {
      add_minmax(fused, lexical, w);
    } else {  // coverage over the list's best (> 0: every hit holds a query term)
      double best = 0.0;
      for (const auto& e : lexical) best = std::max(best, e.first);
      for (const auto& e : lexical) fused[e.second] += w * (e.first / best);
    }
  }
  std::vector<Scored> out;
  out.reserve(fused.size());
  for (const auto& kv : fused) out.emplace_back(kv.second, kv.first);
  return out;
}

}  // namespace fusion
}  // namespace memkern
