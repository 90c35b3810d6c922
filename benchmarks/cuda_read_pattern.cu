// How fast the H200 streams weights from memory in the read pattern of a warp that owns 16 rows,
// against the same bytes in one piece: the measurement behind the MXFP4 tile layout's 16-row
// fragments (quant/mxfp4_tiles.h). Each warp reads 16 rows x 512 bytes a batch, 16 loads of 16
// bytes a lane in flight, then does `--work` integer steps a load on what it read (a stand-in
// for the widening and the mma). Layouts:
//   rows:       the 16 rows one after another (3 KB each); a load instruction covers pieces of
//               `piece` bytes of 512 / piece rows (64: the tile layout before, 4 lanes a row)
//   contiguous: the warp's 8 KB of a batch in one piece (the 16-row fragments)
// Blocks of 256 threads: --blocks of them (224: an EP8 rank's batch-1 gate/up grid), each holding
// --shared bytes of shared memory (98 KB: two blocks an SM, as the mma expert kernels). Each
// launch reads a fresh slice of a 4 GiB buffer, so nothing comes from L2. Prints one line a
// case and, with --json FILE, writes them.
// Usage: cuda_read_pattern [--blocks 224,1056] [--shared 0,100352] [--pieces 64,128,256,512]
//                          [--work 0,60] [--json FILE]
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "micro_cuda.h"
#include "micro_options.h"

namespace {

using glms::benchmarks::check;

constexpr int kThreads = 256;
constexpr int64_t kRowBytes = 3072;   // a GLM-5.2 gate/up row of MXFP4 codes
constexpr int kRows = 16;             // a warp's rows
constexpr int kBatchRowBytes = 512;   // of each row a batch
constexpr int kLoads = kRows * kBatchRowBytes / (32 * 16);  // 16-byte loads a lane a batch

// piece == 0: contiguous; else the rows layout with pieces of `piece` bytes.
__global__ void __launch_bounds__(kThreads) read_kernel(const uint4* data, int piece, int work, uint32_t* sink) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const auto* base = reinterpret_cast<const uint8_t*>(data) + (int64_t{blockIdx.x} * (kThreads / 32) + warp) * kRows * kRowBytes;
  uint32_t acc = 0;
  for (int64_t batch = 0; batch < kRowBytes / kBatchRowBytes; ++batch) {
    uint4 v[kLoads];
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      const int q = i * 512 + lane * 16;  // byte of the warp's batch
      int64_t offset;
      if (piece == 0) {
        offset = batch * kRows * kBatchRowBytes + q;
      } else {
        const int p = q / piece, row = p % kRows, piece_in_row = p / kRows;
        offset = row * kRowBytes + batch * kBatchRowBytes + piece_in_row * piece + q % piece;
      }
      v[i] = __ldg(reinterpret_cast<const uint4*>(base + offset));
    }
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      uint32_t x = v[i].x ^ v[i].y ^ v[i].z ^ v[i].w;
      for (int k = 0; k < work; ++k) x = x * 1664525u + 1013904223u;
      acc += x;
    }
  }
  if (acc == 0x9e3779b9u) *sink = acc;  // keeps the loads; never true for the buffer's bytes
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> block_counts = {224, 1056}, shared_sizes = {0, 100352}, pieces = {64, 128, 256, 512}, works = {0, 60};
  std::string json_path;
  if (!glms::benchmarks::parse_options(
          argc, argv,
          {{"--blocks", [&](const char* v) { block_counts = glms::benchmarks::parse_int_list(v); }},
           {"--shared", [&](const char* v) { shared_sizes = glms::benchmarks::parse_int_list(v); }},
           {"--pieces", [&](const char* v) { pieces = glms::benchmarks::parse_int_list(v); }},
           {"--work", [&](const char* v) { works = glms::benchmarks::parse_int_list(v); }},
           {"--json", [&](const char* v) { json_path = v; }}}))
    return 2;
  if (!glms::benchmarks::has_cuda_device()) return 77;
  const size_t bytes = size_t{4} << 30;
  uint4* data = nullptr;
  uint32_t* sink = nullptr;
  check(cudaMalloc(&data, bytes), "cudaMalloc");
  check(cudaMalloc(&sink, sizeof(uint32_t)), "cudaMalloc");
  check(cudaMemset(data, 1, bytes), "cudaMemset");
  check(cudaFuncSetAttribute(read_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024), "shared memory");
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "event");
  check(cudaEventCreate(&stop), "event");
  std::vector<int> layouts = {0};
  layouts.insert(layouts.end(), pieces.begin(), pieces.end());
  std::ostringstream json;
  json << "{\"points\": [";
  bool first = true;
  std::printf("%-10s %5s %7s %6s %5s %9s %7s\n", "layout", "piece", "shared", "blocks", "work", "us", "TB/s");
  for (const int piece : layouts)
    for (const int shared : shared_sizes)
      for (const int blocks : block_counts)
        for (const int work : works) {
          const int64_t used = int64_t{blocks} * (kThreads / 32) * kRows * kRowBytes;
          const int64_t slices = static_cast<int64_t>(bytes) / used;
          if (slices < 2) continue;
          float best_ms = 1e30f;
          for (int rep = 0; rep < 12; ++rep) {
            const uint4* slice = data + (rep % slices) * (used / 16);
            check(cudaEventRecord(start), "record");
            read_kernel<<<blocks, kThreads, shared>>>(slice, piece, work, sink);
            check(cudaEventRecord(stop), "record");
            check(cudaEventSynchronize(stop), "read_kernel");
            float ms = 0;
            check(cudaEventElapsedTime(&ms, start, stop), "elapsed");
            if (rep >= 2 && ms < best_ms) best_ms = ms;  // two warm-ups
          }
          const double us = best_ms * 1e3, rate = used / (us * 1e-6) / 1e12;
          const char* layout = piece == 0 ? "contiguous" : "rows";
          std::printf("%-10s %5d %7d %6d %5d %9.1f %7.2f\n", layout, piece, shared, blocks, work, us, rate);
          json << (first ? "" : ",") << "\n  {\"layout\": \"" << layout << "\", \"piece_bytes\": " << piece
               << ", \"shared_bytes\": " << shared << ", \"blocks\": " << blocks << ", \"work\": " << work
               << ", \"bytes\": " << used << ", \"us\": " << us << ", \"tb_per_s\": " << rate << "}";
          first = false;
        }
  json << "\n]}\n";
  if (!json_path.empty()) std::ofstream(json_path) << json.str();
  return 0;
}
