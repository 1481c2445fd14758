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
#include "memkern/vector_index.h"

namespace memkern {

// Excludes a set of labels (invalidated records) from a search.
class ExcludeFilter : public hnswlib::BaseFilterFunctor {
 public:
  explicit ExcludeFilter(const std::unordered_set<int64_t>* s) : s_(s) {}
  bool operator()(hnswlib::labeltype id) override { return s_->find(static_cast<int64_t>(id)) == s_->end(); }

 private:
  const std::unordered_set<int64_t>* s_;
};

class HnswIndex : public VectorIndex {
 public:
  using Graph = hnswlib::HierarchicalNSW<float>;
  HnswIndex(Space* space, size_t dim, size_t M, size_t ef_construction, size_t capacity, size_t seed);
  // Loads a graph written by save(); the caller has verified the file's checksum.
  HnswIndex(Space* space, size_t dim, const std::string& file, size_t min_capacity);

  const char* kind() const override { return "hnsw"; }
  const char* file_suffix() const override { return ".hnsw"; }
  bool concurrent_put() const override { return true; }
  // Adds or replaces the vector of `label` (grows the capacity geometrically as needed; writer only).
  void put(int64_t label, const float* v) override;
  void remove(int64_t label) override;  // marks deleted
  // Grows the capacity once to hold `n` more points (avoids repeated doubling in batch adds).
  void reserve_more(size_t n) override;
  // Shrinks the capacity to the points held (a loaded graph keeps its saved capacity otherwise).
  void shrink_to_fit() override;
  bool contains(int64_t label) const override;
  // Copies the stored vector of `label` into out[dim].
  void vector(int64_t label, float* out) const override;
  // k nearest (distance ascending) among allowed labels.
  std::vector<std::pair<float, int64_t>> knn(const float* q, size_t k, size_t ef,
                                             hnswlib::BaseFilterFunctor* f) const override;
  void save(const std::string& file) const override;
  size_t size() const override { return g_->cur_element_count; }
  size_t deleted() const override { return g_->num_deleted_; }
  size_t capacity() const override { return g_->max_elements_; }
  // Live labels in insertion order (for rebuilds).
  std::vector<int64_t> labels() const override;
  size_t memory_bytes() const override;

 private:
  size_t dim_;
  std::unique_ptr<Graph> g_;
};

}  // namespace memkern
