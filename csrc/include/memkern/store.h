// The native memory store: records + one vector index per (namespace, level), a write-ahead log
// and generation snapshots under one directory (formats and crash rules: snapshot.h, log_codec.h).
// Thread safety: any number of concurrent readers (get, search, embeddings, ...) and one writer at
// a time (std::shared_mutex); automatic snapshots are written by a background thread that holds
// the writer lock only to switch logs and generations (microseconds), never while it writes files.
#pragma once
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "memkern/filter.h"
#include "memkern/hnsw_index.h"
#include "memkern/lexical.h"
#include "memkern/vector_index.h"
#include "memkern/record.h"
#include "memkern/snapshot.h"
#include "memkern/space.h"
#include "memkern/wal.h"

namespace memkern {

enum class FsyncMode : int { Always = 0, Batch = 1, Never = 2 };

// Size limits checked before anything is allocated (overflow-safe; the Python layer checks the
// same numbers, exported as Store.max_k etc.).
constexpr uint64_t kMaxK = 1u << 20;            // k of a search
constexpr uint64_t kMaxEf = 1u << 20;           // ef of a search
constexpr uint64_t kMaxCandidates = 1u << 20;   // candidates of a turn+topic search
constexpr uint64_t kMaxResults = 1u << 26;      // B * k result slots of one call (12 bytes each)
constexpr int kMaxThreads = 256;
constexpr size_t kMaxGroup = 256;                // writes one group commit covers at most
constexpr uint64_t kDefaultFlatLimit = 1024;
constexpr uint64_t kMaxFlatLimit = 1u << 24;
// Largest L2 norm of a stored vector or query: |<q, x>| <= ||q|| ||x|| <= 1e36 and
// ||q - x||^2 <= 4e36 stay finite in float32 (max 3.4e38), so no score is ever inf or NaN.
constexpr double kMaxNorm = 1e18;
// The squared L2 norm of v[d], summed in double: finite exactly when every value is (a float32
// squared never overflows a double).
inline double squared_norm(const float* v, size_t d) {
  double s = 0;
  for (size_t j = 0; j < d; ++j) s += static_cast<double>(v[j]) * v[j];
  return s;
}
// Whether a vector of squared norm s is within kMaxNorm: the rule every stored vector and query meets.
inline bool norm_within_bound(double s) { return std::sqrt(s) <= kMaxNorm; }
constexpr double kMaxAlpha = 100.0;             // |alpha| of a turn+topic search (keeps scores finite)
constexpr size_t kMaxQueryTextBytes = 1u << 18; // one query text of a lexical / hybrid search (UTF-8 bytes)
constexpr size_t kMaxFilterKeys = 64;           // keys of one filter
constexpr size_t kMaxFilterValues = 4096;       // values of one filter, all keys together
// Times a write accepts (event_time; unix seconds): years 1-9999 UTC, the range ISO 8601 renders
// (the Python layer's memkern.validate.MIN_TIME / MAX_TIME). Also the largest half-life.
constexpr double kMinTime = -62135596800.0;     // 0001-01-01T00:00:00Z
constexpr double kMaxTime = 253402300799.0;     // 9999-12-31T23:59:59Z
#define MEMKERN_TIME_RANGE "unix seconds in [-62135596800, 253402300799] (years 1-9999 UTC)"
inline bool time_in_range(double t) { return t >= kMinTime && t <= kMaxTime; }  // false for NaN

struct StoreOptions {
  uint32_t dim = 0;          // 0: take it from the existing store
  int metric = -1;           // -1: take it from the existing store
  uint32_t M = 16;
  uint32_t ef_construction = 200;
  FsyncMode fsync = FsyncMode::Always;
  double fsync_interval_s = 1.0;    // Batch mode: at most this long between fsyncs
  uint64_t snapshot_every = 50000;  // logged record operations between automatic snapshots (0: never)
  int num_threads = 1;              // threads inserting the vectors of one batch / answering a query batch
  // A (namespace, level) is answered by exact scan (FlatIndex) while it holds at most this many
  // vectors and by an HNSW graph beyond (promoted on the add that crosses it; compact() demotes).
  uint64_t flat_limit = kDefaultFlatLimit;
  // The ids this store hands out: [id_base, id_end). A store opened with id_base > its next id
  // continues from id_base (a sharded store gives each shard its own range, so ids are unique
  // across shards and a record moved by import_records keeps its id). Not stored: pass the same
  // range on every open.
  int64_t id_base = 0;
  int64_t id_end = INT64_MAX;
  // Persistence off: no directory, log, snapshot or lock; `path` is unused and dim / metric are
  // required. Writes take the same encode -> apply path (the entry is applied, never appended);
  // fsync, fsync_interval_s and snapshot_every are ignored. The records live as long as the Store.
  bool in_memory = false;
  // Open an existing store for reading while another process may write it (Store::open_read_only):
  // no LOCK is taken, nothing on disk is changed, writes raise ValueError; refresh() follows the
  // writer's log. fsync, fsync_interval_s and snapshot_every are ignored.
  bool read_only = false;
};

// One record to add. parent: -1 none, >= 0 an existing topic id, <= -2 the item at index
// (-2 - parent) of the same batch.
struct NewItem {
  uint8_t level = kTopic;
  int64_t parent = -1;
  std::string summary, turns_json, meta_json;
  const float* embedding = nullptr;
  double event_time = kNoEventTime;  // the conversation's own time (unix seconds); NaN: none
};

// One record written with its own id by import_records: `rec` holds its id, level, parent (-1 for a
// topic; a turn's topic: a record of the namespace or an earlier item), status, reason, version,
// op, created_at, updated_at, event_time, texts and history (versions 1..version-1 with their
// vectors); `embedding` is its current vector [dim], stored as given (metric "cos": a unit vector).
struct ImportItem {
  Record rec;
  std::vector<float> embedding;
};

// What search_ex does besides (or instead of) the plain vector search.
struct SearchSpec {
  uint8_t mode = 0;             // 0 dense, 1 lexical (BM25 of `texts`), 2 hybrid (both, fused)
  uint8_t fusion = 2;           // 0 reciprocal rank (k0 = 60), 1 weighted min-max, 2 dense min-max + idf coverage (memkern/fusion.h)
  double lexical_weight = 0.35; // weight of the lexical list (the dense list gets 1 - w)
  SearchFilter filter;          // meta clauses and time range, applied inside the index search
  double half_life = 0;         // recency prior: score += recency_weight * 2^(-max(now - t, 0) / half_life); 0 = off
  double recency_weight = 0.1;
  double now = 0;
  size_t candidates = 50;       // depth of each first-stage list when fusing or re-scoring
};

// What the last snapshot cost (for benchmarks): how long it held the writer lock (rotation,
// switch) and the reader lock (the longest batch of namespace copies), and what it wrote.
struct SnapshotStats {
  double total_s = 0, rotation_hold_s = 0, switch_hold_s = 0, max_batch_hold_s = 0;
  uint64_t batches = 0, copied = 0, copied_by_writers = 0, linked = 0, bytes = 0;
};

// What search_turn_topic_ex does: a first stage over the turn records (dense, lexical or hybrid, as
// in SearchSpec, with its filter / time range / recency prior), then context terms. For turn t,
//   score(t) = own(t) + alpha * sim(q, topic(t)) + neighbour_weight * max(0, base(prev t), base(next t))
//              + group_weight * max(0, max{base(u) : u in S0, group(u) == group(t)})  (+ the recency prior)
// base: the first-stage score over S0 (mode 0: sim(q, t); 1: BM25; 2: the fused score of
// fusion.h over the two `candidates`-deep lists); S0: the first-stage lists, plus (mode 0 with
// alpha != 0) every turn of the top `candidates` topics, scored exactly. base is 0 outside S0.
// own(t) = base(t) on S0; the neighbours of S0's turns are candidates too (neighbour_weight != 0):
// own = sim(q, t) in mode 0, 0 otherwise. A turn's group: the value of meta[group_key] on the turn
// record, else on its topic; the topic itself when group_key is empty or neither holds the key.
// prev / next: the turns of the same group adjacent in id order (write order) that pass the filter.
struct TurnSearchSpec {
  SearchSpec first;              // mode, fusion, lexical_weight, filter, recency, candidates
  double alpha = 0.0;            // weight of sim(q, topic)
  double neighbour_weight = 0.0; // weight of the best adjacent turn's base score
  double group_weight = 0.0;     // weight of the best base score in the turn's group
  std::string group_key;         // "" : the topic is the group
};

// A copy of one record (what get() returns), with a copy of its current vector.
struct RecordView {
  Record rec;
  std::string ns_name;
  std::vector<float> embedding;  // [dim]
};

struct SearchResult {
  std::vector<int64_t> ids;  // [B * k], -1 padded
  std::vector<float> scores; // [B * k], kPadScore padded
};

// Score written beside a -1 padding id: the lowest finite float32.
constexpr float kPadScore = -3.4028234663852886e+38f;

class Store {
 public:
  Store(const std::string& path, const StoreOptions& opt);
  ~Store();
  // A read-only view of the store at `path` (opt.read_only set): the live snapshot plus every log
  // entry intact at the time of the open, read without the LOCK while a writer may be snapshotting
  // (files renamed or removed under it). An open that meets a half-switched state (CORRUPTED or
  // IO errors) is retried from the start, up to kReadOnlyOpenTries times; what persists is raised.
  static std::unique_ptr<Store> open_read_only(const std::string& path, StoreOptions opt);
  static constexpr int kReadOnlyOpenTries = 20;

  uint32_t dim() const { return dim_; }
  Metric metric() const { return metric_; }
  uint32_t M() const { return M_; }
  uint32_t ef_construction() const { return efc_; }
  const std::string& path() const { return path_; }  // "" in memory mode
  bool in_memory() const { return memory_; }
  bool read_only() const { return read_only_; }
  // Read-only views: applies the log entries the writer has appended since the open or the last
  // refresh, under the writer lock (a reader sees every entry whole or not at all), following the
  // log chain across the writer's snapshots. Returns the entries applied, or -1 when this view
  // cannot follow any more (a log it needs was retired by two snapshots, or the store was
  // replaced): reopen it. A store opened for writing returns 0 (its view is always current).
  int64_t refresh();
  // How error messages name this store: "store <path>" or "in-memory store".
  std::string where() const { return memory_ ? std::string("in-memory store") : "store " + path_; }

  std::vector<int64_t> add(const std::string& ns, const std::vector<NewItem>& items);
  // New version of a record (op Merge or Update); null fields keep the current value.
  // `children` are turn records added to the topic in the same atomic log entry;
  // replace_children deletes the topic's existing turn records in that same entry.
  uint32_t new_version(int64_t id, VersionOp op, const std::string* summary, const float* embedding,
                       const std::string* turns_json, const std::string* meta_json,
                       const std::vector<NewItem>& children, std::vector<int64_t>* child_ids,
                       bool replace_children = false, const double* event_time = nullptr);
  void invalidate(int64_t id, const std::string& reason);
  // Writes `items` into namespace `ns` with their own ids, histories and timestamps, in one
  // atomic log entry (LogOp::Import), like add. Refuses (KeyError / ValueError, nothing written)
  // an id the store holds, one it deleted and has not compacted away yet, and one in its own
  // unused range [next id, id_end) (which it would hand out later). The next id does not move.
  void import_records(const std::string& ns, const std::vector<ImportItem>& items);
  int64_t next_id() const;
  std::vector<int64_t> remove(int64_t id);  // the id and its turn records; returns them

  RecordView get(int64_t id) const;
  // get / search_into without waiting: false, and nothing done, when a writer holds the store (the
  // Python binding tries these with the GIL held and releases the GIL only to wait).
  bool try_get(int64_t id, RecordView& out) const;
  bool try_search_into(const std::string& ns, const float* q, size_t B, size_t k, size_t ef,
                       bool include_invalidated, uint8_t level, int64_t* ids, float* scores) const;
  std::vector<RecordView> get_batch(const std::vector<int64_t>& ids) const;
  std::vector<Version> history(int64_t id) const;  // all versions, oldest first, current last
  void embeddings(const int64_t* ids, size_t n, float* out) const;
  SearchResult search(const std::string& ns, const float* q, size_t B, size_t k, size_t ef,
                      bool include_invalidated, uint8_t level) const;
  // search() writing into the caller's ids / scores ([B * k] each; every slot is written, -1 /
  // kPadScore padded). Check the sizes with check_result_size before allocating them.
  void search_into(const std::string& ns, const float* q, size_t B, size_t k, size_t ef, bool include_invalidated,
                   uint8_t level, int64_t* ids, float* scores) const;
  // Throws the ValueError a search of B queries, k results each, beam ef would: the bounds
  // checked before anything is allocated.
  static void check_result_size(size_t B, size_t k, size_t ef);
  // Turns scored as sim(q, turn) + alpha * sim(q, its topic): candidates are the top
  // `candidates` turns plus every turn of the top `candidates` topics, scored exactly.
  SearchResult search_turn_topic(const std::string& ns, const float* q, size_t B, size_t k, size_t ef,
                                 bool include_invalidated, float alpha, size_t candidates) const;
  // Two-level search with a hybrid first stage, filters and context terms (TurnSearchSpec above),
  // in one call; texts: B query texts for modes 1 and 2.
  SearchResult search_turn_topic_ex(const std::string& ns, const float* q, const std::vector<std::string>& texts,
                                    size_t B, size_t k, size_t ef, bool include_invalidated,
                                    const TurnSearchSpec& spec) const;
  // Lexical / hybrid search, metadata filters, time ranges and the recency prior (spec above).
  // q: [B, dim] (zeros are fine for mode 1); texts: B query texts for modes 1 and 2.
  // Filters act inside the search: an exact scan of the records the meta index says match when
  // they are few (|matches|^2 < max(depth, ef) * M * live), else the index search with the filter
  // as hnswlib's BaseFilterFunctor / the flat scan's predicate; BM25 candidates are checked too.
  SearchResult search_ex(const std::string& ns, const float* q, const std::vector<std::string>& texts, size_t B,
                         size_t k, size_t ef, bool include_invalidated, uint8_t level, const SearchSpec& spec) const;
  std::vector<std::string> namespaces() const;
  // Distinct canonical values (filter.h) of the top-level meta key `key` among the namespace's
  // records at `level` (active and invalidated), from the derived meta index: no record is read.
  // Raises ValueError while the derived indexes are off (a benchmark hook).
  std::vector<std::string> meta_values(const std::string& ns, const std::string& key, uint8_t level) const;
  size_t count(const std::string& ns, bool include_invalidated, uint8_t level) const;
  bool contains(int64_t id) const;
  // The topic id of each record (a turn record's parent; -1 for a topic); KeyError naming `ids`
  // for an unknown id, before anything is written to `out`.
  void parents(const int64_t* ids, size_t n, int64_t* out) const;
  // Ids of a namespace's records at `level`, ascending.
  std::vector<int64_t> ids(const std::string& ns, bool include_invalidated, uint8_t level) const;

  // Write semantics (every write: add, new_version, invalidate, remove): the entry is appended
  // to the log (a failed or short write is cut back off), synced when fsync is "always" (or a
  // "batch" interval is due; a failed sync removes the entry again), and only then applied in
  // memory. So a call that raises has changed nothing, in memory or on disk, and a call that
  // returns is durable. The automatic snapshot (snapshot_every logged operations after the last
  // one) is handed to the background thread: the write returns at once, and a failure of the
  // snapshot is recorded in last_snapshot_error() and retried snapshot_every operations later.
  // When the store cannot know its own state on disk any more (the log could not be cut back
  // after a failed write, or a compaction could not be written), it is *poisoned*: reads keep
  // working, writes raise IOError until the store is reopened.
  // In memory mode there is nothing to write: flush, snapshot and snapshot_async only check that
  // the store is writable, compact drops deleted records' vectors and tombstones (no snapshot),
  // close drops the records.
  void flush();     // fsync the log
  // Writes a snapshot now, in the calling thread (after one the background thread is writing), and
  // retires the log files it holds; other calls go on meanwhile. Raises on failure (nothing lost:
  // the log chain keeps every write).
  void snapshot();
  // Hands a snapshot to the background thread and returns at once (what the automatic one does);
  // a failure is recorded like the automatic one's.
  void snapshot_async();
  void compact();   // drop deleted records and their vectors from the graphs, then snapshot
  // Waits for the background snapshot in progress (if any) to end.
  void wait_snapshot();
  // Waits for a snapshot in progress, snapshots if the log holds anything (only the namespaces
  // changed since the last snapshot are written; a failure is recorded, not raised: the log keeps
  // the data), fsyncs the log, releases the lock. Raises IOError (after releasing everything)
  // only when the final fsync of the log failed.
  void close();
  bool closed() const { return closed_; }
  size_t memory_bytes() const;  // approximate heap bytes (records + graphs)
  // Index kind ("flat", "hnsw" or "" when none) of a namespace's level (tests, stats).
  std::string index_kind(const std::string& ns, uint8_t level) const;
  uint64_t generation() const;
  // What opening found: log entries replayed, and whether a torn last entry was cut off.
  uint64_t replayed_entries() const { return replayed_; }
  bool recovered_torn_tail() const { return torn_tail_; }
  // Random id of this store, in CURRENT and in the log header (0: an old store without one yet).
  uint64_t store_id() const { return store_id_; }
  // Why the last automatic snapshot failed ("" when it succeeded or none ran), and how many failed.
  std::string last_snapshot_error() const;
  uint64_t snapshot_failures() const;
  SnapshotStats last_snapshot_stats() const;
  // Group commit under fsync "always": groups led and the writes they held (writes / groups is the
  // number of writes one fdatasync covered on average).
  uint64_t commit_groups() const { return groups_.load(); }
  uint64_t grouped_writes() const { return grouped_writes_.load(); }
  // True once per failure of an automatic snapshot not reported yet (the bindings log a warning).
  bool take_unreported_snapshot_failure();
  // Files of the log chain (snapshot.h, "Logs"), oldest first; the last one takes the appends.
  std::vector<std::string> log_files() const;
  // Why writes are refused ("" when they are not).
  std::string poisoned() const;

 private:
  struct Namespace {
    std::string name;
    std::unique_ptr<VectorIndex> index[kNumLevels];
    std::unordered_set<int64_t> invalidated[kNumLevels];
    size_t n[kNumLevels] = {0, 0};  // records held (active + invalidated)
    std::vector<int64_t> tombstones;  // ids deleted from it (until compaction), written in its blob
    // Its blob in the live snapshot (pack 0: none) and the graph files that blob names; `dirty`:
    // changed since (or never written), so the next snapshot copies it.
    BlobRef blob;
    std::string graph_file[kNumLevels];
    bool dirty = true;
    // Derived state (never persisted: rebuilt from the records on open, kept in step by apply()).
    lexical::LexicalIndex lex[kNumLevels];  // BM25 postings of the records' summaries
    MetaIndex meta[kNumLevels];             // (meta key, canonical scalar) -> ids
    TimeIndex times[kNumLevels];            // ids ordered by event / created / updated time
  };

  // Derived state of one record: index (after it is in records_) / unindex (before it changes or goes).
  // No-ops until ensure_derived() has built the derived state (a store opened from a snapshot
  // builds it on the first call that reads it; the build reads every record, so writes before it
  // are covered).
  void index_derived(const Record& r);
  void unindex_derived(const Record& r);
  // The time index is kept apart: timestamps change on more operations (invalidate, event time).
  void index_times(const Record& r);
  void unindex_times(const Record& r);
  // Builds the derived state (BM25 postings, meta and time indexes) from the records, once.
  // The caller holds mu_ (shared or unique); concurrent callers wait for the one that builds.
  void ensure_derived() const;
  void build_derived(const Record& r);  // what index_derived / index_times add, whether or not built
  void build_times(const Record& r);
  bool meta_matches(const Record& r, const SearchFilter& f) const;

  void check_open() const;
  void check_writable() const;  // open and not poisoned
  void configure(const StoreOptions& opt);  // checks and takes the options both modes share
  void open_or_create(const StoreOptions& opt);
  void open_in_memory(const StoreOptions& opt);
  // Read-only views: the log being followed (tail_fd_ open on it; -1 when none yet).
  int tail_fd_ = -1;
  uint64_t tail_gen_ = 0, tail_off_ = 0;
  uint32_t tail_format_ = kWalFormat;
  bool read_only_ = false;
  void load_snapshot(uint64_t gen);
  void load_snapshot_v2(const std::string& dir, const std::string& data, const std::string& file);
  void check_loaded(const std::string& file);  // records vs indexes vs links; derived indexes

  // Snapshots (snapshot.cpp; the procedure: snapshot.h). run_snapshot needs snap_run_mu_ and not mu_.
  struct SnapJob;
  struct NsImage;
  // `compacting`: every namespace is copied and no tombstone is kept (compact()).
  void run_snapshot(bool compacting = false);
  void write_snapshot_files(SnapJob& job, const std::string& dir);  // steps 3-4 (up to the switch)
  void auto_snapshot();       // run_snapshot, recording instead of raising a failure (background thread)
  void request_snapshot();    // wakes the background thread (writer lock held)
  void snapshot_thread_main();
  void stop_snapshot_thread();
  // Copy-on-write: before a write changes namespace `nsi` while a snapshot copies namespaces, the
  // namespace is copied as it was when the snapshot started (writer lock held).
  void before_change(uint32_t nsi);
  uint32_t find_ns_index(const std::string& name) const;  // UINT32_MAX when none
  std::unique_ptr<NsImage> copy_namespace(uint32_t i) const;  // any lock held
  void replay(const std::string& payload);
  uint32_t ns_index(const std::string& name);  // creates
  const Namespace* find_ns(const std::string& name) const;
  VectorIndex& index_for(Namespace& ns, uint8_t level);
  // Before `adding` new vectors go into (ns, level): promotes a FlatIndex that would then hold
  // more than flat_limit_ vectors to an HNSW graph, and reserves room for them.
  void prepare_index(Namespace& ns, uint8_t level, size_t adding);
  // A fresh index holding `labels`' vectors copied from `from` (flat if few enough, else HNSW).
  std::unique_ptr<VectorIndex> rebuild_index(const VectorIndex& from, const std::vector<int64_t>& labels,
                                             uint8_t level, size_t extra) const;
  void check_query(const float* q, size_t B, size_t k, size_t ef) const;
  const Record& rec_or_throw(int64_t id, const char* what) const;
  // search_into's body; the caller holds mu_ shared.
  void search_locked(const std::string& ns, const float* q, size_t B, size_t k, size_t ef,
                     bool include_invalidated, uint8_t level, int64_t* ids, float* scores) const;
  Version current_version(const Record& r) const;
  // Log, apply, maybe request a snapshot; `nsi`: the namespace the entry changes (UINT32_MAX: a new one).
  void commit(const std::string& payload, uint64_t ops, uint32_t nsi);
  void apply(const std::string& payload);
  struct PendingPut {
    Namespace* ns;
    uint8_t level;
    int64_t id;
    std::vector<float> vec;
  };
  void put_vectors(std::vector<PendingPut>& pending);
  void maybe_sync();
  bool snapshot_due() const;  // an automatic snapshot should start after this write (writer lock held)

  // Group commit (fsync "always"): writers queue, and the one at the front leads. Under the writer
  // lock it runs every queued write in order, logging and applying each; the last one's fdatasync
  // covers the whole group before that last write is applied, and no write of the group returns
  // before it. A lone writer is a group of one: exactly the path without a queue.
  struct GroupWrite;
  template <class F>
  auto write(F&& body) -> decltype(body());  // `body` runs with the writer lock held
  void run_grouped(GroupWrite& w);
  void lead_group(const std::vector<GroupWrite*>& group);  // records each write's error, never throws
  std::mutex group_mu_;                   // guards group_queue_ and each GroupWrite's `done`
  std::condition_variable group_cv_;
  std::deque<GroupWrite*> group_queue_;
  // The group being led (writer lock held).
  bool in_group_ = false;
  bool group_last_ = true;                // the write running is the group's last: it syncs
  bool group_sync_failed_ = false;        // that sync failed (never retried: its pages may be lost)
  std::atomic<uint64_t> groups_{0}, grouped_writes_{0};
  // Set when a group's fsync failed after other writes of it were applied in memory: those
  // writes raised and are cut from the log, so reads and writes are refused until a reopen.
  std::string lost_;

  void prepare_vector(const float* in, float* out) const;  // copy (+ normalise for cos)
  // Row b of the query matrix q as the indexes compare it: for metric cos an L2-normalised copy
  // in `buf` (prepare_vector, as the stored vectors were), else q's own row (no copy).
  const float* query_row(const float* q, size_t b, std::vector<float>& buf) const;
  void validate_items(const std::vector<NewItem>& items, size_t batch_base, bool allow_batch_parents) const;
  void check_id_room(size_t n) const;  // n new ids fit below id_end
  void encode_new_items(Writer& w, const std::string& ns, const std::vector<NewItem>& items, int64_t first_id,
                  double now) const;

  std::string path_;
  bool memory_ = false;  // persistence off (StoreOptions::in_memory)
  uint32_t dim_ = 0;
  Metric metric_ = Metric::IP;
  uint32_t M_ = 16, efc_ = 200;
  FsyncMode fsync_ = FsyncMode::Always;
  double fsync_interval_s_ = 1.0;
  double last_sync_ = 0;
  bool dirty_ = false;
  uint64_t snapshot_every_ = 0;
  int threads_ = 1;
  uint64_t flat_limit_ = kDefaultFlatLimit;
  uint64_t ops_since_snapshot_ = 0;
  uint64_t generation_ = 0;
  int64_t next_id_ = 0;
  int64_t id_base_ = 0, id_end_ = INT64_MAX;
  int lock_fd_ = -1;
  bool closed_ = false;
  uint64_t replayed_ = 0;
  bool torn_tail_ = false;
  uint64_t store_id_ = 0;
  bool opened_before_ = false;      // LOCK held a pid: a store was created in this directory before
  uint64_t snapshot_retry_at_ = 0;  // after a failed automatic snapshot: retry at this many ops
  std::atomic<uint64_t> snapshot_failures_{0};  // read without the lock after every write call
  std::string last_snapshot_error_;
  std::string poison_;
  std::atomic<uint64_t> reported_failures_{0};
  // The log chain: files before the last one (complete and synced), the last one's generation.
  std::vector<std::string> chain_;
  uint64_t log_gen_ = 0;
  std::vector<int64_t> orphan_tombstones_;  // deleted ids from a format 1-2 snapshot (namespace unknown)
  std::map<uint64_t, uint64_t> packs_;      // pack files of the live snapshot: number -> size
  SnapJob* job_ = nullptr;                  // the snapshot between its start and its switch (under mu_)
  SnapshotStats last_stats_;
  // The background snapshot thread (started by the first automatic snapshot).
  std::thread snap_thread_;
  std::mutex snap_mu_;                      // guards the three flags below
  std::condition_variable snap_cv_;
  bool snap_wanted_ = false, snap_busy_ = false, snap_stop_ = false;
  std::mutex snap_run_mu_;                  // one snapshot (or compaction) at a time

  std::unique_ptr<Space> space_;
  std::vector<float> zeros_;  // [dim] (||q||^2 = l2 distance to it)
  std::vector<std::unique_ptr<Namespace>> ns_;
  std::unordered_map<std::string, uint32_t> ns_by_name_;
  std::unordered_map<int64_t, Record> records_;
  std::unordered_set<int64_t> tombstones_;  // deleted ids (until compaction)
  std::unordered_map<int64_t, MetaScalars> meta_scalars_;  // derived: filterable meta of records that have any
  // Whether the derived state is built (set false by a snapshot load; ensure_derived sets it)
  mutable std::atomic<bool> derived_ready_{true};
  mutable std::mutex derived_mu_;
  Wal wal_;
  mutable std::shared_mutex mu_;
};

const char* metric_name(Metric m);

// Test / benchmark hook: whether stores maintain the derived lexical + meta indexes (default on).
// Off, writes cost what they cost before these indexes existed (bench_lexical.py compares).
void set_derived_indexes(bool on);
bool derived_indexes();

}  // namespace memkern
