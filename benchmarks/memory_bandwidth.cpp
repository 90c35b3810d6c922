// Measures this machine's memory bandwidth with all OpenMP threads: a streaming read (what a
// decode step does to the weights) and a copy (bytes read + written). Prints one JSON object.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <vector>

int main(int argc, char** argv) {
  const size_t bytes = (argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1024) << 20;  // MiB
  const size_t n = bytes / sizeof(float);
  std::vector<float> a(n), b(n);
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) a[i] = static_cast<float>(i % 1013) * 0.001f;

  auto best_seconds = [](auto&& body) {
    double best = 1e30;
    for (int rep = 0; rep < 7; ++rep) {
      const auto start = std::chrono::steady_clock::now();
      body();
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    return best;
  };
  // The read sums the words as integers: integer adds vectorise freely, so the loop is bound
  // by memory, not by a chain of dependent float adds.
  const auto* words = reinterpret_cast<const uint32_t*>(a.data());
  volatile uint64_t sink = 0;
  const double read_s = best_seconds([&] {
    uint64_t total = 0;
#pragma omp parallel for schedule(static) reduction(+ : total)
    for (size_t i = 0; i < n; ++i) total += words[i];
    sink = sink + total;
  });
  const double copy_s = best_seconds([&] {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; ++i) b[i] = a[i];
  });
  std::printf("{\"threads\": %d, \"buffer_bytes\": %zu, \"read_gb_per_s\": %.2f, \"copy_gb_per_s\": %.2f}\n",
              omp_get_max_threads(), bytes, bytes / read_s / 1e9, 2.0 * bytes / copy_s / 1e9);
  return sink == 12345 ? 1 : 0;
}
