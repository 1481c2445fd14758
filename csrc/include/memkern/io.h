// Checked file I/O for every store write path, with a test-only fault injector and counters.
//
// Every write(), fsync()/fdatasync() and rename() the store issues goes through these wrappers,
// so that a test can make the Nth call of a kind fail and count the syncs an acknowledged write
// performed. The injector is process-wide and off unless armed:
//   * by the environment variable MEMKERN_FAULT, read when a Store opens (the count starts at
//     that open), or
//   * by memkern._store._test_set_fault(spec) (tests only).
// spec: "" (off) or comma-separated rules "<kind>:<N>[+]", kind one of
//   write  - the Nth write() fails with ENOSPC (nothing written)
//   short  - the Nth write() writes half of its bytes, the next write() fails with ENOSPC
//   fsync  - the Nth fsync()/fdatasync() fails with EIO
//   rename - the Nth rename() fails with EIO (nothing renamed)
// N counts calls of that kind from 1; a trailing "+" makes every call from the Nth on fail
// (a disk that stays full), otherwise only the Nth fails. E.g. "short:1,fsync:1+": the next
// write is cut short and no fsync succeeds any more.
#pragma once
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace memkern {
namespace io {

// Modes of everything a store creates: memories are private to the user who owns the store.
// Directories (the store's, a snapshot's) 0700, files (log, snapshot files, CURRENT, LOCK, their
// temporaries) 0600; the umask can only narrow them. An existing directory keeps its mode.
constexpr mode_t kDirMode = 0700;
constexpr mode_t kFileMode = 0600;

// Raw wrappers (errno set on failure, like the system calls).
ssize_t write(int fd, const void* p, size_t n);
int fsync(int fd);
int fdatasync(int fd);
int rename(const char* from, const char* to);

// write() until all n bytes are out; throws IOError naming `what` otherwise.
void write_all(int fd, const void* p, size_t n, const std::string& what);

struct Counters {
  uint64_t writes = 0, syncs = 0, renames = 0, faults = 0;
  uint64_t sync_ns = 0;  // nanoseconds spent inside the syncs
};
Counters counters();
// Arms the injector (see above); throws ValueError on a bad spec. Resets the per-kind counts.
void set_fault(const std::string& spec);
// Arms it from MEMKERN_FAULT if that is set (called when a Store opens).
void set_fault_from_env();

// A buffered writer over a file descriptor that checks every write and keeps a running CRC-32 and
// byte count of what it wrote (for graph files, which can be larger than memory wants to copy).
class FdWriter {
 public:
  FdWriter(int fd, std::string what) : fd_(fd), what_(std::move(what)) { buf_.reserve(kBuf); }
  void put(const void* p, size_t n);
  template <typename T>
  void pod(const T& v) {
    put(&v, sizeof(T));
  }
  void flush();
  uint64_t bytes() const { return bytes_; }
  uint32_t crc() const { return crc_; }

 private:
  static constexpr size_t kBuf = 1 << 20;
  int fd_;
  std::string what_;
  std::string buf_;
  uint64_t bytes_ = 0;
  uint32_t crc_ = 0;
};

// Creates (truncates) `file`, lets `body` write its bytes through an FdWriter, then flushes, fsyncs
// and checks the file's length against what was written; returns the size and CRC-32. Any failed,
// short or unsynced write raises IOError (naming `what`), so a cut file is never reported as good.
void write_file_checked(const std::string& file, const std::string& what, const std::function<void(FdWriter&)>& body,
                        uint64_t* size, uint32_t* crc);

// A snapshot file mapped read-only, unmapped when this goes (move-only).
struct MappedFile {
  const char* p = nullptr;
  size_t n = 0;
  MappedFile() = default;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  MappedFile(MappedFile&& o) noexcept : p(o.p), n(o.n) { o.p = nullptr; }
  ~MappedFile();
};

// Maps `file` read-only once its size is `size`, the one the snapshot recorded (`where` names the
// record, e.g. records.bin); `populate` reads it all in at once (MAP_POPULATE). CorruptedError
// naming `what` and the file when it cannot be opened, read or mapped, is empty, or has another size.
MappedFile map_file(const std::string& file, uint64_t size, const std::string& what, const std::string& where,
                    bool populate);

}  // namespace io
}  // namespace memkern
