// Distance spaces for hnswlib with run-time CPU dispatch (AVX-512 or AVX2+FMA when the CPU has it), so
// the portable build (no -march=native) is not slower than a natively compiled hnswlib.
//   ip / cos: distance = 1 - <a, b>   (cos stores L2-normalised vectors)
//   l2:       distance = ||a - b||^2
#pragma once
#include <hnswlib/hnswlib.h>

#include <cstddef>

namespace memkern {

enum class Metric : uint32_t { IP = 0, L2 = 1, Cos = 2 };

// The distance functions the dispatcher picked (hnswlib's signature; the third argument points
// to the size_t dim).
hnswlib::DISTFUNC<float> ip_distance();
hnswlib::DISTFUNC<float> l2_distance();
// Which kernel the dispatcher picked ("avx512", "avx2+fma" or "scalar").
const char* simd_kernel_name();

class Space : public hnswlib::SpaceInterface<float> {
 public:
  Space(size_t dim, Metric metric) : dim_(dim), metric_(metric) {}
  size_t get_data_size() override { return dim_ * sizeof(float); }
  hnswlib::DISTFUNC<float> get_dist_func() override { return metric_ == Metric::L2 ? l2_distance() : ip_distance(); }
  void* get_dist_func_param() override { return &dim_; }
  // Distance -> "higher is better" score: <q, x> for ip/cos, -||q - x||^2 for l2.
  float score(float dist) const { return metric_ == Metric::L2 ? -dist : 1.0f - dist; }

 private:
  size_t dim_;
  Metric metric_;
};

}  // namespace memkern
