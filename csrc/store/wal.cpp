#include "memkern/wal.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "memkern/crc32.h"
#include "memkern/errors.h"
#include "memkern/io.h"
#include "memkern/serial.h"

namespace memkern {
namespace {

constexpr char kWalMagic[8] = {'M', 'K', 'W', 'A', 'L', 0, 0, 0};
constexpr size_t kWalHeaderSize = 44;
constexpr size_t kEntryHeaderSize = 12;
constexpr uint32_t kMaxEntry = 1u << 31;

std::string errno_text() { return std::strerror(errno); }

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

WalHeader Wal::read(const std::string& file, std::vector<std::string>* entries, WalScan* scan) {
  std::string data;
  if (!read_file(file, &data)) throw CorruptedError("write-ahead log " + file + " is missing");
  *scan = WalScan{};
  scan->file_size = data.size();
  if (data.size() < kWalHeaderSize) throw CorruptedError("write-ahead log " + file + ": header truncated");
  Reader rd(data.data(), data.size(), "write-ahead log " + file);
  if (std::memcmp(data.data(), kWalMagic, 8) != 0) rd.fail("bad magic (not a memkern log)");
  uint32_t hcrc;
  std::memcpy(&hcrc, data.data() + kWalHeaderSize - 4, 4);
  if (crc32(data.data(), kWalHeaderSize - 4) != hcrc) rd.fail("header checksum mismatch");
  rd.pod<uint64_t>();  // magic
  WalHeader h;
  h.format = rd.u32();
  if (h.format != 1 && h.format != kWalFormat)
    rd.fail("format version " + std::to_string(h.format) + " (this build reads 1.." + std::to_string(kWalFormat) + ")");
  h.dim = rd.u32();
  h.metric = rd.u32();
  if (rd.u32() != 0) rd.fail("unknown header flags");
  h.generation = rd.u64();
  h.store_id = rd.u64();  // format 1: a reserved zero
  // End of the last nonzero byte: from there on the file is a zero tail.
  size_t nz_end = data.size();
  while (nz_end > kWalHeaderSize && data[nz_end - 1] == 0) --nz_end;
  size_t off = kWalHeaderSize;
  while (off < data.size()) {
    size_t left = data.size() - off;
    if (off >= nz_end || left < kEntryHeaderSize) {  // zero tail, or a cut entry header
      scan->torn = true;
      break;
    }
    uint32_t len, pcrc, ecrc;
    std::memcpy(&len, data.data() + off, 4);
    std::memcpy(&pcrc, data.data() + off + 4, 4);
    std::memcpy(&ecrc, data.data() + off + 8, 4);
    if (crc32(data.data() + off, 8) != ecrc || len > kMaxEntry)
      rd.fail("entry header at offset " + std::to_string(off) + " is corrupted");
    if (len > left - kEntryHeaderSize) {  // the entry runs past the end: its write was cut (torn)
      scan->torn = true;
      break;
    }
    const char* payload = data.data() + off + kEntryHeaderSize;
    if (crc32(payload, len) != pcrc) {
      // Every byte of this entry is there, so it was written completely (and may have been
      // acknowledged): a checksum failure is damage, never a torn write.
      rd.fail("entry at offset " + std::to_string(off) + " (complete, " + std::to_string(len) +
              " bytes) fails its checksum: the log is damaged");
    }
    entries->emplace_back(payload, len);
    off += kEntryHeaderSize + len;
  }
  scan->good_end = off;
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

void Wal::open_append(const std::string& file) {
  close();
  fd_ = ::open(file.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  if (fd_ < 0) throw IOError("open " + file + ": " + errno_text());
  off_t end = ::lseek(fd_, 0, SEEK_END);
  if (end < 0) {
    std::string e = errno_text();
    close();
    throw IOError("seek " + file + ": " + e);
  }
  file_ = file;
  end_ = last_start_ = static_cast<uint64_t>(end);
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
  buf.reserve(kEntryHeaderSize + payload.size());
  uint32_t len = static_cast<uint32_t>(payload.size());
  uint32_t pcrc = crc32(payload.data(), payload.size());
  buf.append(reinterpret_cast<const char*>(&len), 4);
  buf.append(reinterpret_cast<const char*>(&pcrc), 4);
  uint32_t ecrc = crc32(buf.data(), 8);
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
  uint64_t to = last_start_;
  if (rewind_to(to)) {
    bytes_ -= end_ - to;
    end_ = to;
    --n_;
  } else {
    // Bytes of an operation that raised stay in the file: refuse appends until they are cut.
    poison_ = "an entry whose fsync failed could not be removed: " + errno_text();
    end_ = to;
  }
}

void Wal::sync() {
  if (fd_ < 0) return;
  if (io::fdatasync(fd_) != 0) throw IOError("fdatasync write-ahead log " + file_ + ": " + errno_text());
}

void Wal::close() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

}  // namespace memkern
