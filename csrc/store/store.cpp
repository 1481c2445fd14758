// The store's write path (add, new_version, invalidate, remove, compact; log, sync, apply) and
// open/close. Snapshots: snapshot.cpp; reads and searches: query.cpp; the log format: log_codec.h.
#include "memkern/store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <functional>
#include <optional>
#include <type_traits>
#include <thread>
#include <climits>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <queue>
#include <tuple>

#include "memkern/errors.h"
#include "memkern/flat_index.h"
#include "memkern/io.h"
#include "memkern/log_codec.h"
#include "memkern/serial.h"
#include "memkern/snapshot.h"
#include "memkern/util.h"

namespace memkern {
namespace {

// Heap bytes of a string beyond its inline (small-string) buffer.
size_t heap(const std::string& s) { return s.capacity() > 15 ? s.capacity() + 1 : 0; }

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

Store::Store(const std::string& path, const StoreOptions& opt)
    : path_(opt.in_memory ? std::string() : path), memory_(opt.in_memory) {
  if (memory_) {
    open_in_memory(opt);  // no directory, no LOCK, no log: nothing below runs
    return;
  }
  if (opt.read_only) {
    // No LOCK, no directory created, nothing written: open_or_create only reads (and refuses a
    // directory that holds no store).
    read_only_ = true;
    open_or_create(opt);
    return;
  }
  if (::mkdir(path.c_str(), io::kDirMode) != 0 && errno != EEXIST) throw IOError("create directory " + path + ": " + std::strerror(errno));
  std::string lock = path + "/LOCK";
  lock_fd_ = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, io::kFileMode);
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

std::unique_ptr<Store> Store::open_read_only(const std::string& path, StoreOptions opt) {
  opt.read_only = true;
  opt.in_memory = false;
  struct stat st;  // no directory at all is not a writer's switch in progress: refused at once
  if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw IOError("store " + path + ": no store there (a read-only open needs an existing store)");
  for (int attempt = 1;; ++attempt) {
    try {
      return std::make_unique<Store>(path, opt);
    } catch (const CorruptedError&) {
      if (attempt >= kReadOnlyOpenTries) throw;
    } catch (const IOError&) {
      if (attempt >= kReadOnlyOpenTries) throw;
    }
    // The writer was switching generations under this open (files renamed or removed): again.
    std::this_thread::sleep_for(std::chrono::milliseconds(2 * attempt));
  }
}

Store::~Store() {
  try {
    close();
  } catch (...) {
  }
}

void Store::configure(const StoreOptions& opt) {
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
  if (opt.id_base < 0 || opt.id_end <= opt.id_base)
    throw ValueError("id_base/id_end: expected 0 <= id_base < id_end, got " + std::to_string(opt.id_base) + ", " +
                     std::to_string(opt.id_end));
  id_base_ = opt.id_base;
  id_end_ = opt.id_end;
}

void Store::open_in_memory(const StoreOptions& opt) {
  configure(opt);
  if (opt.dim == 0) throw ValueError("dim: an in-memory store needs dim (got none)");
  if (opt.metric < 0) throw ValueError("metric: an in-memory store needs a metric (got none)");
  dim_ = opt.dim;
  metric_ = static_cast<Metric>(opt.metric);
  space_.reset(new Space(dim_, metric_));
  zeros_.assign(dim_, 0.0f);
  fsync_ = FsyncMode::Never;  // never consulted: commit() does not log
  snapshot_every_ = 0;
  store_id_ = new_store_id();
  generation_ = 0;
  next_id_ = id_base_;
  last_sync_ = now_s();
}

void Store::open_or_create(const StoreOptions& opt) {
  configure(opt);
  io::set_fault_from_env();     // test-only fault injection (memkern/io.h); off unless MEMKERN_FAULT is set
  set_snapshot_gate_from_env();  // test-only (snapshot.h); off unless MEMKERN_SNAPSHOT_GATE is set
  Current cur = read_current(path_);
  const bool have_snapshot = cur.generation != kNoGeneration;
  const uint64_t gen = have_snapshot ? cur.generation : 0;
  // The log chain (snapshot.h, "Logs"): every log file, by generation.
  struct LogFile {
    std::string name;
    WalHeader h;
    std::vector<std::string> entries;
    WalScan scan;
    int fd = -1;  // read-only opens: kept open, the last one is followed
  };
  std::vector<LogFile> logs;
  struct CloseFds {  // read-only opens: every descriptor but the followed one is closed on exit
    std::vector<LogFile>& logs;
    ~CloseFds() {
      for (auto& f : logs)
        if (f.fd >= 0) ::close(f.fd);
    }
  } close_fds{logs};
  for (const auto& n : list_dir(path_)) {
    if (!is_log_file_name(n)) continue;
    LogFile f;
    f.name = n;
    if (read_only_) {
      // Through a descriptor: the writer may rename the file (wal-<N>.log -> wal.log) meanwhile.
      f.fd = ::open((path_ + "/" + n).c_str(), O_RDONLY | O_CLOEXEC);
      if (f.fd < 0) throw IOError("open " + path_ + "/" + n + ": " + std::strerror(errno));
      logs.push_back(std::move(f));
      LogFile& g = logs.back();
      g.h = Wal::read_fd(g.fd, path_ + "/" + n, &g.entries, &g.scan);
      continue;
    }
    f.h = Wal::read(path_ + "/" + n, &f.entries, &f.scan);
    logs.push_back(std::move(f));
  }
  std::sort(logs.begin(), logs.end(), [](const LogFile& a, const LogFile& b) { return a.h.generation < b.h.generation; });
  for (size_t i = 1; i < logs.size(); ++i)
    if (logs[i].h.generation == logs[i - 1].h.generation)
      throw CorruptedError("store " + path_ + ": two logs of generation " + std::to_string(logs[i].h.generation) + " (" +
                           logs[i - 1].name + ", " + logs[i].name + ")");
  const bool have_wal = !logs.empty();
  if (!have_snapshot) {
    for (const auto& n : list_dir(path_))
      if (n.rfind("snap-", 0) == 0 && n.find(".tmp") == std::string::npos && have_wal == false)
        throw CorruptedError("store " + path_ + ": snapshot directory " + n + " exists but CURRENT is missing");
  }
  if (read_only_ && !have_snapshot && !have_wal)
    throw IOError("store " + path_ + ": no store there (a read-only open needs an existing store)");
  if (!have_snapshot && !have_wal && opened_before_)
    throw CorruptedError("store " + path_ + ": the directory held a store (its LOCK file) but wal.log and CURRENT "
                         "are missing (deleted?): its records would be lost, so no new store is created over it; "
                         "restore the files, or remove the directory to start a new store");
  if (have_snapshot && !have_wal)  // a snapshot's log is replaced by rename, never removed
    throw CorruptedError("store " + path_ + ": the write-ahead log wal.log is missing (deleted?): the writes made "
                         "since snapshot " + std::to_string(gen) + " would be lost, so the store is not opened; "
                         "restore wal.log");
  // Every log must be this store's (a log without an id older than the snapshot is an old
  // store's, which the snapshot holds).
  if (have_snapshot) {
    for (const auto& f : logs)
      if (f.h.store_id != cur.store_id && !(f.h.store_id == 0 && f.h.generation < gen))
        throw CorruptedError("store " + path_ + ": " + f.name + " belongs to another store (its store id " +
                             std::to_string(f.h.store_id) + ", this store's " + std::to_string(cur.store_id) +
                             "); refusing to replay it");
    store_id_ = cur.store_id;
  } else if (have_wal) {
    for (const auto& f : logs)
      if (f.h.store_id != logs[0].h.store_id)
        throw CorruptedError("store " + path_ + ": " + f.name + " belongs to another store than " + logs[0].name);
    store_id_ = logs[0].h.store_id;
  } else {
    store_id_ = new_store_id();
  }
  // The chain: generations gen, gen + 1, ... (older logs are held by the snapshot).
  std::vector<LogFile*> chain;
  for (auto& f : logs)
    if (f.h.generation >= gen) chain.push_back(&f);
  if (have_wal && chain.empty()) {
    const uint64_t newest = logs.back().h.generation;
    if (newest + 1 < gen)
      throw CorruptedError("store " + path_ + ": wal.log is from generation " + std::to_string(newest) +
                           ", older than the snapshot's previous one (" + std::to_string(gen) +
                           "): the current log was replaced, its writes would be lost");
    // newest == gen - 1: a crash between the switch of CURRENT and the log's replacement in a
    // format 1-2 store; the snapshot holds its content, a fresh log replaces it.
  }
  if (!chain.empty() && chain[0]->h.generation != gen)
    throw CorruptedError("store " + path_ + ": " +
                         (have_snapshot ? "the log of snapshot generation " + std::to_string(gen) + " is missing"
                                        : std::string("log generation ") + std::to_string(chain[0]->h.generation) +
                                              " but no snapshot (CURRENT missing)") +
                         " (the oldest log, " + chain[0]->name + ", is of generation " +
                         std::to_string(chain[0]->h.generation) + "): its writes would be lost");
  for (size_t i = 1; i < chain.size(); ++i)
    if (chain[i]->h.generation != chain[i - 1]->h.generation + 1)
      throw CorruptedError("store " + path_ + ": the log chain has a gap between " + chain[i - 1]->name + " and " +
                           chain[i]->name + " (generations " + std::to_string(chain[i - 1]->h.generation) + ", " +
                           std::to_string(chain[i]->h.generation) + ")");
  // Only the last log that holds entries may have a torn tail: the ones before it were complete
  // and synced before the next one took its first entry.
  size_t last_content = 0;
  for (size_t i = 0; i < chain.size(); ++i)
    if (chain[i]->scan.file_size > kWalHeaderSize) last_content = i;
  if (read_only_) {
    // The writer may have appended to an earlier log after this open read it and before it
    // switched to the next one (which then had entries when it was read): the earlier logs are
    // complete now, so their rest is read before anything is applied.
    for (size_t i = 0; i < last_content; ++i) {
      LogFile& f = *chain[i];
      f.scan.good_end = Wal::follow(f.fd, f.h.format, f.scan.good_end, &f.entries);
      struct stat fst;
      if (::fstat(f.fd, &fst) == 0) f.scan.file_size = static_cast<uint64_t>(fst.st_size);
      f.scan.torn = f.scan.good_end < f.scan.file_size;
    }
  }
  for (size_t i = 0; i < last_content; ++i)
    if (chain[i]->scan.torn)
      throw CorruptedError("store " + path_ + ": write-ahead log " + chain[i]->name + " is damaged at offset " +
                           std::to_string(chain[i]->scan.good_end) + " (" + chain[i]->scan.why + "), but the newer " +
                           chain[last_content]->name + " holds entries written after it had been synced: synced "
                           "data was lost or altered (disk or file-system damage)");

  if (have_snapshot) {
    load_snapshot(gen);
    generation_ = gen;
  } else if (have_wal) {
    const WalHeader& wh = chain[0]->h;
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

  for (const LogFile* f : chain)
    if (f->h.dim != dim_ || f->h.metric != static_cast<uint32_t>(metric_))
      throw CorruptedError("store " + path_ + ": log header of " + f->name + " (" + std::to_string(f->h.dim) +
                           ") disagrees with the snapshot");
  uint64_t replayed = 0;
  for (const LogFile* f : chain) {
    for (const auto& e : f->entries) apply(e);
    replayed += f->entries.size();
  }
  replayed_ = replayed;
  if (read_only_) {
    // Follow the log appends go to (what a snapshot switches to next is found by refresh()).
    torn_tail_ = false;  // a torn end is an append in progress here, read again by refresh()
    if (chain.empty()) {
      tail_gen_ = generation_ - 1;  // the writer's next open creates the log of generation_
    } else {
      // The last log with entries: a newer, empty one may be a snapshot's next log that the
      // writer has not switched to yet (it still appends to this one); refresh() finds it.
      LogFile& tail = *chain[last_content];
      tail_fd_ = tail.fd;
      tail.fd = -1;  // kept
      tail_gen_ = tail.h.generation;
      tail_format_ = tail.h.format;
      tail_off_ = tail.scan.good_end;
    }
    snapshot_every_ = 0;
    fsync_ = FsyncMode::Never;
    last_sync_ = now_s();
    return;
  }
  std::string active;
  if (chain.empty()) {
    // No log yet, or a log whose content the snapshot already holds (above).
    WalHeader h;
    h.dim = dim_;
    h.metric = static_cast<uint32_t>(metric_);
    h.generation = generation_;
    h.store_id = store_id_;
    Wal::create(path_, "wal.log", h);
    active = "wal.log";
    log_gen_ = generation_;
  } else {
    LogFile& tail = *chain[last_content];
    torn_tail_ = tail.scan.torn;  // not fatal: an interrupted write that was never acknowledged
    if (tail.scan.torn) Wal::cut(path_ + "/" + tail.name, tail.scan.good_end);  // appends start at a clean boundary
    active = chain.back()->name;
    log_gen_ = chain.back()->h.generation;
    for (size_t i = 0; i + 1 < chain.size(); ++i) chain_.push_back(path_ + "/" + chain[i]->name);
  }
  // Leftovers: logs the snapshot holds, an interrupted snapshot's files.
  for (const auto& n : list_dir(path_)) {
    if (n.rfind("snap-", 0) == 0 && n != snapshot_dir_name(generation_)) remove_tree(path_ + "/" + n);
    if (n.size() > 4 && n.compare(n.size() - 4, 4, ".tmp") == 0) ::unlink((path_ + "/" + n).c_str());
    if (is_log_file_name(n) && n != active &&
        std::find(chain_.begin(), chain_.end(), path_ + "/" + n) == chain_.end())
      ::unlink((path_ + "/" + n).c_str());
  }
  wal_.open_append(path_ + "/" + active);
  try {
    wal_.sync();  // what the log holds is durable from here on (its entries' sync watermark)
  } catch (const std::exception&) {
    // the first sync of a write establishes it instead
  }
  ops_since_snapshot_ = replayed;
  last_sync_ = now_s();
  next_id_ = std::max(next_id_, id_base_);
  if (next_id_ > id_end_)
    throw ValueError("id_end: expected >= the store's next id " + std::to_string(next_id_) + ", got " +
                     std::to_string(id_end_));
}

void Store::close() {
  stop_snapshot_thread();  // lets a snapshot in progress finish
  std::lock_guard<std::mutex> run(snap_run_mu_);
  bool want_snapshot;
  {
    std::shared_lock<std::shared_mutex> lk(mu_);
    if (closed_) return;
    want_snapshot = !memory_ && !read_only_ && poison_.empty() && (ops_since_snapshot_ > 0 || !chain_.empty());
  }
  bool snapped = false;
  if (want_snapshot) {
    // Makes the next open fast (no log replay); the log holds the data anyway, so a failure is
    // recorded, not raised. Only the namespaces changed since the last snapshot are written.
    try {
      run_snapshot();
      snapped = true;
    } catch (const std::exception& e) {
      std::unique_lock<std::shared_mutex> lk(mu_);
      last_snapshot_error_ = e.what();
      ++snapshot_failures_;
    }
  }
  std::unique_lock<std::shared_mutex> lk(mu_);
  std::string sync_error;
  if (!snapped && poison_.empty() && !memory_ && !read_only_) {
    try {
      wal_.sync();
    } catch (const std::exception& e) {
      sync_error = e.what();
    }
  }
  wal_.close();
  if (tail_fd_ >= 0) {
    ::close(tail_fd_);
    tail_fd_ = -1;
  }
  if (lock_fd_ >= 0) {
    ::close(lock_fd_);  // releases the flock
    lock_fd_ = -1;
  }
  records_.clear();
  ns_.clear();
  ns_by_name_.clear();
  tombstones_.clear();
  orphan_tombstones_.clear();
  meta_scalars_.clear();
  closed_ = true;
  if (!sync_error.empty()) throw IOError("close " + path_ + ": " + sync_error);
}

int64_t Store::refresh() {
  std::unique_lock<std::shared_mutex> lk(mu_);  // searches wait while entries are applied
  check_open();
  if (!read_only_) return 0;
  int64_t applied = 0;
  bool diverged = false;  // an entry this view could not apply: its state is not the writer's
  auto apply_all = [&](const std::vector<std::string>& entries) {
    for (const auto& e : entries) {
      try {
        apply(e);
      } catch (const std::exception&) {
        diverged = true;
        return;
      }
      ++applied;
    }
  };
  {
    for (;;) {
      std::vector<std::string> entries;
      if (tail_fd_ >= 0) tail_off_ = Wal::follow(tail_fd_, tail_format_, tail_off_, &entries);
      apply_all(entries);
      if (diverged) return -1;
      // Has the writer switched to a newer log? Then the followed one is complete (the switch
      // syncs it first): read its rest, then go on with the next generation's log.
      const uint64_t want = tail_gen_ + 1;
      const Current cur = read_current(path_);
      bool switched = cur.generation != kNoGeneration && cur.generation > tail_gen_;
      int next_fd = -1;
      WalHeader next;
      for (const auto& n : list_dir(path_)) {
        if (!is_log_file_name(n)) continue;
        const std::string file = path_ + "/" + n;
        int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue;  // renamed or removed since the listing: seen on the next refresh
        uint64_t size = 0;
        WalHeader h;
        try {
          h = Wal::read_header(fd, file, &size);
        } catch (const std::exception&) {
          ::close(fd);
          continue;  // a log being created (written to a temporary name first): not part of the chain
        }
        if (h.generation > tail_gen_ && size > kWalHeaderSize) switched = true;
        if (h.generation == want && next_fd < 0) {
          next_fd = fd;
          next = h;
        } else {
          ::close(fd);
        }
      }
      if (!switched) {
        if (next_fd >= 0) ::close(next_fd);
        return applied;
      }
      if (tail_fd_ >= 0) {
        entries.clear();
        tail_off_ = Wal::follow(tail_fd_, tail_format_, tail_off_, &entries);
        apply_all(entries);
      }
      if (diverged || next_fd < 0 || next.store_id != store_id_ || next.dim != dim_ ||
          next.metric != static_cast<uint32_t>(metric_)) {
        if (next_fd >= 0) ::close(next_fd);
        return -1;  // the log this view needs next was retired (or the store replaced): reopen
      }
      if (tail_fd_ >= 0) ::close(tail_fd_);
      tail_fd_ = next_fd;
      tail_gen_ = want;
      tail_format_ = next.format;
      tail_off_ = kWalHeaderSize;
    }
  }
}

void Store::check_open() const {
  if (closed_) throw ValueError(where() + " is closed");
  if (!lost_.empty()) throw IOError(where() + " refuses reads and writes until it is reopened: " + lost_);
}

void Store::check_writable() const {
  check_open();
  if (read_only_)
    throw ValueError(where() + " is open read_only: writes go through the process that opened it for writing");
  if (!poison_.empty())
    throw IOError(where() + (memory_ ? " refuses writes: " : " refuses writes until it is reopened: ") + poison_);
}

std::string Store::last_snapshot_error() const {
  std::shared_lock<std::shared_mutex> lk(mu_);
  return last_snapshot_error_;
}

uint64_t Store::snapshot_failures() const { return snapshot_failures_.load(); }

bool Store::take_unreported_snapshot_failure() {
  // Lock-free: it runs after every write call with the GIL held, and must not wait for a snapshot.
  uint64_t now = snapshot_failures_.load();
  return reported_failures_.exchange(now) != now;
}

uint64_t Store::generation() const {
  std::shared_lock<std::shared_mutex> lk(mu_);
  return generation_;
}

std::vector<std::string> Store::log_files() const {
  std::shared_lock<std::shared_mutex> lk(mu_);
  std::vector<std::string> out = chain_;
  if (wal_.is_open()) out.push_back(wal_.file());
  return out;
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
    const double s = squared_norm(it.embedding, dim_);
    if (!norm_within_bound(s))
      throw ValueError("embeddings: expected an L2 norm <= 1e18 (scores must stay finite in float32), got " +
                       num(std::sqrt(s)) + " in row " + std::to_string(i));
    if (metric_ == Metric::Cos && s == 0)
      throw ValueError("embeddings: metric \"cos\" needs nonzero vectors, row " + std::to_string(i) + " is zero");
    if (!std::isnan(it.event_time) && !time_in_range(it.event_time))
      throw ValueError("event_times: expected " MEMKERN_TIME_RANGE " or None, got " + num(it.event_time) +
                       " in row " + std::to_string(i));
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

void Store::encode_new_items(Writer& w, const std::string& ns, const std::vector<NewItem>& items, int64_t first_id,
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
    prepare_vector(it.embedding, v.data());
    memkern::encode_add(w, ns, r, v.data(), dim_);
    if (!std::isnan(it.event_time)) encode_event_time(w, r.id, it.event_time);
  }
}

// Logged operations encode_new_items writes for `items` (an add each, plus an event time each
// for the items that have one).
static uint32_t new_item_ops(const std::vector<NewItem>& items) {
  uint32_t n = static_cast<uint32_t>(items.size());
  for (const auto& it : items) n += std::isnan(it.event_time) ? 0 : 1;
  return n;
}

void Store::commit(const std::string& payload, uint64_t ops, uint32_t nsi) {
  if (memory_) {
    // Persistence off: the same entry, applied without a log (no snapshot ever runs).
    try {
      apply(payload);
    } catch (const std::exception& e) {
      poison_ = std::string("an operation failed while being applied: ") + e.what();
      throw;
    }
    ops_since_snapshot_ += ops;
    return;
  }
  // Validation happened before; from here the operation is logged (and synced), then applied:
  // if logging or syncing fails, nothing was applied and the entry is not in the log. In a group
  // (run_grouped) only the group's last write syncs, for every entry of the group.
  before_change(nsi);    // a snapshot copying namespaces gets this one as it was first
  wal_.append(payload);  // a failed or short write is cut back off inside
  dirty_ = true;
  if (!in_group_ || group_last_) {
    try {
      maybe_sync();
    } catch (...) {
      wal_.undo_last();  // a write whose sync failed must not come back on reopen
      if (wal_.poisoned()) poison_ = "the log entry of a write whose fsync failed could not be removed";
      if (in_group_) group_sync_failed_ = true;
      throw;
    }
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
  // The background thread writes it; this write returns now (a group asks once it is durable).
  if (!in_group_ && snapshot_due()) request_snapshot();
}

bool Store::snapshot_due() const {
  return snapshot_every_ && ops_since_snapshot_ >= snapshot_every_ && ops_since_snapshot_ >= snapshot_retry_at_ && !job_;
}

// ------------------------------------------------------------------------------- group commit

struct Store::GroupWrite {
  std::function<void()> run;  // the write's body (writer lock held)
  std::exception_ptr error;
  bool done = false;          // a leader ran it (group_mu_)
};

template <class F>
auto Store::write(F&& body) -> decltype(body()) {
  using R = decltype(body());
  if (fsync_ != FsyncMode::Always) {  // nothing to share: "batch" / "never", views, in memory
    std::unique_lock<std::shared_mutex> lk(mu_);
    return body();
  }
  GroupWrite w;
  if constexpr (std::is_void_v<R>) {
    w.run = [&] { body(); };
    run_grouped(w);
  } else {
    std::optional<R> out;
    w.run = [&] { out.emplace(body()); };
    run_grouped(w);
    return std::move(*out);
  }
}

void Store::run_grouped(GroupWrite& w) {
  std::unique_lock<std::mutex> q(group_mu_);
  group_queue_.push_back(&w);
  group_cv_.wait(q, [&] { return w.done || group_queue_.front() == &w; });
  if (!w.done) {
    // Lead: every write queued now (this one first), in arrival order.
    std::vector<GroupWrite*> group(group_queue_.begin(),
                                   group_queue_.begin() + std::min<size_t>(group_queue_.size(), kMaxGroup));
    q.unlock();
    lead_group(group);
    q.lock();
    for (size_t i = 0; i < group.size(); ++i) {
      group_queue_.front()->done = true;
      group_queue_.pop_front();
    }
    group_cv_.notify_all();  // the group's writers return; the next in the queue leads
  }
  q.unlock();
  if (w.error) std::rethrow_exception(w.error);
}

void Store::lead_group(const std::vector<GroupWrite*>& group) {
  std::unique_lock<std::shared_mutex> lk(mu_);  // readers never see a write before it is durable
  const uint64_t start = wal_.end();             // every entry before it was synced by its own group
  const uint64_t entries = wal_.entries_since_open();
  std::vector<GroupWrite*> logged;               // applied, durable only once the group's sync succeeds
  in_group_ = true;
  group_sync_failed_ = false;
  for (size_t i = 0; i < group.size(); ++i) {
    group_last_ = i + 1 == group.size();
    const uint64_t before = wal_.end();
    try {
      group[i]->run();
    } catch (...) {
      group[i]->error = std::current_exception();
    }
    if (!group[i]->error && wal_.end() > before) logged.push_back(group[i]);
  }
  in_group_ = false;
  group_last_ = true;
  std::string why;
  if (group_sync_failed_) {
    why = "the fdatasync of its group failed";
  } else if (wal_.synced_end() < wal_.end()) {
    // The last write raised before logging: the others still need their sync.
    try {
      maybe_sync();
    } catch (const std::exception& e) {
      why = e.what();
    }
  }
  groups_.fetch_add(1);
  grouped_writes_.fetch_add(group.size());
  if (!why.empty() && wal_.end() > start) {
    // Writes of the group were applied in memory but are not durable: none of them is
    // acknowledged, their entries leave the log, and the store must be reopened.
    wal_.cut_back_to(start, wal_.entries_since_open() - entries);
    lost_ = "an fdatasync failed after " + std::to_string(logged.size()) +
            " write(s) of its group were applied in memory (" + why + "); they raised and are not in the log" +
            (wal_.poisoned() ? " (but could not be cut from it)" : "");
    poison_ = lost_;
    for (GroupWrite* g : logged) g->error = std::make_exception_ptr(IOError(where() + ": " + lost_));
    return;
  }
  if (snapshot_due()) request_snapshot();
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
  std::vector<LogOperation> ops = decode_log_entry(payload, dim_);  // the whole entry parses, or nothing runs
  auto fail = [](const std::string& why) { throw CorruptedError("log entry: " + why); };
  std::vector<PendingPut> pending;  // vectors of new records, inserted together (maybe in parallel)
  for (LogOperation& o : ops) {
    if (o.kind != LogOp::Add) put_vectors(pending);  // later operations may read those vectors
    if (o.kind == LogOp::Add || o.kind == LogOp::Import) {
      const bool imported = o.kind == LogOp::Import;
      const std::string& ns_name = o.ns;
      Record r = std::move(o.record);
      if (records_.count(r.id) || r.id < 0 || r.id == INT64_MAX || (imported && tombstones_.count(r.id)))
        fail(std::string(imported ? "import" : "add") + " of a bad or existing id " + std::to_string(r.id));
      if (r.level == kTurn) {
        auto p = records_.find(r.parent);
        if (r.parent < 0 || p == records_.end() || p->second.level != kTopic || ns_[p->second.ns]->name != ns_name)
          fail("turn record without its topic");
      } else if (r.parent != -1) {
        fail("topic record with a parent");
      }
      uint32_t nsi = ns_index(ns_name);
      r.ns = nsi;
      Namespace& ns = *ns_[nsi];
      ns.dirty = true;
      if (r.parent >= 0) {
        auto p = records_.find(r.parent);
        if (p == records_.end()) fail("turn of an unknown topic");
        p->second.children.push_back(r.id);
        if (!imported && p->second.status == Status::Invalidated) {  // an import keeps its own status
          r.status = Status::Invalidated;
          r.reason = p->second.reason;
        }
      }
      index_for(ns, r.level);
      pending.push_back({&ns, r.level, r.id, std::move(o.embedding)});
      ns.n[r.level]++;
      if (r.status == Status::Invalidated) ns.invalidated[r.level].insert(r.id);
      r.children.clear();
      if (!imported) next_id_ = std::max(next_id_, r.id + 1);  // an import leaves the next id alone
      int64_t id = r.id;
      const Record& added = records_.emplace(id, std::move(r)).first->second;
      index_derived(added);
      index_times(added);
    } else if (o.kind == LogOp::Version) {
      int64_t id = o.id;
      auto it = records_.find(id);
      if (it == records_.end()) fail("new version of an unknown id");
      Record& r = it->second;
      Namespace& ns = *ns_[r.ns];
      ns.dirty = true;
      Version old = current_version(r);
      bool reindex = o.fields & (kHasSummary | kHasMeta);
      if (reindex) unindex_derived(r);
      unindex_times(r);
      if (o.fields & kHasSummary) r.summary = std::move(o.summary);
      if (o.fields & kHasEmbedding) ns.index[r.level]->put(id, o.embedding.data());
      if (o.fields & kHasTurns) r.turns_json = std::move(o.turns_json);
      if (o.fields & kHasMeta) r.meta_json = std::move(o.meta_json);
      r.updated_at = o.time;
      r.version += 1;
      r.op = o.version_op;
      r.history.push_back(std::move(old));
      if (reindex) index_derived(r);
      index_times(r);
    } else if (o.kind == LogOp::EventTime) {
      auto it = records_.find(o.id);
      if (it == records_.end()) fail("event time of an unknown id");
      ns_[it->second.ns]->dirty = true;
      unindex_times(it->second);
      it->second.event_time = o.time;
      index_times(it->second);
    } else if (o.kind == LogOp::Invalidate) {
      int64_t id = o.id;
      const std::string& reason = o.reason;
      double ts = o.time;
      auto it = records_.find(id);
      if (it == records_.end()) fail("invalidate of an unknown id");
      std::vector<int64_t> ids{id};
      ids.insert(ids.end(), it->second.children.begin(), it->second.children.end());
      ns_[it->second.ns]->dirty = true;
      for (int64_t x : ids) {
        Record& r = records_.at(x);
        if (r.status == Status::Invalidated) continue;
        r.status = Status::Invalidated;
        r.reason = reason;
        unindex_times(r);
        r.updated_at = ts;
        index_times(r);
        ns_[r.ns]->invalidated[r.level].insert(x);
      }
    } else {  // LogOp::Delete
      int64_t id = o.id;
      auto it = records_.find(id);
      if (it == records_.end()) fail("delete of an unknown id");
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
        ns.dirty = true;
        unindex_derived(r);
        unindex_times(r);
        ns.index[r.level]->remove(x);
        ns.invalidated[r.level].erase(x);
        ns.n[r.level]--;
        ns.tombstones.push_back(x);
        records_.erase(jt);
        tombstones_.insert(x);
      }
    }
  }
  put_vectors(pending);
}

// ------------------------------------------------------------------------------- writes

std::vector<int64_t> Store::add(const std::string& ns, const std::vector<NewItem>& items) {
  return write([&]() -> std::vector<int64_t> {
    check_writable();
    if (ns.empty()) throw ValueError("namespace: expected a non-empty string, got ''");
    if (items.empty()) return {};
    validate_items(items, 0, true);
    check_id_room(items.size());
    Writer w;
    encode_op_count(w, new_item_ops(items));
    int64_t first = next_id_;
    encode_new_items(w, ns, items, first, now_s());
    commit(w.buf, items.size(), find_ns_index(ns));
    std::vector<int64_t> ids(items.size());
    for (size_t i = 0; i < items.size(); ++i) ids[i] = first + static_cast<int64_t>(i);
    return ids;
  });
}

uint32_t Store::new_version(int64_t id, VersionOp op, const std::string* summary, const float* embedding,
                            const std::string* turns_json, const std::string* meta_json,
                            const std::vector<NewItem>& children, std::vector<int64_t>* child_ids,
                            bool replace_children, const double* event_time) {
  return write([&]() -> uint32_t {
    check_writable();
    if (op != VersionOp::Merge && op != VersionOp::Update)
      throw ValueError("op: expected merge or update, got " + std::to_string(static_cast<int>(op)));
    const Record& r = rec_or_throw(id, "id");
    if (event_time && !time_in_range(*event_time))
      throw ValueError("event_time: expected " MEMKERN_TIME_RANGE ", got " + num(*event_time));
    if (!children.empty() && r.level != kTopic) throw ValueError("turn_embeddings: record " + std::to_string(id) + " is a turn");
    if (embedding) {
      NewItem probe;
      probe.embedding = embedding;
      validate_items({probe}, 0, false);
    }
    for (const auto& c : children)
      if (c.level != kTurn || c.parent != id) throw ValueError("children: expected turn records of the topic");
    validate_items(children, 0, false);
    check_id_room(children.size());
    double now = now_s();
    std::vector<int64_t> old_children = replace_children ? r.children : std::vector<int64_t>{};
    Writer w;
    encode_op_count(w, static_cast<uint32_t>(old_children.size() + 1 + (event_time ? 1 : 0)) + new_item_ops(children));
    for (int64_t c : old_children) encode_delete(w, c);
    std::vector<float> v;
    if (embedding) {
      v.resize(dim_);
      prepare_vector(embedding, v.data());
    }
    encode_version(w, id, op, summary, embedding ? v.data() : nullptr, dim_, turns_json, meta_json, now);
    if (event_time) encode_event_time(w, id, *event_time);
    int64_t first = next_id_;
    encode_new_items(w, ns_[r.ns]->name, children, first, now);
    uint32_t version = r.version + 1;
    commit(w.buf, old_children.size() + 1 + children.size(), r.ns);
    if (child_ids) {
      child_ids->clear();
      for (size_t i = 0; i < children.size(); ++i) child_ids->push_back(first + static_cast<int64_t>(i));
    }
    return version;
  });
}

void Store::check_id_room(size_t n) const {
  if (static_cast<uint64_t>(id_end_ - next_id_) < n)
    throw ValueError(where() + ": its id range ends at " + std::to_string(id_end_) + " (next id " +
                     std::to_string(next_id_) + ", " + std::to_string(n) + " requested)");
}

int64_t Store::next_id() const {
  std::shared_lock<std::shared_mutex> lk(mu_);
  return next_id_;
}

void Store::import_records(const std::string& ns, const std::vector<ImportItem>& items) {
  return write([&] {
    check_writable();
    if (ns.empty()) throw ValueError("namespace: expected a non-empty string, got ''");
    if (items.empty()) return;
    std::unordered_map<int64_t, uint8_t> batch;  // id -> level of the items before
    auto check_vec = [&](const std::vector<float>& v, const std::string& what) {
      if (v.size() != dim_)
        throw ValueError(what + ": expected " + std::to_string(dim_) + " floats, got " + std::to_string(v.size()));
      NewItem probe;
      probe.embedding = v.data();
      validate_items({probe}, 0, false);
      if (metric_ == Metric::Cos) {
        double s = 0;
        for (float x : v) s += static_cast<double>(x) * x;
        if (std::fabs(std::sqrt(s) - 1.0) > 1e-3)
          throw ValueError(what + ": metric \"cos\" stores unit vectors, got norm " + num(std::sqrt(s)));
      }
    };
    for (size_t i = 0; i < items.size(); ++i) {
      const Record& r = items[i].rec;
      const std::string at = "records[" + std::to_string(i) + "]";
      if (r.id < 0 || r.id == INT64_MAX) throw ValueError(at + ".id: expected an id in 0..2**63-2, got " + std::to_string(r.id));
      if (records_.count(r.id) || batch.count(r.id))
        throw KeyError(at + ".id: id " + std::to_string(r.id) + " is already in " + where() + " (ids must not collide)");
      if (tombstones_.count(r.id))
        throw KeyError(at + ".id: id " + std::to_string(r.id) + " was deleted from " + where() +
                       " and is not compacted away yet (compact() it first)");
      if (r.id >= next_id_ && r.id < id_end_)
        throw ValueError(at + ".id: id " + std::to_string(r.id) + " lies in " + where() + "'s own unused id range [" +
                         std::to_string(next_id_) + ", " + std::to_string(id_end_) + ") and would collide with an id it hands out");
      if (r.level >= kNumLevels) throw ValueError(at + ".level: expected topic or turn");
      if (r.level == kTopic) {
        if (r.parent != -1) throw ValueError(at + ".parent: topics have no parent");
      } else {
        auto b = batch.find(r.parent);
        bool ok = b != batch.end() && b->second == kTopic;
        if (!ok) {
          auto p = records_.find(r.parent);
          ok = p != records_.end() && p->second.level == kTopic && ns_[p->second.ns]->name == ns;
        }
        if (!ok) throw ValueError(at + ".parent: a turn record needs its topic (in the namespace, or earlier in the batch), got " +
                                  std::to_string(r.parent));
      }
      if (static_cast<uint8_t>(r.status) > 1) throw ValueError(at + ".status: expected active or invalidated");
      if (r.op > 2) throw ValueError(at + ".op: expected add, merge or update");
      if (r.version != r.history.size() + 1)
        throw ValueError(at + ".version: expected len(history) + 1 = " + std::to_string(r.history.size() + 1) + ", got " +
                         std::to_string(r.version));
      for (size_t j = 0; j < r.history.size(); ++j) {
        if (r.history[j].version != j + 1 || r.history[j].op > 2)
          throw ValueError(at + ".history[" + std::to_string(j) + "]: expected version " + std::to_string(j + 1) +
                           " with op add, merge or update");
        check_vec(r.history[j].embedding, at + ".history[" + std::to_string(j) + "].embedding");
        if (!std::isfinite(r.history[j].updated_at)) throw ValueError(at + ".history: updated_at must be finite");
      }
      check_vec(items[i].embedding, at + ".embedding");
      if (!std::isfinite(r.created_at) || !std::isfinite(r.updated_at))
        throw ValueError(at + ": created_at / updated_at must be finite");
      if (!std::isnan(r.event_time) && !time_in_range(r.event_time))
        throw ValueError(at + ".event_time: expected " MEMKERN_TIME_RANGE " or none, got " + num(r.event_time));
      batch.emplace(r.id, r.level);
    }
    Writer w;
    encode_op_count(w, static_cast<uint32_t>(items.size()));
    for (const auto& it : items) encode_import(w, ns, it.rec, it.embedding.data(), dim_);
    commit(w.buf, items.size(), find_ns_index(ns));
  });
}

void Store::invalidate(int64_t id, const std::string& reason) {
  return write([&] {
    check_writable();
    const Record& r = rec_or_throw(id, "id");
    if (r.status == Status::Invalidated) throw ValueError("id: record " + std::to_string(id) + " is already invalidated");
    Writer w;
    encode_op_count(w, 1);
    encode_invalidate(w, id, reason, now_s());
    commit(w.buf, 1, r.ns);
  });
}

std::vector<int64_t> Store::remove(int64_t id) {
  return write([&]() -> std::vector<int64_t> {
    check_writable();
    const Record& r = rec_or_throw(id, "id");
    std::vector<int64_t> ids = r.children;
    ids.push_back(id);
    Writer w;
    encode_op_count(w, 1);
    encode_delete(w, id);
    commit(w.buf, 1, r.ns);
    return ids;
  });
}

void Store::flush() {
  std::unique_lock<std::shared_mutex> lk(mu_);
  check_writable();
  if (memory_) return;  // no log
  wal_.sync();
  dirty_ = false;
  last_sync_ = now_s();
}

void Store::compact() {
  std::lock_guard<std::mutex> run(snap_run_mu_);  // after a snapshot in progress
  {
    std::unique_lock<std::shared_mutex> lk(mu_);
    check_writable();
    // Drop empty namespaces and rebuild graphs that hold deleted vectors.
    std::vector<std::unique_ptr<Namespace>> keep;
    std::vector<uint32_t> remap(ns_.size(), UINT32_MAX);
    for (uint32_t i = 0; i < ns_.size(); ++i) {
      if (ns_[i]->n[kTopic] + ns_[i]->n[kTurn] == 0) {
        // its tombstones stay until the compaction's snapshot is in place
        orphan_tombstones_.insert(orphan_tombstones_.end(), ns_[i]->tombstones.begin(), ns_[i]->tombstones.end());
        continue;
      }
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
      ns->dirty = true;  // renumbered and rebuilt: every namespace is written again
      ns->blob = BlobRef{};
      for (auto& g : ns->graph_file) g.clear();
    }
    ns_ = std::move(keep);
    ns_by_name_.clear();
    for (uint32_t i = 0; i < ns_.size(); ++i) ns_by_name_[ns_[i]->name] = i;
    for (auto& kv : records_) kv.second.ns = remap[kv.second.ns];
    packs_.clear();
    if (memory_) {
      // No snapshot or log can name a deleted id: its tombstone's only job is done.
      tombstones_.clear();
      for (auto& ns : ns_) ns->tombstones.clear();
      orphan_tombstones_.clear();
      return;
    }
  }
  // The tombstones go when this snapshot is in place (a failed one leaves them: the old snapshot
  // and the log still name those ids).
  run_snapshot(/*compacting=*/true);
}

size_t Store::memory_bytes() const {
  std::shared_lock<std::shared_mutex> lk(mu_);
  ensure_derived();  // what the store holds once used
  size_t b = 0;
  for (const auto& ns : ns_)
    for (int l = 0; l < kNumLevels; ++l)
      if (ns->index[l]) b += ns->index[l]->memory_bytes();
  for (const auto& ns : ns_)
    for (int l = 0; l < kNumLevels; ++l)
      b += ns->lex[l].memory_bytes() + ns->meta[l].memory_bytes() + ns->times[l].memory_bytes();
  for (const auto& kv : meta_scalars_) {
    b += 64;
    for (const auto& e : kv.second) b += 64 + e.first.capacity() + e.second.capacity();
  }
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
