// CRC-32 (IEEE 802.3): published check values, a bitwise reference on every length and alignment
// the slicing-by-8 loop distinguishes, and chaining through crc32_update.
#include <cstdint>
#include <string>
#include <vector>

#include "check.h"
#include "memkern/crc32.h"

namespace {

// The textbook bit-at-a-time CRC-32 (reflected polynomial 0xEDB88320).
uint32_t reference_crc(const unsigned char* p, size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (0xEDB88320u ^ (c >> 1)) : (c >> 1);
  }
  return ~c;
}

uint32_t crc_of(const std::string& s) { return memkern::crc32(s.data(), s.size()); }

}  // namespace

TEST(crc32, known_vectors) {
  CHECK_EQ(crc_of(""), 0x00000000u);
  CHECK_EQ(crc_of("a"), 0xE8B7BE43u);
  CHECK_EQ(crc_of("abc"), 0x352441C2u);
  CHECK_EQ(crc_of("123456789"), 0xCBF43926u);  // the standard check value
  CHECK_EQ(crc_of("The quick brown fox jumps over the lazy dog"), 0x414FA339u);
  CHECK_EQ(crc_of(std::string(32, '\0')), 0x190A55ADu);
  CHECK_EQ(crc_of(std::string(32, '\xff')), 0xFF6CAB0Bu);
}

TEST(crc32, matches_bitwise_reference_on_every_length_and_offset) {
  std::vector<unsigned char> buf(300);
  uint32_t x = 12345;
  for (auto& b : buf) {
    x = x * 1103515245u + 12345u;
    b = static_cast<unsigned char>(x >> 16);
  }
  for (size_t off = 0; off < 8; ++off)
    for (size_t n = 0; n + off <= 200; ++n)
      if (memkern::crc32(buf.data() + off, n) != reference_crc(buf.data() + off, n)) {
        CHECK_EQ(memkern::crc32(buf.data() + off, n), reference_crc(buf.data() + off, n));
        return;
      }
}

TEST(crc32, update_chains_like_one_call) {
  std::string s = "write-ahead log entries are checked with crc32, in pieces or at once";
  uint32_t whole = crc_of(s);
  for (size_t cut = 0; cut <= s.size(); ++cut) {
    uint32_t c = memkern::crc32_update(0, s.data(), cut);
    c = memkern::crc32_update(c, s.data() + cut, s.size() - cut);
    if (c != whole) {
      CHECK_EQ(c, whole);
      return;
    }
  }
}

TEST(crc32, folding_path_matches_the_reference_on_long_buffers) {
  // lengths around the 64-byte fold blocks and the 16-byte tail, at every offset mod 16, chained
  // through crc32_update at odd cuts: the carry-less path (where the CPU has it) against the bitwise one
  std::vector<unsigned char> buf(70000);
  uint32_t x = 987654321u;
  for (auto& b : buf) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<unsigned char>(x >> 24);
  }
  const size_t lengths[] = {63, 64, 65, 79, 80, 127, 128, 129, 191, 255, 256, 257, 1000, 4095, 4096, 4097, 65536, 69983};
  for (size_t off = 0; off < 16; ++off)
    for (size_t n : lengths) {
      uint32_t want = reference_crc(buf.data() + off, n);
      if (memkern::crc32(buf.data() + off, n) != want) {
        CHECK_EQ(memkern::crc32(buf.data() + off, n), want);
        return;
      }
      size_t cut = (n * 7) / 13;
      uint32_t c = memkern::crc32_update(memkern::crc32_update(0, buf.data() + off, cut), buf.data() + off + cut, n - cut);
      if (c != want) {
        CHECK_EQ(c, want);
        return;
      }
    }
  std::string zeros(1 << 20, '\0');
  CHECK_EQ(memkern::crc32(zeros.data(), zeros.size()), 0xA738EA1Cu);  // zlib.crc32(bytes(1 << 20))
}
