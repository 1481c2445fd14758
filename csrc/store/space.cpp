#include "memkern/space.h"

#include "memkern/simd.h"

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

// AVX-512: 32 floats per step in two accumulators (what a -march=native hnswlib build uses on
// these CPUs; the AVX2 kernel cost ~10% more per distance at d=384), then 16 at a time with a
// masked load, so the last d % 16 floats need no scalar loop and any d works.
__attribute__((target("avx512f"))) inline __mmask16 first_lanes(size_t left) {
  return left >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << left) - 1);
}

__attribute__((target("avx512f"))) float ip_avx512(const float* a, const float* b, size_t d) {
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  size_t i = 0;
  for (; i + 32 <= d; i += 32) {
    s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
  }
  for (; i < d; i += 16) {
    __mmask16 m = first_lanes(d - i);
    s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s1);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

__attribute__((target("avx512f"))) float l2_avx512(const float* a, const float* b, size_t d) {
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  size_t i = 0;
  for (; i + 32 <= d; i += 32) {
    __m512 e0 = _mm512_sub_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i));
    __m512 e1 = _mm512_sub_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16));
    s0 = _mm512_fmadd_ps(e0, e0, s0);
    s1 = _mm512_fmadd_ps(e1, e1, s1);
  }
  for (; i < d; i += 16) {
    __mmask16 m = first_lanes(d - i);
    __m512 e = _mm512_sub_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i));
    s0 = _mm512_fmadd_ps(e, e, s0);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}
#endif

// hnswlib's distance signature around each kernel, compiled for the kernel's instruction set so
// the kernel inlines into it: a distance is then one indirect call (the index's fstdistfunc_),
// not a wrapper calling the kernel through a second pointer.
inline float ip_dist_of(float dot) { return 1.0f - dot; }
inline size_t dim_of(const void* p) { return *static_cast<const size_t*>(p); }
inline const float* f32(const void* p) { return static_cast<const float*>(p); }

float ip_dist_scalar(const void* a, const void* b, const void* d) { return ip_dist_of(ip_scalar(f32(a), f32(b), dim_of(d))); }
float l2_dist_scalar(const void* a, const void* b, const void* d) { return l2_scalar(f32(a), f32(b), dim_of(d)); }
#ifdef MEMKERN_X86
__attribute__((target("avx2,fma"))) float ip_dist_avx2(const void* a, const void* b, const void* d) {
  return ip_dist_of(ip_avx2(f32(a), f32(b), dim_of(d)));
}
__attribute__((target("avx2,fma"))) float l2_dist_avx2(const void* a, const void* b, const void* d) {
  return l2_avx2(f32(a), f32(b), dim_of(d));
}
__attribute__((target("avx512f"))) float ip_dist_avx512(const void* a, const void* b, const void* d) {
  return ip_dist_of(ip_avx512(f32(a), f32(b), dim_of(d)));
}
__attribute__((target("avx512f"))) float l2_dist_avx512(const void* a, const void* b, const void* d) {
  return l2_avx512(f32(a), f32(b), dim_of(d));
}
#endif

// Picked once at load time (memkern/simd.h: the best the CPU runs, capped by MEMKERN_SIMD).
struct Dispatch {
  hnswlib::DISTFUNC<float> ip = ip_dist_scalar, l2 = l2_dist_scalar;
  const char* name = "scalar";
  Dispatch() {
#ifdef MEMKERN_X86
    const Simd level = simd_level();
    if (level == Simd::Avx2) {
      ip = ip_dist_avx2;
      l2 = l2_dist_avx2;
      name = "avx2+fma";
    } else if (level == Simd::Avx512) {
      ip = ip_dist_avx512;
      l2 = l2_dist_avx512;
      name = "avx512";
    }
#endif
  }
};
const Dispatch& dispatch() {
  static const Dispatch d;
  return d;
}

}  // namespace

hnswlib::DISTFUNC<float> ip_distance() { return dispatch().ip; }
hnswlib::DISTFUNC<float> l2_distance() { return dispatch().l2; }

const char* simd_kernel_name() { return dispatch().name; }

}  // namespace memkern
