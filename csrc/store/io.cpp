#include "memkern/io.h"

#include <stdio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "memkern/crc32.h"
#include "memkern/errors.h"

namespace memkern {
namespace io {
namespace {

enum Kind { kNone = 0, kWrite, kShort, kFsync, kRename };

struct Fault {
  std::mutex mu;
  Kind kind = kNone;
  uint64_t at = 0;         // the call (1-based) of `kind` that fails
  bool sticky = false;     // every call from `at` on fails
  uint64_t seen = 0;       // calls of the armed kind since arming
  bool short_pending = false;  // a short write happened: the next write fails
};

Fault& fault() {
  static Fault f;
  return f;
}

std::atomic<uint64_t> n_writes{0}, n_syncs{0}, n_renames{0}, n_faults{0};

// Whether this call (of `k`) must fail; counts it.
bool trip(Kind k) {
  Fault& f = fault();
  std::lock_guard<std::mutex> g(f.mu);
  if (f.kind == kNone) return false;
  bool same = f.kind == k || (f.kind == kShort && k == kWrite);
  if (!same) return false;
  ++f.seen;
  bool hit = f.sticky ? f.seen >= f.at : f.seen == f.at;
  if (hit) ++n_faults;
  return hit;
}

}  // namespace

ssize_t write(int fd, const void* p, size_t n) {
  ++n_writes;
  Fault& f = fault();
  {
    std::lock_guard<std::mutex> g(f.mu);
    if (f.short_pending) {
      f.short_pending = f.sticky;
      errno = ENOSPC;
      return -1;
    }
  }
  if (trip(kWrite)) {
    bool is_short;
    {
      std::lock_guard<std::mutex> g(f.mu);
      is_short = f.kind == kShort;
      if (is_short) f.short_pending = true;
    }
    if (is_short && n > 1) return ::write(fd, p, n / 2);
    errno = ENOSPC;
    return -1;
  }
  return ::write(fd, p, n);
}

int fsync(int fd) {
  ++n_syncs;
  if (trip(kFsync)) {
    errno = EIO;
    return -1;
  }
  return ::fsync(fd);
}

int fdatasync(int fd) {
  ++n_syncs;
  if (trip(kFsync)) {
    errno = EIO;
    return -1;
  }
  return ::fdatasync(fd);
}

int rename(const char* from, const char* to) {
  ++n_renames;
  if (trip(kRename)) {
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
  c.renames = n_renames.load();
  c.faults = n_faults.load();
  return c;
}

void set_fault(const std::string& spec) {
  Kind k = kNone;
  uint64_t at = 0;
  bool sticky = false;
  if (!spec.empty()) {
    auto colon = spec.find(':');
    std::string kind = spec.substr(0, colon);
    std::string num = colon == std::string::npos ? "" : spec.substr(colon + 1);
    if (!num.empty() && num.back() == '+') {
      sticky = true;
      num.pop_back();
    }
    if (kind == "write") k = kWrite;
    else if (kind == "short") k = kShort;
    else if (kind == "fsync") k = kFsync;
    else if (kind == "rename") k = kRename;
    bool digits = !num.empty() && num.size() < 19 && num.find_first_not_of("0123456789") == std::string::npos;
    if (k == kNone || !digits || (at = std::strtoull(num.c_str(), nullptr, 10)) == 0)
      throw ValueError("fault spec: expected \"write|short|fsync|rename:N[+]\" with N >= 1, got \"" + spec + "\"");
  }
  Fault& f = fault();
  std::lock_guard<std::mutex> g(f.mu);
  f.kind = k;
  f.at = at;
  f.sticky = sticky;
  f.seen = 0;
  f.short_pending = false;
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

}  // namespace io
}  // namespace memkern
