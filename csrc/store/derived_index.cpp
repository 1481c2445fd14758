// The store's derived per-record state that lexical / filtered search (query.cpp, search_ex)
// reads: the BM25 index and the filterable meta of each (namespace, level). Never persisted:
// apply() keeps it in step on every write (add, version, delete; log replay included) once it is
// built; a store opened from a snapshot builds it from the records' texts on the first call that
// reads it (ensure_derived), so an open and a plain vector search never pay for it.
#include <algorithm>
#include <atomic>

#include "memkern/errors.h"
#include "memkern/store.h"

namespace memkern {

namespace {

std::atomic<bool> g_derived{true};

}  // namespace

void set_derived_indexes(bool on) { g_derived = on; }
bool derived_indexes() { return g_derived; }

void Store::ensure_derived() const {
  if (derived_ready_.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> g(derived_mu_);
  if (derived_ready_.load(std::memory_order_relaxed)) return;
  // Under mu_ (held by the caller): no writer runs, and readers of the derived state wait above.
  Store* self = const_cast<Store*>(this);
  for (const auto& kv : records_) {
    self->build_derived(kv.second);
    self->build_times(kv.second);
  }
  derived_ready_.store(true, std::memory_order_release);
}

void Store::index_derived(const Record& r) {
  if (derived_ready_.load(std::memory_order_relaxed)) build_derived(r);
}

void Store::build_derived(const Record& r) {
  if (!g_derived) return;
  Namespace& ns = *ns_[r.ns];
  ns.lex[r.level].put(r.id, r.summary);
  MetaScalars m = parse_meta_scalars(r.meta_json);
  if (m.empty()) {
    meta_scalars_.erase(r.id);
    return;
  }
  ns.meta[r.level].put(r.id, m);
  meta_scalars_[r.id] = std::move(m);
}

std::vector<std::string> Store::meta_values(const std::string& ns, const std::string& key, uint8_t level) const {
  std::shared_lock<std::shared_mutex> lk(mu_);
  check_open();
  if (level >= kNumLevels) throw ValueError("level: expected topic or turn");
  if (!g_derived) throw ValueError("meta_values: the derived indexes are off (set_derived_indexes)");
  ensure_derived();
  const Namespace* n = find_ns(ns);
  if (!n) return {};
  return n->meta[level].values(key);
}

void Store::unindex_derived(const Record& r) {
  if (!derived_ready_.load(std::memory_order_relaxed)) return;
  Namespace& ns = *ns_[r.ns];
  ns.lex[r.level].remove(r.id);
  auto it = meta_scalars_.find(r.id);
  if (it == meta_scalars_.end()) return;
  ns.meta[r.level].remove(r.id, it->second);
  meta_scalars_.erase(it);
}

void Store::index_times(const Record& r) {
  if (derived_ready_.load(std::memory_order_relaxed)) build_times(r);
}

void Store::build_times(const Record& r) {
  if (g_derived) ns_[r.ns]->times[r.level].put(r);
}

void Store::unindex_times(const Record& r) {
  if (derived_ready_.load(std::memory_order_relaxed)) ns_[r.ns]->times[r.level].remove(r);
}

// Every clause holds on the record's own meta, or (turn records) on its topic's where its own
// meta lacks the key.
bool Store::meta_matches(const Record& r, const SearchFilter& f) const {
  static const MetaScalars kEmpty;
  auto own_it = meta_scalars_.find(r.id);
  const MetaScalars& own = own_it == meta_scalars_.end() ? kEmpty : own_it->second;
  const MetaScalars* parent = nullptr;
  if (r.level == kTurn) {
    auto p = meta_scalars_.find(r.parent);
    if (p != meta_scalars_.end()) parent = &p->second;
  }
  auto lookup = [](const MetaScalars& m, const std::string& key) -> const std::string* {
    auto it = std::lower_bound(m.begin(), m.end(), key,
                               [](const std::pair<std::string, std::string>& kv, const std::string& k) {
                                 return kv.first < k;
                               });
    return (it != m.end() && it->first == key) ? &it->second : nullptr;
  };
  for (const auto& c : f.clauses) {
    const std::string* v = lookup(own, c.key);
    if (!v && parent) v = lookup(*parent, c.key);
    if (!v || !std::binary_search(c.values.begin(), c.values.end(), *v)) return false;
  }
  return true;
}

}  // namespace memkern
