// pybind11 binding of memkern::Store as memkern._store.Store (the Python layer, store.py,
// validates arguments and converts dtypes; this layer checks shapes again and releases the GIL
// around the heavy calls).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <tuple>
#include <type_traits>

#include "memkern/errors.h"
#include "memkern/io.h"
#include "memkern/store.h"
#include "utf8.h"

namespace py = pybind11;
using memkern_py::utf8;
using memkern::Store;

namespace {

using F32 = py::array_t<float, py::array::c_style | py::array::forcecast>;
using I64 = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;
// Searches of at most this many queries keep the GIL unless they must wait for a writer.
constexpr size_t kHoldGilRows = 1;
// How often such a call found a writer and released the GIL to wait (_test_gil_waits).
std::atomic<uint64_t> g_gil_waits{0};
using U8 = py::array_t<uint8_t, py::array::c_style | py::array::forcecast>;
using F64 = py::array_t<double, py::array::c_style | py::array::forcecast>;

memkern::FsyncMode parse_fsync(const std::string& s) {
  if (s == "always") return memkern::FsyncMode::Always;
  if (s == "batch") return memkern::FsyncMode::Batch;
  if (s == "never") return memkern::FsyncMode::Never;
  throw memkern::ValueError("fsync: expected \"always\", \"batch\" or \"never\", got \"" + s + "\"");
}

int parse_metric(const std::string& s) {
  if (s.empty()) return -1;
  if (s == "ip") return 0;
  if (s == "l2") return 1;
  if (s == "cos") return 2;
  throw memkern::ValueError("metric: expected \"ip\", \"l2\" or \"cos\", got \"" + s + "\"");
}

void check_matrix(const F32& a, size_t rows, size_t dim, const char* name) {
  if (a.ndim() != 2 || static_cast<size_t>(a.shape(1)) != dim || static_cast<size_t>(a.shape(0)) != rows)
    throw memkern::ValueError(std::string(name) + ": expected shape [" + std::to_string(rows) + ", " + std::to_string(dim) +
                              "]");
}

// Per-item event times (NaN: none); an empty array leaves every item without one.
void set_event_times(std::vector<memkern::NewItem>& items, const F64& t) {
  if (t.size() == 0) return;
  if (static_cast<size_t>(t.size()) != items.size())
    throw memkern::ValueError("event_times: expected " + std::to_string(items.size()) + " values, got " +
                              std::to_string(t.size()));
  for (size_t i = 0; i < items.size(); ++i) items[i].event_time = t.data()[i];
}

std::vector<memkern::NewItem> make_items(const std::vector<std::string>& summaries, const std::vector<std::string>& turns,
                                         const std::vector<std::string>& metas, const F32& emb, const U8& levels,
                                         const I64& parents, size_t dim) {
  size_t n = summaries.size();
  if (turns.size() != n || metas.size() != n || static_cast<size_t>(levels.size()) != n ||
      static_cast<size_t>(parents.size()) != n)
    throw memkern::ValueError("add: summaries, turns, metas, levels and parents must have the same length");
  check_matrix(emb, n, dim, "embeddings");
  std::vector<memkern::NewItem> items(n);
  const float* e = emb.data();
  for (size_t i = 0; i < n; ++i) {
    items[i].level = levels.data()[i];
    items[i].parent = parents.data()[i];
    items[i].summary = summaries[i];
    items[i].turns_json = turns[i];
    items[i].meta_json = metas[i];
    items[i].embedding = e + i * dim;
  }
  return items;
}

// A write returns normally even when an automatic snapshot failed (every write is in the log);
// the failure (the background thread's, since the last call) is logged here, with the GIL held,
// on the "memkern" logger.
void warn_snapshot_failure(Store& s) {
  if (!s.take_unreported_snapshot_failure()) return;
  py::module_::import("logging").attr("getLogger")("memkern").attr("warning")(
      "memkern store %s: automatic snapshot failed (%s); every write is in the log and was kept, the snapshot "
      "is retried later (MemoryStore.last_snapshot_error)",
      s.path(), s.last_snapshot_error());
}

// Runs a store write with the GIL released, then reports a failed automatic snapshot.
template <typename F>
auto write_call(Store& s, F&& f) {
  using R = decltype(f());
  if constexpr (std::is_void_v<R>) {
    {
      py::gil_scoped_release nogil;
      f();
    }
    warn_snapshot_failure(s);
  } else {
    R r = [&] {
      py::gil_scoped_release nogil;
      return f();
    }();
    warn_snapshot_failure(s);
    return r;
  }
}

}  // namespace

// The SearchSpec of a search_ex / search_turn_topic_ex call (filter values: canonical bytes).
static memkern::SearchSpec search_spec(uint8_t mode, uint8_t fusion, double lexical_weight,
                                const std::vector<std::pair<std::string, std::vector<py::bytes>>>& clauses,
                                bool has_time, double t_lo, double t_hi, uint8_t time_field, double half_life,
                                double recency_weight, double now, size_t candidates) {
  if (time_field > 2) throw memkern::ValueError("time_field: expected event, created or updated");
  if (clauses.size() > memkern::kMaxFilterKeys)
    throw memkern::ValueError("filter: expected at most " + std::to_string(memkern::kMaxFilterKeys) + " keys");
  memkern::SearchSpec spec;
  spec.mode = mode;
  spec.fusion = fusion;
  spec.lexical_weight = lexical_weight;
  size_t n_values = 0;
  for (const auto& c : clauses) {
    n_values += c.second.size();
    if (n_values > memkern::kMaxFilterValues)
      throw memkern::ValueError("filter: expected at most " + std::to_string(memkern::kMaxFilterValues) + " values");
    memkern::FilterClause fc;
    fc.key = c.first;
    for (const auto& v : c.second) fc.values.push_back(std::string(v));
    std::sort(fc.values.begin(), fc.values.end());
    spec.filter.clauses.push_back(std::move(fc));
  }
  spec.filter.has_time = has_time;
  spec.filter.t_lo = t_lo;
  spec.filter.t_hi = t_hi;
  spec.filter.time_field = static_cast<memkern::TimeField>(time_field);
  spec.half_life = half_life;
  spec.recency_weight = recency_weight;
  spec.now = now;
  spec.candidates = candidates;
  return spec;
}

void register_store(py::module_& m) {
  py::class_<Store>(m, "Store", "Native memory store; use memkern.MemoryStore instead.")
      .def(py::init([](const std::string& path, uint32_t dim, const std::string& metric, uint32_t M,
                       uint32_t ef_construction, const std::string& fsync, double fsync_interval_s,
                       uint64_t snapshot_every, int num_threads, uint64_t flat_limit, int64_t id_base,
                       int64_t id_end) {
             memkern::StoreOptions o;
             o.dim = dim;
             o.metric = parse_metric(metric);
             o.M = M;
             o.ef_construction = ef_construction;
             o.fsync = parse_fsync(fsync);
             o.fsync_interval_s = fsync_interval_s;
             o.snapshot_every = snapshot_every;
             o.num_threads = num_threads;
             o.flat_limit = flat_limit;
             o.id_base = id_base;
             o.id_end = id_end;
             py::gil_scoped_release nogil;
             return new Store(path, o);
           }),
           py::arg("path"), py::arg("dim"), py::arg("metric"), py::arg("M"), py::arg("ef_construction"),
           py::arg("fsync"), py::arg("fsync_interval_s"), py::arg("snapshot_every"), py::arg("num_threads") = 1,
           py::arg("flat_limit") = memkern::kDefaultFlatLimit, py::arg("id_base") = 0,
           py::arg("id_end") = INT64_MAX)
      .def_static(
          "in_memory",
          // The same engine with persistence off (StoreOptions::in_memory): no file is ever opened.
          [](uint32_t dim, const std::string& metric, uint32_t M, uint32_t ef_construction, int num_threads,
             uint64_t flat_limit, int64_t id_base, int64_t id_end) {
            if (metric.empty()) throw memkern::ValueError("metric: an in-memory store needs a metric (got none)");
            memkern::StoreOptions o;
            o.in_memory = true;
            o.dim = dim;
            o.metric = parse_metric(metric);
            o.M = M;
            o.ef_construction = ef_construction;
            o.num_threads = num_threads;
            o.flat_limit = flat_limit;
            o.id_base = id_base;
            o.id_end = id_end;
            py::gil_scoped_release nogil;
            return std::make_unique<Store>(std::string(), o);
          },
          py::arg("dim"), py::arg("metric"), py::arg("M") = 16, py::arg("ef_construction") = 200,
          py::arg("num_threads") = 1, py::arg("flat_limit") = memkern::kMaxFlatLimit, py::arg("id_base") = 0,
          py::arg("id_end") = INT64_MAX)
      .def_static(
          "open_read_only",
          // A read-only view while another process may write (Store::open_read_only): no LOCK.
          [](const std::string& path, uint32_t dim, const std::string& metric, int num_threads) {
            memkern::StoreOptions o;
            o.dim = dim;
            o.metric = parse_metric(metric);
            o.num_threads = num_threads;
            py::gil_scoped_release nogil;
            return Store::open_read_only(path, o);
          },
          py::arg("path"), py::arg("dim") = 0, py::arg("metric") = "", py::arg("num_threads") = 1)
      .def("refresh", &Store::refresh, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("read_only", &Store::read_only)
      .def_property_readonly("in_memory_mode", &Store::in_memory)
      .def_property_readonly("next_id", &Store::next_id)
      .def_property_readonly("dim", &Store::dim)
      .def_property_readonly("metric", [](const Store& s) { return std::string(memkern::metric_name(s.metric())); })
      .def_property_readonly("M", &Store::M)
      .def_property_readonly("ef_construction", &Store::ef_construction)
      .def_property_readonly("path", &Store::path)
      .def_property_readonly("closed", &Store::closed)
      .def_property_readonly("generation", &Store::generation)
      .def_property_readonly("replayed_entries", &Store::replayed_entries)
      .def_property_readonly("recovered_torn_tail", &Store::recovered_torn_tail)
      .def_property_readonly("store_id", &Store::store_id)
      .def_property_readonly("last_snapshot_error", &Store::last_snapshot_error)
      .def_property_readonly("snapshot_failures", &Store::snapshot_failures)
      .def_property_readonly("commit_groups", &Store::commit_groups,
                             "Group commits led under fsync \"always\" (each one fdatasync).")
      .def_property_readonly("grouped_writes", &Store::grouped_writes,
                             "Writes those group commits covered (grouped_writes / commit_groups per fdatasync).")
      .def_property_readonly("poisoned", &Store::poisoned)
      .def("add",
           [](Store& s, const std::string& ns, const std::vector<std::string>& summaries,
              const std::vector<std::string>& turns, const std::vector<std::string>& metas, const F32& emb,
              const U8& levels, const I64& parents, const F64& event_times) {
             auto items = make_items(summaries, turns, metas, emb, levels, parents, s.dim());
             set_event_times(items, event_times);
             std::vector<int64_t> ids = write_call(s, [&] { return s.add(ns, items); });
             return py::array_t<int64_t>(ids.size(), ids.data());
           },
           py::arg("namespace"), py::arg("summaries"), py::arg("turns_json"), py::arg("metas_json"),
           py::arg("embeddings"), py::arg("levels"), py::arg("parents"), py::arg("event_times") = F64(0))
      .def("new_version",
           [](Store& s, int64_t id, memkern::VersionOp op, std::optional<std::string> summary, std::optional<F32> emb,
              std::optional<std::string> turns, std::optional<std::string> meta, const std::vector<std::string>& c_summaries,
              const std::vector<std::string>& c_turns, const std::vector<std::string>& c_metas, const F32& c_emb,
              bool replace_children, std::optional<double> event_time, const F64& c_event_times) {
             if (emb) check_matrix(*emb, 1, s.dim(), "embedding");
             size_t m = c_summaries.size();
             U8 levels(m);
             I64 parents(m);
             for (size_t i = 0; i < m; ++i) {
               levels.mutable_data()[i] = memkern::kTurn;
               parents.mutable_data()[i] = id;
             }
             auto items = make_items(c_summaries, c_turns, c_metas, c_emb, levels, parents, s.dim());
             set_event_times(items, c_event_times);
             std::vector<int64_t> child_ids;
             uint32_t version = write_call(s, [&] {
               return s.new_version(id, op, summary ? &*summary : nullptr, emb ? emb->data() : nullptr,
                                    turns ? &*turns : nullptr, meta ? &*meta : nullptr, items, &child_ids,
                                    replace_children, event_time ? &*event_time : nullptr);
             });
             return py::make_tuple(version, py::array_t<int64_t>(child_ids.size(), child_ids.data()));
           },
           py::arg("id"), py::arg("op"), py::arg("summary"), py::arg("embedding"), py::arg("turns_json"),
           py::arg("meta_json"), py::arg("child_summaries"), py::arg("child_turns_json"), py::arg("child_metas_json"),
           py::arg("child_embeddings"), py::arg("replace_children"), py::arg("event_time") = py::none(),
           py::arg("child_event_times") = F64(0))
      .def("invalidate",
           [](Store& s, int64_t id, const std::string& reason) { write_call(s, [&] { s.invalidate(id, reason); }); })
      .def("delete", [](Store& s, int64_t id) { return write_call(s, [&] { return s.remove(id); }); })
      .def("import_records",
           // Records with their own ids (memkern.transfer.import_records): per record its id, level,
           // parent, status, reason, timestamps and event time (NaN: none); `versions` lists each
           // record's versions oldest first as (op, summary, turns_json, meta_json, updated_at), the
           // last one current; `embeddings` holds their vectors in that order [sum of versions, dim].
           [](Store& s, const std::string& ns, const I64& ids, const U8& levels, const I64& parents, const U8& statuses,
              const std::vector<std::string>& reasons, const F64& created_at, const F64& updated_at,
              const F64& event_times,
              const std::vector<std::vector<std::tuple<uint8_t, std::string, std::string, std::string, double>>>& versions,
              const F32& embeddings) {
             size_t n = static_cast<size_t>(ids.size());
             if (static_cast<size_t>(levels.size()) != n || static_cast<size_t>(parents.size()) != n ||
                 static_cast<size_t>(statuses.size()) != n || reasons.size() != n ||
                 static_cast<size_t>(created_at.size()) != n || static_cast<size_t>(updated_at.size()) != n ||
                 static_cast<size_t>(event_times.size()) != n || versions.size() != n)
               throw memkern::ValueError("import_records: expected " + std::to_string(n) + " entries in every per-record argument");
             size_t total = 0;
             for (const auto& v : versions) {
               if (v.empty()) throw memkern::ValueError("versions: every record needs at least one version");
               total += v.size();
             }
             check_matrix(embeddings, total, s.dim(), "embeddings");
             std::vector<memkern::ImportItem> items(n);
             const float* e = embeddings.data();
             size_t dim = s.dim();
             for (size_t i = 0; i < n; ++i) {
               memkern::Record& r = items[i].rec;
               r.id = ids.data()[i];
               r.level = levels.data()[i];
               r.parent = parents.data()[i];
               if (statuses.data()[i] > 1) throw memkern::ValueError("statuses: expected 0 (active) or 1 (invalidated)");
               r.status = static_cast<memkern::Status>(statuses.data()[i]);
               r.reason = reasons[i];
               r.created_at = created_at.data()[i];
               r.updated_at = updated_at.data()[i];
               r.event_time = event_times.data()[i];
               const auto& vs = versions[i];
               for (size_t j = 0; j + 1 < vs.size(); ++j, e += dim) {
                 memkern::Version v;
                 v.version = static_cast<uint32_t>(j + 1);
                 v.op = std::get<0>(vs[j]);
                 v.summary = std::get<1>(vs[j]);
                 v.turns_json = std::get<2>(vs[j]);
                 v.meta_json = std::get<3>(vs[j]);
                 v.updated_at = std::get<4>(vs[j]);
                 v.embedding.assign(e, e + dim);
                 r.history.push_back(std::move(v));
               }
               const auto& cur = vs.back();
               r.version = static_cast<uint32_t>(vs.size());
               r.op = std::get<0>(cur);
               r.summary = std::get<1>(cur);
               r.turns_json = std::get<2>(cur);
               r.meta_json = std::get<3>(cur);
               items[i].embedding.assign(e, e + dim);
               e += dim;
             }
             write_call(s, [&] { s.import_records(ns, items); });
           },
           py::arg("namespace"), py::arg("ids"), py::arg("levels"), py::arg("parents"), py::arg("statuses"),
           py::arg("reasons"), py::arg("created_at"), py::arg("updated_at"), py::arg("event_times"),
           py::arg("versions"), py::arg("embeddings"))
      .def("meta_values",
           // Decoded: str, float or bool per distinct value (filter.h's canonical form).
           [](const Store& s, const std::string& ns, const std::string& key, uint8_t level) {
             std::vector<std::string> vals;
             {
               py::gil_scoped_release nogil;
               vals = s.meta_values(ns, key, level);
             }
             py::list out;
             for (const auto& v : vals) {
               if (v.empty()) continue;
               if (v[0] == 's') out.append(utf8(v.substr(1), "meta value"));
               else if (v[0] == 'b') out.append(py::bool_(v == "b1"));
               else if (v[0] == 'n' && v.size() == 9) {
                 double d;
                 std::memcpy(&d, v.data() + 1, 8);
                 out.append(py::float_(d));
               }
             }
             return out;
           },
           py::arg("namespace"), py::arg("key"), py::arg("level") = 0)
      .def("contains", &Store::contains)
      .def("parents",
           [](const Store& s, const I64& ids) {
             size_t n = static_cast<size_t>(ids.size());
             py::array_t<int64_t> out(n);
             int64_t* o = out.mutable_data();
             const int64_t* p = ids.data();
             {
               py::gil_scoped_release nogil;
               s.parents(p, n, o);
             }
             return out;
           })
      // Records come back as StoredRecord / StoredVersion objects (register_records.cpp).
      // A single get / small search is microseconds: it first tries the store's lock with the GIL
      // held, and releases the GIL only to wait for a writer. (Releasing it around every call made
      // each one wait for the GIL again, up to a switch interval, behind busy Python threads.)
      .def("get",
           [](const Store& s, int64_t id) {
             memkern::RecordView v;
             if (!s.try_get(id, v)) {
               g_gil_waits.fetch_add(1, std::memory_order_relaxed);
               py::gil_scoped_release nogil;
               v = s.get(id);
             }
             return v;
           })
      .def("get_batch",
           [](const Store& s, const I64& ids) {
             std::vector<int64_t> v(ids.data(), ids.data() + ids.size());
             py::gil_scoped_release nogil;
             return s.get_batch(v);
           })
      .def("history", &Store::history, py::call_guard<py::gil_scoped_release>())
      .def("embeddings",
           [](const Store& s, const I64& ids) {
             size_t n = static_cast<size_t>(ids.size());
             py::array_t<float> out({n, static_cast<size_t>(s.dim())});
             float* o = out.mutable_data();
             const int64_t* p = ids.data();
             {
               py::gil_scoped_release nogil;
               s.embeddings(p, n, o);
             }
             return out;
           })
      .def("search",
           [](const Store& s, const std::string& ns, const F32& q, size_t k, size_t ef, bool include_invalidated,
              memkern::Level level) {
             if (q.ndim() != 2 || static_cast<size_t>(q.shape(1)) != s.dim())
               throw memkern::ValueError("queries: expected shape [B, " + std::to_string(s.dim()) + "]");
             size_t B = static_cast<size_t>(q.shape(0));
             Store::check_result_size(B, k, ef);  // before the outputs are allocated
             py::array_t<int64_t> ids({B, k});
             py::array_t<float> sc({B, k});
             int64_t* pi = ids.mutable_data();
             float* ps = sc.mutable_data();
             if (B > kHoldGilRows || !s.try_search_into(ns, q.data(), B, k, ef, include_invalidated, level, pi, ps)) {
               if (B <= kHoldGilRows) g_gil_waits.fetch_add(1, std::memory_order_relaxed);
               py::gil_scoped_release nogil;
               s.search_into(ns, q.data(), B, k, ef, include_invalidated, level, pi, ps);
             }
             return py::make_tuple(std::move(ids), std::move(sc));
           })
      .def("search_ex",
           [](const Store& s, const std::string& ns, const F32& q, const std::vector<std::string>& texts, size_t k,
              size_t ef, bool include_invalidated, memkern::Level level, uint8_t mode, uint8_t fusion, double lexical_weight,
              const std::vector<std::pair<std::string, std::vector<py::bytes>>>& clauses, bool has_time, double t_lo,
              double t_hi, uint8_t time_field, double half_life, double recency_weight, double now,
              size_t candidates) {
             if (q.ndim() != 2 || static_cast<size_t>(q.shape(1)) != s.dim())
               throw memkern::ValueError("queries: expected shape [B, " + std::to_string(s.dim()) + "]");
             size_t B = static_cast<size_t>(q.shape(0));
             memkern::SearchSpec spec = search_spec(mode, fusion, lexical_weight, clauses, has_time, t_lo, t_hi,
                                                    time_field, half_life, recency_weight, now, candidates);
             memkern::SearchResult r;
             {
               py::gil_scoped_release nogil;
               r = s.search_ex(ns, q.data(), texts, B, k, ef, include_invalidated, level, spec);
             }
             py::array_t<int64_t> ids({B, k});
             py::array_t<float> sc({B, k});
             std::copy(r.ids.begin(), r.ids.end(), ids.mutable_data());
             std::copy(r.scores.begin(), r.scores.end(), sc.mutable_data());
             return py::make_tuple(ids, sc);
           })
      .def("search_turn_topic_ex",
           [](const Store& s, const std::string& ns, const F32& q, const std::vector<std::string>& texts, size_t k,
              size_t ef, bool include_invalidated, uint8_t mode, uint8_t fusion, double lexical_weight,
              const std::vector<std::pair<std::string, std::vector<py::bytes>>>& clauses, bool has_time, double t_lo,
              double t_hi, uint8_t time_field, double half_life, double recency_weight, double now,
              size_t candidates, double alpha, double neighbour_weight, double group_weight,
              const std::string& group_key) {
             if (q.ndim() != 2 || static_cast<size_t>(q.shape(1)) != s.dim())
               throw memkern::ValueError("queries: expected shape [B, " + std::to_string(s.dim()) + "]");
             memkern::TurnSearchSpec spec;
             spec.first = search_spec(mode, fusion, lexical_weight, clauses, has_time, t_lo, t_hi, time_field,
                                      half_life, recency_weight, now, candidates);
             spec.alpha = alpha;
             spec.neighbour_weight = neighbour_weight;
             spec.group_weight = group_weight;
             spec.group_key = group_key;
             size_t B = static_cast<size_t>(q.shape(0));
             memkern::SearchResult r;
             {
               py::gil_scoped_release nogil;
               r = s.search_turn_topic_ex(ns, q.data(), texts, B, k, ef, include_invalidated, spec);
             }
             py::array_t<int64_t> ids({B, k});
             py::array_t<float> sc({B, k});
             std::copy(r.ids.begin(), r.ids.end(), ids.mutable_data());
             std::copy(r.scores.begin(), r.scores.end(), sc.mutable_data());
             return py::make_tuple(ids, sc);
           })
      .def("search_turn_topic",
           [](const Store& s, const std::string& ns, const F32& q, size_t k, size_t ef, bool include_invalidated,
              float alpha, size_t candidates) {
             if (q.ndim() != 2 || static_cast<size_t>(q.shape(1)) != s.dim())
               throw memkern::ValueError("queries: expected shape [B, " + std::to_string(s.dim()) + "]");
             size_t B = static_cast<size_t>(q.shape(0));
             memkern::SearchResult r;
             {
               py::gil_scoped_release nogil;
               r = s.search_turn_topic(ns, q.data(), B, k, ef, include_invalidated, alpha, candidates);
             }
             py::array_t<int64_t> ids({B, k});
             py::array_t<float> sc({B, k});
             std::copy(r.ids.begin(), r.ids.end(), ids.mutable_data());
             std::copy(r.scores.begin(), r.scores.end(), sc.mutable_data());
             return py::make_tuple(ids, sc);
           })
      .def("namespaces",
           [](const Store& s) {
             py::list out;
             for (const auto& n : s.namespaces()) out.append(utf8(n, "namespace"));
             return out;
           })
      .def("ids",
           [](const Store& s, const std::string& ns, bool include_invalidated, memkern::Level level) {
             std::vector<int64_t> v;
             {
               py::gil_scoped_release nogil;
               v = s.ids(ns, include_invalidated, level);
             }
             return py::array_t<int64_t>(v.size(), v.data());
           })
      .def("count", [](const Store& s, const std::string& ns, bool include_invalidated, memkern::Level level) {
        return s.count(ns, include_invalidated, level);
      })
      .def("flush", &Store::flush, py::call_guard<py::gil_scoped_release>())
      .def("snapshot", &Store::snapshot, py::call_guard<py::gil_scoped_release>())
      .def("snapshot_async", &Store::snapshot_async, py::call_guard<py::gil_scoped_release>())
      .def("compact", &Store::compact, py::call_guard<py::gil_scoped_release>())
      .def("wait_snapshot", [](Store& s) { write_call(s, [&] { s.wait_snapshot(); }); })
      .def_property_readonly("log_files", &Store::log_files)
      .def_property_readonly("last_snapshot_stats", [](const Store& s) {
        memkern::SnapshotStats st = s.last_snapshot_stats();
        py::dict d;
        d["total_s"] = st.total_s;
        d["rotation_hold_s"] = st.rotation_hold_s;  // writer lock held to rotate the log
        d["switch_hold_s"] = st.switch_hold_s;      // writer lock held to switch generations
        d["max_batch_hold_s"] = st.max_batch_hold_s;  // reader lock held by the longest batch of copies
        d["batches"] = st.batches;
        d["copied"] = st.copied;
        d["copied_by_writers"] = st.copied_by_writers;
        d["linked"] = st.linked;
        d["bytes"] = st.bytes;
        return d;
      })
      .def("close", [](Store& s) { write_call(s, [&] { s.close(); }); })
      .def("memory_bytes", &Store::memory_bytes)
      .def("index_kind", [](const Store& s, const std::string& ns, memkern::Level level) { return s.index_kind(ns, level); })
      .def_property_readonly_static("simd_kernel", [](py::object) { return std::string(memkern::simd_kernel_name()); })
      .def_property_readonly_static("pad_score", [](py::object) { return memkern::kPadScore; })
      .def_property_readonly_static("max_k", [](py::object) { return memkern::kMaxK; })
      .def_property_readonly_static("max_ef", [](py::object) { return memkern::kMaxEf; })
      .def_property_readonly_static("max_candidates", [](py::object) { return memkern::kMaxCandidates; })
      .def_property_readonly_static("max_results", [](py::object) { return memkern::kMaxResults; })
      .def_property_readonly_static("max_norm", [](py::object) { return memkern::kMaxNorm; })
      .def_property_readonly_static("max_alpha", [](py::object) { return memkern::kMaxAlpha; })
      .def_property_readonly_static("default_flat_limit", [](py::object) { return memkern::kDefaultFlatLimit; })
      .def_property_readonly_static("max_flat_limit", [](py::object) { return memkern::kMaxFlatLimit; });

  // Test-only hooks (memkern/io.h): not part of the API.
  // The query check of the Python search path (memkern.store.checks.as_queries): one pass, no
  // temporaries. An exponent of all ones is inf or NaN.
  m.def("all_finite",
        [](const py::array_t<float, py::array::c_style>& a) {
          const float* p = a.data();
          uint32_t bad = 0;
          for (py::ssize_t i = 0, n = a.size(); i < n; ++i) {
            uint32_t u;
            std::memcpy(&u, p + i, 4);
            bad |= static_cast<uint32_t>((u & 0x7f800000u) == 0x7f800000u);
          }
          return bad == 0;
        },
        py::arg("a"), "Whether every value of a C-contiguous float32 array is finite (no NaN or inf).");
  // The stored-vector check of the Python write path (memkern.store.checks.as_float32): the same
  // rule as Store::validate_items, so an accepted array is never refused by the engine.
  m.def("stored_rows_ok",
        [](const py::array_t<float, py::array::c_style>& a) {
          if (a.ndim() < 1 || a.size() == 0) return false;
          const py::ssize_t d = a.shape(a.ndim() - 1), rows = a.size() / d;
          const float* p = a.data();
          for (py::ssize_t r = 0; r < rows; ++r, p += d)
            if (!memkern::norm_within_bound(memkern::squared_norm(p, static_cast<size_t>(d)))) return false;
          return true;
        },
        py::arg("a"),
        "Whether a non-empty C-contiguous float32 array holds only finite values and every row (last axis) "
        "has an L2 norm <= max_norm: the check a stored vector passes.");
  m.def("_test_set_lexical", &memkern::set_derived_indexes, py::arg("on"),
        "TEST / BENCH ONLY: whether stores maintain the derived BM25 + meta indexes (default True); a store "
        "written with it off gives incomplete lexical / filtered results until reopened with it on.");
  m.def("_test_set_fault", &memkern::io::set_fault, py::arg("spec"),
        "TEST ONLY: make the Nth write/short write/fsync/rename of the store fail (\"write:N\", \"short:N\", "
        "\"fsync:N\", \"rename:N\", a trailing '+' for every call from the Nth on; \"\" turns it off).");
  m.def("_test_snapshot_gate", &memkern::set_snapshot_gate, py::arg("point"),
        "TEST ONLY: hold the thread writing the next snapshot at \"rotated\", \"copied\", \"written\" or "
        "\"switched\" (memkern/snapshot.h) until _test_release_snapshot_gate(); \"\" turns it off.");
  m.def("_test_wait_snapshot_gate", &memkern::wait_snapshot_gate, py::arg("timeout_s"),
        py::call_guard<py::gil_scoped_release>(),
        "TEST ONLY: whether a snapshot reached the armed gate within timeout_s seconds.");
  m.def("_test_release_snapshot_gate", &memkern::release_snapshot_gate,
        "TEST ONLY: let the snapshot held at the gate go on.");
  m.def("_test_gil_waits", [] { return g_gil_waits.load(); },
        "TEST ONLY: how many single gets / one-query searches found a writer holding the store and released "
        "the GIL to wait for it (the others ran with the GIL held).");
  m.def("_test_io_counters", [] {
    auto c = memkern::io::counters();
    py::dict d;
    d["writes"] = c.writes;
    d["syncs"] = c.syncs;
    d["sync_ns"] = c.sync_ns;
    d["renames"] = c.renames;
    d["faults"] = c.faults;
    return d;
  }, "TEST ONLY: process-wide counts of the store's write(), fsync()/fdatasync() and rename() calls, and the "
        "nanoseconds spent inside the syncs (sync_ns).");
}
