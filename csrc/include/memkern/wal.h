// Write-ahead log file (header + framed entries) and the small-file helpers the snapshot shares.
// The file format, how a torn tail is told from damage, and how appends fail cleanly are written
// down in one place: memkern/log_codec.h.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace memkern {

constexpr uint32_t kFormatVersion = 3;     // records.bin written now (1 and 2 are still read: snapshot.h)
constexpr uint32_t kWalFormat = 3;         // log files written now (1 and 2 are still read and appended to)
constexpr uint32_t kCurrentFormat = 2;     // CURRENT written now (1 is still read)
constexpr size_t kWalHeaderSize = 44;

struct WalHeader {
  uint32_t format = kWalFormat;
  uint32_t dim = 0;
  uint32_t metric = 0;
  uint64_t generation = 0;
  uint64_t store_id = 0;  // 0: unknown (a format-1 log, or a store created before store ids)
};

// What Wal::read found besides the entries (log_codec.h, "Reading").
struct WalScan {
  bool torn = false;       // bytes past the last intact entry that no later entry proves synced: cut back
  uint64_t good_end = 0;   // end of the last intact entry (where a torn tail is cut)
  uint64_t file_size = 0;
  std::string why;         // what was wrong at good_end when torn ("" otherwise)
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
  // a bad header, or for damage that a later intact entry proves lay in synced bytes (log_codec.h).
  static WalHeader read(const std::string& file, std::vector<std::string>* entries, WalScan* scan);
  // read() through a descriptor the caller keeps open (a read-only open follows the log with it,
  // while the writer may rename or remove the file).
  static WalHeader read_fd(int fd, const std::string& file, std::vector<std::string>* entries, WalScan* scan);
  // The header alone (CorruptedError for a bad one) and the file's size, through `fd`.
  static WalHeader read_header(int fd, const std::string& file, uint64_t* size);
  // Following a log another process appends to (read-only opens): the intact entries from byte
  // `off` on, up to the first that is not (an append still in progress: read again later).
  // Returns the offset after the last entry taken.
  static uint64_t follow(int fd, uint32_t format, uint64_t off, std::vector<std::string>* entries);
  // Cuts the file to `size` bytes and fsyncs it (drops a torn tail).
  static void cut(const std::string& file, uint64_t size);
  // Bytes of one entry's framing in a log of `format` (12 for formats 1-2, 20 for 3).
  static size_t entry_header_size(uint32_t format);

  // Opens `file` for appending, in the format its header names; `synced` says whether every byte
  // already in it is known durable (else the first sync establishes it).
  void open_append(const std::string& file, bool synced = false);
  // Appends go to `file` (a new, synced log) from now on; on failure the current file stays open.
  void switch_to(const std::string& file);
  // Appends one entry with a single write(); returns after the bytes are in the OS (a process
  // kill can no longer lose them); sync() makes them durable against power loss. On failure
  // the partial entry is removed (or the log poisoned) and IOError is raised.
  void append(const std::string& payload);
  // Removes the entry the last append() wrote (its sync failed: it must not come back).
  // Poisons the log if the file cannot be cut back; never throws.
  void undo_last();
  // Removes every entry from byte `to` on (`entries` of them): a group of writes whose shared
  // fsync failed. Poisons the log if the file cannot be cut back; never throws.
  void cut_back_to(uint64_t to, uint64_t entries);
  void sync();
  void close();
  bool is_open() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  const std::string& file() const { return file_; }
  void set_file_name(const std::string& file) { file_ = file; }  // after a rename (the fd stays)
  bool poisoned() const { return !poison_.empty(); }
  uint64_t entries_since_open() const { return n_; }
  uint64_t bytes() const { return bytes_; }
  uint64_t end() const { return end_; }
  uint64_t synced_end() const { return synced_end_; }
  uint32_t format() const { return format_; }

 private:
  bool rewind_to(uint64_t end);  // ftruncate + fdatasync; false (and errno) on failure

  int fd_ = -1;
  std::string file_;
  uint32_t format_ = kWalFormat;
  uint64_t n_ = 0;
  uint64_t bytes_ = 0;
  uint64_t end_ = 0;         // file size after the last good entry
  uint64_t last_start_ = 0;  // where the last appended entry starts
  uint64_t synced_end_ = 0;  // bytes [0, synced_end_) are known durable (the last successful sync)
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
