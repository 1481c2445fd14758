#include "memkern/wal.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "memkern/crc32.h"
#include "memkern/errors.h"
#include "memkern/serial.h"

namespace memkern {
namespace {

constexpr char kWalMagic[8] = {'M', 'K', 'W', 'A', 'L', 0, 0, 0};
constexpr size_t kWalHeaderSize = 44;
constexpr size_t kEntryHeaderSize = 12;
constexpr uint32_t kMaxEntry = 1u << 31;

std::string errno_text() { return std::strerror(errno); }

void write_all(int fd, const char* p, size_t n, const std::string& what) {
  while (n) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw IOError("write " + what + ": " + errno_text());
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

std::string encode_header(const WalHeader& h) {
  Writer w;
  w.buf.append(kWalMagic, 8);
  w.u32(h.format);
  w.u32(h.dim);
  w.u32(h.metric);
  w.u32(0);
  w.u64(h.generation);
  w.u64(0);
  w.u32(crc32(w.buf.data(), w.buf.size()));
  return w.buf;
}

}  // namespace

bool read_file(const std::string& path, std::string* out) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return false;
    throw IOError("open " + path + ": " + errno_text());
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    throw IOError("stat " + path + ": " + errno_text());
  }
  out->resize(static_cast<size_t>(st.st_size));
  size_t got = 0;
  while (got < out->size()) {
    ssize_t r = ::read(fd, &(*out)[got], out->size() - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += static_cast<size_t>(r);
  }
  ::close(fd);
  out->resize(got);
  return true;
}

void fsync_path(const std::string& path, bool directory) {
  int fd = ::open(path.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) throw IOError("open " + path + " for fsync: " + errno_text());
  int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw IOError("fsync " + path + ": " + errno_text());
}

void write_file_atomic(const std::string& dir, const std::string& name, const std::string& data) {
  std::string tmp = dir + "/" + name + ".tmp";
  std::string dst = dir + "/" + name;
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw IOError("create " + tmp + ": " + errno_text());
  try {
    write_all(fd, data.data(), data.size(), tmp);
    if (::fsync(fd) != 0) throw IOError("fsync " + tmp + ": " + errno_text());
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), dst.c_str()) != 0) throw IOError("rename " + tmp + ": " + errno_text());
  fsync_path(dir, true);
}

void Wal::create(const std::string& dir, const std::string& name, const WalHeader& h) {
  write_file_atomic(dir, name, encode_header(h));
}

WalHeader Wal::read(const std::string& file, std::vector<std::string>* entries, bool* torn) {
  std::string data;
  if (!read_file(file, &data)) throw CorruptedError("write-ahead log " + file + " is missing");
  *torn = false;
  if (data.size() < kWalHeaderSize) throw CorruptedError("write-ahead log " + file + ": header truncated");
  Reader rd(data.data(), data.size(), "write-ahead log " + file);
  if (std::memcmp(data.data(), kWalMagic, 8) != 0) rd.fail("bad magic (not a memkern log)");
  uint32_t hcrc;
  std::memcpy(&hcrc, data.data() + kWalHeaderSize - 4, 4);
  if (crc32(data.data(), kWalHeaderSize - 4) != hcrc) rd.fail("header checksum mismatch");
  rd.pod<uint64_t>();  // magic
  WalHeader h;
  h.format = rd.u32();
  if (h.format != kFormatVersion)
    rd.fail("format version " + std::to_string(h.format) + " (this build reads " + std::to_string(kFormatVersion) + ")");
  h.dim = rd.u32();
  h.metric = rd.u32();
  rd.u32();
  h.generation = rd.u64();
  size_t off = kWalHeaderSize;
  while (off < data.size()) {
    size_t left = data.size() - off;
    if (left < kEntryHeaderSize) {
      *torn = true;
      break;
    }
    uint32_t len, pcrc, ecrc;
    std::memcpy(&len, data.data() + off, 4);
    std::memcpy(&pcrc, data.data() + off + 4, 4);
    std::memcpy(&ecrc, data.data() + off + 8, 4);
    if (crc32(data.data() + off, 8) != ecrc || len > kMaxEntry)
      rd.fail("entry header at offset " + std::to_string(off) + " is corrupted");
    if (len > left - kEntryHeaderSize) {  // payload not fully written: torn tail
      *torn = true;
      break;
    }
    const char* payload = data.data() + off + kEntryHeaderSize;
    if (crc32(payload, len) != pcrc) {
      if (off + kEntryHeaderSize + len == data.size()) {  // last entry: torn
        *torn = true;
        break;
      }
      rd.fail("entry at offset " + std::to_string(off) + " fails its checksum");
    }
    entries->emplace_back(payload, len);
    off += kEntryHeaderSize + len;
  }
  if (*torn) {
    if (::truncate(file.c_str(), static_cast<off_t>(off)) != 0)
      throw IOError("truncate torn log tail of " + file + ": " + errno_text());
  }
  return h;
}

Wal::~Wal() { close(); }

void Wal::open_append(const std::string& file) {
  close();
  fd_ = ::open(file.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  if (fd_ < 0) throw IOError("open " + file + ": " + errno_text());
  n_ = 0;
  bytes_ = 0;
}

void Wal::append(const std::string& payload) {
  if (fd_ < 0) throw IOError("write-ahead log is closed");
  if (payload.size() > kMaxEntry) throw ValueError("one operation is too large for the log (> 2 GiB)");
  std::string buf;
  buf.reserve(kEntryHeaderSize + payload.size());
  uint32_t len = static_cast<uint32_t>(payload.size());
  uint32_t pcrc = crc32(payload.data(), payload.size());
  buf.append(reinterpret_cast<const char*>(&len), 4);
  buf.append(reinterpret_cast<const char*>(&pcrc), 4);
  uint32_t ecrc = crc32(buf.data(), 8);
  buf.append(reinterpret_cast<const char*>(&ecrc), 4);
  buf.append(payload);
  write_all(fd_, buf.data(), buf.size(), "write-ahead log");
  ++n_;
  bytes_ += buf.size();
}

void Wal::sync() {
  if (fd_ >= 0 && ::fdatasync(fd_) != 0) throw IOError("fdatasync write-ahead log: " + errno_text());
}

void Wal::close() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

}  // namespace memkern
