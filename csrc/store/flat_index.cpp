#include "memkern/flat_index.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>

#include "memkern/errors.h"
#include "memkern/hnsw_index.h"
#include "memkern/io.h"
#include "memkern/crc32.h"

namespace memkern {

constexpr char FlatIndex::kMagic[8];

namespace {

// Distance used for ordering: NaN sorts last (never reached with validated vectors, but a
// comparator must stay a strict weak order whatever the data).
inline float order_key(float d) { return std::isnan(d) ? std::numeric_limits<float>::infinity() : d; }

}  // namespace

FlatIndex::FlatIndex(Space* space, size_t dim, size_t capacity)
    : dim_(dim), dist_(space->get_dist_func()), dist_param_(space->get_dist_func_param()) {
  if (capacity) {
    data_.reserve(capacity * dim_);
    labels_.reserve(capacity);
  }
}

FlatIndex::FlatIndex(Space* space, size_t dim, const std::string& file, uint64_t size, uint32_t crc)
    : dim_(dim), dist_(space->get_dist_func()), dist_param_(space->get_dist_func_param()) {
  const std::string what = "flat index file " + file;
  const io::MappedFile m = io::map_file(file, size, "flat index file", "the snapshot", /*populate=*/true);
  if (crc32(m.p, m.n) != crc) throw CorruptedError(what + ": checksum mismatch");
  if (m.n < 24 || std::memcmp(m.p, kMagic, 8) != 0) throw CorruptedError(what + ": bad header");
  uint64_t fdim, n;
  std::memcpy(&fdim, m.p + 8, 8);
  std::memcpy(&n, m.p + 16, 8);
  if (fdim != dim_) throw CorruptedError(what + ": dim " + std::to_string(fdim) + " != the store's " + std::to_string(dim_));
  // Overflow-safe size check: n rows of (8 + 4 * dim) bytes must fill the rest of the file exactly.
  uint64_t row = 8 + 4 * static_cast<uint64_t>(dim_);
  uint64_t body = m.n - 24;
  if (n > body / row || n * row != body)
    throw CorruptedError(what + ": size " + std::to_string(m.n) + " does not match " + std::to_string(n) +
                         " vectors of dim " + std::to_string(dim_));
  take(m.p + 24, m.p + 24 + n * 8, n, what);
}

FlatIndex::FlatIndex(Space* space, size_t dim, const char* labels, const char* vectors, size_t n, const std::string& what)
    : dim_(dim), dist_(space->get_dist_func()), dist_param_(space->get_dist_func_param()) {
  take(labels, vectors, n, what);
}

void FlatIndex::take(const char* labels, const char* vectors, size_t n, const std::string& what) {
  if (n > std::numeric_limits<uint32_t>::max()) throw CorruptedError(what + ": " + std::to_string(n) + " vectors");
  labels_.resize(n);
  std::memcpy(labels_.data(), labels, n * 8);
  data_.resize(n * dim_);
  std::memcpy(data_.data(), vectors, n * dim_ * sizeof(float));
  pos_.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    if (labels_[i] < 0) throw CorruptedError(what + ": negative label " + std::to_string(labels_[i]));
    if (!pos_.emplace(labels_[i], static_cast<uint32_t>(i)).second)
      throw CorruptedError(what + ": label " + std::to_string(labels_[i]) + " appears twice");
  }
  for (size_t i = 0; i < n; ++i) {  // what add() accepts: finite values, L2 norm <= 1e18
    double s = 0;
    for (size_t j = 0; j < dim_; ++j) {
      float x = data_[i * dim_ + j];
      if (!std::isfinite(x)) throw CorruptedError(what + ": a stored vector holds NaN or inf");
      s += static_cast<double>(x) * x;
    }
    if (s > 1e36) throw CorruptedError(what + ": a stored vector has an L2 norm above 1e18");
  }
}

void FlatIndex::put(int64_t label, const float* v) {
  auto it = pos_.find(label);
  if (it != pos_.end()) {
    std::memcpy(data_.data() + static_cast<size_t>(it->second) * dim_, v, dim_ * sizeof(float));
    return;
  }
  if (labels_.size() >= std::numeric_limits<uint32_t>::max()) throw ValueError("flat index is full");
  data_.insert(data_.end(), v, v + dim_);  // geometric growth
  labels_.push_back(label);
  pos_.emplace(label, static_cast<uint32_t>(labels_.size() - 1));
}

void FlatIndex::remove(int64_t label) {
  auto it = pos_.find(label);
  if (it == pos_.end()) return;
  size_t i = it->second, last = labels_.size() - 1;
  pos_.erase(it);
  if (i != last) {  // move the last row into the hole
    std::memcpy(data_.data() + i * dim_, data_.data() + last * dim_, dim_ * sizeof(float));
    labels_[i] = labels_[last];
    pos_[labels_[i]] = static_cast<uint32_t>(i);
  }
  labels_.pop_back();
  data_.resize(last * dim_);
}

void FlatIndex::reserve_more(size_t n) {
  size_t need = labels_.size() + n;
  if (need > labels_.capacity()) {
    labels_.reserve(need);
    data_.reserve(need * dim_);
    pos_.reserve(need);
  }
}

void FlatIndex::vector(int64_t label, float* out) const {
  auto it = pos_.find(label);
  if (it == pos_.end()) throw KeyError("id " + std::to_string(label) + " has no vector");
  std::memcpy(out, data_.data() + static_cast<size_t>(it->second) * dim_, dim_ * sizeof(float));
}

std::vector<std::pair<float, int64_t>> FlatIndex::knn(const float* q, size_t k, size_t /*ef*/,
                                                      hnswlib::BaseFilterFunctor* f) const {
  std::vector<std::pair<float, int64_t>> all;
  if (k == 0 || labels_.empty()) return all;
  all.reserve(labels_.size());
  for (size_t i = 0; i < labels_.size(); ++i) {
    if (f && !(*f)(static_cast<hnswlib::labeltype>(labels_[i]))) continue;
    all.emplace_back(order_key(dist_(q, data_.data() + i * dim_, dist_param_)), labels_[i]);
  }
  size_t m = std::min(k, all.size());
  std::partial_sort(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(m), all.end());  // (distance, label)
  all.resize(m);
  return all;
}

void FlatIndex::serialize(std::string* out) const {
  uint64_t n = labels_.size();
  out->reserve(out->size() + 8 + n * (8 + dim_ * sizeof(float)));
  out->append(reinterpret_cast<const char*>(&n), 8);
  out->append(reinterpret_cast<const char*>(labels_.data()), n * sizeof(int64_t));
  out->append(reinterpret_cast<const char*>(data_.data()), n * dim_ * sizeof(float));
}

size_t FlatIndex::memory_bytes() const {
  return data_.capacity() * sizeof(float) + labels_.capacity() * sizeof(int64_t) +
         pos_.size() * (sizeof(int64_t) + sizeof(uint32_t) + 2 * sizeof(void*)) + pos_.bucket_count() * sizeof(void*);
}

std::unique_ptr<VectorIndex> load_vector_index(Space* space, size_t dim, const std::string& file, uint64_t size,
                                               uint32_t crc) {
  char head[8] = {0};
  {
    int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw CorruptedError("index file " + file + ": cannot open: " + std::strerror(errno));
    ssize_t r = ::read(fd, head, sizeof(head));
    ::close(fd);
    (void)r;
  }
  if (std::memcmp(head, FlatIndex::kMagic, 8) == 0) {
    return std::unique_ptr<VectorIndex>(new FlatIndex(space, dim, file, size, crc));
  }
  return load_graph_file(space, dim, file, size, crc);  // size, checksum, structure, then the graph
}

}  // namespace memkern
