#include "memkern/io.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "memkern/crc32.h"
#include "memkern/errors.h"

namespace memkern {
namespace io {
namespace {

enum Kind { kNone = 0, kWrite, kShort, kFsync, kRename };

struct Rule {
  Kind kind = kNone;
  uint64_t at = 0;      // the call (1-based) of `kind` that fails
  bool sticky = false;  // every call from `at` on fails
  uint64_t seen = 0;    // calls of that kind since arming
};

struct Fault {
  std::mutex mu;
  std::vector<Rule> rules;
  bool short_pending = false;  // a short write happened: the next write fails
  bool short_sticky = false;
};

Fault& fault() {
  static Fault f;
  return f;
}

std::atomic<uint64_t> n_writes{0}, n_syncs{0}, n_renames{0}, n_faults{0};
std::atomic<uint64_t> sync_ns{0};  // wall time inside fsync / fdatasync

template <class F>
int timed_sync(F&& sync) {
  const auto t0 = std::chrono::steady_clock::now();
  const int r = sync();
  sync_ns += static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
  return r;
}

// Which rule (if any) makes this call (of `k`) fail; counts it for every matching rule.
Kind trip(Kind k) {
  Fault& f = fault();
  std::lock_guard<std::mutex> g(f.mu);
  Kind hit = kNone;
  for (Rule& r : f.rules) {
    bool same = r.kind == k || (r.kind == kShort && k == kWrite);
    if (!same) continue;
    ++r.seen;
    if (r.sticky ? r.seen >= r.at : r.seen == r.at) {
      hit = r.kind;
      if (r.kind == kShort) {
        f.short_pending = true;
        f.short_sticky = r.sticky;
      }
    }
  }
  if (hit != kNone) ++n_faults;
  return hit;
}

}  // namespace

ssize_t write(int fd, const void* p, size_t n) {
  ++n_writes;
  Fault& f = fault();
  {
    std::lock_guard<std::mutex> g(f.mu);
    if (f.short_pending) {
      f.short_pending = f.short_sticky;
      ++n_faults;
      errno = ENOSPC;
      return -1;
    }
  }
  Kind hit = trip(kWrite);
  if (hit == kShort && n > 1) return ::write(fd, p, n / 2);
  if (hit != kNone) {
    errno = ENOSPC;
    return -1;
  }
  return ::write(fd, p, n);
}

int fsync(int fd) {
  ++n_syncs;
  if (trip(kFsync) != kNone) {
    errno = EIO;
    return -1;
  }
  return timed_sync([fd] { return ::fsync(fd); });
}

int fdatasync(int fd) {
  ++n_syncs;
  if (trip(kFsync) != kNone) {
    errno = EIO;
    return -1;
  }
  return timed_sync([fd] { return ::fdatasync(fd); });
}

int rename(const char* from, const char* to) {
  ++n_renames;
  if (trip(kRename) != kNone) {
    errno = EIO;
    return -1;
  }
  return ::rename(from, to);
}

void write_all(int fd, const void* data, size_t n, const std::string& what) {
  const char* p = static_cast<const char*>(data);
  while (n) {
    ssize_t w = io::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw IOError("write " + what + ": " + std::strerror(errno));
    }
    if (w == 0) throw IOError("write " + what + ": no progress (disk full?)");
    p += w;
    n -= static_cast<size_t>(w);
  }
}

Counters counters() {
  Counters c;
  c.writes = n_writes.load();
  c.syncs = n_syncs.load();
  c.sync_ns = sync_ns.load();
  c.renames = n_renames.load();
  c.faults = n_faults.load();
  return c;
}

void set_fault(const std::string& spec) {
  std::vector<Rule> rules;
  size_t start = 0;
  while (start < spec.size()) {
    size_t end = spec.find(',', start);
    if (end == std::string::npos) end = spec.size();
    std::string one = spec.substr(start, end - start);
    start = end + 1;
    Rule r;
    auto colon = one.find(':');
    std::string kind = one.substr(0, colon);
    std::string num = colon == std::string::npos ? "" : one.substr(colon + 1);
    if (!num.empty() && num.back() == '+') {
      r.sticky = true;
      num.pop_back();
    }
    if (kind == "write") r.kind = kWrite;
    else if (kind == "short") r.kind = kShort;
    else if (kind == "fsync") r.kind = kFsync;
    else if (kind == "rename") r.kind = kRename;
    bool digits = !num.empty() && num.size() < 19 && num.find_first_not_of("0123456789") == std::string::npos;
    if (r.kind == kNone || !digits || (r.at = std::strtoull(num.c_str(), nullptr, 10)) == 0)
      throw ValueError("fault spec: expected \"write|short|fsync|rename:N[+]\" (comma-separated) with N >= 1, got \"" +
                       spec + "\"");
    rules.push_back(r);
  }
  Fault& f = fault();
  std::lock_guard<std::mutex> g(f.mu);
  f.rules = std::move(rules);
  f.short_pending = false;
  f.short_sticky = false;
}

void set_fault_from_env() {
  const char* s = std::getenv("MEMKERN_FAULT");
  if (s) set_fault(s);
}

void FdWriter::put(const void* p, size_t n) {
  crc_ = crc32_update(crc_, p, n);
  bytes_ += n;
  if (buf_.size() + n > kBuf) flush();
  if (n >= kBuf) {
    write_all(fd_, p, n, what_);
    return;
  }
  buf_.append(static_cast<const char*>(p), n);
}

void FdWriter::flush() {
  if (buf_.empty()) return;
  write_all(fd_, buf_.data(), buf_.size(), what_);
  buf_.clear();
}

void write_file_checked(const std::string& file, const std::string& what, const std::function<void(FdWriter&)>& body,
                        uint64_t* size, uint32_t* crc) {
  int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, kFileMode);
  if (fd < 0) throw IOError("create " + file + ": " + std::strerror(errno));
  try {
    FdWriter w(fd, file);
    body(w);
    w.flush();
    if (io::fsync(fd) != 0) throw IOError("fsync " + file + ": " + std::strerror(errno));
    struct stat st;
    if (::fstat(fd, &st) != 0) throw IOError("stat " + file + ": " + std::strerror(errno));
    if (static_cast<uint64_t>(st.st_size) != w.bytes())
      throw IOError(what + " " + file + " holds " + std::to_string(st.st_size) + " bytes after writing " +
                    std::to_string(w.bytes()));
    *size = w.bytes();
    *crc = w.crc();
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (::close(fd) != 0) throw IOError("close " + file + ": " + std::strerror(errno));
}

MappedFile::~MappedFile() {
  if (p) ::munmap(const_cast<char*>(p), n);
}

MappedFile map_file(const std::string& file, uint64_t size, const std::string& what, const std::string& where,
                    bool populate) {
  const std::string name = what + " " + file;
  int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw CorruptedError(name + " cannot be opened: " + std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    std::string e = std::strerror(errno);
    ::close(fd);
    throw CorruptedError(name + " cannot be read: " + e);
  }
  const uint64_t n = static_cast<uint64_t>(st.st_size);
  if (n != size) {
    ::close(fd);
    throw CorruptedError(name + ": size " + std::to_string(n) + " != " + std::to_string(size) + " recorded in " +
                         where + " (truncated?)");
  }
  if (n == 0) {
    ::close(fd);
    throw CorruptedError(name + " is empty");
  }
  void* m = ::mmap(nullptr, n, PROT_READ, MAP_PRIVATE | (populate ? MAP_POPULATE : 0), fd, 0);
  std::string e = m == MAP_FAILED ? std::strerror(errno) : "";
  ::close(fd);
  if (m == MAP_FAILED) throw CorruptedError(name + " cannot be mapped: " + e);
  MappedFile out;
  out.p = static_cast<const char*>(m);
  out.n = static_cast<size_t>(n);
  return out;
}

}  // namespace io
}  // namespace memkern
