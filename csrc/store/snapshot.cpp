#include "memkern/snapshot.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <vector>

#include "memkern/crc32.h"
#include "memkern/errors.h"
#include "memkern/serial.h"
#include "memkern/wal.h"

namespace memkern {
namespace {
constexpr char kCurMagic[8] = {'M', 'K', 'C', 'U', 'R', 0, 0, 0};
}

std::string encode_current(uint64_t generation, uint64_t store_id) {
  Writer w;
  w.buf.append(kCurMagic, 8);
  w.u32(kCurrentFormat);
  w.u64(generation);
  w.u64(store_id);
  w.u32(crc32(w.buf.data(), w.buf.size()));
  return w.buf;
}

Current read_current(const std::string& dir) {
  Current cur;
  std::string data;
  if (!read_file(dir + "/CURRENT", &data)) return cur;
  Reader rd(data.data(), data.size(), "snapshot pointer " + dir + "/CURRENT");
  if (data.size() != 24 && data.size() != 32) rd.fail("wrong size " + std::to_string(data.size()) + " (expected 32)");
  if (std::memcmp(data.data(), kCurMagic, 8) != 0) rd.fail("bad magic");
  uint32_t c;
  std::memcpy(&c, data.data() + data.size() - 4, 4);
  if (crc32(data.data(), data.size() - 4) != c) rd.fail("checksum mismatch");
  rd.u64();
  cur.format = rd.u32();
  if (cur.format != 1 && cur.format != kCurrentFormat)
    rd.fail("format version " + std::to_string(cur.format) + " (this build reads 1.." + std::to_string(kCurrentFormat) + ")");
  if (data.size() != (cur.format == 1 ? 24u : 32u))
    rd.fail("format version " + std::to_string(cur.format) + " in a " + std::to_string(data.size()) + "-byte file");
  cur.generation = rd.u64();
  if (cur.format >= 2) {
    cur.store_id = rd.u64();
    if (cur.store_id == 0) rd.fail("store id 0");
  }
  if (cur.generation == kNoGeneration) rd.fail("bad generation");
  return cur;
}

uint64_t new_store_id() {
  std::random_device rd;
  uint64_t id = 0;
  while (id == 0) id = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  return id;
}

std::string snapshot_dir_name(uint64_t generation) { return "snap-" + std::to_string(generation); }

}  // namespace memkern
