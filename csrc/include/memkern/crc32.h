// CRC-32 (IEEE 802.3, reflected polynomial 0xEDB88320, the zlib checksum): carry-less multiplication
// folding on x86-64 CPUs with PCLMULQDQ (checked at run time), a slicing-by-8 table otherwise and
// for the last 0-15 bytes.
#pragma once
#include <cstddef>
#include <cstdint>

namespace memkern {

// Continue a CRC-32 over `n` bytes. Start with crc = 0; the result of one call feeds the next.
uint32_t crc32_update(uint32_t crc, const void* data, size_t n);

inline uint32_t crc32(const void* data, size_t n) { return crc32_update(0, data, n); }

}  // namespace memkern
