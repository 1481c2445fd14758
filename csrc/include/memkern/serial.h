// Little-endian binary encoding helpers. Reader validates every length against the bytes left
// before it allocates or copies anything, and throws CorruptedError otherwise.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "memkern/errors.h"

namespace memkern {

class Writer {
 public:
  std::string buf;
  template <typename T>
  void pod(const T& v) {
    buf.append(reinterpret_cast<const char*>(&v), sizeof(T));
  }
  void u8(uint8_t v) { pod(v); }
  void u32(uint32_t v) { pod(v); }
  void u64(uint64_t v) { pod(v); }
  void i64(int64_t v) { pod(v); }
  void f64(double v) { pod(v); }
  void str(const std::string& s) {
    u64(s.size());
    buf.append(s);
  }
  void floats(const float* p, size_t n) {
    u64(n);
    buf.append(reinterpret_cast<const char*>(p), n * sizeof(float));
  }
};

class Reader {
 public:
  Reader(const char* data, size_t size, std::string what) : p_(data), end_(data + size), what_(std::move(what)) {}
  size_t left() const { return static_cast<size_t>(end_ - p_); }
  const char* pos() const { return p_; }
  [[noreturn]] void fail(const std::string& why) const {
    throw CorruptedError(what_ + ": " + why);
  }
  void need(size_t n) const {
    if (n > left()) fail("truncated (needs " + std::to_string(n) + " bytes, " + std::to_string(left()) + " left)");
  }
  template <typename T>
  T pod() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, p_, sizeof(T));
    p_ += sizeof(T);
    return v;
  }
  uint8_t u8() { return pod<uint8_t>(); }
  uint32_t u32() { return pod<uint32_t>(); }
  uint64_t u64() { return pod<uint64_t>(); }
  int64_t i64() { return pod<int64_t>(); }
  double f64() { return pod<double>(); }
  void skip(size_t n) {
    need(n);
    p_ += n;
  }
  std::string str() {
    uint64_t n = u64();
    need(n);
    std::string s(p_, n);
    p_ += n;
    return s;
  }
  // Reads a float array; `expect` (if nonzero) is the only accepted length.
  std::vector<float> floats(size_t expect) {
    uint64_t n = u64();
    if (expect && n != expect) fail("vector length " + std::to_string(n) + " != dim " + std::to_string(expect));
    if (n > left() / sizeof(float)) fail("vector length exceeds file");
    std::vector<float> v(n);
    std::memcpy(v.data(), p_, n * sizeof(float));
    p_ += n * sizeof(float);
    return v;
  }
  // A count of items each taking at least `min_bytes`: bounded by the bytes left.
  uint64_t count(size_t min_bytes) {
    uint64_t n = u64();
    if (min_bytes && n > left() / min_bytes) fail("item count " + std::to_string(n) + " exceeds file");
    return n;
  }

 private:
  const char* p_;
  const char* end_;
  std::string what_;
};

}  // namespace memkern
