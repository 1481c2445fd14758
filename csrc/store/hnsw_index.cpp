#include "memkern/hnsw_index.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <queue>

#include "memkern/crc32.h"
#include "memkern/errors.h"
#include "memkern/io.h"

namespace memkern {

namespace {
constexpr size_t kGraphHeader = 96;  // bytes of the graph file's header (layout below)
}  // namespace

HnswIndex::HnswIndex(Space* space, size_t dim, size_t M, size_t ef_construction, size_t capacity, size_t seed)
    : dim_(dim), g_(new Graph(space, std::max<size_t>(capacity, 16), M, ef_construction, seed)) {}

HnswIndex::HnswIndex(Space* space, size_t dim, const char* p, size_t n) : dim_(dim) {
  // Bytes in serialize()'s layout (the comment above validate_graph_bytes), already checked by it:
  // the fields are taken as they are, the capacity set to the element count.
  (void)n;
  g_.reset(new Graph(space));
  Graph& g = *g_;
  auto u64 = [&](size_t off) {
    uint64_t v;
    std::memcpy(&v, p + off, 8);
    return static_cast<size_t>(v);
  };
  g.offsetLevel0_ = u64(0);
  g.cur_element_count = u64(16);
  g.max_elements_ = std::max<size_t>(g.cur_element_count, 1);
  g.size_data_per_element_ = u64(24);
  g.label_offset_ = u64(32);
  g.offsetData_ = u64(40);
  std::memcpy(&g.maxlevel_, p + 48, 4);
  std::memcpy(&g.enterpoint_node_, p + 52, 4);
  g.maxM_ = u64(56);
  g.maxM0_ = u64(64);
  g.M_ = u64(72);
  std::memcpy(&g.mult_, p + 80, 8);
  g.ef_construction_ = u64(88);
  g.data_size_ = space->get_data_size();
  g.fstdistfunc_ = space->get_dist_func();
  g.dist_func_param_ = space->get_dist_func_param();
  const size_t cur = g.cur_element_count, cap = g.max_elements_;
  g.size_links_per_element_ = g.maxM_ * sizeof(hnswlib::tableint) + sizeof(hnswlib::linklistsizeint);
  g.size_links_level0_ = g.maxM0_ * sizeof(hnswlib::tableint) + sizeof(hnswlib::linklistsizeint);
  g.revSize_ = 1.0 / g.mult_;
  g.ef_ = 10;
  g.data_level0_memory_ = static_cast<char*>(std::malloc(cap * g.size_data_per_element_));
  g.linkLists_ = static_cast<char**>(std::calloc(cap, sizeof(void*)));
  if (!g.data_level0_memory_ || !g.linkLists_) throw std::bad_alloc();
  std::memcpy(g.data_level0_memory_, p + kGraphHeader, cur * g.size_data_per_element_);
  std::vector<std::mutex>(cap).swap(g.link_list_locks_);
  std::vector<std::mutex>(Graph::MAX_LABEL_OPERATION_LOCKS).swap(g.label_op_locks_);
  g.visited_list_pool_.reset(new hnswlib::VisitedListPool(1, cap));
  g.element_levels_.assign(cap, 0);
  g.label_lookup_.reserve(cur);
  size_t off = kGraphHeader + cur * g.size_data_per_element_;
  for (size_t i = 0; i < cur; ++i) {
    const auto id = static_cast<hnswlib::tableint>(i);
    g.label_lookup_[g.getExternalLabel(id)] = id;
    uint32_t sz;
    std::memcpy(&sz, p + off, 4);
    off += 4;
    if (sz) {
      g.element_levels_[i] = static_cast<int>(sz / g.size_links_per_element_);
      g.linkLists_[i] = static_cast<char*>(std::malloc(sz));  // freed by hnswlib's destructor
      if (!g.linkLists_[i]) throw std::bad_alloc();
      std::memcpy(g.linkLists_[i], p + off, sz);
      off += sz;
    }
    if (g.isMarkedDeleted(id)) {
      ++g.num_deleted_;
      if (g.allow_replace_deleted_) g.deleted_elements.insert(id);
    }
  }
  if (g.data_size_ != dim * sizeof(float) || g.size_data_per_element_ < dim * sizeof(float))
    throw CorruptedError("graph: vector size does not match the store's dim");
}

void HnswIndex::put(int64_t label, const float* v) {
  if (g_->cur_element_count >= g_->max_elements_) {
    g_->resizeIndex(std::max<size_t>(g_->max_elements_ * 2, 16));
  }
  g_->addPoint(v, static_cast<hnswlib::labeltype>(label));
}

void HnswIndex::reserve_more(size_t n) {
  size_t need = g_->cur_element_count + n;
  if (need > g_->max_elements_) g_->resizeIndex(std::max(need, g_->max_elements_ + g_->max_elements_ / 2));
}

void HnswIndex::remove(int64_t label) { g_->markDelete(static_cast<hnswlib::labeltype>(label)); }

bool HnswIndex::contains(int64_t label) const {
  std::unique_lock<std::mutex> lk(g_->label_lookup_lock);
  auto it = g_->label_lookup_.find(static_cast<hnswlib::labeltype>(label));
  return it != g_->label_lookup_.end() && !g_->isMarkedDeleted(it->second);
}

void HnswIndex::vector(int64_t label, float* out) const {
  hnswlib::tableint internal;
  {
    std::unique_lock<std::mutex> lk(g_->label_lookup_lock);
    auto it = g_->label_lookup_.find(static_cast<hnswlib::labeltype>(label));
    if (it == g_->label_lookup_.end()) throw KeyError("id " + std::to_string(label) + " has no vector");
    internal = it->second;
  }
  std::memcpy(out, g_->getDataByInternalId(internal), dim_ * sizeof(float));
}

std::vector<std::pair<float, int64_t>> HnswIndex::knn(const float* q, size_t k, size_t ef,
                                                      hnswlib::BaseFilterFunctor* f) const {
  std::vector<std::pair<float, int64_t>> out;
  const Graph& g = *g_;
  if (g.cur_element_count == 0 || k == 0) return out;
  size_t width = std::max(ef, k);
  if (width >= live()) {
    // The caller asks for (about) every live vector: an exact scan costs no more than a beam
    // search that wide, and it is exhaustive even where graph updates left a node unreachable.
    std::priority_queue<std::pair<float, hnswlib::tableint>> heap;  // max-heap of the k best
    for (size_t i = 0; i < g.cur_element_count; ++i) {
      auto id = static_cast<hnswlib::tableint>(i);
      if (g.isMarkedDeleted(id)) continue;
      if (f && !(*f)(g.getExternalLabel(id))) continue;
      float d = g.fstdistfunc_(q, g.getDataByInternalId(id), g.dist_func_param_);
      if (heap.size() < k) {
        heap.emplace(d, id);
      } else if (d < heap.top().first) {
        heap.pop();
        heap.emplace(d, id);
      }
    }
    out.resize(heap.size());
    for (size_t i = heap.size(); i-- > 0;) {
      out[i] = {heap.top().first, static_cast<int64_t>(g.getExternalLabel(heap.top().second))};
      heap.pop();
    }
    return out;
  }
  // Greedy descent through the upper layers (as hnswlib does), then a beam search of width
  // max(ef, k) on layer 0 with this call's ef instead of the graph's shared ef_ member.
  hnswlib::tableint cur = g.enterpoint_node_;
  float curd = g.fstdistfunc_(q, g.getDataByInternalId(cur), g.dist_func_param_);
  for (int level = g.maxlevel_; level > 0; --level) {
    bool changed = true;
    while (changed) {
      changed = false;
      unsigned int* data = reinterpret_cast<unsigned int*>(g.get_linklist(cur, level));
      int size = g.getListCount(data);
      auto* cand = reinterpret_cast<hnswlib::tableint*>(data + 1);
      for (int i = 0; i < size; ++i) {
        hnswlib::tableint c = cand[i];
        if (c >= g.max_elements_) throw CorruptedError("graph link out of range");
        float d = g.fstdistfunc_(q, g.getDataByInternalId(c), g.dist_func_param_);
        if (d < curd) {
          curd = d;
          cur = c;
          changed = true;
        }
      }
    }
  }
  auto top = (!g.num_deleted_ && !f) ? g.searchBaseLayerST<true>(cur, q, width, f)
                                     : g.searchBaseLayerST<false>(cur, q, width, f);
  while (top.size() > k) top.pop();
  out.resize(top.size());
  for (size_t i = top.size(); i-- > 0;) {
    out[i] = {top.top().first, static_cast<int64_t>(g.getExternalLabel(top.top().second))};
    top.pop();
  }
  return out;
}

// hnswlib 0.8 graph file layout (what its loadIndex reads), little-endian:
//   header (96 bytes): u64 offsetLevel0 (0), u64 max_elements, u64 cur_element_count,
//     u64 size_data_per_element, u64 label_offset, u64 offsetData, i32 maxlevel,
//     u32 enterpoint_node, u64 maxM, u64 maxM0, u64 M, f64 mult, u64 ef_construction;
//   level 0: cur_element_count blocks of size_data_per_element bytes, each
//     [u16 link count, u8 deleted flag, u8 unused, maxM0 x u32 neighbour ids, dim x f32, u64 label];
//   then per element: u32 byte size of its upper-level links (level * size_links_per_element,
//     size_links_per_element = 4 + 4 * maxM), followed by those bytes, one
//     [u32 count, maxM x u32 ids] block per level 1..level.
namespace {

// Whether the n float32 values at p (any alignment) are all finite: no exponent of all ones. No
// branch in the loop, so the compiler vectorises it (the check runs over every stored vector on open).
inline bool all_finite_f32(const char* p, size_t n) {
  uint32_t bad = 0;
  for (size_t j = 0; j < n; ++j) {
    uint32_t u;
    std::memcpy(&u, p + 4 * j, 4);
    bad |= static_cast<uint32_t>((u & 0x7f800000u) == 0x7f800000u);
  }
  return bad == 0;
}
}  // namespace

void HnswIndex::serialize(std::string* out) const {
  const Graph& g = *g_;
  const size_t cur = g.cur_element_count;
  size_t upper = 0;
  for (size_t i = 0; i < cur; ++i)
    if (g.element_levels_[i] > 0) upper += g.size_links_per_element_ * g.element_levels_[i];
  out->reserve(out->size() + kGraphHeader + cur * (g.size_data_per_element_ + 4) + upper);
  auto pod = [&](const auto& v) { out->append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  pod(static_cast<uint64_t>(g.offsetLevel0_));
  pod(static_cast<uint64_t>(cur));  // capacity: the loader grows it on demand
  pod(static_cast<uint64_t>(cur));
  pod(static_cast<uint64_t>(g.size_data_per_element_));
  pod(static_cast<uint64_t>(g.label_offset_));
  pod(static_cast<uint64_t>(g.offsetData_));
  pod(static_cast<int32_t>(g.maxlevel_));
  pod(static_cast<uint32_t>(g.enterpoint_node_));
  pod(static_cast<uint64_t>(g.maxM_));
  pod(static_cast<uint64_t>(g.maxM0_));
  pod(static_cast<uint64_t>(g.M_));
  pod(static_cast<double>(g.mult_));
  pod(static_cast<uint64_t>(g.ef_construction_));
  out->append(g.data_level0_memory_, cur * g.size_data_per_element_);
  for (size_t i = 0; i < cur; ++i) {
    uint32_t n = g.element_levels_[i] > 0 ? static_cast<uint32_t>(g.size_links_per_element_ * g.element_levels_[i]) : 0;
    pod(n);
    if (n) out->append(g.linkLists_[i], n);
  }
}

void validate_graph_bytes(const char* p, size_t n, size_t dim, const std::string& what) {
  auto fail = [&](const std::string& why) { throw CorruptedError(what + ": " + why); };
  auto u64at = [&](size_t off) {
    uint64_t v;
    std::memcpy(&v, p + off, 8);
    return v;
  };
  auto u32at = [&](size_t off) {
    uint32_t v;
    std::memcpy(&v, p + off, 4);
    return v;
  };
  auto u16at = [&](size_t off) {
    uint16_t v;
    std::memcpy(&v, p + off, 2);
    return v;
  };
  if (n < kGraphHeader) fail("truncated header (" + std::to_string(n) + " bytes)");
  uint64_t off0 = u64at(0), cur = u64at(16), size_data = u64at(24), label_off = u64at(32), data_off = u64at(40);
  int32_t maxlevel;
  std::memcpy(&maxlevel, p + 48, 4);
  uint32_t enter = u32at(52);
  uint64_t maxM = u64at(56), maxM0 = u64at(64), M = u64at(72), efc = u64at(88);
  double mult;
  std::memcpy(&mult, p + 80, 8);
  if (off0 != 0) fail("level-0 offset " + std::to_string(off0) + " (expected 0)");
  if (M < 2 || M > 4096 || maxM != M || maxM0 != 2 * M)
    fail("bad link sizes (M " + std::to_string(M) + ", maxM " + std::to_string(maxM) + ", maxM0 " + std::to_string(maxM0) + ")");
  if (!std::isfinite(mult) || std::fabs(mult * std::log(static_cast<double>(M)) - 1.0) > 1e-9)
    fail("level multiplier does not match M");
  if (efc < 1 || efc > (1u << 20)) fail("ef_construction " + std::to_string(efc) + " out of range");
  const uint64_t links0 = maxM0 * 4 + 4, data_size = dim * sizeof(float), links = maxM * 4 + 4;
  if (data_off != links0 || label_off != links0 + data_size || size_data != links0 + data_size + 8)
    fail("element layout does not match dim " + std::to_string(dim) + " and M " + std::to_string(M));
  if (cur == 0 || cur > (n - kGraphHeader) / (size_data + 4) || cur > UINT32_MAX)
    fail("element count " + std::to_string(cur) + " does not fit the file");
  if (maxlevel < 0 || maxlevel > 255) fail("top level " + std::to_string(maxlevel) + " out of range");
  if (enter >= cur) fail("entry point " + std::to_string(enter) + " out of range");
  // Upper-level link lists: sizes, hence levels, and the exact file length.
  std::vector<uint8_t> level(cur);
  std::vector<uint64_t> upper(cur, 0);
  size_t off = kGraphHeader + cur * size_data;
  for (uint64_t i = 0; i < cur; ++i) {
    if (n - off < 4) fail("truncated link lists");
    uint32_t sz = u32at(off);
    off += 4;
    if (sz % links != 0 || sz / links > static_cast<uint64_t>(maxlevel)) fail("element " + std::to_string(i) + " has a bad link list size");
    if (sz > n - off) fail("truncated link lists");
    level[i] = static_cast<uint8_t>(sz / links);
    upper[i] = off;
    off += sz;
  }
  if (off != n) fail("length " + std::to_string(n) + " != " + std::to_string(off) + " implied by its header");
  if (level[enter] != maxlevel) fail("entry point is not on the top level");
  std::unordered_set<uint64_t> labels;
  labels.reserve(cur);
  for (uint64_t i = 0; i < cur; ++i) {
    const size_t e = kGraphHeader + i * size_data;
    uint16_t c = u16at(e);
    if (c > maxM0) fail("element " + std::to_string(i) + " has " + std::to_string(c) + " level-0 links (max " + std::to_string(maxM0) + ")");
    for (uint16_t j = 0; j < c; ++j)
      if (u32at(e + 4 + 4 * j) >= cur) fail("element " + std::to_string(i) + " links to an element out of range");
    if (!all_finite_f32(p + e + data_off, dim)) fail("element " + std::to_string(i) + " has a non-finite vector value");
    if (!labels.insert(u64at(e + label_off)).second) fail("label " + std::to_string(u64at(e + label_off)) + " appears twice");
    for (uint8_t l = 1; l <= level[i]; ++l) {
      const size_t b = upper[i] + (l - 1) * links;
      uint32_t cnt = u32at(b) & 0xffffu;
      if (cnt > maxM) fail("element " + std::to_string(i) + " has too many links on level " + std::to_string(l));
      for (uint32_t j = 0; j < cnt; ++j) {
        uint32_t t = u32at(b + 4 + 4 * j);
        if (t >= cur || level[t] < l) fail("element " + std::to_string(i) + " links to a bad element on level " + std::to_string(l));
      }
    }
  }
}

std::unique_ptr<HnswIndex> load_graph_file(Space* space, size_t dim, const std::string& file, uint64_t size,
                                           uint32_t crc) {
  const io::MappedFile m = io::map_file(file, size, "graph file", "the snapshot", /*populate=*/true);
  if (crc32(m.p, m.n) != crc) throw CorruptedError("graph file " + file + ": checksum mismatch");
  validate_graph_bytes(m.p, m.n, dim, "graph file " + file);
  try {
    return std::unique_ptr<HnswIndex>(new HnswIndex(space, dim, m.p, m.n));
  } catch (const CorruptedError&) {
    throw;
  } catch (const std::exception& e) {
    throw CorruptedError("graph file " + file + ": " + e.what());
  }
}

std::vector<int64_t> HnswIndex::labels() const {
  std::vector<int64_t> out;
  out.reserve(live());
  for (size_t i = 0; i < g_->cur_element_count; ++i)
    if (!g_->isMarkedDeleted(static_cast<hnswlib::tableint>(i)))
      out.push_back(static_cast<int64_t>(g_->getExternalLabel(static_cast<hnswlib::tableint>(i))));
  return out;
}

size_t HnswIndex::memory_bytes() const {
  size_t b = g_->max_elements_ * g_->size_data_per_element_;          // level 0 (links + vector + label)
  b += g_->max_elements_ * (sizeof(void*) + sizeof(int) + sizeof(std::mutex));  // link list ptrs, levels, locks
  for (size_t i = 0; i < g_->cur_element_count; ++i)
    if (g_->element_levels_[i] > 0) b += g_->size_links_per_element_ * g_->element_levels_[i];
  b += g_->label_lookup_.size() * (sizeof(hnswlib::labeltype) + sizeof(hnswlib::tableint) + 2 * sizeof(void*));
  return b;
}

}  // namespace memkern
