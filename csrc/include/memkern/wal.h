// Write-ahead log. File = header, then entries.
//   header (44 bytes): magic "MKWAL\0\0\0", u32 format, u32 dim, u32 metric, u32 reserved,
//                      u64 generation, u64 reserved, u32 crc32 of the preceding 40 bytes.
//   entry: u32 len, u32 crc32(payload), u32 crc32(first 8 bytes), payload[len].
// A short or unverifiable *last* entry is a torn write and is cut off on open; a bad entry
// followed by more data is corruption (CorruptedError): acknowledged data is never dropped
// silently.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace memkern {

constexpr uint32_t kFormatVersion = 1;

struct WalHeader {
  uint32_t format = kFormatVersion;
  uint32_t dim = 0;
  uint32_t metric = 0;
  uint64_t generation = 0;
};

class Wal {
 public:
  Wal() = default;
  ~Wal();
  Wal(const Wal&) = delete;
  Wal& operator=(const Wal&) = delete;

  // Creates (atomically: temp + fsync + rename + fsync dir) an empty log.
  static void create(const std::string& dir, const std::string& name, const WalHeader& h);
  // Reads the header and every intact entry; cuts a torn tail off the file. Throws
  // CorruptedError for a bad header or a bad entry that is not the last one.
  static WalHeader read(const std::string& file, std::vector<std::string>* entries, bool* torn);

  void open_append(const std::string& file);
  // Appends one entry with a single write(); returns after the bytes are in the OS (a process
  // kill can no longer lose them); sync() makes them durable against power loss.
  void append(const std::string& payload);
  void sync();
  void close();
  uint64_t entries_since_open() const { return n_; }
  uint64_t bytes() const { return bytes_; }

 private:
  int fd_ = -1;
  uint64_t n_ = 0;
  uint64_t bytes_ = 0;
};

// File helpers used by the log and the snapshot.
void write_file_atomic(const std::string& dir, const std::string& name, const std::string& data);
void fsync_path(const std::string& path, bool directory);
bool read_file(const std::string& path, std::string* out);  // false if it does not exist

}  // namespace memkern
