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
// Writing a snapshot: graph files and records.bin (each checked write + fsync), then CURRENT.tmp
// and wal.log.tmp (the next, empty log), then the switch: rename CURRENT.tmp -> CURRENT, rename
// wal.log.tmp -> wal.log, fsync the directory, remove the old generation. Any failure before the
// first rename leaves the store as it was.
#pragma once
#include <cstdint>
#include <string>

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

}  // namespace memkern
