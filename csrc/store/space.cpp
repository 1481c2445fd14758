#include "memkern/space.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define MEMKERN_X86 1
#endif

namespace memkern {
namespace {

float ip_scalar(const float* a, const float* b, size_t d) {
  float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  size_t i = 0;
  for (; i + 4 <= d; i += 4) {
    s0 += a[i] * b[i];
    s1 += a[i + 1] * b[i + 1];
    s2 += a[i + 2] * b[i + 2];
    s3 += a[i + 3] * b[i + 3];
  }
  for (; i < d; ++i) s0 += a[i] * b[i];
  return (s0 + s1) + (s2 + s3);
}

float l2_scalar(const float* a, const float* b, size_t d) {
  float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  size_t i = 0;
  for (; i + 4 <= d; i += 4) {
    float e0 = a[i] - b[i], e1 = a[i + 1] - b[i + 1], e2 = a[i + 2] - b[i + 2], e3 = a[i + 3] - b[i + 3];
    s0 += e0 * e0;
    s1 += e1 * e1;
    s2 += e2 * e2;
    s3 += e3 * e3;
  }
  for (; i < d; ++i) s0 += (a[i] - b[i]) * (a[i] - b[i]);
  return (s0 + s1) + (s2 + s3);
}

#ifdef MEMKERN_X86
__attribute__((target("avx2,fma"))) inline float hsum256(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

__attribute__((target("avx2,fma"))) float ip_avx2(const float* a, const float* b, size_t d) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 16 <= d; i += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
  }
  for (; i + 8 <= d; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
  float s = hsum256(_mm256_add_ps(s0, s1));
  for (; i < d; ++i) s += a[i] * b[i];
  return s;
}

__attribute__((target("avx2,fma"))) float l2_avx2(const float* a, const float* b, size_t d) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 16 <= d; i += 16) {
    __m256 e0 = _mm256_sub_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i));
    __m256 e1 = _mm256_sub_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8));
    s0 = _mm256_fmadd_ps(e0, e0, s0);
    s1 = _mm256_fmadd_ps(e1, e1, s1);
  }
  for (; i + 8 <= d; i += 8) {
    __m256 e0 = _mm256_sub_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i));
    s0 = _mm256_fmadd_ps(e0, e0, s0);
  }
  float s = hsum256(_mm256_add_ps(s0, s1));
  for (; i < d; ++i) s += (a[i] - b[i]) * (a[i] - b[i]);
  return s;
}
#endif

using Kernel = float (*)(const float*, const float*, size_t);

struct Dispatch {
  Kernel ip = ip_scalar, l2 = l2_scalar;
  const char* name = "scalar";
  Dispatch() {
#ifdef MEMKERN_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
      ip = ip_avx2;
      l2 = l2_avx2;
      name = "avx2+fma";
    }
#endif
  }
};
const Dispatch& dispatch() {
  static const Dispatch d;
  return d;
}
// Resolved once at load time so the hot path is one indirect call.
const Kernel g_ip = dispatch().ip;
const Kernel g_l2 = dispatch().l2;

}  // namespace

float dist_ip(const void* a, const void* b, const void* dim) {
  return 1.0f - g_ip(static_cast<const float*>(a), static_cast<const float*>(b), *static_cast<const size_t*>(dim));
}

float dist_l2(const void* a, const void* b, const void* dim) {
  return g_l2(static_cast<const float*>(a), static_cast<const float*>(b), *static_cast<const size_t*>(dim));
}

const char* simd_kernel_name() { return dispatch().name; }

}  // namespace memkern
