// Snapshot = a generation directory "snap-<gen>/" holding records.bin and one hnswlib graph
// file per (namespace, level), plus the CURRENT file naming the live generation.
//   CURRENT (24 bytes): magic "MKCUR\0\0\0", u32 format, u64 generation, u32 crc32.
//   records.bin: magic "MKSNAP\0\0", u32 format, u64 body_len, body, u32 crc32(all before).
//     body: dim, metric, M, ef_construction, next_id, namespaces, records (+ history,
//     children), tombstones, graph table (file name, size, crc32 of each graph file).
// Graph files are verified against size + crc32 before hnswlib parses them.
#pragma once
#include <cstdint>
#include <string>

namespace memkern {

constexpr uint64_t kNoGeneration = ~uint64_t(0);

void write_current(const std::string& dir, uint64_t generation);
// Returns kNoGeneration when there is no CURRENT file; CorruptedError when it is bad.
uint64_t read_current(const std::string& dir);
std::string snapshot_dir_name(uint64_t generation);
// size + crc32 of a whole file (CorruptedError if unreadable).
void file_size_crc(const std::string& path, uint64_t* size, uint32_t* crc);

}  // namespace memkern
