#include "memkern/simd.h"

#include <cstdlib>
#include <string>

namespace memkern {

Simd simd_level(bool avx512_dq_vl) {
  Simd level = Simd::Scalar;
#if defined(__x86_64__) || defined(_M_X64)
  __builtin_cpu_init();
  const char* force = std::getenv("MEMKERN_SIMD");
  const std::string cap = force ? force : "";
  if (cap != "scalar" && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) level = Simd::Avx2;
  if (cap.empty() && __builtin_cpu_supports("avx512f") &&
      (!avx512_dq_vl || (__builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))))
    level = Simd::Avx512;
#else
  (void)avx512_dq_vl;
#endif
  return level;
}

}  // namespace memkern
