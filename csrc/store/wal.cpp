#include "memkern/wal.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "memkern/crc32.h"
#include "memkern/errors.h"
#include "memkern/io.h"
#include "memkern/serial.h"

namespace memkern {
namespace {

constexpr char kWalMagic[8] = {'M', 'K', 'W', 'A', 'L', 0, 0, 0};
constexpr uint32_t kMaxEntry = 1u << 31;

std::string errno_text() { return std::strerror(errno); }

// One entry of a log of `format` at `off` of data[0, size), if it is intact: its framing checks
// out (header checksum, a length that fits, payload checksum) and, format 3, its sync watermark
// is not past its own start. Formats 1-2 have no watermark: read as the entry's start (every
// earlier byte synced, what fsync "always" guarantees).
struct Framed {
  uint64_t payload = 0, len = 0, end = 0, synced = 0;
};

// `base`: the file offset of data[0] (watermarks are file offsets).
bool parse_entry(const char* data, uint64_t size, uint64_t off, uint32_t format, Framed* e, const char** why,
                 uint64_t base = 0) {
  const size_t hs = Wal::entry_header_size(format);
  if (size - off < hs) {
    *why = "an incomplete entry header";
    return false;
  }
  uint32_t len, pcrc, hcrc;
  std::memcpy(&len, data + off, 4);
  std::memcpy(&pcrc, data + off + 4, 4);
  std::memcpy(&hcrc, data + off + hs - 4, 4);
  if (crc32(data + off, hs - 4) != hcrc) {
    *why = "an entry header that fails its checksum";
    return false;
  }
  uint64_t synced = base + off;
  if (format >= 3) std::memcpy(&synced, data + off + 8, 8);
  if (len > kMaxEntry || synced > base + off) {
    *why = "an entry header with impossible values";
    return false;
  }
  if (len > size - off - hs) {
    *why = "an entry that runs past the end of the file";
    return false;
  }
  if (crc32(data + off + hs, len) != pcrc) {
    *why = "an entry whose payload fails its checksum";
    return false;
  }
  e->payload = off + hs;
  e->len = len;
  e->end = off + hs + len;
  e->synced = synced;
  return true;
}

}  // namespace

std::string Wal::encode_header(const WalHeader& h) {
  Writer w;
  w.buf.append(kWalMagic, 8);
  w.u32(h.format);
  w.u32(h.dim);
  w.u32(h.metric);
  w.u32(0);
  w.u64(h.generation);
  w.u64(h.store_id);
  w.u32(crc32(w.buf.data(), w.buf.size()));
  return w.buf;
}

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
  int rc = io::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) throw IOError("fsync " + path + ": " + std::strerror(err));
}

void write_temp(const std::string& dir, const std::string& name, const std::string& data) {
  std::string tmp = dir + "/" + name + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, io::kFileMode);
  if (fd < 0) throw IOError("create " + tmp + ": " + errno_text());
  try {
    io::write_all(fd, data.data(), data.size(), tmp);
    if (io::fsync(fd) != 0) throw IOError("fsync " + tmp + ": " + errno_text());
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::close(fd) != 0) {
    ::unlink(tmp.c_str());
    throw IOError("close " + tmp + ": " + errno_text());
  }
}

void write_file_atomic(const std::string& dir, const std::string& name, const std::string& data) {
  write_temp(dir, name, data);
  std::string tmp = dir + "/" + name + ".tmp";
  std::string dst = dir + "/" + name;
  if (io::rename(tmp.c_str(), dst.c_str()) != 0) {
    std::string e = errno_text();
    ::unlink(tmp.c_str());
    throw IOError("rename " + tmp + ": " + e);
  }
  fsync_path(dir, true);
}

void Wal::create(const std::string& dir, const std::string& name, const WalHeader& h) {
  write_file_atomic(dir, name, encode_header(h));
}

size_t Wal::entry_header_size(uint32_t format) { return format >= 3 ? 20 : 12; }

// Bytes [off, off + n) of an open file (fewer at its end).
static std::string pread_all(int fd, uint64_t off, uint64_t n, const std::string& file) {
  std::string out(static_cast<size_t>(n), '\0');
  size_t got = 0;
  while (got < out.size()) {
    ssize_t r = ::pread(fd, &out[got], out.size() - got, static_cast<off_t>(off + got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw IOError("read " + file + ": " + errno_text());
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  out.resize(got);
  return out;
}

static uint64_t fd_size(int fd, const std::string& file) {
  struct stat st;
  if (::fstat(fd, &st) != 0) throw IOError("stat " + file + ": " + errno_text());
  return static_cast<uint64_t>(st.st_size);
}

static WalHeader parse_header(const std::string& data, const std::string& file) {
  if (data.size() < kWalHeaderSize) throw CorruptedError("write-ahead log " + file + ": header truncated");
  Reader rd(data.data(), data.size(), "write-ahead log " + file);
  if (std::memcmp(data.data(), kWalMagic, 8) != 0) rd.fail("bad magic (not a memkern log)");
  uint32_t hcrc;
  std::memcpy(&hcrc, data.data() + kWalHeaderSize - 4, 4);
  if (crc32(data.data(), kWalHeaderSize - 4) != hcrc) rd.fail("header checksum mismatch");
  rd.pod<uint64_t>();  // magic
  WalHeader h;
  h.format = rd.u32();
  if (h.format < 1 || h.format > kWalFormat)
    rd.fail("format version " + std::to_string(h.format) + " (this build reads 1.." + std::to_string(kWalFormat) + ")");
  h.dim = rd.u32();
  h.metric = rd.u32();
  if (rd.u32() != 0) rd.fail("unknown header flags");
  h.generation = rd.u64();
  h.store_id = rd.u64();  // format 1: a reserved zero
  return h;
}

WalHeader Wal::read_header(int fd, const std::string& file, uint64_t* size) {
  *size = fd_size(fd, file);
  return parse_header(pread_all(fd, 0, kWalHeaderSize, file), file);
}

uint64_t Wal::follow(int fd, uint32_t format, uint64_t off, std::vector<std::string>* entries) {
  const uint64_t size = fd_size(fd, "the followed log");
  if (size <= off) return off;
  const std::string data = pread_all(fd, off, size - off, "the followed log");
  uint64_t at = 0;
  const char* why = "";
  Framed e;
  while (at < data.size() && parse_entry(data.data(), data.size(), at, format, &e, &why, off)) {
    entries->emplace_back(data.data() + e.payload, e.len);
    at = e.end;
  }
  return off + at;
}

WalHeader Wal::read(const std::string& file, std::vector<std::string>* entries, WalScan* scan) {
  int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) throw CorruptedError("write-ahead log " + file + " is missing");
    throw IOError("open " + file + ": " + errno_text());
  }
  try {
    WalHeader h = read_fd(fd, file, entries, scan);
    ::close(fd);
    return h;
  } catch (...) {
    ::close(fd);
    throw;
  }
}

WalHeader Wal::read_fd(int fd, const std::string& file, std::vector<std::string>* entries, WalScan* scan) {
  const std::string data = pread_all(fd, 0, fd_size(fd, file), file);
  *scan = WalScan{};
  scan->file_size = data.size();
  WalHeader h = parse_header(data, file);
  Reader rd(data.data(), data.size(), "write-ahead log " + file);
  const uint64_t size = data.size();
  uint64_t off = kWalHeaderSize;
  const char* why = "";
  Framed e;
  while (off < size && parse_entry(data.data(), size, off, h.format, &e, &why)) {
    entries->emplace_back(data.data() + e.payload, e.len);
    off = e.end;
  }
  scan->good_end = off;
  if (off == size) return h;
  // The bytes from `off` on hold no intact entry. They are a tail the crash may have torn (an
  // append that had not been synced: cut back) unless a later intact entry was written after the
  // log had been synced past `off`: then synced bytes were lost or altered (damage, refused).
  const size_t hs = entry_header_size(h.format);
  for (uint64_t y = off + 1; y + hs <= size; ++y) {
    uint32_t len;
    std::memcpy(&len, data.data() + y, 4);
    if (len == 0 || len > size - y - hs) continue;  // cheap pre-checks (zeros, most garbage) before the checksum
    Framed later;
    const char* ignored;
    if (parse_entry(data.data(), size, y, h.format, &later, &ignored) && later.synced > off)
      rd.fail("the entry at offset " + std::to_string(off) + " is damaged (" + why + "), but the intact entry at offset " +
              std::to_string(y) + " was written after the log had been synced past it (to offset " +
              std::to_string(later.synced) + "): synced data was lost or altered (disk or file-system damage), so the "
              "log is not cut back; the " + std::to_string(entries->size()) + " entries before offset " +
              std::to_string(off) + " are intact");
  }
  scan->torn = true;
  scan->why = why;
  return h;
}

void Wal::cut(const std::string& file, uint64_t size) {
  int fd = ::open(file.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) throw IOError("open " + file + ": " + errno_text());
  if (::ftruncate(fd, static_cast<off_t>(size)) != 0 || io::fdatasync(fd) != 0) {
    std::string e = errno_text();
    ::close(fd);
    throw IOError("cut the torn tail off " + file + ": " + e);
  }
  ::close(fd);
}

Wal::~Wal() { close(); }

void Wal::open_append(const std::string& file, bool synced) {
  close();
  fd_ = ::open(file.c_str(), O_RDWR | O_APPEND | O_CLOEXEC);
  if (fd_ < 0) throw IOError("open " + file + ": " + errno_text());
  char head[kWalHeaderSize];
  off_t end = ::lseek(fd_, 0, SEEK_END);
  if (end < static_cast<off_t>(kWalHeaderSize) || ::pread(fd_, head, kWalHeaderSize, 0) != static_cast<ssize_t>(kWalHeaderSize)) {
    std::string e = end < 0 ? errno_text() : "header truncated";
    close();
    throw IOError("open " + file + " for appending: " + e);
  }
  std::memcpy(&format_, head + 8, 4);
  if (format_ < 1 || format_ > kWalFormat) {
    close();
    throw IOError("open " + file + " for appending: log format " + std::to_string(format_));
  }
  file_ = file;
  end_ = last_start_ = static_cast<uint64_t>(end);
  synced_end_ = synced ? end_ : kWalHeaderSize;  // the header was synced when the log was created
  poison_.clear();
  n_ = 0;
  bytes_ = 0;
}

void Wal::switch_to(const std::string& file) {
  Wal next;
  next.open_append(file, true);
  close();
  fd_ = next.fd_;
  next.fd_ = -1;
  file_ = next.file_;
  format_ = next.format_;
  end_ = next.end_;
  last_start_ = next.last_start_;
  synced_end_ = next.synced_end_;
  poison_.clear();
  n_ = 0;
  bytes_ = 0;
}

bool Wal::rewind_to(uint64_t end) {
  return ::ftruncate(fd_, static_cast<off_t>(end)) == 0 && io::fdatasync(fd_) == 0;
}

void Wal::append(const std::string& payload) {
  if (fd_ < 0) throw IOError("write-ahead log is closed");
  if (payload.size() > kMaxEntry) throw ValueError("one operation is too large for the log (> 2 GiB)");
  if (!poison_.empty()) {
    // An earlier failed write left bytes that could not be cut off: retry the cut first.
    if (!rewind_to(end_))
      throw IOError("write-ahead log " + file_ + ": refusing writes until the partial entry an earlier failed write "
                    "left can be removed (" + poison_ + "; now: " + errno_text() + ")");
    poison_.clear();
  }
  std::string buf;
  const size_t hs = entry_header_size(format_);
  buf.reserve(hs + payload.size());
  uint32_t len = static_cast<uint32_t>(payload.size());
  uint32_t pcrc = crc32(payload.data(), payload.size());
  buf.append(reinterpret_cast<const char*>(&len), 4);
  buf.append(reinterpret_cast<const char*>(&pcrc), 4);
  if (format_ >= 3) {
    uint64_t synced = std::min(synced_end_, end_);  // what a reader may rely on as durable before this entry
    buf.append(reinterpret_cast<const char*>(&synced), 8);
  }
  uint32_t ecrc = crc32(buf.data(), buf.size());
  buf.append(reinterpret_cast<const char*>(&ecrc), 4);
  buf.append(payload);
  try {
    io::write_all(fd_, buf.data(), buf.size(), "write-ahead log " + file_);
  } catch (const IOError& e) {
    // A short or failed write (ENOSPC, EFBIG, EIO) may have left part of the entry: cut it off so
    // that the next entry starts at a clean boundary.
    if (!rewind_to(end_)) {
      poison_ = std::string(e.what()) + "; cutting it off failed: " + errno_text();
      throw IOError(std::string(e.what()) + " (the partial entry could not be removed: " + errno_text() +
                    "; the log refuses writes until it can)");
    }
    throw;
  }
  last_start_ = end_;
  end_ += buf.size();
  ++n_;
  bytes_ += buf.size();
}

void Wal::undo_last() {
  if (fd_ < 0 || last_start_ == end_) return;
  cut_back_to(last_start_, 1);
}

void Wal::cut_back_to(uint64_t to, uint64_t entries) {
  if (fd_ < 0 || to >= end_) return;
  if (rewind_to(to)) {
    bytes_ -= end_ - to;
    n_ -= std::min(n_, entries);
  } else {
    // Bytes of operations that raised stay in the file: refuse appends until they are cut.
    poison_ = std::string(entries == 1 ? "an entry" : "entries") + " whose fsync failed could not be removed: " + errno_text();
  }
  end_ = to;
  last_start_ = to;
  synced_end_ = std::min(synced_end_, end_);
}

void Wal::sync() {
  if (fd_ < 0) return;
  if (io::fdatasync(fd_) != 0) throw IOError("fdatasync write-ahead log " + file_ + ": " + errno_text());
  synced_end_ = end_;
}

void Wal::close() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

}  // namespace memkern
