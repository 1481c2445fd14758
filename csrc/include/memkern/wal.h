// Write-ahead log and the small-file helpers the snapshot shares.
//
// File = header, then entries (all integers little-endian).
//   header (44 bytes): magic "MKWAL\0\0\0", u32 format, u32 dim, u32 metric, u32 flags (0),
//                      u64 generation, u64 store_id, u32 crc32 of the preceding 40 bytes.
//     format 2 (written now) carries the store's random id; format 1 (older stores, still read)
//     had a reserved zero there, read as store_id 0 ("unknown"). generation = the snapshot the log
//     continues (0: none yet). Opening refuses a log whose store_id is not the snapshot's
//     (another store's log) and a log whose generation is not the snapshot's or the one before
//     it (the crash window between switching CURRENT and replacing the log).
//   entry: u32 len, u32 crc32(payload), u32 crc32(the first 8 bytes), payload[len].
//     payload: u32 n_ops, then n_ops operations (store.cpp), applied all-or-nothing.
// Reading tells a torn tail from damage:
//   * torn (cut off on open, it was never acknowledged): fewer than 12 bytes left, or an intact
//     entry header whose length runs past the end of the file, or a tail of zero bytes only
//     (space a file system allocated but never wrote);
//   * damage (CorruptedError, nothing is dropped silently): a bad entry header, or a complete
//     entry (all its bytes present) whose payload fails its checksum, wherever it is.
// Appending: one write() per entry. A failed or short write is cut back off the file
// (ftruncate to the previous end + fdatasync) before the error is raised; when even that fails
// the log refuses every later append (poisoned) until a retry of the cut succeeds.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace memkern {

constexpr uint32_t kFormatVersion = 1;     // records.bin
constexpr uint32_t kWalFormat = 2;         // wal.log written now (1 is still read)
constexpr uint32_t kCurrentFormat = 2;     // CURRENT written now (1 is still read)

struct WalHeader {
  uint32_t format = kWalFormat;
  uint32_t dim = 0;
  uint32_t metric = 0;
  uint64_t generation = 0;
  uint64_t store_id = 0;  // 0: unknown (a format-1 log, or a store created before store ids)
};

// What Wal::read found besides the entries.
struct WalScan {
  bool torn = false;       // an incomplete (unacknowledged) last entry or a zero tail follows
  uint64_t good_end = 0;   // end of the last intact entry (where a torn tail is cut)
  uint64_t file_size = 0;
};

class Wal {
 public:
  Wal() = default;
  ~Wal();
  Wal(const Wal&) = delete;
  Wal& operator=(const Wal&) = delete;

  static std::string encode_header(const WalHeader& h);
  // Creates (atomically: temp + fsync + rename + fsync dir) an empty log.
  static void create(const std::string& dir, const std::string& name, const WalHeader& h);
  // Reads the header and every intact entry; changes nothing on disk. Throws CorruptedError for
  // a bad header or damaged entries (see above).
  static WalHeader read(const std::string& file, std::vector<std::string>* entries, WalScan* scan);
  // Cuts the file to `size` bytes and fsyncs it (drops a torn tail).
  static void cut(const std::string& file, uint64_t size);

  void open_append(const std::string& file);
  // Appends one entry with a single write(); returns after the bytes are in the OS (a process
  // kill can no longer lose them); sync() makes them durable against power loss. On failure
  // the partial entry is removed (or the log poisoned) and IOError is raised.
  void append(const std::string& payload);
  // Removes the entry the last append() wrote (its sync failed: it must not come back).
  // Poisons the log if the file cannot be cut back; never throws.
  void undo_last();
  void sync();
  void close();
  bool is_open() const { return fd_ >= 0; }
  bool poisoned() const { return !poison_.empty(); }
  uint64_t entries_since_open() const { return n_; }
  uint64_t bytes() const { return bytes_; }

 private:
  bool rewind_to(uint64_t end);  // ftruncate + fdatasync; false (and errno) on failure

  int fd_ = -1;
  std::string file_;
  uint64_t n_ = 0;
  uint64_t bytes_ = 0;
  uint64_t end_ = 0;         // file size after the last good entry
  uint64_t last_start_ = 0;  // where the last appended entry starts
  std::string poison_;       // why appends are refused (empty: they are not)
};

// File helpers used by the log and the snapshot (all writes, fsyncs and renames go through
// memkern::io, hence through the test-only fault injector).
// Writes dir/name.tmp and fsyncs it.
void write_temp(const std::string& dir, const std::string& name, const std::string& data);
// write_temp, rename over dir/name, fsync dir.
void write_file_atomic(const std::string& dir, const std::string& name, const std::string& data);
void fsync_path(const std::string& path, bool directory);
bool read_file(const std::string& path, std::string* out);  // false if it does not exist

}  // namespace memkern
