// The sparse MLA attention of one prefill chunk at GLM-5.2's shapes (64 heads, latent 512, rope
// 64, top-k 2048), as bench-step's `attention.core` runs it for a fresh sequence: token i of an
// N-token prefill attends over min(i + 1, top-k) of positions 0..i (all of them, or a random
// top-k in position order), its rows in a paged bf16 cache. Times each wgmma kernel with CUDA
// events (median of --reps) and states its rate over the products' FLOPs against the bf16 GEMM
// rate measured in the same run (cuBLAS, 8192^3), and each kernel's output against the first's
// (relative L2), so that a wrong kernel shows. Usage:
//   cuda_mla_prefill [--tokens 2048,8192] [--top-k 2048] [--reps 10] [--json FILE]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "micro_options.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/mla.h"

namespace cuda = glms::ops::cuda;

namespace {

constexpr int kHeads = 64, kLatent = 512, kRope = 64, kBlockSize = 64;

float bf16_to_float(uint16_t bits) {
  const uint32_t word = uint32_t{bits} << 16;
  float value;
  std::memcpy(&value, &word, sizeof value);
  return value;
}

double gemm_rate(cudaStream_t stream) {
  constexpr int64_t n = 8192;
  cuda::DeviceBuffer x(sizeof(uint16_t) * n * n), w(sizeof(uint16_t) * n * n), y(sizeof(float) * n * n);
  cuda::fill_uniform_bf16(x.as<uint16_t>(), n * n, 1, 1.0f, stream);
  cuda::fill_uniform_bf16(w.as<uint16_t>(), n * n, 2, 1.0f, stream);
  cuda::Gemm gemm;
  cuda::Event start, stop;
  gemm.linear(x.as<uint16_t>(), n, w.as<uint16_t>(), n, n, y.as<float>(), stream);
  constexpr int reps = 10;
  start.record(stream);
  for (int i = 0; i < reps; ++i) gemm.linear(x.as<uint16_t>(), n, w.as<uint16_t>(), n, n, y.as<float>(), stream);
  stop.record(stream);
  cuda::synchronize_stream(stream);
  return 2.0 * double(n) * n * n * reps / (stop.elapsed_ms_since(start) * 1e-3);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> token_counts = {2048, 8192};
  int top_k = 2048, reps = 10;
  std::string json_path;
  if (!glms::benchmarks::parse_options(
          argc, argv,
          {{"--tokens", [&](const char* v) { token_counts = glms::benchmarks::parse_int_list(v); }},
           {"--top-k", [&](const char* v) { top_k = std::atoi(v); }},
           {"--reps", [&](const char* v) { reps = std::atoi(v); }},
           {"--json", [&](const char* v) { json_path = v; }}}))
    return 2;
  if (cuda::device_count() == 0) {
    std::fprintf(stderr, "no CUDA device\n");
    return 77;
  }
  cuda::Stream stream;
  const double gemm_flops_per_s = gemm_rate(stream.get());
  std::printf("bf16 GEMM rate (cuBLAS 8192^3): %.0f TFLOP/s\n", gemm_flops_per_s / 1e12);
  std::printf("%7s  %-26s %9s %9s %8s %9s\n", "tokens", "kernel", "ms", "TFLOP/s", "x GEMM", "rel L2");
  std::ostringstream json;
  json << "{\"heads\": " << kHeads << ", \"latent\": " << kLatent << ", \"rope\": " << kRope << ", \"top_k\": " << top_k
       << ", \"bf16_gemm_flops_per_s\": " << gemm_flops_per_s << ", \"points\": [";
  bool first_point = true;
  const int row = kLatent + kRope;
  for (const int n : token_counts) {
    // One sequence whose blocks are laid out in a shuffled order, as a pool hands them out.
    const int blocks = (n + kBlockSize - 1) / kBlockSize;
    std::mt19937 rng(7 + n);
    std::vector<int32_t> table(blocks);
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), rng);
    std::vector<int32_t> selected(int64_t{n} * top_k, 0), counts(n), sequence(n, 0);
    std::vector<int32_t> positions;
    double flops = 0;
    for (int i = 0; i < n; ++i) {
      positions.resize(i + 1);
      std::iota(positions.begin(), positions.end(), 0);
      const int count = std::min(i + 1, top_k);
      if (count < i + 1) {
        std::shuffle(positions.begin(), positions.end(), rng);
        std::sort(positions.begin(), positions.begin() + count);
      }
      std::copy(positions.begin(), positions.begin() + count, selected.begin() + int64_t{i} * top_k);
      counts[i] = count;
      flops += 2.0 * count * kHeads * (row + kLatent);
    }
    cuda::DeviceBuffer cache(sizeof(uint16_t) * int64_t{blocks} * kBlockSize * row),
        queries(sizeof(uint16_t) * int64_t{n} * kHeads * row), d_selected(sizeof(int32_t) * selected.size()),
        d_counts(sizeof(int32_t) * n), d_table(sizeof(int32_t) * blocks), d_sequence(sizeof(int32_t) * n),
        out(sizeof(uint16_t) * int64_t{n} * kHeads * kLatent);
    cuda::fill_uniform_bf16(cache.as<uint16_t>(), int64_t{blocks} * kBlockSize * row, 11, 1.0f, stream.get());
    // Scores of order one: queries uniform with the softmax scale in them.
    cuda::fill_uniform_bf16(queries.as<uint16_t>(), int64_t{n} * kHeads * row, 12, 4.0f / std::sqrt(float(row)),
                            stream.get());
    d_selected.upload(selected.data(), selected.size() * sizeof(int32_t));
    d_counts.upload(counts.data(), counts.size() * sizeof(int32_t));
    d_table.upload(table.data(), table.size() * sizeof(int32_t));
    d_sequence.upload(sequence.data(), sequence.size() * sizeof(int32_t));

    cuda::MlaAttentionArgs a;
    a.queries = queries.as<uint16_t>();
    a.cache = cache.data();
    a.storage = cuda::CacheStorage::kBf16;
    a.selected = d_selected.as<int32_t>();
    a.num_selected = d_counts.as<int32_t>();
    a.max_selected = top_k;
    a.block_tables = d_table.as<int32_t>();
    a.max_blocks = blocks;
    a.token_sequence = d_sequence.as<int32_t>();
    a.block_size = kBlockSize;
    a.num_tokens = n;
    a.num_heads = kHeads;
    a.latent_dim = kLatent;
    a.rope_dim = kRope;
    a.out = out.as<uint16_t>();

    std::vector<uint16_t> reference;
    for (const bool specialized : {false, true}) {
      a.warp_specialized = specialized;
      const char* name = specialized ? "wgmma, warp-specialised" : "wgmma";
      cuda::memset_async(out.data(), 0xff, out.bytes(), stream.get());
      cuda::mla_attention_wgmma(a, stream.get());
      stream.synchronize();
      std::vector<uint16_t> result(int64_t{n} * kHeads * kLatent);
      out.download(result.data(), result.size() * sizeof(uint16_t));
      if (reference.empty()) reference = result;
      const double error = glms::benchmarks::relative_l2(result, reference, bf16_to_float);
      cuda::Event start, stop;
      std::vector<float> times;
      for (int r = 0; r < reps; ++r) {
        start.record(stream.get());
        cuda::mla_attention_wgmma(a, stream.get());
        stop.record(stream.get());
        stream.synchronize();
        times.push_back(stop.elapsed_ms_since(start));
      }
      std::sort(times.begin(), times.end());
      const double ms = times[times.size() / 2], rate = flops / (ms * 1e-3);
      std::printf("%7d  %-26s %9.3f %9.1f %8.3f %9.2e\n", n, name, ms, rate / 1e12, rate / gemm_flops_per_s, error);
      json << (first_point ? "" : ",") << "\n  {\"tokens\": " << n << ", \"kernel\": \"" << name << "\", \"ms\": " << ms
           << ", \"flops\": " << flops << ", \"flops_per_s\": " << rate
           << ", \"fraction_of_gemm_rate\": " << rate / gemm_flops_per_s << ", \"rel_l2_vs_first\": " << error << "}";
      first_point = false;
    }
  }
  json << "\n]}\n";
  if (!json_path.empty()) std::ofstream(json_path) << json.str();
  return 0;
}
