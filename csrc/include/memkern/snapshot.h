// Snapshot = a generation directory "snap-<gen>/" holding records.bin and one hnswlib graph
// file per (namespace, level), plus the CURRENT file naming the live generation.
//   CURRENT, format 2 (32 bytes): magic "MKCUR\0\0\0", u32 format, u64 generation,
//     u64 store_id (random, nonzero; the log header carries the same id), u32 crc32.
//     Format 1 (24 bytes, older stores, still read): no store_id (read as 0, "unknown"); the
//     next snapshot of such a store gives it an id.
//   records.bin: magic "MKSNAP\0\0", u32 format, u64 body_len, body, u32 crc32(all before).
//     body: dim, metric, M, ef_construction, next_id, namespaces, records (+ history,
//     children), tombstones, graph table (file name, size, crc32 of each graph file).
// Graph files are verified against size + crc32, then their structure (hnsw_index.h,
// validate_graph_bytes), before hnswlib parses them.
// records.bin body in full (all integers little-endian, str = u64 length + bytes):
//   u32 dim, u32 metric, u32 M, u32 ef_construction, i64 next_id,
//   u64 n_namespaces, n x str name,
//   u64 n_records, n x (record fields (record.h), u64 n_history, n x version (record.h),
//                       u64 n_children, n x i64 child id),
//   u64 n_tombstones, n x i64 id,
//   u64 n_graphs, n x (u32 namespace index, u8 level, str file name, u64 size, u32 crc32).
//   format 2 only: u64 n_event_times, n x (i64 record id, f64 event_time) for the records that
//     have one (format 1, older stores, still read: no event times).
// The BM25 and filterable-meta indexes are not in the snapshot: they are rebuilt from the records'
// texts when the store opens (store.h, Namespace::lex / meta).
// Writing a snapshot: graph files and records.bin (each checked write + fsync), then CURRENT.tmp
// and wal.log.tmp (the next, empty log), then the switch: rename CURRENT.tmp -> CURRENT, rename
// wal.log.tmp -> wal.log, fsync the directory, remove the old generation. Any failure before the
// first rename leaves the store as it was.
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

// Limits of a store's parameters (checked when a store opens and when a snapshot is read).
constexpr uint32_t kMaxDim = 1u << 16;
constexpr uint32_t kMaxM = 4096;
constexpr uint32_t kMaxEfConstruction = 1u << 20;

// The graph table entry of one (namespace, level) index file in a snapshot directory.
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

// What records.bin holds, decoded and checked (ranges, ids, graph table) but not yet linked.
struct SnapshotContents {
  SnapshotParams params;
  std::vector<std::string> namespaces;
  std::unordered_map<int64_t, Record> records;  // with history and children
  std::vector<int64_t> tombstones;
  std::vector<GraphFile> graphs;
};

// The whole records.bin file (magic, format, length, body, crc32). Records are written in the
// map's iteration order, each with its history and children.
std::string encode_records_file(const SnapshotParams& params, const std::vector<std::string>& namespaces,
                                const std::unordered_map<int64_t, Record>& records,
                                const std::unordered_set<int64_t>& tombstones, const std::vector<GraphFile>& graphs);
// Parses and checks a records.bin file; CorruptedError naming "snapshot <file>" when it is bad.
SnapshotContents decode_records_file(const std::string& data, const std::string& file);

}  // namespace memkern
