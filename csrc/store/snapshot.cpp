// Snapshots (format: memkern/snapshot.h): the CURRENT pointer, the records.bin codec, and the
// Store members that write a snapshot (snapshot, snapshot_locked) and load one (load_snapshot).
#include "memkern/snapshot.h"

#include <cmath>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "memkern/crc32.h"
#include "memkern/errors.h"
#include "memkern/io.h"
#include "memkern/serial.h"
#include "memkern/store.h"
#include "memkern/util.h"
#include "memkern/wal.h"

namespace memkern {
namespace {
constexpr char kCurMagic[8] = {'M', 'K', 'C', 'U', 'R', 0, 0, 0};
constexpr char kSnapMagic[8] = {'M', 'K', 'S', 'N', 'A', 'P', 0, 0};
}

std::string encode_current(uint64_t generation, uint64_t store_id) {
  Writer w;
  w.buf.append(kCurMagic, 8);
  w.u32(kCurrentFormat);
  w.u64(generation);
  w.u64(store_id);
  w.u32(crc32(w.buf.data(), w.buf.size()));
  return w.buf;
}

Current read_current(const std::string& dir) {
  Current cur;
  std::string data;
  if (!read_file(dir + "/CURRENT", &data)) return cur;
  Reader rd(data.data(), data.size(), "snapshot pointer " + dir + "/CURRENT");
  if (data.size() != 24 && data.size() != 32) rd.fail("wrong size " + std::to_string(data.size()) + " (expected 32)");
  if (std::memcmp(data.data(), kCurMagic, 8) != 0) rd.fail("bad magic");
  uint32_t c;
  std::memcpy(&c, data.data() + data.size() - 4, 4);
  if (crc32(data.data(), data.size() - 4) != c) rd.fail("checksum mismatch");
  rd.u64();
  cur.format = rd.u32();
  if (cur.format != 1 && cur.format != kCurrentFormat)
    rd.fail("format version " + std::to_string(cur.format) + " (this build reads 1.." + std::to_string(kCurrentFormat) + ")");
  if (data.size() != (cur.format == 1 ? 24u : 32u))
    rd.fail("format version " + std::to_string(cur.format) + " in a " + std::to_string(data.size()) + "-byte file");
  cur.generation = rd.u64();
  if (cur.format >= 2) {
    cur.store_id = rd.u64();
    if (cur.store_id == 0) rd.fail("store id 0");
  }
  if (cur.generation == kNoGeneration) rd.fail("bad generation");
  return cur;
}

uint64_t new_store_id() {
  std::random_device rd;
  uint64_t id = 0;
  while (id == 0) id = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  return id;
}

std::string snapshot_dir_name(uint64_t generation) { return "snap-" + std::to_string(generation); }

// ------------------------------------------------------------------------------- records.bin codec

std::string encode_records_file(const SnapshotParams& params, const std::vector<std::string>& namespaces,
                                const std::unordered_map<int64_t, Record>& records,
                                const std::unordered_set<int64_t>& tombstones, const std::vector<GraphFile>& graphs) {
  Writer b;
  b.u32(params.dim);
  b.u32(params.metric);
  b.u32(params.M);
  b.u32(params.ef_construction);
  b.i64(params.next_id);
  b.u64(namespaces.size());
  for (const auto& n : namespaces) b.str(n);
  b.u64(records.size());
  for (const auto& kv : records) {
    const Record& r = kv.second;
    write_record_fields(b, r);
    b.u64(r.history.size());
    for (const auto& v : r.history) write_version(b, v);
    b.u64(r.children.size());
    for (int64_t c : r.children) b.i64(c);
  }
  b.u64(tombstones.size());
  for (int64_t t : tombstones) b.i64(t);
  b.u64(graphs.size());
  for (const auto& g : graphs) {
    b.u32(g.ns);
    b.u8(g.level);
    b.str(g.name);
    b.u64(g.size);
    b.u32(g.crc);
  }
  uint64_t n_ev = 0;
  for (const auto& kv : records) n_ev += std::isnan(kv.second.event_time) ? 0 : 1;
  b.u64(n_ev);
  for (const auto& kv : records) {
    if (std::isnan(kv.second.event_time)) continue;
    b.i64(kv.first);
    b.f64(kv.second.event_time);
  }
  Writer f;
  f.buf.append(kSnapMagic, 8);
  f.u32(kFormatVersion);
  f.u64(b.buf.size());
  f.buf.append(b.buf);
  f.u32(crc32(f.buf.data(), f.buf.size()));
  return f.buf;
}

SnapshotContents decode_records_file(const std::string& data, const std::string& file) {
  Reader hdr(data.data(), data.size(), "snapshot " + file);
  if (data.size() < 24) hdr.fail("truncated header");
  if (std::memcmp(data.data(), kSnapMagic, 8) != 0) hdr.fail("bad magic");
  hdr.u64();
  uint32_t format = hdr.u32();
  if (format != 1 && format != kFormatVersion)
    hdr.fail("format version " + std::to_string(format) + " (this build reads 1.." + std::to_string(kFormatVersion) + ")");
  uint64_t body_len = hdr.u64();
  if (body_len != data.size() - 24) hdr.fail("size " + std::to_string(data.size()) + " does not match its header (truncated?)");
  uint32_t c;
  std::memcpy(&c, data.data() + data.size() - 4, 4);
  if (crc32(data.data(), data.size() - 4) != c) hdr.fail("checksum mismatch");
  Reader rd(data.data() + 20, body_len, "snapshot " + file);

  SnapshotContents s;
  SnapshotParams& p = s.params;
  p.dim = rd.u32();
  p.metric = rd.u32();
  if (p.dim == 0 || p.dim > kMaxDim || p.metric > 2) rd.fail("bad dim/metric");
  p.M = rd.u32();
  p.ef_construction = rd.u32();
  p.next_id = rd.i64();
  if (p.M < 2 || p.M > kMaxM || p.ef_construction < 1 || p.ef_construction > kMaxEfConstruction)
    rd.fail("bad graph parameters");
  if (p.next_id < 0 || p.next_id == INT64_MAX) rd.fail("bad next id");
  uint64_t n_ns = rd.count(8);
  s.namespaces.reserve(n_ns);
  for (uint64_t i = 0; i < n_ns; ++i) s.namespaces.push_back(rd.str());
  uint64_t n_rec = rd.count(64);
  s.records.reserve(n_rec);
  for (uint64_t i = 0; i < n_rec; ++i) {
    Record r = read_record_fields(rd);
    if (r.ns >= n_ns) rd.fail("record namespace out of range");
    uint64_t nh = rd.count(40);
    r.history.reserve(nh);
    for (uint64_t j = 0; j < nh; ++j) r.history.push_back(read_version(rd, p.dim));
    uint64_t nc = rd.count(8);
    r.children.resize(nc);
    for (uint64_t j = 0; j < nc; ++j) r.children[j] = rd.i64();
    // Imported records (Store::import_records) keep their ids, which may lie past next_id.
    if (r.id < 0 || r.id == INT64_MAX) rd.fail("record id out of range");
    int64_t id = r.id;
    if (!s.records.emplace(id, std::move(r)).second) rd.fail("duplicate record id");
  }
  uint64_t n_tomb = rd.count(8);
  s.tombstones.reserve(n_tomb);
  for (uint64_t i = 0; i < n_tomb; ++i) s.tombstones.push_back(rd.i64());
  uint64_t n_graphs = rd.count(16);
  std::set<std::pair<uint32_t, uint8_t>> seen;
  for (uint64_t i = 0; i < n_graphs; ++i) {
    GraphFile g;
    g.ns = rd.u32();
    g.level = rd.u8();
    g.name = rd.str();
    g.size = rd.u64();
    g.crc = rd.u32();
    if (g.ns >= n_ns || g.level >= kNumLevels || g.name.find('/') != std::string::npos ||
        !seen.emplace(g.ns, g.level).second)
      rd.fail("bad graph table entry");
    s.graphs.push_back(std::move(g));
  }
  if (format >= 2) {
    uint64_t n_ev = rd.count(16);
    for (uint64_t i = 0; i < n_ev; ++i) {
      int64_t id = rd.i64();
      double t = rd.f64();
      auto it = s.records.find(id);
      if (it == s.records.end() || !std::isnan(it->second.event_time) || !(std::fabs(t) <= 1e12))
        rd.fail("bad event time entry");
      it->second.event_time = t;
    }
  }
  if (rd.left() != 0) rd.fail("trailing bytes");
  return s;
}

// ------------------------------------------------------------------------------- Store: load

void Store::load_snapshot(uint64_t gen) {
  const std::string dir = path_ + "/" + snapshot_dir_name(gen);
  const std::string file = dir + "/records.bin";
  std::string data;
  if (!read_file(file, &data)) throw CorruptedError("snapshot " + file + " is missing");
  SnapshotContents s = decode_records_file(data, file);
  dim_ = s.params.dim;
  metric_ = static_cast<Metric>(s.params.metric);
  M_ = s.params.M;
  efc_ = s.params.ef_construction;
  next_id_ = s.params.next_id;
  space_.reset(new Space(dim_, metric_));
  for (auto& name : s.namespaces) {
    auto ns = std::make_unique<Namespace>();
    ns->name = std::move(name);
    ns_by_name_[ns->name] = static_cast<uint32_t>(ns_.size());
    ns_.push_back(std::move(ns));
  }
  records_ = std::move(s.records);
  tombstones_.insert(s.tombstones.begin(), s.tombstones.end());
  // Size, checksum, then structure (FlatIndex or hnswlib graph) before anything is allocated.
  for (const auto& g : s.graphs)
    ns_[g.ns]->index[g.level] = load_vector_index(space_.get(), dim_, dir + "/" + g.name, g.size, g.crc);
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
  // Derived state: BM25 postings and filterable meta, rebuilt from the records' texts.
  for (auto& kv : records_) {
    index_derived(kv.second);
    index_times(kv.second);
  }
  for (auto& ns : ns_)
    for (int l = 0; l < kNumLevels; ++l)
      if (ns->index[l] && ns->index[l]->live() != ns->n[l])
        throw CorruptedError("snapshot " + file + ": graph of namespace '" + ns->name + "' holds " +
                             std::to_string(ns->index[l]->live()) + " vectors for " + std::to_string(ns->n[l]) + " records");
}

// ------------------------------------------------------------------------------- Store: write

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
    if (::mkdir(dir.c_str(), io::kDirMode) != 0) throw IOError("create " + dir + ": " + std::strerror(errno));
    std::vector<GraphFile> graphs;
    for (uint32_t i = 0; i < ns_.size(); ++i)
      for (uint8_t l = 0; l < kNumLevels; ++l)
        if (ns_[i]->index[l] && ns_[i]->index[l]->size() > 0) {
          GraphFile g;
          g.ns = i;
          g.level = l;
          g.name = "g" + std::to_string(i) + "_" + std::to_string(l) + ns_[i]->index[l]->file_suffix();
          ns_[i]->index[l]->save(dir + "/" + g.name, &g.size, &g.crc);  // checked + fsynced
          graphs.push_back(std::move(g));
        }
    SnapshotParams params;
    params.dim = dim_;
    params.metric = static_cast<uint32_t>(metric_);
    params.M = M_;
    params.ef_construction = efc_;
    params.next_id = next_id_;
    std::vector<std::string> names;
    names.reserve(ns_.size());
    for (const auto& ns : ns_) names.push_back(ns->name);
    const std::string records_bin = encode_records_file(params, names, records_, tombstones_, graphs);
    write_file_atomic(dir, "records.bin", records_bin);  // also fsyncs the snapshot directory
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

}  // namespace memkern
