// Exact vector index: a dense [n, dim] float32 array scanned in full by knn(). Memory is the
// vectors plus one label and one hash entry per vector, grown geometrically from zero; search
// results are exact (ties broken by the smaller label). Used for small namespaces (see
// vector_index.h).
//
// Snapshot bytes (serialize(), the flat level of a namespace blob, snapshot.h):
//   u64 n | i64 labels[n] | f32 vectors[n][dim]
// File format of a format 1-2 snapshot (still read): magic "MKFLAT\x01\x00" (8 bytes) | u64 dim |
// then the bytes above. Loading checks that the size matches n and dim exactly, that labels are
// >= 0 and distinct, and that every value is finite with L2 norm <= 1e18, before it keeps anything.
#pragma once
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "memkern/space.h"
#include "memkern/vector_index.h"

namespace memkern {

class FlatIndex : public VectorIndex {
 public:
  static constexpr char kMagic[8] = {'M', 'K', 'F', 'L', 'A', 'T', 1, 0};

  FlatIndex(Space* space, size_t dim, size_t capacity = 0);
  // Loads a format 1-2 snapshot file whose size and CRC-32 the snapshot recorded; throws
  // CorruptedError on any mismatch or inconsistency.
  FlatIndex(Space* space, size_t dim, const std::string& file, uint64_t size, uint32_t crc);
  // Loads n rows (labels[n] then vectors[n][dim], unaligned bytes) checked like a file; `what`
  // names them in errors.
  FlatIndex(Space* space, size_t dim, const char* labels, const char* vectors, size_t n, const std::string& what);

  const char* kind() const override { return "flat"; }
  bool concurrent_put() const override { return false; }
  void put(int64_t label, const float* v) override;
  void remove(int64_t label) override;
  void reserve_more(size_t n) override;
  bool contains(int64_t label) const override { return pos_.count(label) > 0; }
  void vector(int64_t label, float* out) const override;
  std::vector<std::pair<float, int64_t>> knn(const float* q, size_t k, size_t ef,
                                             hnswlib::BaseFilterFunctor* f) const override;
  void serialize(std::string* out) const override;
  size_t size() const override { return labels_.size(); }
  size_t deleted() const override { return 0; }
  size_t capacity() const override { return labels_.capacity(); }
  std::vector<int64_t> labels() const override { return labels_; }
  size_t memory_bytes() const override;

 private:
  void take(const char* labels, const char* vectors, size_t n, const std::string& what);

  size_t dim_;
  hnswlib::DISTFUNC<float> dist_;
  void* dist_param_;
  std::vector<float> data_;        // [n * dim], row i is the vector of labels_[i]
  std::vector<int64_t> labels_;    // [n]
  std::unordered_map<int64_t, uint32_t> pos_;  // label -> row
};

}  // namespace memkern
