#include "memkern/hnsw_index.h"

#include <algorithm>
#include <cstring>
#include <queue>

#include "memkern/errors.h"

namespace memkern {

HnswIndex::HnswIndex(Space* space, size_t dim, size_t M, size_t ef_construction, size_t capacity, size_t seed)
    : dim_(dim), g_(new Graph(space, std::max<size_t>(capacity, 16), M, ef_construction, seed)) {}

HnswIndex::HnswIndex(Space* space, size_t dim, const std::string& file, size_t min_capacity) : dim_(dim) {
  g_.reset(new Graph(space));
  try {
    g_->loadIndex(file, space, min_capacity);
  } catch (const std::exception& e) {
    throw CorruptedError("graph file " + file + ": " + e.what());
  }
  if (g_->data_size_ != dim * sizeof(float) || g_->size_data_per_element_ < dim * sizeof(float))
    throw CorruptedError("graph file " + file + ": vector size does not match the store's dim");
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

void HnswIndex::shrink_to_fit() {
  size_t need = std::max<size_t>(g_->cur_element_count, 16);
  if (need < g_->max_elements_) g_->resizeIndex(need);
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

void HnswIndex::save(const std::string& file) const { g_->saveIndex(file); }

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
