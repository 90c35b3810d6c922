// The sparse MLA attention of one prefill chunk at GLM-5.2's shapes (64 heads, latent 512, rope
// 64, top-k 2048), as bench-step's `attention.core` runs it for a fresh sequence: token i of an
// N-token prefill attends over min(i + 1, top-k) of positions 0..i (all of them, or a random
// top-k in position order), its rows in a paged bf16 cache. Times each wgmma kernel with CUDA
// events (median of --reps) and states its rate over the products' FLOPs against the bf16 GEMM
// rate measured in the same run (cuBLAS, 8192^3), and each kernel's output against the first's
// (relative L2), so that a wrong kernel shows: mla_wgmma.cu's, the warp-specialised one with two
// 64-row stages (a block a token, persistent: a block an SM, and persistent over pairs of stages)
// and with its ring of 32-row stages. Each line also states the rate at which the kernel moved the
// selected rows and the queries into shared memory, and the last lines time the warp-specialised
// kernels' copies alone (mla_attention_copies_only): the floor their gathers set. --top-k 64 gives
// every token past the 64th one step of rows, so that a line's time is mostly what a token costs
// besides its steps.
// Usage:
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

// A fresh sequence of n tokens whose blocks a pool handed out in shuffled order: token i's
// selection is min(i + 1, top_k) of positions 0..i (all, or a random top-k in position order).
struct PrefillSelection {
  int tokens = 0, blocks = 0;
  std::vector<int32_t> table, selected, counts;  // [blocks], [tokens, top_k], [tokens]
  double flops = 0;                              // the scores' and P V products' over every token
  double gathered_bytes = 0;                     // the selected rows' and the queries' bytes
};

PrefillSelection select_positions(int n, int top_k) {
  PrefillSelection p;
  p.tokens = n;
  p.blocks = (n + kBlockSize - 1) / kBlockSize;
  std::mt19937 rng(7 + n);
  p.table.resize(p.blocks);
  std::iota(p.table.begin(), p.table.end(), 0);
  std::shuffle(p.table.begin(), p.table.end(), rng);
  p.selected.assign(int64_t{n} * top_k, 0);
  p.counts.resize(n);
  std::vector<int32_t> positions;
  for (int i = 0; i < n; ++i) {
    positions.resize(i + 1);
    std::iota(positions.begin(), positions.end(), 0);
    const int count = std::min(i + 1, top_k);
    if (count < i + 1) {
      std::shuffle(positions.begin(), positions.end(), rng);
      std::sort(positions.begin(), positions.begin() + count);
    }
    std::copy(positions.begin(), positions.begin() + count, p.selected.begin() + int64_t{i} * top_k);
    p.counts[i] = count;
    p.flops += 2.0 * count * kHeads * (kLatent + kRope + kLatent);
    p.gathered_bytes += 2.0 * (kLatent + kRope) * (count + kHeads);
  }
  return p;
}

// The selection's device buffers: a random bf16 cache, queries with scores of order one (the
// softmax scale in them), and the attention's arguments over them.
class PrefillAttention {
 public:
  PrefillAttention(const PrefillSelection& p, int top_k, cudaStream_t stream)
      : cache_(sizeof(uint16_t) * int64_t{p.blocks} * kBlockSize * kRow),
        queries_(sizeof(uint16_t) * int64_t{p.tokens} * kHeads * kRow),
        selected_(sizeof(int32_t) * p.selected.size()),
        counts_(sizeof(int32_t) * p.tokens),
        table_(sizeof(int32_t) * p.blocks),
        sequence_(sizeof(int32_t) * p.tokens),
        out_(sizeof(uint16_t) * int64_t{p.tokens} * kHeads * kLatent) {
    cuda::fill_uniform_bf16(cache_.as<uint16_t>(), int64_t{p.blocks} * kBlockSize * kRow, 11, 1.0f, stream);
    cuda::fill_uniform_bf16(queries_.as<uint16_t>(), int64_t{p.tokens} * kHeads * kRow, 12,
                            4.0f / std::sqrt(float(kRow)), stream);
    selected_.upload(p.selected.data(), p.selected.size() * sizeof(int32_t));
    counts_.upload(p.counts.data(), p.counts.size() * sizeof(int32_t));
    table_.upload(p.table.data(), p.table.size() * sizeof(int32_t));
    const std::vector<int32_t> sequence(p.tokens, 0);
    sequence_.upload(sequence.data(), sequence.size() * sizeof(int32_t));
    args.queries = queries_.as<uint16_t>();
    args.cache = cache_.data();
    args.storage = cuda::CacheStorage::kBf16;
    args.selected = selected_.as<int32_t>();
    args.num_selected = counts_.as<int32_t>();
    args.max_selected = top_k;
    args.block_tables = table_.as<int32_t>();
    args.max_blocks = p.blocks;
    args.token_sequence = sequence_.as<int32_t>();
    args.block_size = kBlockSize;
    args.num_tokens = p.tokens;
    args.num_heads = kHeads;
    args.latent_dim = kLatent;
    args.rope_dim = kRope;
    args.out = out_.as<uint16_t>();
  }

  // The attention's output ([tokens, heads, latent] bf16; the buffer poisoned before the run).
  std::vector<uint16_t> output(cuda::Stream& stream) {
    cuda::memset_async(out_.data(), 0xff, out_.bytes(), stream.get());
    cuda::mla_attention_wgmma(args, stream.get());
    stream.synchronize();
    std::vector<uint16_t> result(int64_t{args.num_tokens} * kHeads * kLatent);
    out_.download(result.data(), result.size() * sizeof(uint16_t));
    return result;
  }

  // The median of `reps` timed runs, in milliseconds (copies_only: mla_attention_copies_only).
  double median_ms(cuda::Stream& stream, int reps, bool copies_only = false) {
    cuda::Event start, stop;
    std::vector<float> times;
    for (int r = 0; r < reps; ++r) {
      start.record(stream.get());
      if (copies_only)
        cuda::mla_attention_copies_only(args, stream.get());
      else
        cuda::mla_attention_wgmma(args, stream.get());
      stop.record(stream.get());
      stream.synchronize();
      times.push_back(stop.elapsed_ms_since(start));
    }
    std::sort(times.begin(), times.end());
    return times[times.size() / 2];
  }

  cuda::MlaAttentionArgs args;

 private:
  static constexpr int kRow = kLatent + kRope;
  cuda::DeviceBuffer cache_, queries_, selected_, counts_, table_, sequence_, out_;
};

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
  std::printf("%7s  %-28s %9s %9s %8s %9s %9s\n", "tokens", "kernel", "ms", "TFLOP/s", "x GEMM", "gather", "rel L2");
  std::ostringstream json;
  json << "{\"heads\": " << kHeads << ", \"latent\": " << kLatent << ", \"rope\": " << kRope << ", \"top_k\": " << top_k
       << ", \"bf16_gemm_flops_per_s\": " << gemm_flops_per_s << ", \"points\": [";
  bool first_point = true;
  for (const int n : token_counts) {
    const PrefillSelection selection = select_positions(n, top_k);
    PrefillAttention attention(selection, top_k, stream.get());
    std::vector<uint16_t> reference, specialized;
    for (const int variant : {0, 1, 2, 3, 4}) {
      attention.args.warp_specialized = variant > 0;
      attention.args.ring_stages = variant == 2;
      attention.args.persistent = variant >= 3;
      attention.args.paired_stages = variant == 4;
      const char* name = variant == 4   ? "warp-specialised paired"
                         : variant == 3 ? "warp-specialised persistent"
                         : variant == 2 ? "warp-specialised ring"
                         : variant == 1 ? "wgmma, warp-specialised"
                                        : "wgmma";
      const std::vector<uint16_t> result = attention.output(stream);
      if (reference.empty()) reference = result;
      if (variant == 1) specialized = result;
      const double error = glms::benchmarks::relative_l2(result, reference, bf16_to_float);
      // The persistent kernel rounds each value as the block-a-token kernel does: bit for bit.
      if (variant == 3 && result != specialized)
        std::printf("  (persistent: not bit for bit the two-stage kernel's)\n");
      const double ms = attention.median_ms(stream, reps), rate = selection.flops / (ms * 1e-3);
      const double gather = selection.gathered_bytes / (ms * 1e-3);
      std::printf("%7d  %-28s %9.3f %9.1f %8.3f %6.2f TB/s %9.2e\n", n, name, ms, rate / 1e12, rate / gemm_flops_per_s,
                  gather / 1e12, error);
      json << (first_point ? "" : ",") << "\n  {\"tokens\": " << n << ", \"kernel\": \"" << name << "\", \"ms\": " << ms
           << ", \"flops\": " << selection.flops << ", \"flops_per_s\": " << rate
           << ", \"fraction_of_gemm_rate\": " << rate / gemm_flops_per_s << ", \"gathered_bytes\": "
           << selection.gathered_bytes << ", \"gathered_bytes_per_s\": " << gather << ", \"rel_l2_vs_first\": " << error
           << "}";
      first_point = false;
    }
    for (const bool ring : {false, true}) {
      attention.args.ring_stages = ring;
      const char* name = ring ? "the ring's copies alone" : "two stages' copies alone";
      const double copies_ms = attention.median_ms(stream, reps, true);
      const double copies_rate = selection.gathered_bytes / (copies_ms * 1e-3);
      std::printf("%7d  %-28s %9.3f %9s %8s %6.2f TB/s\n", n, name, copies_ms, "", "", copies_rate / 1e12);
      json << ",\n  {\"tokens\": " << n << ", \"kernel\": \"" << (ring ? "ring copies only" : "copies only")
           << "\", \"ms\": " << copies_ms << ", \"gathered_bytes\": " << selection.gathered_bytes
           << ", \"gathered_bytes_per_s\": " << copies_rate << "}";
    }
    attention.args.ring_stages = false;
    attention.args.persistent = false;
    attention.args.paired_stages = false;
  }
  json << "\n]}\n";
  if (!json_path.empty()) std::ofstream(json_path) << json.str();
  return 0;
}
