#include "memkern/snapshot.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "memkern/crc32.h"
#include "memkern/errors.h"
#include "memkern/serial.h"
#include "memkern/wal.h"

namespace memkern {
namespace {
constexpr char kCurMagic[8] = {'M', 'K', 'C', 'U', 'R', 0, 0, 0};
}

void write_current(const std::string& dir, uint64_t generation) {
  Writer w;
  w.buf.append(kCurMagic, 8);
  w.u32(kFormatVersion);
  w.u64(generation);
  w.u32(crc32(w.buf.data(), w.buf.size()));
  write_file_atomic(dir, "CURRENT", w.buf);
}

uint64_t read_current(const std::string& dir) {
  std::string data;
  if (!read_file(dir + "/CURRENT", &data)) return kNoGeneration;
  Reader rd(data.data(), data.size(), "snapshot pointer " + dir + "/CURRENT");
  if (data.size() != 24) rd.fail("wrong size " + std::to_string(data.size()) + " (expected 24)");
  if (std::memcmp(data.data(), kCurMagic, 8) != 0) rd.fail("bad magic");
  uint32_t c;
  std::memcpy(&c, data.data() + 20, 4);
  if (crc32(data.data(), 20) != c) rd.fail("checksum mismatch");
  rd.u64();
  uint32_t format = rd.u32();
  if (format != kFormatVersion)
    rd.fail("format version " + std::to_string(format) + " (this build reads " + std::to_string(kFormatVersion) + ")");
  return rd.u64();
}

std::string snapshot_dir_name(uint64_t generation) { return "snap-" + std::to_string(generation); }

void file_size_crc(const std::string& path, uint64_t* size, uint32_t* crc) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw CorruptedError("snapshot file " + path + " cannot be opened: " + std::strerror(errno));
  std::vector<char> buf(1 << 20);
  uint32_t c = 0;
  uint64_t n = 0;
  for (;;) {
    ssize_t r = ::read(fd, buf.data(), buf.size());
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      ::close(fd);
      throw CorruptedError("snapshot file " + path + " cannot be read: " + std::strerror(errno));
    }
    if (r == 0) break;
    c = crc32_update(c, buf.data(), static_cast<size_t>(r));
    n += static_cast<uint64_t>(r);
  }
  ::close(fd);
  *size = n;
  *crc = c;
}

}  // namespace memkern
