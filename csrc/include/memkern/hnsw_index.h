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
  // The graph held by the n bytes at p, in serialize()'s layout, which must have passed
  // validate_graph_bytes (then no byte pattern, even one under a valid checksum, can make hnswlib
  // read out of bounds). Capacity = element count (the one recorded in the bytes is ignored).
  HnswIndex(Space* space, size_t dim, const char* p, size_t n);

  const char* kind() const override { return "hnsw"; }
  bool concurrent_put() const override { return true; }
  // Adds or replaces the vector of `label` (grows the capacity geometrically as needed; writer only).
  void put(int64_t label, const float* v) override;
  void remove(int64_t label) override;  // marks deleted
  // Grows the capacity once to hold `n` more points (avoids repeated doubling in batch adds).
  void reserve_more(size_t n) override;
  bool contains(int64_t label) const override;
  // Copies the stored vector of `label` into out[dim].
  void vector(int64_t label, float* out) const override;
  // k nearest (distance ascending) among allowed labels.
  std::vector<std::pair<float, int64_t>> knn(const float* q, size_t k, size_t ef,
                                             hnswlib::BaseFilterFunctor* f) const override;
  // Appends the graph in hnswlib 0.8's file layout (capacity = element count) to `out`.
  void serialize(std::string* out) const override;
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

// Checks the bytes of a graph file in hnswlib 0.8's layout against everything hnswlib's loader
// and search trust: the 96-byte header (sizes consistent with dim and M, level multiplier,
// ef_construction, entry point), the file length, each element's link counts (<= maxM0 on level
// 0, <= maxM above), every neighbour id (< element count, and on level l a node that has level
// l), unique labels and finite vectors. Throws CorruptedError naming `what` and the problem.
void validate_graph_bytes(const char* p, size_t n, size_t dim, const std::string& what);
// Maps the file, checks its size and CRC-32 against what the snapshot recorded and its bytes
// with validate_graph_bytes, then builds the graph from the mapping (one read of the file).
// CorruptedError otherwise.
std::unique_ptr<HnswIndex> load_graph_file(Space* space, size_t dim, const std::string& file, uint64_t size,
                                           uint32_t crc);

}  // namespace memkern
