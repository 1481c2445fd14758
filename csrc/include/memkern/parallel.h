// Row-parallel execution of a batch of queries, shared by the store's search paths (query.cpp,
// turn_search.cpp).
#pragma once
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace memkern {

// Below this many distance evaluations in one call, starting threads costs more than it saves.
constexpr size_t kParallelMinWork = 1u << 15;

// Runs body(b) for b in [0, B) on up to `threads` threads (the caller's included), when the
// call's work (B * cost_per_row distance evaluations) is worth it; results do not depend on it.
template <typename F>
inline void parallel_rows(size_t B, int threads, size_t cost_per_row, F body) {
  size_t T = std::min<size_t>(static_cast<size_t>(std::max(threads, 1)), B);
  if (cost_per_row == 0 || B < kParallelMinWork / cost_per_row + 1) T = 1;
  if (T <= 1) {
    for (size_t b = 0; b < B; ++b) body(b);
    return;
  }
  std::atomic<size_t> next{0};
  std::exception_ptr error;
  std::mutex error_mu;
  auto work = [&]() {
    for (size_t b = next++; b < B; b = next++) {
      try {
        body(b);
      } catch (...) {
        std::lock_guard<std::mutex> g(error_mu);
        if (!error) error = std::current_exception();
      }
    }
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < T; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace memkern
