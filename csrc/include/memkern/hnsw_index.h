// One HNSW graph (hnswlib 0.8) of one namespace and level, with a per-call ef search that is
// safe for concurrent readers (hnswlib's own searchKnn reads a shared ef_ member).
#pragma once
#include <hnswlib/hnswlib.h>

#include <memory>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "memkern/space.h"

namespace memkern {

// Excludes a set of labels (invalidated records) from a search.
class ExcludeFilter : public hnswlib::BaseFilterFunctor {
 public:
  explicit ExcludeFilter(const std::unordered_set<int64_t>* s) : s_(s) {}
  bool operator()(hnswlib::labeltype id) override { return s_->find(static_cast<int64_t>(id)) == s_->end(); }

 private:
  const std::unordered_set<int64_t>* s_;
};

class HnswIndex {
 public:
  using Graph = hnswlib::HierarchicalNSW<float>;
  HnswIndex(Space* space, size_t dim, size_t M, size_t ef_construction, size_t capacity, size_t seed);
  // Loads a graph written by save(); the caller has verified the file's checksum.
  HnswIndex(Space* space, size_t dim, const std::string& file, size_t min_capacity);

  // Adds or replaces the vector of `label` (grows the capacity as needed; writer only).
  void put(int64_t label, const float* v);
  void remove(int64_t label);  // marks deleted
  // Grows the capacity once to hold `n` more points (avoids repeated doubling in batch adds).
  void reserve_more(size_t n);
  bool contains(int64_t label) const;
  // Copies the stored vector of `label` into out[dim].
  void vector(int64_t label, float* out) const;
  // k nearest (distance ascending) among allowed labels.
  std::vector<std::pair<float, int64_t>> knn(const float* q, size_t k, size_t ef, hnswlib::BaseFilterFunctor* f) const;
  void save(const std::string& file) const;
  size_t size() const { return g_->cur_element_count; }
  size_t deleted() const { return g_->num_deleted_; }
  size_t live() const { return size() - deleted(); }
  size_t capacity() const { return g_->max_elements_; }
  // Live labels in insertion order (for rebuilds).
  std::vector<int64_t> labels() const;
  size_t memory_bytes() const;

 private:
  size_t dim_;
  std::unique_ptr<Graph> g_;
};

}  // namespace memkern
