#include "memkern/store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <thread>
#include <climits>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <queue>
#include <tuple>

#include "memkern/crc32.h"
#include "memkern/errors.h"
#include "memkern/flat_index.h"
#include "memkern/io.h"
#include "memkern/serial.h"
#include "memkern/snapshot.h"

namespace memkern {
namespace {

enum Op : uint8_t { kOpAdd = 1, kOpVersion = 2, kOpInvalidate = 3, kOpDelete = 4 };
enum VersionFlags : uint8_t { kHasSummary = 1, kHasEmbedding = 2, kHasTurns = 4, kHasMeta = 8 };
constexpr char kSnapMagic[8] = {'M', 'K', 'S', 'N', 'A', 'P', 0, 0};
constexpr uint32_t kMaxDim = 1u << 16;
constexpr uint32_t kMaxM = 4096;
constexpr uint32_t kMaxEfConstruction = 1u << 20;

double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

bool exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}

std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") out.push_back(n);
  }
  ::closedir(d);
  return out;
}

void remove_tree(const std::string& dir) {  // one level deep: snapshot directories hold files only
  for (const auto& n : list_dir(dir)) ::unlink((dir + "/" + n).c_str());
  ::rmdir(dir.c_str());
}

// Heap bytes of a string beyond its inline (small-string) buffer.
size_t heap(const std::string& s) { return s.capacity() > 15 ? s.capacity() + 1 : 0; }

std::string num(double x) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.3g", x);
  return b;
}

std::string describe(uint32_t dim, Metric m) {
  return "dim=" + std::to_string(dim) + ", metric=\"" + metric_name(m) + "\"";
}

}  // namespace

const char* metric_name(Metric m) {
  switch (m) {
    case Metric::IP: return "ip";
    case Metric::L2: return "l2";
    case Metric::Cos: return "cos";
  }
  return "?";
}

// ------------------------------------------------------------------------------- open / close

Store::Store(const std::string& path, const StoreOptions& opt) : path_(path) {
  if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) throw IOError("create directory " + path + ": " + std::strerror(errno));
  std::string lock = path + "/LOCK";
  lock_fd_ = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd_ < 0) throw IOError("open " + lock + ": " + std::strerror(errno));
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    ::close(lock_fd_);
    lock_fd_ = -1;
    throw IOError("store " + path + " is already open (by another process or another MemoryStore in this one); "
                  "close it first");
  }
  // The pid is written once the store is open, so a non-empty LOCK means a store was created here
  // (a crash in the middle of creating one leaves it empty).
  struct stat lst;
  opened_before_ = ::fstat(lock_fd_, &lst) == 0 && lst.st_size > 0;
  try {
    open_or_create(opt);
  } catch (...) {
    wal_.close();
    ::close(lock_fd_);
    lock_fd_ = -1;
    throw;
  }
  std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(lock_fd_, 0) == 0) {
    ssize_t w = ::pwrite(lock_fd_, pid.data(), pid.size(), 0);
    (void)w;
  }
}

Store::~Store() {
  try {
    close();
  } catch (...) {
  }
}

void Store::open_or_create(const StoreOptions& opt) {
  M_ = opt.M;
  efc_ = opt.ef_construction;
  fsync_ = opt.fsync;
  fsync_interval_s_ = opt.fsync_interval_s;
  snapshot_every_ = opt.snapshot_every;
  if (opt.num_threads < 1 || opt.num_threads > kMaxThreads)
    throw ValueError("num_threads: expected 1.." + std::to_string(kMaxThreads) + ", got " + std::to_string(opt.num_threads));
  threads_ = opt.num_threads;
  if (opt.flat_limit > kMaxFlatLimit)
    throw ValueError("flat_limit: expected 0.." + std::to_string(kMaxFlatLimit) + ", got " + std::to_string(opt.flat_limit));
  flat_limit_ = opt.flat_limit;
  if (!std::isfinite(opt.fsync_interval_s) || opt.fsync_interval_s < 0)
    throw ValueError("fsync_interval: expected finite seconds >= 0, got " + std::to_string(opt.fsync_interval_s));
  if (opt.dim > kMaxDim) throw ValueError("dim: expected 1.." + std::to_string(kMaxDim) + ", got " + std::to_string(opt.dim));
  if (opt.metric < -1 || opt.metric > 2) throw ValueError("metric: expected ip, l2 or cos");
  if (opt.M < 2 || opt.M > kMaxM) throw ValueError("M: expected 2.." + std::to_string(kMaxM) + ", got " + std::to_string(opt.M));
  if (opt.ef_construction < 1 || opt.ef_construction > kMaxEfConstruction)
    throw ValueError("ef_construction: expected 1.." + std::to_string(kMaxEfConstruction) + ", got " +
                     std::to_string(opt.ef_construction));

  io::set_fault_from_env();  // test-only fault injection (memkern/io.h); off unless MEMKERN_FAULT is set
  const std::string wal_file = path_ + "/wal.log";
  Current cur = read_current(path_);
  uint64_t gen = cur.generation;
  bool have_wal = exists(wal_file);
  bool have_snapshot = gen != kNoGeneration;
  if (!have_snapshot) {
    for (const auto& n : list_dir(path_))
      if (n.rfind("snap-", 0) == 0 && n.find(".tmp") == std::string::npos && have_wal == false)
        throw CorruptedError("store " + path_ + ": snapshot directory " + n + " exists but CURRENT is missing");
  }
  if (!have_snapshot && !have_wal && opened_before_)
    throw CorruptedError("store " + path_ + ": the directory held a store (its LOCK file) but wal.log and CURRENT "
                         "are missing (deleted?): its records would be lost, so no new store is created over it; "
                         "restore the files, or remove the directory to start a new store");
  if (have_snapshot && !have_wal)  // a snapshot's log is replaced by rename, never removed
    throw CorruptedError("store " + path_ + ": the write-ahead log wal.log is missing (deleted?): the writes made "
                         "since snapshot " + std::to_string(gen) + " would be lost, so the store is not opened; "
                         "restore wal.log");
  std::vector<std::string> entries;
  WalScan scan;
  WalHeader wh;
  if (have_wal) wh = Wal::read(wal_file, &entries, &scan);
  torn_tail_ = scan.torn;  // not fatal: the last write was interrupted and never acknowledged
  if (have_snapshot && have_wal) {
    // The log must be this store's: same id, and the snapshot's generation (or the one before,
    // left by a crash between switching CURRENT and replacing the log).
    bool stale_legacy = wh.store_id == 0 && wh.generation < gen;  // an id-less log the snapshot holds
    if (wh.store_id != cur.store_id && !stale_legacy)
      throw CorruptedError("store " + path_ + ": wal.log belongs to another store (its store id " +
                           std::to_string(wh.store_id) + ", this store's " + std::to_string(cur.store_id) +
                           "); refusing to replay it");
    if (wh.generation + 1 < gen)
      throw CorruptedError("store " + path_ + ": wal.log is from generation " + std::to_string(wh.generation) +
                           ", older than the snapshot's previous one (" + std::to_string(gen) +
                           "): the current log was replaced, its writes would be lost");
    store_id_ = cur.store_id;
  } else if (have_wal) {
    store_id_ = wh.store_id;
  } else {
    store_id_ = new_store_id();
  }

  if (have_snapshot) {
    load_snapshot(gen);
    generation_ = gen;
  } else if (have_wal) {
    if (wh.generation != 0)
      throw CorruptedError("store " + path_ + ": log generation " + std::to_string(wh.generation) +
                           " but no snapshot (CURRENT missing)");
    if (wh.dim == 0 || wh.dim > kMaxDim || wh.metric > 2) throw CorruptedError("store " + path_ + ": log header has a bad dim/metric");
    dim_ = wh.dim;
    metric_ = static_cast<Metric>(wh.metric);
    generation_ = 0;
  } else {
    if (opt.dim == 0) throw ValueError("dim: a new store at " + path_ + " needs dim (got none)");
    if (opt.metric < 0) throw ValueError("metric: a new store needs a metric");
    dim_ = opt.dim;
    metric_ = static_cast<Metric>(opt.metric);
    generation_ = 0;
  }
  // What the caller asked for must match what the store holds.
  if ((opt.dim && opt.dim != dim_) || (opt.metric >= 0 && static_cast<Metric>(opt.metric) != metric_)) {
    throw ValueError("store " + path_ + " holds " + describe(dim_, metric_) + "; it was opened with " +
                     describe(opt.dim ? opt.dim : dim_, opt.metric >= 0 ? static_cast<Metric>(opt.metric) : metric_));
  }
  if (!space_) space_.reset(new Space(dim_, metric_));
  zeros_.assign(dim_, 0.0f);

  if (have_wal && (wh.dim != dim_ || wh.metric != static_cast<uint32_t>(metric_)))
    throw CorruptedError("store " + path_ + ": log header (" + std::to_string(wh.dim) + ") disagrees with the snapshot");
  bool replay_log = have_wal && wh.generation == generation_;
  if (have_wal && wh.generation > generation_)
    throw CorruptedError("store " + path_ + ": log generation " + std::to_string(wh.generation) +
                         " is newer than snapshot generation " + std::to_string(generation_));
  if (replay_log) {
    for (const auto& e : entries) apply(e);
    replayed_ = entries.size();
  } else {
    // No log yet, or a log whose content the snapshot already holds (a crash came between
    // switching CURRENT and truncating the log).
    WalHeader h;
    h.dim = dim_;
    h.metric = static_cast<uint32_t>(metric_);
    h.generation = generation_;
    h.store_id = store_id_;
    Wal::create(path_, "wal.log", h);
  }
  if (replay_log && scan.torn) Wal::cut(wal_file, scan.good_end);  // appends start at a clean boundary
  // Leftovers of an interrupted snapshot.
  for (const auto& n : list_dir(path_)) {
    if (n.rfind("snap-", 0) == 0 && n != snapshot_dir_name(generation_)) remove_tree(path_ + "/" + n);
    if (n.size() > 4 && n.compare(n.size() - 4, 4, ".tmp") == 0) ::unlink((path_ + "/" + n).c_str());
  }
  wal_.open_append(wal_file);
  ops_since_snapshot_ = entries.size();
  last_sync_ = now_s();
}

void Store::load_snapshot(uint64_t gen) {
  const std::string dir = path_ + "/" + snapshot_dir_name(gen);
  const std::string file = dir + "/records.bin";
  std::string data;
  if (!read_file(file, &data)) throw CorruptedError("snapshot " + file + " is missing");
  Reader hdr(data.data(), data.size(), "snapshot " + file);
  if (data.size() < 24) hdr.fail("truncated header");
  if (std::memcmp(data.data(), kSnapMagic, 8) != 0) hdr.fail("bad magic");
  hdr.u64();
  uint32_t format = hdr.u32();
  if (format != kFormatVersion)
    hdr.fail("format version " + std::to_string(format) + " (this build reads " + std::to_string(kFormatVersion) + ")");
  uint64_t body_len = hdr.u64();
  if (body_len != data.size() - 24) hdr.fail("size " + std::to_string(data.size()) + " does not match its header (truncated?)");
  uint32_t c;
  std::memcpy(&c, data.data() + data.size() - 4, 4);
  if (crc32(data.data(), data.size() - 4) != c) hdr.fail("checksum mismatch");
  Reader rd(data.data() + 20, body_len, "snapshot " + file);

  dim_ = rd.u32();
  uint32_t metric = rd.u32();
  if (dim_ == 0 || dim_ > kMaxDim || metric > 2) rd.fail("bad dim/metric");
  metric_ = static_cast<Metric>(metric);
  M_ = rd.u32();
  efc_ = rd.u32();
  next_id_ = rd.i64();
  if (M_ < 2 || M_ > kMaxM || efc_ < 1 || efc_ > kMaxEfConstruction) rd.fail("bad graph parameters");
  if (next_id_ < 0 || next_id_ == INT64_MAX) rd.fail("bad next id");
  space_.reset(new Space(dim_, metric_));
  uint64_t n_ns = rd.count(8);
  for (uint64_t i = 0; i < n_ns; ++i) {
    auto ns = std::make_unique<Namespace>();
    ns->name = rd.str();
    ns_by_name_[ns->name] = static_cast<uint32_t>(ns_.size());
    ns_.push_back(std::move(ns));
  }
  uint64_t n_rec = rd.count(64);
  records_.reserve(n_rec);
  for (uint64_t i = 0; i < n_rec; ++i) {
    Record r = read_record_fields(rd);
    if (r.ns >= ns_.size()) rd.fail("record namespace out of range");
    uint64_t nh = rd.count(40);
    r.history.reserve(nh);
    for (uint64_t j = 0; j < nh; ++j) r.history.push_back(read_version(rd, dim_));
    uint64_t nc = rd.count(8);
    r.children.resize(nc);
    for (uint64_t j = 0; j < nc; ++j) r.children[j] = rd.i64();
    if (r.id < 0 || r.id >= next_id_) rd.fail("record id out of range");
    int64_t id = r.id;
    if (!records_.emplace(id, std::move(r)).second) rd.fail("duplicate record id");
  }
  uint64_t n_tomb = rd.count(8);
  for (uint64_t i = 0; i < n_tomb; ++i) tombstones_.insert(rd.i64());
  uint64_t n_graphs = rd.count(16);
  for (uint64_t i = 0; i < n_graphs; ++i) {
    uint32_t ns = rd.u32();
    uint8_t level = rd.u8();
    std::string name = rd.str();
    uint64_t size = rd.u64();
    uint32_t crc = rd.u32();
    if (ns >= ns_.size() || level >= kNumLevels || name.find('/') != std::string::npos || ns_[ns]->index[level])
      rd.fail("bad graph table entry");
    // Size, checksum, then structure (FlatIndex or hnswlib graph) before anything is allocated.
    ns_[ns]->index[level] = load_vector_index(space_.get(), dim_, dir + "/" + name, size, crc);
  }
  if (rd.left() != 0) rd.fail("trailing bytes");
  // Cross-check records against graphs.
  size_t per_level[kNumLevels] = {0, 0};
  for (auto& kv : records_) {
    const Record& r = kv.second;
    Namespace& ns = *ns_[r.ns];
    if (!ns.index[r.level] || !ns.index[r.level]->contains(r.id))
      throw CorruptedError("snapshot " + file + ": record " + std::to_string(r.id) + " has no vector in its graph");
    ns.n[r.level]++;
    per_level[r.level]++;
    if (r.status == Status::Invalidated) ns.invalidated[r.level].insert(r.id);
  }
  for (auto& kv : records_) {  // topic <-> turn links
    const Record& r = kv.second;
    if (r.level == kTurn) {
      auto p = records_.find(r.parent);
      if (p == records_.end() || p->second.level != kTopic || p->second.ns != r.ns ||
          std::find(p->second.children.begin(), p->second.children.end(), r.id) == p->second.children.end())
        throw CorruptedError("snapshot " + file + ": turn record " + std::to_string(r.id) + " is not linked to its topic");
    } else {
      if (r.parent != -1) throw CorruptedError("snapshot " + file + ": topic record with a parent");
      for (int64_t c : r.children) {
        auto ch = records_.find(c);
        if (ch == records_.end() || ch->second.parent != r.id || ch->second.level != kTurn)
          throw CorruptedError("snapshot " + file + ": topic " + std::to_string(r.id) + " links a bad turn record");
      }
    }
  }
  for (auto& ns : ns_)
    for (int l = 0; l < kNumLevels; ++l)
      if (ns->index[l] && ns->index[l]->live() != ns->n[l])
        throw CorruptedError("snapshot " + file + ": graph of namespace '" + ns->name + "' holds " +
                             std::to_string(ns->index[l]->live()) + " vectors for " + std::to_string(ns->n[l]) + " records");
}

void Store::close() {
  std::unique_lock<std::shared_mutex> lk(mu_);
  if (closed_) return;
  std::string sync_error;
  bool snapped = false;
  if (poison_.empty()) {
    if (ops_since_snapshot_ > 0) {
      auto_snapshot();  // makes the next open fast (no log replay); the log holds the data anyway
      snapped = ops_since_snapshot_ == 0;
    }
    if (!snapped && poison_.empty()) {
      try {
        wal_.sync();
      } catch (const std::exception& e) {
        sync_error = e.what();
      }
    }
  }
  wal_.close();
  if (lock_fd_ >= 0) {
    ::close(lock_fd_);  // releases the flock
    lock_fd_ = -1;
  }
  records_.clear();
  ns_.clear();
  ns_by_name_.clear();
  tombstones_.clear();
  closed_ = true;
  if (!sync_error.empty()) throw IOError("close " + path_ + ": " + sync_error);
}

void Store::check_open() const {
  if (closed_) throw ValueError("store " + path_ + " is closed");
}

void Store::check_writable() const {
  check_open();
  if (!poison_.empty())
    throw IOError("store " + path_ + " refuses writes until it is reopened: " + poison_);
}

std::string Store::last_snapshot_error() const {
  std::shared_lock<std::shared_mutex> lk(mu_);
  return last_snapshot_error_;
}

uint64_t Store::snapshot_failures() const {
  std::shared_lock<std::shared_mutex> lk(mu_);
  return snapshot_failures_;
}

std::string Store::poisoned() const {
  std::shared_lock<std::shared_mutex> lk(mu_);
  return poison_;
}

// ------------------------------------------------------------------------------- helpers

uint32_t Store::ns_index(const std::string& name) {
  auto it = ns_by_name_.find(name);
  if (it != ns_by_name_.end()) return it->second;
  auto ns = std::make_unique<Namespace>();
  ns->name = name;
  uint32_t i = static_cast<uint32_t>(ns_.size());
  ns_.push_back(std::move(ns));
  ns_by_name_[name] = i;
  return i;
}

const Store::Namespace* Store::find_ns(const std::string& name) const {
  auto it = ns_by_name_.find(name);
  return it == ns_by_name_.end() ? nullptr : ns_[it->second].get();
}

VectorIndex& Store::index_for(Namespace& ns, uint8_t level) {
  if (!ns.index[level]) ns.index[level].reset(new FlatIndex(space_.get(), dim_));  // grows from zero
  return *ns.index[level];
}

std::unique_ptr<VectorIndex> Store::rebuild_index(const VectorIndex& from, const std::vector<int64_t>& labels,
                                                  uint8_t level, size_t extra) const {
  size_t n = labels.size() + extra;
  std::unique_ptr<VectorIndex> fresh;
  if (n <= flat_limit_) fresh.reset(new FlatIndex(space_.get(), dim_, n));
  else fresh.reset(new HnswIndex(space_.get(), dim_, M_, efc_, n, 100 + level));
  std::vector<float> v(dim_);
  for (int64_t lab : labels) {
    from.vector(lab, v.data());
    fresh->put(lab, v.data());
  }
  return fresh;
}

void Store::prepare_index(Namespace& ns, uint8_t level, size_t adding) {
  VectorIndex& idx = index_for(ns, level);
  if (std::strcmp(idx.kind(), "flat") == 0 && idx.live() + adding > flat_limit_) {
    ns.index[level] = rebuild_index(idx, idx.labels(), level, adding);  // promotion to HNSW
  } else {
    idx.reserve_more(adding);
  }
}

std::string Store::index_kind(const std::string& name, uint8_t level) const {
  std::shared_lock<std::shared_mutex> lk(mu_);
  check_open();
  if (level >= kNumLevels) throw ValueError("level: expected topic or turn");
  const Namespace* ns = find_ns(name);
  return ns && ns->index[level] ? ns->index[level]->kind() : "";
}

// The record's current state as a Version (its embedding read from its graph).
Version Store::current_version(const Record& r) const {
  Version v;
  v.version = r.version;
  v.summary = r.summary;
  v.turns_json = r.turns_json;
  v.meta_json = r.meta_json;
  v.updated_at = r.updated_at;
  v.op = r.op;
  v.embedding.resize(dim_);
  ns_[r.ns]->index[r.level]->vector(r.id, v.embedding.data());
  return v;
}

const Record& Store::rec_or_throw(int64_t id, const char* what) const {
  auto it = records_.find(id);
  if (it == records_.end()) {
    if (tombstones_.count(id)) throw KeyError(std::string(what) + ": id " + std::to_string(id) + " was deleted");
    throw KeyError(std::string(what) + ": unknown id " + std::to_string(id));
  }
  return it->second;
}

bool Store::contains(int64_t id) const {
  std::shared_lock<std::shared_mutex> lk(mu_);
  return records_.count(id) > 0;
}

void Store::prepare_vector(const float* in, float* out) const {
  std::memcpy(out, in, dim_ * sizeof(float));
  if (metric_ == Metric::Cos) {
    double s = 0;
    for (uint32_t i = 0; i < dim_; ++i) s += static_cast<double>(out[i]) * out[i];
    if (s > 0) {
      float inv = static_cast<float>(1.0 / std::sqrt(s));
      for (uint32_t i = 0; i < dim_; ++i) out[i] *= inv;
    }
  }
}

void Store::validate_items(const std::vector<NewItem>& items, size_t batch_base, bool allow_batch_parents) const {
  for (size_t i = 0; i < items.size(); ++i) {
    const NewItem& it = items[i];
    if (it.level >= kNumLevels) throw ValueError("level: expected topic or turn");
    if (!it.embedding) throw ValueError("embedding: missing");
    for (uint32_t j = 0; j < dim_; ++j)
      if (!std::isfinite(it.embedding[j]))
        throw ValueError("embeddings: expected finite values, got a NaN/inf in row " + std::to_string(i));
    double s = 0;
    for (uint32_t j = 0; j < dim_; ++j) s += static_cast<double>(it.embedding[j]) * it.embedding[j];
    if (std::sqrt(s) > kMaxNorm)
      throw ValueError("embeddings: expected an L2 norm <= 1e18 (scores must stay finite in float32), got " +
                       num(std::sqrt(s)) + " in row " + std::to_string(i));
    if (metric_ == Metric::Cos && s == 0)
      throw ValueError("embeddings: metric \"cos\" needs nonzero vectors, row " + std::to_string(i) + " is zero");
    if (it.level == kTopic) {
      if (it.parent != -1) throw ValueError("parent: topics have no parent");
    } else {
      if (it.parent >= 0) {
        const Record& p = rec_or_throw(it.parent, "topic_id");
        if (p.level != kTopic) throw ValueError("topic_id: record " + std::to_string(it.parent) + " is a turn, not a topic");
      } else if (it.parent <= -2 && allow_batch_parents) {
        size_t j = static_cast<size_t>(-2 - it.parent);
        if (j >= i || items[j].level != kTopic) throw ValueError("parent: batch reference must name an earlier topic");
      } else {
        throw ValueError("parent: a turn record needs its topic");
      }
    }
  }
  (void)batch_base;
}

void Store::encode_add(Writer& w, const std::string& ns, const std::vector<NewItem>& items, int64_t first_id,
                       double now) const {
  std::vector<float> v(dim_);
  for (size_t i = 0; i < items.size(); ++i) {
    const NewItem& it = items[i];
    Record r;
    r.id = first_id + static_cast<int64_t>(i);
    r.level = it.level;
    r.parent = it.parent <= -2 ? first_id + (-2 - it.parent) : it.parent;
    r.created_at = r.updated_at = now;
    r.summary = it.summary;
    r.turns_json = it.turns_json;
    r.meta_json = it.meta_json;
    w.u8(kOpAdd);
    w.str(ns);
    write_record_fields(w, r);
    prepare_vector(it.embedding, v.data());
    w.floats(v.data(), dim_);
  }
}

void Store::commit(const std::string& payload, uint64_t ops) {
  // Validation happened before; from here the operation is logged (and synced), then applied:
  // if logging or syncing fails, nothing was applied and the entry is not in the log.
  wal_.append(payload);  // a failed or short write is cut back off inside
  dirty_ = true;
  try {
    maybe_sync();
  } catch (...) {
    wal_.undo_last();  // a write whose sync failed must not come back on reopen
    if (wal_.poisoned()) poison_ = "the log entry of a write whose fsync failed could not be removed";
    throw;
  }
  try {
    apply(payload);
  } catch (const std::exception& e) {
    // Cannot happen for a validated operation short of running out of memory; the in-memory
    // state may be half-updated, so take the entry back and refuse writes until a reopen.
    wal_.undo_last();
    poison_ = std::string("an operation failed while being applied: ") + e.what();
    throw;
  }
  ops_since_snapshot_ += ops;
  if (snapshot_every_ && ops_since_snapshot_ >= snapshot_every_ && ops_since_snapshot_ >= snapshot_retry_at_)
    auto_snapshot();
}

void Store::auto_snapshot() {
  try {
    snapshot_locked();
    last_snapshot_error_.clear();
  } catch (const std::exception& e) {
    // The write that triggered it is durable in the log: report, retry later, never raise.
    last_snapshot_error_ = e.what();
    ++snapshot_failures_;
    snapshot_retry_at_ = ops_since_snapshot_ + std::max<uint64_t>(snapshot_every_, 1);
  }
}

void Store::maybe_sync() {
  if (fsync_ == FsyncMode::Always) {
    wal_.sync();
    dirty_ = false;
  } else if (fsync_ == FsyncMode::Batch) {
    double t = now_s();
    if (t - last_sync_ >= fsync_interval_s_) {
      wal_.sync();
      last_sync_ = t;
      dirty_ = false;
    }
  }
}

// ------------------------------------------------------------------------------- apply (log replay)

void Store::put_vectors(std::vector<PendingPut>& pending) {
  if (pending.empty()) return;
  // Per target index: promote a flat index that outgrows flat_limit_ and make room for all its
  // new vectors first (HNSW resizing is not thread-safe), then insert.
  std::vector<std::pair<Namespace*, uint8_t>> order;
  std::unordered_map<Namespace*, size_t> per_index[kNumLevels];
  for (auto& p : pending)
    if (per_index[p.level][p.ns]++ == 0) order.emplace_back(p.ns, p.level);
  for (auto& t : order) prepare_index(*t.first, t.second, per_index[t.second][t.first]);
  std::vector<PendingPut*> parallel;
  for (auto& p : pending) {
    VectorIndex& idx = *p.ns->index[p.level];
    if (threads_ > 1 && idx.concurrent_put()) parallel.push_back(&p);
    else idx.put(p.id, p.vec.data());
  }
  if (parallel.size() < 4 * static_cast<size_t>(threads_)) {
    for (auto* p : parallel) p->ns->index[p->level]->put(p->id, p->vec.data());
    pending.clear();
    return;
  }
  // hnswlib supports concurrent addPoint of distinct labels once the capacity is there.
  std::atomic<size_t> next{0};
  std::exception_ptr error;
  std::mutex error_mu;
  auto work = [&]() {
    for (size_t i = next++; i < parallel.size(); i = next++) {
      try {
        parallel[i]->ns->index[parallel[i]->level]->put(parallel[i]->id, parallel[i]->vec.data());
      } catch (...) {
        std::lock_guard<std::mutex> g(error_mu);
        if (!error) error = std::current_exception();
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads_; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  pending.clear();
  if (error) std::rethrow_exception(error);
}

void Store::apply(const std::string& payload) {
  Reader rd(payload.data(), payload.size(), "log entry");
  uint32_t n_ops = rd.u32();
  std::vector<PendingPut> pending;  // vectors of new records, inserted together (maybe in parallel)
  for (uint32_t k = 0; k < n_ops; ++k) {
    uint8_t op = rd.u8();
    if (op != kOpAdd) put_vectors(pending);  // later operations may read those vectors
    if (op == kOpAdd) {
      std::string ns_name = rd.str();
      Record r = read_record_fields(rd);
      std::vector<float> v = rd.floats(dim_);
      if (records_.count(r.id) || r.id < 0 || r.id == INT64_MAX) rd.fail("add of a bad or existing id " + std::to_string(r.id));
      if (r.level == kTurn) {
        auto p = records_.find(r.parent);
        if (r.parent < 0 || p == records_.end() || p->second.level != kTopic || ns_[p->second.ns]->name != ns_name)
          rd.fail("turn record without its topic");
      } else if (r.parent != -1) {
        rd.fail("topic record with a parent");
      }
      uint32_t nsi = ns_index(ns_name);
      r.ns = nsi;
      Namespace& ns = *ns_[nsi];
      if (r.parent >= 0) {
        auto p = records_.find(r.parent);
        if (p == records_.end()) rd.fail("turn of an unknown topic");
        p->second.children.push_back(r.id);
        if (p->second.status == Status::Invalidated) {
          r.status = Status::Invalidated;
          r.reason = p->second.reason;
        }
      }
      index_for(ns, r.level);
      pending.push_back({&ns, r.level, r.id, std::move(v)});
      ns.n[r.level]++;
      if (r.status == Status::Invalidated) ns.invalidated[r.level].insert(r.id);
      next_id_ = std::max(next_id_, r.id + 1);
      int64_t id = r.id;
      records_.emplace(id, std::move(r));
    } else if (op == kOpVersion) {
      int64_t id = rd.i64();
      uint8_t vop = rd.u8();
      uint8_t flags = rd.u8();
      auto it = records_.find(id);
      if (it == records_.end()) rd.fail("new version of an unknown id");
      Record& r = it->second;
      Namespace& ns = *ns_[r.ns];
      Version old = current_version(r);
      if (flags & kHasSummary) r.summary = rd.str();
      if (flags & kHasEmbedding) {
        std::vector<float> v = rd.floats(dim_);
        ns.index[r.level]->put(id, v.data());
      }
      if (flags & kHasTurns) r.turns_json = rd.str();
      if (flags & kHasMeta) r.meta_json = rd.str();
      r.updated_at = rd.f64();
      r.version += 1;
      r.op = vop;
      r.history.push_back(std::move(old));
    } else if (op == kOpInvalidate) {
      int64_t id = rd.i64();
      std::string reason = rd.str();
      double ts = rd.f64();
      auto it = records_.find(id);
      if (it == records_.end()) rd.fail("invalidate of an unknown id");
      std::vector<int64_t> ids{id};
      ids.insert(ids.end(), it->second.children.begin(), it->second.children.end());
      for (int64_t x : ids) {
        Record& r = records_.at(x);
        if (r.status == Status::Invalidated) continue;
        r.status = Status::Invalidated;
        r.reason = reason;
        r.updated_at = ts;
        ns_[r.ns]->invalidated[r.level].insert(x);
      }
    } else if (op == kOpDelete) {
      int64_t id = rd.i64();
      auto it = records_.find(id);
      if (it == records_.end()) rd.fail("delete of an unknown id");
      std::vector<int64_t> ids = it->second.children;
      ids.push_back(id);
      if (it->second.parent >= 0) {
        auto p = records_.find(it->second.parent);
        if (p != records_.end()) {
          auto& ch = p->second.children;
          ch.erase(std::remove(ch.begin(), ch.end(), id), ch.end());
        }
      }
      for (int64_t x : ids) {
        auto jt = records_.find(x);
        if (jt == records_.end()) continue;
        Record& r = jt->second;
        Namespace& ns = *ns_[r.ns];
        ns.index[r.level]->remove(x);
        ns.invalidated[r.level].erase(x);
        ns.n[r.level]--;
        records_.erase(jt);
        tombstones_.insert(x);
      }
    } else {
      rd.fail("unknown operation " + std::to_string(op));
    }
  }
  put_vectors(pending);
  if (rd.left() != 0) rd.fail("trailing bytes");
}

// ------------------------------------------------------------------------------- writes

std::vector<int64_t> Store::add(const std::string& ns, const std::vector<NewItem>& items) {
  std::unique_lock<std::shared_mutex> lk(mu_);
  check_writable();
  if (ns.empty()) throw ValueError("namespace: expected a non-empty string, got ''");
  if (items.empty()) return {};
  validate_items(items, 0, true);
  Writer w;
  w.u32(static_cast<uint32_t>(items.size()));
  int64_t first = next_id_;
  encode_add(w, ns, items, first, now_s());
  commit(w.buf, items.size());
  std::vector<int64_t> ids(items.size());
  for (size_t i = 0; i < items.size(); ++i) ids[i] = first + static_cast<int64_t>(i);
  return ids;
}

uint32_t Store::new_version(int64_t id, uint8_t op, const std::string* summary, const float* embedding,
                            const std::string* turns_json, const std::string* meta_json,
                            const std::vector<NewItem>& children, std::vector<int64_t>* child_ids,
                            bool replace_children) {
  std::unique_lock<std::shared_mutex> lk(mu_);
  check_writable();
  const Record& r = rec_or_throw(id, "id");
  if (!children.empty() && r.level != kTopic) throw ValueError("turn_embeddings: record " + std::to_string(id) + " is a turn");
  if (embedding) {
    NewItem probe;
    probe.embedding = embedding;
    validate_items({probe}, 0, false);
  }
  for (const auto& c : children)
    if (c.level != kTurn || c.parent != id) throw ValueError("children: expected turn records of the topic");
  validate_items(children, 0, false);
  double now = now_s();
  std::vector<int64_t> old_children = replace_children ? r.children : std::vector<int64_t>{};
  Writer w;
  w.u32(static_cast<uint32_t>(old_children.size() + 1 + children.size()));
  for (int64_t c : old_children) {
    w.u8(kOpDelete);
    w.i64(c);
  }
  w.u8(kOpVersion);
  w.i64(id);
  w.u8(op);
  uint8_t flags = (summary ? kHasSummary : 0) | (embedding ? kHasEmbedding : 0) | (turns_json ? kHasTurns : 0) |
                  (meta_json ? kHasMeta : 0);
  w.u8(flags);
  if (summary) w.str(*summary);
  if (embedding) {
    std::vector<float> v(dim_);
    prepare_vector(embedding, v.data());
    w.floats(v.data(), dim_);
  }
  if (turns_json) w.str(*turns_json);
  if (meta_json) w.str(*meta_json);
  w.f64(now);
  int64_t first = next_id_;
  encode_add(w, ns_[r.ns]->name, children, first, now);
  uint32_t version = r.version + 1;
  commit(w.buf, old_children.size() + 1 + children.size());
  if (child_ids) {
    child_ids->clear();
    for (size_t i = 0; i < children.size(); ++i) child_ids->push_back(first + static_cast<int64_t>(i));
  }
  return version;
}

void Store::invalidate(int64_t id, const std::string& reason) {
  std::unique_lock<std::shared_mutex> lk(mu_);
  check_writable();
  const Record& r = rec_or_throw(id, "id");
  if (r.status == Status::Invalidated) throw ValueError("id: record " + std::to_string(id) + " is already invalidated");
  Writer w;
  w.u32(1);
  w.u8(kOpInvalidate);
  w.i64(id);
  w.str(reason);
  w.f64(now_s());
  commit(w.buf, 1);
}

std::vector<int64_t> Store::remove(int64_t id) {
  std::unique_lock<std::shared_mutex> lk(mu_);
  check_writable();
  const Record& r = rec_or_throw(id, "id");
  std::vector<int64_t> ids = r.children;
  ids.push_back(id);
  Writer w;
  w.u32(1);
  w.u8(kOpDelete);
  w.i64(id);
  commit(w.buf, 1);
  return ids;
}

void Store::flush() {
  std::unique_lock<std::shared_mutex> lk(mu_);
  check_writable();
  wal_.sync();
  dirty_ = false;
  last_sync_ = now_s();
}

void Store::snapshot() {
  std::unique_lock<std::shared_mutex> lk(mu_);
  check_writable();
  snapshot_locked();
}

void Store::snapshot_locked() {
  uint64_t gen = generation_ + 1;
  uint64_t id = store_id_ ? store_id_ : new_store_id();  // an old store gets its id now
  const std::string dir = path_ + "/" + snapshot_dir_name(gen);
  const std::string cur_tmp = path_ + "/CURRENT.tmp", wal_tmp = path_ + "/wal.log.tmp";
  // Phase 1: write everything the new generation needs beside the live files. A failure here
  // leaves the store exactly as it was.
  try {
    if (exists(dir)) remove_tree(dir);
    if (::mkdir(dir.c_str(), 0755) != 0) throw IOError("create " + dir + ": " + std::strerror(errno));
    Writer b;
    b.u32(dim_);
    b.u32(static_cast<uint32_t>(metric_));
    b.u32(M_);
    b.u32(efc_);
    b.i64(next_id_);
    b.u64(ns_.size());
    for (const auto& ns : ns_) b.str(ns->name);
    b.u64(records_.size());
    for (const auto& kv : records_) {
      const Record& r = kv.second;
      write_record_fields(b, r);
      b.u64(r.history.size());
      for (const auto& v : r.history) write_version(b, v);
      b.u64(r.children.size());
      for (int64_t c : r.children) b.i64(c);
    }
    b.u64(tombstones_.size());
    for (int64_t t : tombstones_) b.i64(t);
    std::vector<std::tuple<uint32_t, uint8_t, std::string>> graphs;
    for (uint32_t i = 0; i < ns_.size(); ++i)
      for (uint8_t l = 0; l < kNumLevels; ++l)
        if (ns_[i]->index[l] && ns_[i]->index[l]->size() > 0)
          graphs.emplace_back(i, l, "g" + std::to_string(i) + "_" + std::to_string(l) +
                               ns_[i]->index[l]->file_suffix());
    b.u64(graphs.size());
    for (const auto& g : graphs) {
      uint64_t size;
      uint32_t crc;
      ns_[std::get<0>(g)]->index[std::get<1>(g)]->save(dir + "/" + std::get<2>(g), &size, &crc);  // checked + fsynced
      b.u32(std::get<0>(g));
      b.u8(std::get<1>(g));
      b.str(std::get<2>(g));
      b.u64(size);
      b.u32(crc);
    }
    Writer f;
    f.buf.append(kSnapMagic, 8);
    f.u32(kFormatVersion);
    f.u64(b.buf.size());
    f.buf.append(b.buf);
    f.u32(crc32(f.buf.data(), f.buf.size()));
    write_file_atomic(dir, "records.bin", f.buf);  // also fsyncs the snapshot directory
    fsync_path(path_, true);                       // the snapshot directory's own entry
    WalHeader h;
    h.dim = dim_;
    h.metric = static_cast<uint32_t>(metric_);
    h.generation = gen;
    h.store_id = id;
    write_temp(path_, "wal.log", Wal::encode_header(h));
    write_temp(path_, "CURRENT", encode_current(gen, id));
  } catch (...) {
    remove_tree(dir);
    ::unlink(cur_tmp.c_str());
    ::unlink(wal_tmp.c_str());
    throw;
  }
  // Phase 2, the switch: from a successful rename of CURRENT on, generation `gen` is the store.
  if (io::rename(cur_tmp.c_str(), (path_ + "/CURRENT").c_str()) != 0) {
    std::string e = std::strerror(errno);
    remove_tree(dir);
    ::unlink(cur_tmp.c_str());
    ::unlink(wal_tmp.c_str());
    throw IOError("rename " + cur_tmp + ": " + e);
  }
  const uint64_t old_gen = generation_;
  generation_ = gen;
  store_id_ = id;
  ops_since_snapshot_ = 0;
  snapshot_retry_at_ = 0;
  wal_.close();
  // The old log (generation gen - 1) is what a reopen now ignores, so nothing may be appended to
  // it any more: if the new log cannot be put in place, refuse writes (the snapshot holds every
  // write so far, and reopening creates a fresh log).
  if (io::rename(wal_tmp.c_str(), (path_ + "/wal.log").c_str()) != 0) {
    poison_ = std::string("the new log could not be put in place after snapshot ") + std::to_string(gen) + ": " +
              std::strerror(errno);
    try {
      fsync_path(path_, true);  // best effort: make the switch itself durable
    } catch (...) {
    }
    throw IOError("store " + path_ + ": " + poison_);
  }
  try {
    wal_.open_append(path_ + "/wal.log");
  } catch (const std::exception& e) {
    poison_ = std::string("the new log could not be opened after snapshot ") + std::to_string(gen) + ": " + e.what();
    throw IOError("store " + path_ + ": " + poison_);
  }
  dirty_ = false;
  last_sync_ = now_s();
  // Both renames durable before the previous generation goes (if this fsync fails, the old
  // snapshot stays; the next open removes it).
  fsync_path(path_, true);
  const std::string old = path_ + "/" + snapshot_dir_name(old_gen);
  if (exists(old)) remove_tree(old);
}

void Store::compact() {
  std::unique_lock<std::shared_mutex> lk(mu_);
  check_writable();
  // Drop empty namespaces and rebuild graphs that hold deleted vectors.
  std::vector<std::unique_ptr<Namespace>> keep;
  std::vector<uint32_t> remap(ns_.size(), UINT32_MAX);
  for (uint32_t i = 0; i < ns_.size(); ++i) {
    if (ns_[i]->n[kTopic] + ns_[i]->n[kTurn] == 0) continue;
    remap[i] = static_cast<uint32_t>(keep.size());
    keep.push_back(std::move(ns_[i]));
  }
  for (auto& ns : keep) {
    for (uint8_t l = 0; l < kNumLevels; ++l) {
      auto& idx = ns->index[l];
      if (!idx) continue;
      bool demote = std::strcmp(idx->kind(), "flat") != 0 && idx->live() <= flat_limit_;
      if (idx->deleted() == 0 && !demote) continue;
      idx = rebuild_index(*idx, idx->labels(), l, 0);  // drops deleted vectors; flat when small
    }
  }
  ns_ = std::move(keep);
  ns_by_name_.clear();
  for (uint32_t i = 0; i < ns_.size(); ++i) ns_by_name_[ns_[i]->name] = i;
  for (auto& kv : records_) kv.second.ns = remap[kv.second.ns];
  tombstones_.clear();
  snapshot_locked();
}

// ------------------------------------------------------------------------------- reads

RecordView Store::get(int64_t id) const {
  std::shared_lock<std::shared_mutex> lk(mu_);
  check_open();
  const Record& r = rec_or_throw(id, "id");
  RecordView v;
  v.rec = r;
  v.rec.history.clear();
  v.ns_name = ns_[r.ns]->name;
  v.embedding.resize(dim_);
  ns_[r.ns]->index[r.level]->vector(id, v.embedding.data());
  return v;
}

std::vector<RecordView> Store::get_batch(const std::vector<int64_t>& ids) const {
  std::shared_lock<std::shared_mutex> lk(mu_);
  check_open();
  for (int64_t id : ids) rec_or_throw(id, "ids");
  std::vector<RecordView> out(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const Record& r = records_.at(ids[i]);
    out[i].rec = r;
    out[i].rec.history.clear();
    out[i].ns_name = ns_[r.ns]->name;
    out[i].embedding.resize(dim_);
    ns_[r.ns]->index[r.level]->vector(ids[i], out[i].embedding.data());
  }
  return out;
}

std::vector<Version> Store::history(int64_t id) const {
  std::shared_lock<std::shared_mutex> lk(mu_);
  check_open();
  const Record& r = rec_or_throw(id, "id");
  std::vector<Version> out = r.history;
  out.push_back(current_version(r));
  return out;
}

void Store::embeddings(const int64_t* ids, size_t n, float* out) const {
  std::shared_lock<std::shared_mutex> lk(mu_);
  check_open();
  for (size_t i = 0; i < n; ++i) rec_or_throw(ids[i], "ids");
  for (size_t i = 0; i < n; ++i) {
    const Record& r = records_.at(ids[i]);
    ns_[r.ns]->index[r.level]->vector(ids[i], out + i * dim_);
  }
}

void Store::check_query(const float* q, size_t B, size_t k, size_t ef) const {
  // Every size is bounded before anything is allocated; B * k is checked without overflow.
  if (k > kMaxK) throw ValueError("k: expected 1.." + std::to_string(kMaxK) + ", got " + std::to_string(k));
  if (ef > kMaxEf) throw ValueError("ef: expected 1.." + std::to_string(kMaxEf) + ", got " + std::to_string(ef));
  if (k != 0 && B > kMaxResults / k)
    throw ValueError("k: expected B * k <= " + std::to_string(kMaxResults) + " result slots, got B=" +
                     std::to_string(B) + ", k=" + std::to_string(k));
  auto dist = space_->get_dist_func();
  void* param = space_->get_dist_func_param();
  for (size_t b = 0; b < B; ++b) {
    const float* qq = q + b * dim_;
    // Fast path: <q, q> with the SIMD kernel (ip distance is 1 - <a, b>); NaN, inf and a norm
    // above kMaxNorm all fail `n2 <= kMaxNorm^2` (1e36 is a finite float32).
    float n2 = metric_ == Metric::L2 ? dist(qq, zeros_.data(), param) : 1.0f - dist(qq, qq, param);
    if (n2 <= static_cast<float>(kMaxNorm * kMaxNorm)) continue;
    double s = 0;
    for (uint32_t j = 0; j < dim_; ++j) {
      if (!std::isfinite(qq[j])) throw ValueError("queries: expected finite values, got a NaN/inf in row " + std::to_string(b));
      s += static_cast<double>(qq[j]) * qq[j];
    }
    if (std::sqrt(s) > kMaxNorm)
      throw ValueError("queries: expected an L2 norm <= 1e18 (scores must stay finite in float32), got " +
                       num(std::sqrt(s)) + " in row " + std::to_string(b));
  }
}

namespace {

// A score that can be neither NaN nor inf (a guard for vectors stored before the norm bound).
inline float finite_score(float s) {
  if (std::isnan(s)) return kPadScore;
  return std::max(kPadScore, std::min(s, -kPadScore));
}

// Distance evaluations one query costs in `idx` (about): a flat index scans everything, a graph
// search visits a few times its beam width.
size_t query_cost(const VectorIndex& idx, size_t k, size_t ef) {
  size_t width = std::max(k, ef);
  return std::max<size_t>(1, std::min(idx.live(), width > (SIZE_MAX >> 5) ? SIZE_MAX : 16 * width));
}

// Below this many distance evaluations in one call, starting threads costs more than it saves.
constexpr size_t kParallelMinWork = 1u << 15;

// Runs body(b) for b in [0, B) on up to `threads` threads (the caller's included), when the
// call's work (B * cost_per_row distance evaluations) is worth it; results do not depend on it.
template <typename F>
void parallel_rows(size_t B, int threads, size_t cost_per_row, F body) {
  size_t T = std::min<size_t>(static_cast<size_t>(std::max(threads, 1)), B);
  if (cost_per_row == 0 || B < kParallelMinWork / cost_per_row + 1) T = 1;
  if (T <= 1) {
    for (size_t b = 0; b < B; ++b) body(b);
    return;
  }
  std::atomic<size_t> next{0};
  std::exception_ptr error;
  std::mutex error_mu;
  auto work = [&]() {
    for (size_t b = next++; b < B; b = next++) {
      try {
        body(b);
      } catch (...) {
        std::lock_guard<std::mutex> g(error_mu);
        if (!error) error = std::current_exception();
      }
    }
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < T; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace

SearchResult Store::search(const std::string& ns_name, const float* q, size_t B, size_t k, size_t ef,
                           bool include_invalidated, uint8_t level) const {
  std::shared_lock<std::shared_mutex> lk(mu_);
  check_open();
  if (level >= kNumLevels) throw ValueError("level: expected topic or turn");
  check_query(q, B, k, ef);
  SearchResult res;
  res.ids.assign(B * k, -1);
  res.scores.assign(B * k, kPadScore);
  const Namespace* ns = find_ns(ns_name);
  if (!ns || !ns->index[level] || k == 0) return res;
  const VectorIndex& idx = *ns->index[level];
  ExcludeFilter filter(&ns->invalidated[level]);
  hnswlib::BaseFilterFunctor* f = (!include_invalidated && !ns->invalidated[level].empty()) ? &filter : nullptr;
  parallel_rows(B, threads_, query_cost(idx, k, ef), [&](size_t b) {
    std::vector<float> qv;
    const float* qq = q + b * dim_;
    if (metric_ == Metric::Cos) {
      qv.resize(dim_);
      prepare_vector(qq, qv.data());
      qq = qv.data();
    }
    auto hits = idx.knn(qq, k, ef, f);
    for (size_t j = 0; j < hits.size(); ++j) {
      res.ids[b * k + j] = hits[j].second;
      res.scores[b * k + j] = finite_score(space_->score(hits[j].first));
    }
  });
  return res;
}

SearchResult Store::search_turn_topic(const std::string& ns_name, const float* q, size_t B, size_t k, size_t ef,
                                      bool include_invalidated, float alpha, size_t candidates) const {
  std::shared_lock<std::shared_mutex> lk(mu_);
  check_open();
  check_query(q, B, k, ef);
  if (candidates > kMaxCandidates)
    throw ValueError("candidates: expected 1.." + std::to_string(kMaxCandidates) + ", got " + std::to_string(candidates));
  if (!std::isfinite(alpha) || std::fabs(alpha) > kMaxAlpha)
    throw ValueError("alpha: expected a finite float in [-100, 100], got " + num(alpha));
  SearchResult res;
  res.ids.assign(B * k, -1);
  res.scores.assign(B * k, kPadScore);
  const Namespace* ns = find_ns(ns_name);
  if (!ns || !ns->index[kTurn] || !ns->index[kTopic] || k == 0) return res;
  const VectorIndex& turns = *ns->index[kTurn];
  const VectorIndex& topics = *ns->index[kTopic];
  ExcludeFilter ft(&ns->invalidated[kTurn]), fp(&ns->invalidated[kTopic]);
  hnswlib::BaseFilterFunctor* f_turn = (!include_invalidated && !ns->invalidated[kTurn].empty()) ? &ft : nullptr;
  hnswlib::BaseFilterFunctor* f_topic = (!include_invalidated && !ns->invalidated[kTopic].empty()) ? &fp : nullptr;
  auto dist = space_->get_dist_func();
  void* param = space_->get_dist_func_param();
  size_t C = std::max(candidates, k);
  size_t cost = query_cost(turns, C, ef) + query_cost(topics, C, ef);
  parallel_rows(B, threads_, cost, [&](size_t b) {
    std::vector<float> qv(dim_), tv(dim_);
    const float* qq = q + b * dim_;
    if (metric_ == Metric::Cos) {
      prepare_vector(qq, qv.data());
      qq = qv.data();
    }
    std::unordered_map<int64_t, float> topic_sim;  // topic id -> sim(q, topic)
    for (auto& h : topics.knn(qq, C, ef, f_topic)) topic_sim[h.second] = space_->score(h.first);
    std::unordered_map<int64_t, float> turn_sim;  // turn id -> sim(q, turn)
    for (auto& h : turns.knn(qq, C, ef, f_turn)) turn_sim[h.second] = space_->score(h.first);
    for (auto& kv : topic_sim) {
      const Record& t = records_.at(kv.first);
      for (int64_t c : t.children) {
        if (turn_sim.count(c)) continue;
        const Record& cr = records_.at(c);
        if (!include_invalidated && cr.status == Status::Invalidated) continue;
        turns.vector(c, tv.data());
        turn_sim[c] = space_->score(dist(qq, tv.data(), param));
      }
    }
    std::vector<std::pair<float, int64_t>> scored;
    scored.reserve(turn_sim.size());
    for (auto& kv : turn_sim) {
      int64_t parent = records_.at(kv.first).parent;
      float ps;
      auto it = topic_sim.find(parent);
      if (it != topic_sim.end()) {
        ps = it->second;
      } else {
        topics.vector(parent, tv.data());
        ps = space_->score(dist(qq, tv.data(), param));
      }
      scored.emplace_back(finite_score(kv.second + alpha * ps), kv.first);
    }
    size_t m = std::min(k, scored.size());
    std::partial_sort(scored.begin(), scored.begin() + m, scored.end(),
                      [](const auto& a, const auto& b2) { return a.first > b2.first || (a.first == b2.first && a.second < b2.second); });
    for (size_t j = 0; j < m; ++j) {
      res.ids[b * k + j] = scored[j].second;
      res.scores[b * k + j] = scored[j].first;
    }
  });
  return res;
}

std::vector<std::string> Store::namespaces() const {
  std::shared_lock<std::shared_mutex> lk(mu_);
  check_open();
  std::vector<std::string> out;
  for (const auto& ns : ns_)
    if (ns->n[kTopic] + ns->n[kTurn] > 0) out.push_back(ns->name);
  std::sort(out.begin(), out.end());
  return out;
}

size_t Store::count(const std::string& name, bool include_invalidated, uint8_t level) const {
  std::shared_lock<std::shared_mutex> lk(mu_);
  check_open();
  if (level >= kNumLevels) throw ValueError("level: expected topic or turn");
  const Namespace* ns = find_ns(name);
  if (!ns) return 0;
  return include_invalidated ? ns->n[level] : ns->n[level] - ns->invalidated[level].size();
}

std::vector<int64_t> Store::ids(const std::string& name, bool include_invalidated, uint8_t level) const {
  std::shared_lock<std::shared_mutex> lk(mu_);
  check_open();
  if (level >= kNumLevels) throw ValueError("level: expected topic or turn");
  std::vector<int64_t> out;
  auto it = ns_by_name_.find(name);
  if (it == ns_by_name_.end()) return out;
  for (const auto& kv : records_) {
    const Record& r = kv.second;
    if (r.ns == it->second && r.level == level && (include_invalidated || r.status == Status::Active))
      out.push_back(kv.first);
  }
  std::sort(out.begin(), out.end());
  return out;
}

size_t Store::memory_bytes() const {
  std::shared_lock<std::shared_mutex> lk(mu_);
  size_t b = 0;
  for (const auto& ns : ns_)
    for (int l = 0; l < kNumLevels; ++l)
      if (ns->index[l]) b += ns->index[l]->memory_bytes();
  for (const auto& kv : records_) {
    const Record& r = kv.second;
    b += sizeof(Record) + 3 * sizeof(void*);  // node of the hash map
    b += heap(r.summary) + heap(r.turns_json) + heap(r.meta_json) + heap(r.reason);
    b += r.children.capacity() * sizeof(int64_t);
    for (const auto& v : r.history)
      b += sizeof(Version) + heap(v.summary) + heap(v.turns_json) + heap(v.meta_json) +
           v.embedding.capacity() * sizeof(float);
  }
  b += records_.bucket_count() * sizeof(void*);
  return b;
}

}  // namespace memkern
