// The instruction set of the native kernels (the store's distances, the reranker's fused path):
// the best this CPU runs, capped by the environment variable MEMKERN_SIMD ("avx2": no AVX-512;
// "scalar": no SIMD) for tests and A/B measurements. Each caller reads it once, at load time.
#pragma once

namespace memkern {

enum class Simd { Scalar, Avx2, Avx512 };

// `avx512_dq_vl`: AVX-512 also needs the DQ and VL extensions (the reranker's kernels use them).
Simd simd_level(bool avx512_dq_vl = false);

}  // namespace memkern
