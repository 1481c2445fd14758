// Snapshots and the log chain: the one place their on-disk format and the rules that keep them
// crash-safe are written down (the log's own framing: log_codec.h).
//
// Files of a store directory:
//   CURRENT          names the live snapshot generation G (absent: no snapshot yet, G = 0).
//   snap-<G>/        the snapshot: records.bin (the manifest), pack-<P>.bin files (namespace blobs),
//                    g<ns>_<level>.hnsw files (the graphs of namespaces past flat_limit).
//   wal.log, wal-<N>.log   the log chain after snapshot G (below).
//   LOCK             the flock of the open store, and the pid that holds it.
//
// CURRENT, format 2 (32 bytes): magic "MKCUR\0\0\0", u32 format, u64 generation, u64 store_id
//   (random, nonzero; every log header carries the same id), u32 crc32. Format 1 (24 bytes, older
//   stores, still read): no store_id (read as 0, "unknown"); the next snapshot gives it one.
//
// records.bin, format 3 (written now): magic "MKSNAP\0\0", u32 format, u64 body_len, body,
//   u32 crc32(all before). All integers little-endian, str = u64 length + bytes.
//   body: u32 dim, u32 metric, u32 M, u32 ef_construction, i64 next_id,
//         u64 n_packs, n x (u64 pack number P, u64 file size)        (the files pack-<P>.bin),
//         u64 n_namespaces, n x (str name, u64 pack number, u64 offset, u64 length, u32 crc32)
//                                                                    (where its blob lies),
//         u64 n_tombstones, n x i64 id   (deleted ids taken over from a format 1-2 snapshot, whose
//                                         namespace is not recorded; until compaction).
// pack-<P>.bin: magic "MKPACK\0\0", u32 format (3), u32 0, then namespace blobs back to back. P is
//   the generation of the snapshot that wrote it. A later snapshot that finds a namespace unchanged
//   keeps pointing at its blob and hard-links the pack (and the namespace's graph files) into its
//   own directory; it rewrites the live blobs of a pack less than half of which is still live.
// blob of one namespace (index i of the namespace table):
//   u64 n_records, n x (record fields (record.h; ns = i), f64 event_time (NaN: none),
//                       u64 n_history, n x version (record.h), u64 n_children, n x i64 child id),
//   u64 n_tombstones, n x i64 (ids deleted from the namespace, until compaction),
//   then per level (topic, turn): u8 kind, then
//     kind 0: no index;
//     kind 1 (flat): u64 n, i64 labels[n], f32 vectors[n][dim];
//     kind 2 (hnsw): str file name, u64 size, u32 crc32 of that hnswlib graph file (hnsw_index.h).
// Every blob is checked against its crc32, sizes and counts against the bytes left, vectors as
// finite with norm <= 1e18, graphs by size + crc32 and then their structure (validate_graph_bytes),
// records against the indexes and the topic <-> turn links, all before the store opens.
// The BM25, filterable-meta and time indexes are not in the snapshot: they are rebuilt from the
// records when the store opens (store.h, Namespace::lex / meta / times).
//
// records.bin, formats 1-2 (older stores, still read; the next snapshot writes format 3): the body
//   u32 dim, u32 metric, u32 M, u32 ef_construction, i64 next_id, u64 n_namespaces, n x str name,
//   u64 n_records, n x (record fields, u64 n_history, n x version, u64 n_children, n x i64),
//   u64 n_tombstones, n x i64, u64 n_graphs, n x (u32 namespace, u8 level, str file name, u64 size,
//   u32 crc32), and in format 2 u64 n_event_times, n x (i64 id, f64 event_time); one index file per
//   (namespace, level): FlatIndex's file layout (flat_index.h) or an hnswlib graph.
//
// Logs. The log is a chain of files L_G, L_G+1, ..., L_G+m (header generations consecutive, the
// first = CURRENT's G): wal.log, or wal-<N>.log for generation N. Opening replays them in order on
// top of snapshot G, refuses a chain with a gap, another store's log, or a log of a generation
// before G-1 alone (its writes would be missing); removes older files; appends to the last one.
// A log of generation G-1 with no newer one is what a crash between CURRENT's switch and the log
// rename of a format 1-2 store leaves: its content is in the snapshot, a fresh log replaces it.
// Every file but the last is complete and synced (rotation below), so only the last may have a
// torn tail; damage to an earlier one is reported as corruption.
//
// Writing snapshot N (Store::snapshot, close, compact, and the automatic one in the background
// thread, snapshot_every logged operations after the last):
//   1. create wal-<N>.log (empty, synced, directory synced), sync the live log;
//   2. rotation, under the writer lock (microseconds to a few ms: no file is written under it):
//      sync the live log if it holds unsynced entries, switch appends to wal-<N>.log, and note
//      what snapshot N holds: the state at this point. The namespaces changed since the last
//      snapshot are marked for copying;
//   3. copy each marked namespace into a blob under the reader lock (one batch of namespaces at a
//      time, a few ms each; readers continue, writers wait at most one batch), while writes go on:
//      a write to a namespace not copied yet copies it first (copy-on-write), so every blob is
//      the namespace as of step 2; the blobs go to snap-<N>/pack-<N>.bin and graph files,
//      unchanged namespaces keep their blobs (packs and graphs hard-linked), all synced;
//   4. records.bin (synced), the directory synced, CURRENT.tmp (synced), rename it over CURRENT
//      (the switch: from here generation N is the store), the directory synced;
//   5. once that sync returned (else a power loss could keep this rename but not CURRENT's),
//      rename wal-<N>.log to wal.log (the fd stays open), sync the directory, remove the older
//      logs and snapshot directories.
// Read-only views (Store::open_read_only, another process than the writer's, no LOCK): open reads
// CURRENT, the snapshot and the chain through descriptors and starts again when the writer's
// steps 4-5 rename or remove a file under it (or a chain file reads torn before the next one has
// entries). An earlier log is read again to its end once a later one was seen with entries (the
// writer may have appended to it meanwhile); the view follows the last log with entries (a newer
// empty one is step 1's, not switched to yet). refresh() reads the followed log from where it stopped; once the writer has switched
// on (a later log holds entries, or CURRENT names a later generation) that log is complete: its
// rest is read and the view goes on with the log of the next generation, wal-<N>.log or wal.log.
// A view whose next log was already removed (two snapshots on) reopens. Views never write.
// A crash anywhere loses nothing acknowledged: before step 4's rename the store is snapshot G
// plus the whole chain (the new file included); after it, snapshot N plus wal-<N>.log / wal.log.
// A failure before the switch removes snap-<N>/ and leaves the chain one file longer (the next
// snapshot retires it); it is reported (last_snapshot_error), never raised by the write that
// triggered it. A write never waits for a file of the snapshot to be written.
#pragma once
#include <cstdint>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "memkern/record.h"

namespace memkern {

constexpr uint64_t kNoGeneration = ~uint64_t(0);

struct Current {
  uint64_t generation = kNoGeneration;  // kNoGeneration: no CURRENT file
  uint64_t store_id = 0;                // 0: unknown (format 1)
  uint32_t format = 0;
};

std::string encode_current(uint64_t generation, uint64_t store_id);
// CorruptedError when the file is bad.
Current read_current(const std::string& dir);
// A random nonzero 64-bit store id.
uint64_t new_store_id();
std::string snapshot_dir_name(uint64_t generation);
std::string pack_file_name(uint64_t pack);
// "wal.log" for the steady state, "wal-<N>.log" for a newer log of the chain.
std::string log_file_name(uint64_t generation);
// Whether a directory entry is a log file of the chain (wal.log or wal-<digits>.log).
bool is_log_file_name(const std::string& name);

// Limits of a store's parameters (checked when a store opens and when a snapshot is read).
constexpr uint32_t kMaxDim = 1u << 16;
constexpr uint32_t kMaxM = 4096;
constexpr uint32_t kMaxEfConstruction = 1u << 20;

constexpr char kPackMagic[8] = {'M', 'K', 'P', 'A', 'C', 'K', 0, 0};
constexpr size_t kPackHeaderSize = 16;

// The graph table entry of one (namespace, level) index file in a format 1-2 snapshot directory.
struct GraphFile {
  uint32_t ns = 0;
  uint8_t level = kTopic;
  std::string name;  // file name inside the snapshot directory (no '/')
  uint64_t size = 0;
  uint32_t crc = 0;
};

struct SnapshotParams {
  uint32_t dim = 0, metric = 0, M = 0, ef_construction = 0;
  int64_t next_id = 0;
};

// What a format 1-2 records.bin holds, decoded and checked (ranges, ids, graph table) but not
// yet linked.
struct SnapshotContents {
  SnapshotParams params;
  std::vector<std::string> namespaces;
  std::unordered_map<int64_t, Record> records;  // with history and children
  std::vector<int64_t> tombstones;
  std::vector<GraphFile> graphs;
};

// The whole format-2 records.bin file (magic, format, length, body, crc32): what older stores
// hold (kept to write test stores of that format). Records are written in the map's iteration
// order, each with its history and children.
std::string encode_records_file(const SnapshotParams& params, const std::vector<std::string>& namespaces,
                                const std::unordered_map<int64_t, Record>& records,
                                const std::unordered_set<int64_t>& tombstones, const std::vector<GraphFile>& graphs);
// Parses and checks a format 1-2 records.bin file; CorruptedError naming "snapshot <file>" when
// it is bad (a format-3 file is refused here: decode_manifest reads it).
SnapshotContents decode_records_file(const std::string& data, const std::string& file);

// Where the blob of one namespace lies (format 3).
struct BlobRef {
  uint64_t pack = 0, offset = 0, length = 0;
  uint32_t crc = 0;
};

// A format-3 records.bin, decoded and checked (ranges; the packs and blobs are read apart).
struct Manifest {
  SnapshotParams params;
  std::vector<std::pair<uint64_t, uint64_t>> packs;  // (pack number, file size)
  std::vector<std::string> namespaces;
  std::vector<BlobRef> blobs;  // [n_namespaces]
  std::vector<int64_t> tombstones;
};

std::string encode_manifest(const Manifest& m);
Manifest decode_manifest(const std::string& data, const std::string& file);
// The records.bin format of `data` (1..3) after checking magic, length and crc32.
uint32_t records_file_format(const std::string& data, const std::string& file);

// Test hooks: hold the thread writing a snapshot at `point` ("rotated": just after the rotation;
// "copied": every changed namespace copied and written; "written": records.bin and CURRENT.tmp
// written, before the switch; "switched": just after it; "" off) until release_snapshot_gate().
// MEMKERN_SNAPSHOT_GATE=<point>, read when a store opens, holds it there for good (crash
// tests kill the process). wait_snapshot_gate: whether the point was reached within the timeout.
void set_snapshot_gate(const std::string& point);
bool wait_snapshot_gate(double timeout_s);
void release_snapshot_gate();
void set_snapshot_gate_from_env();  // MEMKERN_SNAPSHOT_GATE, read when a store opens

}  // namespace memkern
