// Snapshots (format and procedure: memkern/snapshot.h): the CURRENT pointer, the records.bin
// codecs (format 3 manifest; formats 1-2 still read), loading a snapshot, and writing one: the
// rotation of the log, the copy-on-write copies of namespaces, the background thread.
#include "memkern/snapshot.h"

#include <cmath>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "memkern/crc32.h"
#include "memkern/errors.h"
#include "memkern/flat_index.h"
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

std::string pack_file_name(uint64_t pack) { return "pack-" + std::to_string(pack) + ".bin"; }

std::string log_file_name(uint64_t generation) { return "wal-" + std::to_string(generation) + ".log"; }

bool is_log_file_name(const std::string& n) {
  if (n == "wal.log") return true;
  if (n.size() <= 8 || n.compare(0, 4, "wal-") != 0 || n.compare(n.size() - 4, 4, ".log") != 0) return false;
  return n.find_first_not_of("0123456789", 4) == n.size() - 4;
}

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
  f.u32(2);
  f.u64(b.buf.size());
  f.buf.append(b.buf);
  f.u32(crc32(f.buf.data(), f.buf.size()));
  return f.buf;
}

uint32_t records_file_format(const std::string& data, const std::string& file) {
  Reader hdr(data.data(), data.size(), "snapshot " + file);
  if (data.size() < 24) hdr.fail("truncated header");
  if (std::memcmp(data.data(), kSnapMagic, 8) != 0) hdr.fail("bad magic");
  hdr.u64();
  uint32_t format = hdr.u32();
  if (format < 1 || format > kFormatVersion)
    hdr.fail("format version " + std::to_string(format) + " (this build reads 1.." + std::to_string(kFormatVersion) + ")");
  uint64_t body_len = hdr.u64();
  if (body_len != data.size() - 24) hdr.fail("size " + std::to_string(data.size()) + " does not match its header (truncated?)");
  uint32_t c;
  std::memcpy(&c, data.data() + data.size() - 4, 4);
  if (crc32(data.data(), data.size() - 4) != c) hdr.fail("checksum mismatch");
  return format;
}

SnapshotContents decode_records_file(const std::string& data, const std::string& file) {
  uint32_t format = records_file_format(data, file);
  Reader rd(data.data() + 20, data.size() - 24, "snapshot " + file);
  if (format > 2) rd.fail("format version " + std::to_string(format) + " is a manifest (decode_manifest reads it)");

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

// ------------------------------------------------------------------------------- manifest codec

std::string encode_manifest(const Manifest& m) {
  Writer b;
  b.u32(m.params.dim);
  b.u32(m.params.metric);
  b.u32(m.params.M);
  b.u32(m.params.ef_construction);
  b.i64(m.params.next_id);
  b.u64(m.packs.size());
  for (const auto& p : m.packs) {
    b.u64(p.first);
    b.u64(p.second);
  }
  b.u64(m.namespaces.size());
  for (size_t i = 0; i < m.namespaces.size(); ++i) {
    b.str(m.namespaces[i]);
    b.u64(m.blobs[i].pack);
    b.u64(m.blobs[i].offset);
    b.u64(m.blobs[i].length);
    b.u32(m.blobs[i].crc);
  }
  b.u64(m.tombstones.size());
  for (int64_t t : m.tombstones) b.i64(t);
  Writer f;
  f.buf.append(kSnapMagic, 8);
  f.u32(3);
  f.u64(b.buf.size());
  f.buf.append(b.buf);
  f.u32(crc32(f.buf.data(), f.buf.size()));
  return f.buf;
}

Manifest decode_manifest(const std::string& data, const std::string& file) {
  uint32_t format = records_file_format(data, file);
  Reader rd(data.data() + 20, data.size() - 24, "snapshot " + file);
  if (format != 3) rd.fail("format version " + std::to_string(format) + " is not a manifest (format 3)");
  Manifest m;
  SnapshotParams& p = m.params;
  p.dim = rd.u32();
  p.metric = rd.u32();
  if (p.dim == 0 || p.dim > kMaxDim || p.metric > 2) rd.fail("bad dim/metric");
  p.M = rd.u32();
  p.ef_construction = rd.u32();
  p.next_id = rd.i64();
  if (p.M < 2 || p.M > kMaxM || p.ef_construction < 1 || p.ef_construction > kMaxEfConstruction)
    rd.fail("bad graph parameters");
  if (p.next_id < 0 || p.next_id == INT64_MAX) rd.fail("bad next id");
  uint64_t n_packs = rd.count(16);
  std::set<uint64_t> packs;
  for (uint64_t i = 0; i < n_packs; ++i) {
    uint64_t num = rd.u64(), size = rd.u64();
    if (num == 0 || size < kPackHeaderSize || !packs.insert(num).second) rd.fail("bad pack table entry");
    m.packs.emplace_back(num, size);
  }
  uint64_t n_ns = rd.count(8 + 28);
  m.namespaces.reserve(n_ns);
  m.blobs.reserve(n_ns);
  for (uint64_t i = 0; i < n_ns; ++i) {
    m.namespaces.push_back(rd.str());
    BlobRef r;
    r.pack = rd.u64();
    r.offset = rd.u64();
    r.length = rd.u64();
    r.crc = rd.u32();
    auto it = std::find_if(m.packs.begin(), m.packs.end(), [&](const auto& q) { return q.first == r.pack; });
    if (it == m.packs.end() || r.offset < kPackHeaderSize || r.offset > it->second || r.length > it->second - r.offset)
      rd.fail("the blob of namespace " + std::to_string(i) + " lies outside its pack");
    m.blobs.push_back(r);
  }
  uint64_t n_tomb = rd.count(8);
  m.tombstones.reserve(n_tomb);
  for (uint64_t i = 0; i < n_tomb; ++i) m.tombstones.push_back(rd.i64());
  if (rd.left() != 0) rd.fail("trailing bytes");
  return m;
}

// ------------------------------------------------------------------------------- test gate

namespace {

// A point of the snapshot procedure where a test can hold the snapshotting thread (memkern._store
// _test_snapshot_gate; or MEMKERN_SNAPSHOT_GATE=<point> at open, which holds it for good: crash
// tests kill the process there).
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  std::string point;     // "" off
  bool forever = false;  // never released (set from the environment)
  bool reached = false;
  bool released = false;
};

Gate& gate() {
  static Gate g;
  return g;
}

void gate_at(const char* point) {
  Gate& g = gate();
  std::unique_lock<std::mutex> lk(g.mu);
  if (g.point.empty() || g.point != point) return;
  g.reached = true;
  g.cv.notify_all();
  if (g.forever) {
    g.cv.wait(lk, [] { return false; });
  } else {
    // At most two minutes: a test that forgets to release cannot hang the process.
    g.cv.wait_for(lk, std::chrono::seconds(120), [&] { return g.released; });
  }
  g.point.clear();  // one stop per arming
}

}  // namespace

void set_snapshot_gate(const std::string& point) {
  static const char* kPoints[] = {"", "created", "rotated", "copied", "written", "switched"};
  if (std::find(std::begin(kPoints), std::end(kPoints), point) == std::end(kPoints))
    throw ValueError("snapshot gate: expected \"created\", \"rotated\", \"copied\", \"written\", \"switched\" or \"\", "
                     "got \"" + point + "\"");
  Gate& g = gate();
  std::lock_guard<std::mutex> lk(g.mu);
  g.point = point;
  g.forever = false;
  g.reached = false;
  g.released = false;
  g.cv.notify_all();
}

bool wait_snapshot_gate(double timeout_s) {
  Gate& g = gate();
  std::unique_lock<std::mutex> lk(g.mu);
  return g.cv.wait_for(lk, std::chrono::duration<double>(timeout_s), [&] { return g.reached; });
}

void release_snapshot_gate() {
  Gate& g = gate();
  std::lock_guard<std::mutex> lk(g.mu);
  g.released = true;
  g.cv.notify_all();
}

void set_snapshot_gate_from_env() {
  const char* s = std::getenv("MEMKERN_SNAPSHOT_GATE");
  if (!s || !*s) return;
  set_snapshot_gate(s);
  Gate& g = gate();
  std::lock_guard<std::mutex> lk(g.mu);
  g.forever = true;
}

// ------------------------------------------------------------------------------- Store: load

void Store::load_snapshot(uint64_t gen) {
  const std::string dir = path_ + "/" + snapshot_dir_name(gen);
  const std::string file = dir + "/records.bin";
  std::string data;
  if (!read_file(file, &data)) throw CorruptedError("snapshot " + file + " is missing");
  if (records_file_format(data, file) < 3) {
    load_snapshot_v2(dir, data, file);
    return;
  }
  Manifest m = decode_manifest(data, file);
  dim_ = m.params.dim;
  metric_ = static_cast<Metric>(m.params.metric);
  M_ = m.params.M;
  efc_ = m.params.ef_construction;
  next_id_ = m.params.next_id;
  space_.reset(new Space(dim_, metric_));
  std::map<uint64_t, io::MappedFile> mapped;
  for (const auto& pk : m.packs) {
    const std::string pf = dir + "/" + pack_file_name(pk.first);
    const io::MappedFile& mp =
        mapped.emplace(pk.first, io::map_file(pf, pk.second, "snapshot pack", file, /*populate=*/false)).first->second;
    uint32_t fmt;
    std::memcpy(&fmt, mp.p + 8, 4);
    if (std::memcmp(mp.p, kPackMagic, 8) != 0 || fmt != 3) throw CorruptedError("snapshot pack " + pf + ": bad header");
  }
  for (auto& name : m.namespaces) {
    auto ns = std::make_unique<Namespace>();
    ns->name = std::move(name);
    if (!ns_by_name_.emplace(ns->name, static_cast<uint32_t>(ns_.size())).second)
      throw CorruptedError("snapshot " + file + ": namespace '" + ns->name + "' appears twice");
    ns_.push_back(std::move(ns));
  }
  for (uint32_t i = 0; i < ns_.size(); ++i) {
    Namespace& ns = *ns_[i];
    const BlobRef& ref = m.blobs[i];
    const io::MappedFile& mp = mapped.at(ref.pack);
    const std::string what = "snapshot " + dir + "/" + pack_file_name(ref.pack) + ", namespace '" + ns.name + "'";
    const char* blob = mp.p + ref.offset;
    if (crc32(blob, ref.length) != ref.crc) throw CorruptedError(what + ": checksum mismatch");
    Reader rd(blob, ref.length, what);
    uint64_t n_rec = rd.count(64);
    for (uint64_t k = 0; k < n_rec; ++k) {
      Record r = read_record_fields(rd);
      if (r.ns != i) rd.fail("a record of another namespace");
      r.event_time = rd.f64();
      if (!std::isnan(r.event_time) && !(std::fabs(r.event_time) <= kMaxTime)) rd.fail("bad event time");
      uint64_t nh = rd.count(40);
      r.history.reserve(nh);
      for (uint64_t j = 0; j < nh; ++j) r.history.push_back(read_version(rd, dim_));
      uint64_t nc = rd.count(8);
      r.children.resize(nc);
      for (uint64_t j = 0; j < nc; ++j) r.children[j] = rd.i64();
      if (r.id < 0 || r.id == INT64_MAX) rd.fail("record id out of range");
      int64_t id = r.id;
      if (!records_.emplace(id, std::move(r)).second) rd.fail("duplicate record id " + std::to_string(id));
    }
    uint64_t n_tomb = rd.count(8);
    for (uint64_t k = 0; k < n_tomb; ++k) {
      int64_t t = rd.i64();
      ns.tombstones.push_back(t);
      tombstones_.insert(t);
    }
    for (uint8_t l = 0; l < kNumLevels; ++l) {
      uint8_t kind = rd.u8();
      if (kind == 1) {
        uint64_t n = rd.count(8 + 4 * static_cast<size_t>(dim_));  // bounded by the bytes left
        const char* labels = rd.pos();
        rd.skip(n * 8 + n * dim_ * 4);
        ns.index[l].reset(new FlatIndex(space_.get(), dim_, labels, labels + n * 8, n, what));
      } else if (kind == 2) {
        std::string name = rd.str();
        uint64_t size = rd.u64();
        uint32_t crc = rd.u32();
        if (name.empty() || name.find('/') != std::string::npos || name[0] == '.') rd.fail("bad graph file name");
        ns.index[l] = load_vector_index(space_.get(), dim_, dir + "/" + name, size, crc);
        if (std::strcmp(ns.index[l]->kind(), "hnsw") != 0) rd.fail("graph file " + name + " is not a graph");
        ns.graph_file[l] = name;
      } else if (kind != 0) {
        rd.fail("bad index kind " + std::to_string(kind));
      }
    }
    if (rd.left() != 0) rd.fail("trailing bytes");
    ns.blob = ref;
    ns.dirty = false;
  }
  orphan_tombstones_ = m.tombstones;
  tombstones_.insert(m.tombstones.begin(), m.tombstones.end());
  for (const auto& pk : m.packs) packs_[pk.first] = pk.second;
  check_loaded(file);
}

void Store::load_snapshot_v2(const std::string& dir, const std::string& data, const std::string& file) {
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
  orphan_tombstones_ = std::move(s.tombstones);  // their namespaces are not recorded
  // Size, checksum, then structure (FlatIndex or hnswlib graph) before anything is allocated.
  for (const auto& g : s.graphs)
    ns_[g.ns]->index[g.level] = load_vector_index(space_.get(), dim_, dir + "/" + g.name, g.size, g.crc);
  check_loaded(file);  // every namespace stays dirty: the next snapshot writes it in format 3
}

void Store::check_loaded(const std::string& file) {
  // Cross-check records against graphs.
  for (auto& kv : records_) {
    const Record& r = kv.second;
    if (r.ns >= ns_.size()) throw CorruptedError("snapshot " + file + ": record namespace out of range");
    Namespace& ns = *ns_[r.ns];
    if (!ns.index[r.level] || !ns.index[r.level]->contains(r.id))
      throw CorruptedError("snapshot " + file + ": record " + std::to_string(r.id) + " has no vector in its graph");
    ns.n[r.level]++;
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
  // Derived state (BM25 postings, filterable meta, time order): built from the records' texts by
  // the first call that reads it (ensure_derived); log replay and writes until then skip it.
  derived_ready_.store(records_.empty(), std::memory_order_release);
}

// ------------------------------------------------------------------------------- Store: write

// One namespace copied for a snapshot (under a lock): its blob's records and tombstones, and the
// bytes of each level's index (flat rows, or a graph file's bytes).
struct Store::NsImage {
  std::string head;
  uint8_t kind[kNumLevels] = {0, 0};  // 0 none, 1 flat, 2 hnsw
  std::string level[kNumLevels];
  size_t bytes() const { return head.size() + level[0].size() + level[1].size(); }
};

// A snapshot between its rotation and its switch (snapshot.h, steps 2-4).
struct Store::SnapJob {
  enum : uint8_t { kClean = 0, kToCopy = 1, kCopied = 2, kTaken = 3 };
  uint64_t gen = 0, from_gen = 0, store_id = 0, ops_at_rotation = 0;
  bool compacting = false;               // tombstones are dropped (those at rotation)
  SnapshotParams params;
  std::vector<std::string> names;        // [n_ns] the namespaces it holds
  std::vector<uint8_t> state;            // [n_ns]
  std::vector<BlobRef> refs;             // [n_ns] where each blob lies (clean: the live snapshot's)
  std::vector<std::array<std::string, kNumLevels>> graphs;  // [n_ns] graph files each blob names
  std::vector<std::unique_ptr<NsImage>> images;              // [n_ns] copies made by writers
  std::vector<size_t> tombstones_at;     // [n_ns] compaction: tombstones held at rotation
  std::vector<uint32_t> to_copy;
  std::vector<int64_t> orphans;
  std::map<uint64_t, uint64_t> packs, new_packs;
  std::set<uint32_t> moved;              // clean namespaces whose blob was rewritten (retired pack)
  SnapshotStats stats;
};

std::unique_ptr<Store::NsImage> Store::copy_namespace(uint32_t i) const {
  const Namespace& ns = *ns_[i];
  auto im = std::make_unique<NsImage>();
  std::vector<int64_t> ids;
  for (uint8_t l = 0; l < kNumLevels; ++l)
    if (ns.index[l]) {
      std::vector<int64_t> lab = ns.index[l]->labels();
      ids.insert(ids.end(), lab.begin(), lab.end());
    }
  Writer w;
  w.u64(ids.size());
  for (int64_t id : ids) {
    const Record& r = records_.at(id);
    write_record_fields(w, r);
    w.f64(r.event_time);
    w.u64(r.history.size());
    for (const auto& v : r.history) write_version(w, v);
    w.u64(r.children.size());
    for (int64_t c : r.children) w.i64(c);
  }
  const bool drop = job_ && job_->compacting;  // a compaction's snapshot keeps no tombstones
  w.u64(drop ? 0 : ns.tombstones.size());
  if (!drop)
    for (int64_t t : ns.tombstones) w.i64(t);
  im->head = std::move(w.buf);
  for (uint8_t l = 0; l < kNumLevels; ++l)
    if (ns.index[l] && ns.index[l]->size() > 0) {
      im->kind[l] = std::strcmp(ns.index[l]->kind(), "flat") == 0 ? 1 : 2;
      ns.index[l]->serialize(&im->level[l]);
    }
  return im;
}

uint32_t Store::find_ns_index(const std::string& name) const {
  auto it = ns_by_name_.find(name);
  return it == ns_by_name_.end() ? UINT32_MAX : it->second;
}

void Store::before_change(uint32_t nsi) {
  if (!job_ || nsi >= job_->state.size() || job_->state[nsi] != SnapJob::kToCopy) return;
  job_->images[nsi] = copy_namespace(nsi);
  job_->state[nsi] = SnapJob::kCopied;
  ++job_->stats.copied_by_writers;
}

SnapshotStats Store::last_snapshot_stats() const {
  std::shared_lock<std::shared_mutex> lk(mu_);
  return last_stats_;
}

namespace {

// The pack file a snapshot writes: header, then blobs, each with its own CRC-32.
class PackWriter {
 public:
  explicit PackWriter(const std::string& file) : file_(file) {
    fd_ = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, io::kFileMode);
    if (fd_ < 0) throw IOError("create " + file + ": " + std::strerror(errno));
    w_.reset(new io::FdWriter(fd_, file));
    w_->put(kPackMagic, 8);
    w_->pod<uint32_t>(3);
    w_->pod<uint32_t>(0);
  }
  ~PackWriter() {
    if (fd_ >= 0) ::close(fd_);
  }
  void begin() {
    crc_ = 0;
    start_ = w_->bytes();
  }
  void put(const void* p, size_t n) {
    crc_ = crc32_update(crc_, p, n);
    w_->put(p, n);
    if (w_->bytes() - paced_ >= kPace) pace();
  }
  template <typename T>
  void pod(const T& v) {
    put(&v, sizeof(T));
  }
  void str(const std::string& s) {
    pod<uint64_t>(s.size());
    put(s.data(), s.size());
  }
  BlobRef end(uint64_t pack) const { return BlobRef{pack, start_, w_->bytes() - start_, crc_}; }
  // Flushes, fsyncs, checks the length, closes; returns the size.
  uint64_t finish() {
    w_->flush();
    if (io::fsync(fd_) != 0) throw IOError("fsync " + file_ + ": " + std::strerror(errno));
    struct stat st;
    if (::fstat(fd_, &st) != 0 || static_cast<uint64_t>(st.st_size) != w_->bytes())
      throw IOError("snapshot pack " + file_ + " holds " + std::to_string(st.st_size) + " bytes after writing " +
                    std::to_string(w_->bytes()));
    int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) throw IOError("close " + file_ + ": " + std::strerror(errno));
    return w_->bytes();
  }

 private:
  // Streams the file to disk as it is written (start writeback of the last window, wait for the
  // one before), so dirty pages never pile up: the log's fsyncs of concurrent writes do not queue
  // behind hundreds of MB of snapshot, and the final fsync is short. Best effort (the fsync in
  // finish() is what is checked).
  void pace() {
    w_->flush();
    const uint64_t end = w_->bytes();
#ifdef __linux__
    if (paced_ > prev_)
      ::sync_file_range(fd_, static_cast<off_t>(prev_), static_cast<off_t>(paced_ - prev_),
                        SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
    ::sync_file_range(fd_, static_cast<off_t>(paced_), static_cast<off_t>(end - paced_), SYNC_FILE_RANGE_WRITE);
#endif
    prev_ = paced_;
    paced_ = end;
  }

  static constexpr uint64_t kPace = 2u << 20;
  std::string file_;
  int fd_ = -1;
  std::unique_ptr<io::FdWriter> w_;
  uint32_t crc_ = 0;
  uint64_t start_ = 0;
  uint64_t paced_ = 0, prev_ = 0;  // [prev_, paced_): writeback started; [0, prev_): waited for
};

// `to` becomes a hard link of `from` (an unchanged file of the previous snapshot); where the file
// system has no hard links, a checked copy.
void link_or_copy(const std::string& from, const std::string& to) {
  if (::link(from.c_str(), to.c_str()) == 0) return;
  int e = errno;
  if (e != EPERM && e != ENOTSUP && e != EOPNOTSUPP && e != EXDEV && e != EMLINK && e != ENOSYS)
    throw IOError("link " + from + " -> " + to + ": " + std::strerror(e));
  std::string data;
  if (!read_file(from, &data)) throw IOError("copy " + from + ": it is missing");
  uint64_t size;
  uint32_t crc;
  io::write_file_checked(to, "snapshot file", [&](io::FdWriter& w) { w.put(data.data(), data.size()); }, &size, &crc);
}

// Reads `n` bytes at `off` of `file` (a blob of a pack being retired) and checks its CRC-32.
std::string read_blob(const std::string& file, const BlobRef& r) {
  int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw IOError("open " + file + ": " + std::strerror(errno));
  std::string out(r.length, '\0');
  size_t got = 0;
  while (got < r.length) {
    ssize_t k = ::pread(fd, &out[got], r.length - got, static_cast<off_t>(r.offset + got));
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;
    got += static_cast<size_t>(k);
  }
  ::close(fd);
  if (got != r.length || crc32(out.data(), out.size()) != r.crc)
    throw CorruptedError("snapshot pack " + file + ": the blob at offset " + std::to_string(r.offset) +
                         " cannot be read back intact");
  return out;
}

// Copied under one hold of the reader lock, at most about (a hold is also what a preempted
// snapshot thread makes writers wait: keep it short).
constexpr size_t kBatchBytes = 1u << 20;
constexpr double kBatchSeconds = 0.0005;

}  // namespace

void Store::run_snapshot(bool compacting) {
  // 1. The next log file of the chain, durable before anything can be appended to it.
  uint64_t N, G, id;
  WalHeader h;
  {
    std::shared_lock<std::shared_mutex> lk(mu_);
    check_writable();
    N = log_gen_ + 1;
    G = generation_;
    id = store_id_ ? store_id_ : new_store_id();  // an old store gets its id now
    h.dim = dim_;
    h.metric = static_cast<uint32_t>(metric_);
    h.generation = N;
    h.store_id = id;
  }
  const std::string new_log = path_ + "/" + log_file_name(N);
  Wal::create(path_, log_file_name(N), h);
  auto drop_new_log = [&] { ::unlink(new_log.c_str()); };
  gate_at("created");
  // Most unsynced bytes of the live log, outside the lock (the rotation syncs what is left).
  if (io::fdatasync(wal_.fd()) != 0) {
    std::string e = std::strerror(errno);
    drop_new_log();
    throw IOError("fdatasync write-ahead log " + wal_.file() + ": " + e);
  }
  // 2. Rotation: from here on writes go to the new log; snapshot N holds the state at this point.
  auto job = std::make_unique<SnapJob>();
  const double t_start = now_s();
  {
    std::unique_lock<std::shared_mutex> lk(mu_);
    const double t_locked = now_s();
    try {
      check_writable();
      if (wal_.synced_end() < wal_.end()) wal_.sync();  // the earlier file of a chain is complete and synced
      job->compacting = compacting;
      std::string old_log = wal_.file();
      wal_.switch_to(new_log);
      chain_.push_back(old_log);
    } catch (...) {
      drop_new_log();
      throw;
    }
    dirty_ = false;
    last_sync_ = now_s();
    log_gen_ = N;
    job->gen = N;
    job->from_gen = G;
    job->store_id = id;
    job->ops_at_rotation = ops_since_snapshot_;
    job->params.dim = dim_;
    job->params.metric = static_cast<uint32_t>(metric_);
    job->params.M = M_;
    job->params.ef_construction = efc_;
    job->params.next_id = next_id_;
    const size_t n = ns_.size();
    job->names.resize(n);
    job->state.assign(n, SnapJob::kClean);
    job->refs.resize(n);
    job->graphs.resize(n);
    job->images.resize(n);
    job->tombstones_at.resize(n);
    for (uint32_t i = 0; i < n; ++i) {
      Namespace& ns = *ns_[i];
      job->names[i] = ns.name;
      job->tombstones_at[i] = ns.tombstones.size();
      if (ns.dirty || ns.blob.pack == 0 || job->compacting) {
        job->state[i] = SnapJob::kToCopy;
        job->to_copy.push_back(i);
        ns.dirty = false;  // a write from now on marks it again (for the next snapshot)
      } else {
        job->refs[i] = ns.blob;
        for (uint8_t l = 0; l < kNumLevels; ++l) job->graphs[i][l] = ns.graph_file[l];
      }
    }
    job->orphans = job->compacting ? std::vector<int64_t>{} : orphan_tombstones_;
    if (!job->compacting) job->packs = packs_;
    job_ = job.get();
    job->stats.rotation_hold_s = now_s() - t_locked;
  }
  gate_at("rotated");
  const std::string dir = path_ + "/" + snapshot_dir_name(N);
  const std::string cur_tmp = path_ + "/CURRENT.tmp";
  try {
    write_snapshot_files(*job, dir);
  } catch (...) {
    {
      std::unique_lock<std::shared_mutex> lk(mu_);
      job_ = nullptr;
      for (uint32_t i : job->to_copy)
        if (i < ns_.size()) ns_[i]->dirty = true;
    }
    remove_tree(dir);
    ::unlink(cur_tmp.c_str());
    throw;
  }
  // From the rename of CURRENT on, generation N is the store.
  gate_at("switched");
  // The switch durable before the new log replaces wal.log (the older log the switch retires):
  // without it a power loss could keep the rename of the log but not CURRENT's. The new log then
  // takes the steady-state name (its fd stays open; if the rename fails it keeps its own name:
  // a reopen finds it by its header). If this fsync fails, nothing older is removed.
  std::string sync_error;
  try {
    fsync_path(path_, true);
  } catch (const std::exception& e) {
    sync_error = e.what();
  }
  const std::string steady = path_ + "/wal.log";
  const bool renamed = sync_error.empty() && io::rename(new_log.c_str(), steady.c_str()) == 0;
  std::string active;
  {
    std::unique_lock<std::shared_mutex> lk(mu_);
    const double t_locked = now_s();
    generation_ = N;
    store_id_ = id;
    for (uint32_t i = 0; i < job->names.size(); ++i) {
      if (job->state[i] == SnapJob::kClean && !job->moved.count(i)) continue;
      ns_[i]->blob = job->refs[i];
      for (uint8_t l = 0; l < kNumLevels; ++l) ns_[i]->graph_file[l] = job->graphs[i][l];
    }
    if (job->compacting) {  // the tombstones the snapshot dropped (later deletes keep theirs)
      for (uint32_t i = 0; i < job->names.size(); ++i) {
        auto& t = ns_[i]->tombstones;
        size_t k = std::min(job->tombstones_at[i], t.size());
        for (size_t j = 0; j < k; ++j) tombstones_.erase(t[j]);
        t.erase(t.begin(), t.begin() + static_cast<std::ptrdiff_t>(k));
      }
      for (int64_t t : orphan_tombstones_) tombstones_.erase(t);
      orphan_tombstones_.clear();
      for (auto& ns : ns_)  // deletes logged since the rotation
        for (int64_t t : ns->tombstones) tombstones_.insert(t);
    }
    packs_ = job->new_packs;
    ops_since_snapshot_ -= std::min(ops_since_snapshot_, job->ops_at_rotation);
    snapshot_retry_at_ = 0;
    job_ = nullptr;
    chain_.clear();
    if (renamed) wal_.set_file_name(steady);
    active = wal_.file();
    job->stats.switch_hold_s = now_s() - t_locked;
    job->stats.total_s = now_s() - t_start;
    last_stats_ = job->stats;
  }
  if (!sync_error.empty())
    throw IOError("snapshot " + std::to_string(N) + " is in place, but " + sync_error + "; the files it replaces are kept");
  // The rename durable before the files of older generations go (if this fsync fails they stay;
  // the next snapshot or open removes them).
  fsync_path(path_, true);
  const std::string active_name = active.substr(active.rfind('/') + 1);
  for (const auto& n : list_dir(path_)) {
    if (n.rfind("snap-", 0) == 0 && n != snapshot_dir_name(N)) remove_tree(path_ + "/" + n);
    if (is_log_file_name(n) && n != active_name) ::unlink((path_ + "/" + n).c_str());
  }
}

void Store::write_snapshot_files(SnapJob& job, const std::string& dir) {
  const uint64_t N = job.gen;
  const std::string from = path_ + "/" + snapshot_dir_name(job.from_gen);
  if (exists(dir)) remove_tree(dir);
  if (::mkdir(dir.c_str(), io::kDirMode) != 0) throw IOError("create " + dir + ": " + std::strerror(errno));
  // The blobs the unchanged namespaces point into; a pack less than half of which is live has
  // its live blobs rewritten (so old packs do not pile up).
  std::map<uint64_t, uint64_t> live;
  for (uint32_t i = 0; i < job.state.size(); ++i)
    if (job.state[i] == SnapJob::kClean) live[job.refs[i].pack] += job.refs[i].length;
  std::set<uint64_t> retire;
  for (const auto& pk : job.packs)
    if (2 * live[pk.first] < pk.second - kPackHeaderSize) retire.insert(pk.first);
  PackWriter pw(dir + "/" + pack_file_name(N));
  auto write_image = [&](uint32_t i, const NsImage& im) {
    pw.begin();
    pw.put(im.head.data(), im.head.size());
    for (uint8_t l = 0; l < kNumLevels; ++l) {
      pw.pod<uint8_t>(im.kind[l]);
      job.graphs[i][l].clear();
      if (im.kind[l] == 1) {
        pw.put(im.level[l].data(), im.level[l].size());
      } else if (im.kind[l] == 2) {
        std::string name = "g" + std::to_string(i) + "_" + std::to_string(l) + ".hnsw";
        uint64_t size;
        uint32_t crc;
        io::write_file_checked(dir + "/" + name, "graph file",
                               [&](io::FdWriter& w) { w.put(im.level[l].data(), im.level[l].size()); }, &size, &crc);
        job.stats.bytes += size;
        pw.str(name);
        pw.pod<uint64_t>(size);
        pw.pod<uint32_t>(crc);
        job.graphs[i][l] = name;
      }
    }
    job.refs[i] = pw.end(N);
  };
  // 3. The namespaces changed since the last snapshot, copied a batch at a time under the reader
  // lock (writers wait at most one batch; a write to a namespace not copied yet copies it first).
  size_t k = 0;
  while (k < job.to_copy.size()) {
    std::vector<std::pair<uint32_t, std::unique_ptr<NsImage>>> batch;
    {
      std::shared_lock<std::shared_mutex> lk(mu_);
      const double t0 = now_s();
      size_t bytes = 0;
      do {
        uint32_t i = job.to_copy[k++];
        std::unique_ptr<NsImage> im =
            job.state[i] == SnapJob::kCopied ? std::move(job.images[i]) : copy_namespace(i);
        job.state[i] = SnapJob::kTaken;
        bytes += im->bytes();
        batch.emplace_back(i, std::move(im));
      } while (k < job.to_copy.size() && bytes < kBatchBytes && now_s() - t0 < kBatchSeconds);
      job.stats.max_batch_hold_s = std::max(job.stats.max_batch_hold_s, now_s() - t0);
      ++job.stats.batches;
      job.stats.copied += batch.size();
    }
    for (auto& b : batch) write_image(b.first, *b.second);
  }
  gate_at("copied");
  // Unchanged namespaces in a retired pack: their blobs move to the new pack as they are.
  for (uint32_t i = 0; i < job.state.size(); ++i) {
    if (job.state[i] != SnapJob::kClean || !retire.count(job.refs[i].pack)) continue;
    std::string blob = read_blob(from + "/" + pack_file_name(job.refs[i].pack), job.refs[i]);
    pw.begin();
    pw.put(blob.data(), blob.size());
    job.refs[i] = pw.end(N);
    job.moved.insert(i);
  }
  job.new_packs[N] = pw.finish();
  job.stats.bytes += job.new_packs[N];
  // Files kept from the live snapshot: hard links.
  for (const auto& pk : job.packs)
    if (!retire.count(pk.first) && live[pk.first] > 0) {
      link_or_copy(from + "/" + pack_file_name(pk.first), dir + "/" + pack_file_name(pk.first));
      job.new_packs[pk.first] = pk.second;
      ++job.stats.linked;
    }
  for (uint32_t i = 0; i < job.state.size(); ++i)
    if (job.state[i] == SnapJob::kClean)
      for (uint8_t l = 0; l < kNumLevels; ++l)
        if (!job.graphs[i][l].empty()) {
          link_or_copy(from + "/" + job.graphs[i][l], dir + "/" + job.graphs[i][l]);
          ++job.stats.linked;
        }
  // 4. The manifest, then the switch.
  Manifest m;
  m.params = job.params;
  for (const auto& pk : job.new_packs) m.packs.emplace_back(pk.first, pk.second);
  m.namespaces = job.names;
  m.blobs = job.refs;
  m.tombstones = job.orphans;
  write_file_atomic(dir, "records.bin", encode_manifest(m));  // also fsyncs the snapshot directory
  fsync_path(path_, true);                                    // the snapshot directory's own entry
  write_temp(path_, "CURRENT", encode_current(N, job.store_id));
  gate_at("written");
  const std::string cur_tmp = path_ + "/CURRENT.tmp";
  if (io::rename(cur_tmp.c_str(), (path_ + "/CURRENT").c_str()) != 0)
    throw IOError("rename " + cur_tmp + ": " + std::strerror(errno));
}

void Store::snapshot() {
  {
    std::shared_lock<std::shared_mutex> lk(mu_);
    check_writable();
    if (memory_) return;  // persistence off: nothing to write
  }
  std::lock_guard<std::mutex> run(snap_run_mu_);
  run_snapshot();
}

void Store::snapshot_async() {
  std::unique_lock<std::shared_mutex> lk(mu_);
  check_writable();
  if (memory_) return;
  request_snapshot();
}

void Store::auto_snapshot() {
  try {
    run_snapshot();
    std::unique_lock<std::shared_mutex> lk(mu_);
    last_snapshot_error_.clear();
  } catch (const std::exception& e) {
    // Every write is in the log chain: report, retry snapshot_every operations later.
    std::unique_lock<std::shared_mutex> lk(mu_);
    last_snapshot_error_ = e.what();
    ++snapshot_failures_;
    snapshot_retry_at_ = ops_since_snapshot_ + std::max<uint64_t>(snapshot_every_, 1);
  }
}

void Store::request_snapshot() {
  std::lock_guard<std::mutex> g(snap_mu_);
  if (snap_stop_ || snap_wanted_ || snap_busy_) return;
  if (!snap_thread_.joinable()) {
    try {
      snap_thread_ = std::thread(&Store::snapshot_thread_main, this);
    } catch (const std::exception& e) {
      last_snapshot_error_ = std::string("the snapshot thread could not start: ") + e.what();
      ++snapshot_failures_;
      snapshot_retry_at_ = ops_since_snapshot_ + std::max<uint64_t>(snapshot_every_, 1);
      return;
    }
  }
  snap_wanted_ = true;
  snap_cv_.notify_all();
}

void Store::snapshot_thread_main() {
  std::unique_lock<std::mutex> g(snap_mu_);
  for (;;) {
    snap_cv_.wait(g, [&] { return snap_wanted_ || snap_stop_; });
    if (snap_stop_) break;
    snap_wanted_ = false;
    snap_busy_ = true;
    g.unlock();
    {
      std::lock_guard<std::mutex> run(snap_run_mu_);
      auto_snapshot();
    }
    g.lock();
    snap_busy_ = false;
    snap_cv_.notify_all();
  }
}

void Store::stop_snapshot_thread() {
  {
    std::lock_guard<std::mutex> g(snap_mu_);
    snap_stop_ = true;
    snap_cv_.notify_all();
  }
  if (snap_thread_.joinable()) snap_thread_.join();
}

void Store::wait_snapshot() {
  {
    std::unique_lock<std::mutex> g(snap_mu_);
    snap_cv_.wait(g, [&] { return (!snap_wanted_ && !snap_busy_) || snap_stop_; });
  }
  std::lock_guard<std::mutex> run(snap_run_mu_);  // and one another thread writes (snapshot(), compact())
}

}  // namespace memkern
