// The vector index of one namespace and level, behind one interface:
//   FlatIndex  exact scan over a dense [n, dim] float32 array (small namespaces; exact results),
//   HnswIndex  hnswlib graph (large namespaces; approximate, beam width max(ef, k)).
// The store starts every (namespace, level) as a FlatIndex and promotes it to an HnswIndex once
// it holds more than StoreOptions::flat_limit vectors (compact() demotes it again when it shrank).
// Labels are record ids (int64 >= 0). Distances are "lower is better" (Space's distance).
//
// Thread safety: any number of concurrent const calls (knn, vector, contains, ...); mutating calls
// (put, remove, reserve_more) need the store's writer lock. HnswIndex::put is also
// safe for concurrent calls on distinct labels once reserve_more made room (parallel batch
// insert); FlatIndex::put is not (concurrent_put() says which).
#pragma once
#include <hnswlib/hnswlib.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace memkern {

class Space;

class VectorIndex {
 public:
  virtual ~VectorIndex() = default;
  // "flat" or "hnsw".
  virtual const char* kind() const = 0;
  // Whether put() may be called from several threads at once (distinct labels, after reserve_more).
  virtual bool concurrent_put() const = 0;

  // Adds or replaces the vector of `label` (v[dim]); grows the capacity as needed.
  virtual void put(int64_t label, const float* v) = 0;
  // Removes `label` from search results (HnswIndex marks it deleted; FlatIndex drops it).
  virtual void remove(int64_t label) = 0;
  // Grows the capacity once to hold `n` more vectors.
  virtual void reserve_more(size_t n) = 0;
  virtual bool contains(int64_t label) const = 0;
  // Copies the stored vector of `label` into out[dim] (KeyError if there is none).
  virtual void vector(int64_t label, float* out) const = 0;
  // The k nearest (distance ascending) among labels that `f` allows (null: all); at most k pairs
  // (distance, label).
  virtual std::vector<std::pair<float, int64_t>> knn(const float* q, size_t k, size_t ef,
                                                     hnswlib::BaseFilterFunctor* f) const = 0;
  // Appends the index's snapshot bytes to `out`: FlatIndex u64 n, i64 labels[n], f32 vectors[n][dim]
  // (the blob's flat level, snapshot.h); HnswIndex the hnswlib graph file (hnsw_index.h).
  virtual void serialize(std::string* out) const = 0;
  virtual size_t size() const = 0;     // vectors held, deleted ones included
  virtual size_t deleted() const = 0;  // vectors marked deleted
  size_t live() const { return size() - deleted(); }
  virtual size_t capacity() const = 0;
  // Live labels in insertion order (for rebuilds).
  virtual std::vector<int64_t> labels() const = 0;
  virtual size_t memory_bytes() const = 0;
};

// Loads an index written by VectorIndex::save: a FlatIndex file (it starts with FlatIndex's magic)
// or an hnswlib graph. The file must have the `size` and `crc` recorded in the snapshot, and its
// structure is validated before anything is allocated from it (load_graph_file for graphs,
// FlatIndex's own checks for flat files): any damage, even under a valid checksum, gives
// CorruptedError, never a crash.
std::unique_ptr<VectorIndex> load_vector_index(Space* space, size_t dim, const std::string& file, uint64_t size,
                                               uint32_t crc);

}  // namespace memkern
