// The CUDA MoE expert ops against host references on random data: the small-batch expert
// kernels in bf16, MXFP4 and block FP8 (against a double-precision SwiGLU over the same
// dequantised weights) at GLM-5.2 width and odd widths for each token-staging size, the grouped
// GEMMs, and the widening of quantised experts (routing, grouping and the combine:
// test_cuda_moe_routing.cpp). Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <numeric>
#include <random>
#include <thread>
#include <utility>

#include "core/dtype.h"
#include "io/model_config.h"
#include "model/layers.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/linear_fp8.h"
#include "ops/cuda/moe.h"
#include "quant/formats.h"
#include "ops/moe_test_support.h"
#include "quant/mxfp4_tiles.h"
#include "support/cuda_buffers.h"
#include "support/numerics.h"

using namespace glms;
using glms::testing::PlanBuffers;
using glms::testing::poisoned;
using glms::testing::random_choices;
using glms::testing::random_values;
using glms::testing::relative_l2;
using glms::testing::to_device;
using glms::testing::to_host;
namespace cuda = glms::ops::cuda;
using ops::WeightFormat;

namespace {

class CudaMoe : public glms::testing::CudaTest {};

float round_bf16(float v) { return bf16_to_f32(f32_to_bf16(v)); }

// Experts of one layer in the device layout of `format` plus their dequantised values
// (gate_up [E, 2 * inter, hidden], down [E, hidden, inter]) for the reference.
struct Experts {
  WeightFormat format;
  bool tiled;  // MXFP4 in the tile layout of the tensor-core kernels
  int64_t E, hidden, inter;
  std::vector<float> gate_up, down;  // what the kernel should compute with
  cuda::DeviceBuffer d_gate_up, d_gate_up_scales, d_down, d_down_scales;

  cuda::ExpertWeights view() const {
    return {format, d_gate_up.data(), d_gate_up_scales.data(), d_down.data(), d_down_scales.data(), tiled};
  }
};

// Quantises `values` ([E * matrices_per_expert, rows, cols], each matrix quantised on its own
// as a checkpoint stores it) into the device layout (MXFP4 tiled or as packed); returns the
// dequantised values.
std::vector<float> encode(WeightFormat format, bool tiled, const std::vector<float>& values, int64_t matrices,
                          int64_t rows, int64_t cols, cuda::DeviceBuffer& data, cuda::DeviceBuffer& scales) {
  std::vector<float> back(values.size());
  if (format == WeightFormat::Plain) {
    std::vector<uint16_t> bf16(values.size());
    for (size_t i = 0; i < values.size(); ++i) back[i] = bf16_to_f32(bf16[i] = f32_to_bf16(values[i]));
    data = to_device(bf16);
  } else if (format == WeightFormat::Mxfp4) {
    std::vector<uint8_t> packed(values.size() / 2), codes(values.size() / 32);
    for (int64_t r = 0; r < matrices * rows; ++r) {
      quant::quantize_mxfp4(values.data() + r * cols, cols, packed.data() + r * cols / 2, codes.data() + r * cols / 32);
      quant::dequantize_mxfp4(packed.data() + r * cols / 2, codes.data() + r * cols / 32, cols, back.data() + r * cols);
    }
    if (tiled) {
      std::vector<uint8_t> tiles(packed.size());
      quant::tile_mxfp4_rows(packed.data(), matrices * rows, cols, tiles.data());
      packed.swap(tiles);
      quant::tile_mxfp4_scales(codes.data(), matrices * rows, cols, codes.data());
    }
    data = to_device(packed);
    scales = to_device(codes);
  } else {
    const int64_t row_blocks = (rows + 127) / 128, col_blocks = (cols + 127) / 128;
    std::vector<uint8_t> codes(values.size());
    std::vector<float> row_scales;
    for (int64_t m = 0; m < matrices; ++m) {
      std::vector<float> scale_inv(row_blocks * col_blocks);
      quant::quantize_fp8_block(values.data() + m * rows * cols, rows, cols, codes.data() + m * rows * cols,
                                scale_inv.data());
      for (int64_t r = 0; r < rows; ++r) {
        quant::dequantize_fp8_block_row(codes.data() + m * rows * cols, scale_inv.data(), r, cols,
                                        back.data() + (m * rows + r) * cols);
        row_scales.insert(row_scales.end(), scale_inv.begin() + r / 128 * col_blocks,
                          scale_inv.begin() + (r / 128 + 1) * col_blocks);
      }
    }
    data = to_device(codes);
    scales = to_device(row_scales);
  }
  return back;
}

// `block_spread`: each run of 32 weights times 2^k, k in [-spread, spread] (MX scales far apart).
Experts make_experts(WeightFormat format, bool tiled, int64_t E, int64_t hidden, int64_t inter, uint64_t seed,
                     int block_spread = 0) {
  Experts x{format, format == WeightFormat::Mxfp4 && tiled, E, hidden, inter, {}, {}, {}, {}, {}, {}};
  // Gate and up quantised as separate [inter, hidden] matrices, then stacked per expert.
  auto gate_up = random_values(E * 2 * inter * hidden, seed, 1.0f / std::sqrt(static_cast<float>(hidden)));
  auto down = random_values(E * hidden * inter, seed + 1, 1.0f / std::sqrt(static_cast<float>(inter)));
  if (block_spread > 0)
    for (auto* values : {&gate_up, &down})
      for (size_t i = 0; i < values->size(); ++i)
        (*values)[i] = std::ldexp((*values)[i], static_cast<int>((i / 32 * 7) % (2 * block_spread + 1)) - block_spread);
  x.gate_up = encode(format, x.tiled, gate_up, 2 * E, inter, hidden, x.d_gate_up, x.d_gate_up_scales);
  x.down = encode(format, x.tiled, down, E, hidden, inter, x.d_down, x.d_down_scales);
  return x;
}

// Values as quantize_fp8_rows rounds them (rows of `cols`, a multiple of 128): E4M3 with one
// scale a row and 128 columns, back in fp32.
std::vector<float> fp8_rounded_rows(std::vector<float> x) {
  const int64_t block = cuda::kFp8ScaleBlock;
  for (size_t b = 0; b < x.size(); b += block) {
    float amax = 0.0f;
    for (int64_t i = 0; i < block; ++i) amax = std::max(amax, std::fabs(x[b + i]));
    const float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
    for (int64_t i = 0; i < block; ++i)
      x[b + i] = quant::minifloat_to_f32(quant::MiniFloat::E4M3,
                                         quant::f32_to_minifloat(quant::MiniFloat::E4M3, x[b + i] / scale)) *
                 scale;
  }
  return x;
}

// expert_out row of pair (t, e): down_e . bf16(silu(gate_e . x_t) * (up_e . x_t)), in double;
// with `fp8_act` the bf16 act rounded as fp8_rounded_rows rounds it (the W8A8 kernels).
std::vector<float> reference_pair(const Experts& x, const std::vector<float>& tokens, int t, int e,
                                  bool fp8_act = false) {
  const int64_t H = x.hidden, I = x.inter;
  const float* gu = x.gate_up.data() + e * 2 * I * H;
  std::vector<float> act(I);
  for (int64_t i = 0; i < I; ++i) {
    double g = 0, u = 0;
    for (int64_t k = 0; k < H; ++k) {
      g += double(gu[i * H + k]) * tokens[t * H + k];
      u += double(gu[(I + i) * H + k]) * tokens[t * H + k];
    }
    act[i] = round_bf16(static_cast<float>(g / (1.0 + std::exp(-g)) * u));
  }
  if (fp8_act) act = fp8_rounded_rows(std::move(act));
  std::vector<float> out(H);
  const float* d = x.down.data() + e * H * I;
  for (int64_t h = 0; h < H; ++h) {
    double sum = 0;
    for (int64_t i = 0; i < I; ++i) sum += double(d[h * I + i]) * act[i];
    out[h] = static_cast<float>(sum);
  }
  return out;
}

// One run of an expert kernel on the device: the tokens ([n, hidden], values of bf16) and the plan
// of `ids`, act and (poisoned) out buffers; rows() reads out back in pair order.
struct ExpertRun {
  int64_t P, hidden;
  PlanBuffers buffers;
  cuda::DeviceBuffer d_ids, d_x, act, out;
  ExpertRun(const std::vector<float>& tokens, const std::vector<int32_t>& ids, int64_t E, int64_t hidden_size,
            int64_t inter)
      : P(static_cast<int64_t>(ids.size())),
        hidden(hidden_size),
        buffers(static_cast<int>(E), P),
        d_ids(to_device(ids)),
        d_x(to_device(bf16_of(tokens))),
        act(sizeof(uint16_t) * P * inter),
        out(poisoned(P * hidden)) {
    cuda::moe_plan(d_ids.as<int32_t>(), P, static_cast<int>(E), buffers.plan(), nullptr);
  }
  static std::vector<uint16_t> bf16_of(const std::vector<float>& values) {
    std::vector<uint16_t> bf16(values.size());
    for (size_t i = 0; i < values.size(); ++i) bf16[i] = f32_to_bf16(values[i]);
    return bf16;
  }
  // Pair p's output row is out's row pair_slot[p] (the slots are a permutation of the pairs).
  std::vector<float> rows() const {
    const auto got = to_host<float>(out);
    const auto slot = to_host<int32_t>(buffers.pair_slot);
    std::vector<float> rows;
    for (int64_t p = 0; p < P; ++p)
      rows.insert(rows.end(), got.begin() + slot[p] * hidden, got.begin() + (slot[p] + 1) * hidden);
    return rows;
  }
};

// reference_pair's row for every pair of `ids` ([n, top_k]), in pair order; the pairs spread
// over the host's cores (the double-precision reference at GLM-5.2's widths is most of this
// test's time on the GPU machine).
std::vector<float> reference_rows(const Experts& experts, const std::vector<float>& tokens,
                                  const std::vector<int32_t>& ids, int top_k, bool fp8_act = false) {
  const int64_t P = static_cast<int64_t>(ids.size()), H = experts.hidden;
  std::vector<float> rows(P * H);
  std::atomic<int64_t> next{0};
  const auto work = [&] {
    for (int64_t p = next++; p < P; p = next++) {
      const auto want = reference_pair(experts, tokens, static_cast<int>(p / top_k), ids[p], fp8_act);
      std::copy(want.begin(), want.end(), rows.begin() + p * H);
    }
  };
  std::vector<std::thread> threads;
  const int64_t count = std::min<int64_t>(P, std::max(1u, std::thread::hardware_concurrency()));
  for (int64_t i = 1; i < count; ++i) threads.emplace_back(work);
  work();
  for (auto& thread : threads) thread.join();
  return rows;
}

// Relative L2 error of moe_experts_small over `tokens` ([n, hidden], rounded to bf16 here: the
// kernels read bf16) routed to `ids` ([n, top_k]) against reference_pair, every pair's row.
// With `wgmma_tile_rows` >= 0, moe_experts_wgmma instead (tiled MXFP4), in tiles of that many rows.
// With `stream_shape` >= 0, moe_experts_stream in that MoeStreamShape, chunks of `stream_chunk`
// tokens. `reference` (when given) keeps the reference rows between calls on the same inputs.
double experts_error(const Experts& experts, std::vector<float> tokens, const std::vector<int32_t>& ids, int top_k,
                     bool tensor_cores, int wgmma_tile_rows = -1, int stream_shape = -1, int stream_chunk = 8,
                     std::vector<float>* reference = nullptr) {
  const int64_t hidden = experts.hidden, inter = experts.inter, E = experts.E;
  const int n = static_cast<int>(tokens.size() / hidden);
  const int64_t P = static_cast<int64_t>(ids.size());
  for (float& v : tokens) v = round_bf16(v);
  ExpertRun run(tokens, ids, E, hidden, inter);
  const PlanBuffers& buffers = run.buffers;
  const cuda::DeviceBuffer &d_x = run.d_x, &act = run.act, &out = run.out;
  cuda::DeviceBuffer staged(sizeof(uint16_t) * P * std::max(hidden, inter)), unscale(sizeof(float) * P);
  if (stream_shape >= 0)
    cuda::moe_experts_stream(d_x.as<uint16_t>(), hidden, inter, experts.view(), buffers.plan(), static_cast<int>(E),
                             top_k, P, stream_chunk, static_cast<int>(std::min<int64_t>(E, P)),
                             {staged.as<uint32_t>(), unscale.as<float>()}, act.as<uint16_t>(), out.as<float>(), nullptr,
                             static_cast<cuda::MoeStreamShape>(stream_shape));
  else if (wgmma_tile_rows >= 0)
    cuda::moe_experts_wgmma(d_x.as<uint16_t>(), hidden, inter, experts.view(), buffers.plan(), static_cast<int>(E),
                            top_k, P, act.as<uint16_t>(), out.as<float>(), nullptr, wgmma_tile_rows);
  else
    cuda::moe_experts_small(d_x.as<uint16_t>(), hidden, inter, experts.view(), buffers.plan(), static_cast<int>(E),
                            top_k, n, static_cast<int>(std::min<int64_t>(E, P)), act.as<uint16_t>(), out.as<float>(),
                            nullptr, tensor_cores);
  const std::vector<float> got_rows = run.rows();
  if (reference && !reference->empty()) return relative_l2(got_rows, *reference);
  const std::vector<float> want_rows = reference_rows(experts, tokens, ids, top_k);
  if (reference) *reference = want_rows;
  return relative_l2(got_rows, want_rows);
}

// The persistent grouped GEMMs' unit counters (cuda::PersistentLaunch), zero, and their launch:
// with `max_blocks` 3, so that each block takes many tiles and wraps its claim slots' barriers
// (every case but the one-tile ones), or (0) a block an SM.
struct UnitCounters {
  cuda::DeviceBuffer buffer = cuda::zeroed_buffer(cuda::kUnitCounterBytes);
  std::vector<int32_t> values() const {
    std::vector<int32_t> host(2);
    buffer.download(host.data(), sizeof(int32_t) * host.size());
    return host;
  }
  cuda::PersistentLaunch launch(int max_blocks = 3) const { return {buffer.as<int>(), max_blocks}; }
};

// The same for moe_experts_specialized (the warp-specialised grouped GEMMs), or with `widened`
// (quantised experts) for moe_experts_widened, which widens them to bf16 for those GEMMs first;
// the experts' output rows into `rows`.
double specialized_error(const Experts& experts, std::vector<float> tokens, const std::vector<int32_t>& ids,
                         int top_k, cuda::SpecializedTiles tiles, const UnitCounters& counters, bool widened,
                         std::vector<float>& rows) {
  const int64_t hidden = experts.hidden, inter = experts.inter, E = experts.E, P = std::ssize(ids);
  for (float& v : tokens) v = round_bf16(v);
  ExpertRun run(tokens, ids, E, hidden, inter);
  if (widened) {
    cuda::DeviceBuffer buffer(sizeof(uint16_t) * E * 2 * inter * hidden);
    cuda::moe_experts_widened(run.d_x.as<uint16_t>(), hidden, inter, experts.view(), run.buffers.plan(),
                              static_cast<int>(E), top_k, P, buffer.as<uint16_t>(), run.act.as<uint16_t>(),
                              run.out.as<float>(), nullptr, tiles, counters.launch());
  } else {
    cuda::moe_experts_specialized(run.d_x.as<uint16_t>(), hidden, inter, experts.view(), run.buffers.plan(),
                                  static_cast<int>(E), top_k, P, run.act.as<uint16_t>(), run.out.as<float>(), nullptr,
                                  tiles, counters.launch());
  }
  EXPECT_EQ(counters.values(), std::vector<int32_t>({0, 0})) << "after tiles " << static_cast<int>(tiles);
  rows = run.rows();
  return relative_l2(rows, reference_rows(experts, tokens, ids, top_k));
}

// The same for moe_experts_wgmma_rs (tiled MXFP4, the widened weights in wgmma's A registers).
double wgmma_rs_error(const Experts& experts, std::vector<float> tokens, const std::vector<int32_t>& ids, int top_k) {
  const int64_t hidden = experts.hidden, inter = experts.inter, E = experts.E;
  const int64_t P = static_cast<int64_t>(ids.size());
  for (float& v : tokens) v = round_bf16(v);
  ExpertRun run(tokens, ids, E, hidden, inter);
  cuda::DeviceBuffer staged(sizeof(uint16_t) * P * std::max(hidden, inter));
  cuda::moe_experts_wgmma_rs(run.d_x.as<uint16_t>(), hidden, inter, experts.view(), run.buffers.plan(),
                             static_cast<int>(E), top_k, P, staged.as<uint32_t>(), run.act.as<uint16_t>(),
                             run.out.as<float>(), nullptr);
  return relative_l2(run.rows(), reference_rows(experts, tokens, ids, top_k));
}

// `tensor_cores`: whether the shape takes moe_experts_mma (checked), and whether to let it (MXFP4
// experts are tiled for it, packed for the CUDA-core kernels).
void check_experts(WeightFormat format, int64_t E, int64_t hidden, int64_t inter, int top_k,
                   std::initializer_list<int> token_counts, bool tensor_cores) {
  const Experts experts = make_experts(format, tensor_cores, E, hidden, inter, 11 + hidden);
  if (tensor_cores) {
    ASSERT_TRUE(cuda::moe_experts_mma_supported(experts.view(), hidden, inter));
  }
  for (const int n : token_counts) {
    const auto ids = random_choices(n, static_cast<int>(E), top_k, 200 + n);
    EXPECT_LT(experts_error(experts, random_values(n * hidden, 100 + n, 2.0f), ids, top_k, tensor_cores), 2e-3)
        << "format " << static_cast<int>(format) << ", " << n << " tokens, hidden " << hidden << ", inter " << inter
        << (tensor_cores ? ", tensor cores" : ", CUDA cores");
  }
}

}  // namespace

// Token counts 1, 3 and 20 over 4 experts (top-2) stage 1, 4 and 8 tokens per chunk on the
// CUDA-core kernels; on tensor cores part-filled chunks of 8 (1 and 3 tokens) and (20 tokens: 10
// pairs an expert) a wide chunk of 64; 13 tokens over 5 experts (top-3) about 8 pairs an expert,
// some over two chunks of 8; 120 tokens two wide chunks an expert, the second part-filled, over
// rows shorter than one staged slab.
TEST_F(CudaMoe, Bf16ExpertsMatchReference) {
  check_experts(WeightFormat::Plain, 4, 6144, 2048, 2, {1, 3, 20}, false);
  check_experts(WeightFormat::Plain, 5, 40, 24, 2, {1, 7}, false);  // odd widths: the scalar path
}

TEST_F(CudaMoe, Mxfp4ExpertsMatchReference) {
  check_experts(WeightFormat::Mxfp4, 4, 6144, 2048, 2, {1, 3, 20}, true);
  check_experts(WeightFormat::Mxfp4, 4, 6144, 2048, 2, {1, 3, 20}, false);
  check_experts(WeightFormat::Mxfp4, 5, 256, 128, 3, {1, 2, 13, 120}, true);
  check_experts(WeightFormat::Mxfp4, 5, 96, 64, 3, {1, 2, 13}, false);  // not whole 128s: CUDA cores
}

TEST_F(CudaMoe, Fp8ExpertsMatchReference) {
  check_experts(WeightFormat::Fp8Block, 4, 6144, 2048, 2, {1, 3, 20}, true);
  check_experts(WeightFormat::Fp8Block, 4, 6144, 2048, 2, {1, 3, 20}, false);
  check_experts(WeightFormat::Fp8Block, 5, 192, 64, 3, {1, 2, 13, 120}, true);  // partial 128-blocks
  check_experts(WeightFormat::Fp8Block, 5, 208, 48, 3, {1, 2, 13}, false);
}

// The grouped GEMMs on wgmma (moe_experts_wgmma), MXFP4 (W4A16) and bf16 weights, in both tile
// shapes, at GLM-5.2's widths, then over experts with two row tiles (the second part-filled),
// experts with no pairs, more experts than the tile search has threads, and (MXFP4) block scales
// far apart.
void check_wgmma_experts(WeightFormat format, int64_t E, int64_t hidden, int64_t inter, int top_k,
                         std::initializer_list<int> token_counts, int block_spread = 0) {
  const Experts experts = make_experts(format, true, E, hidden, inter, 41 + E, block_spread);
  ASSERT_TRUE(cuda::moe_experts_wgmma_supported(experts.view(), hidden, inter));
  for (const int n : token_counts)
    for (const int tile_rows : {64, 128}) {
      const auto ids = random_choices(n, static_cast<int>(E), top_k, 300 + n);
      EXPECT_LT(experts_error(experts, random_values(n * hidden, 110 + n, 2.0f), ids, top_k, true, tile_rows), 2e-3)
          << "format " << static_cast<int>(format) << ", " << E << " experts, " << n << " tokens, hidden " << hidden
          << ", inter " << inter << ", spread " << block_spread << ", tiles of " << tile_rows << " rows";
    }
}

void check_wgmma_experts_shapes(WeightFormat format) {
  check_wgmma_experts(format, 4, 6144, 2048, 2, {1, 20});
  check_wgmma_experts(format, 5, 512, 256, 3, {1, 13, 150});  // 150 tokens: 90 pairs an expert, two 64-row tiles
  check_wgmma_experts(format, 2, 512, 256, 2, {300});         // 300 pairs an expert: three 128-row tiles
  check_wgmma_experts(format, 40, 256, 128, 2, {5, 70});      // most experts without pairs
  check_wgmma_experts(format, 260, 256, 128, 4, {64});        // two experts a thread in the tile search
  check_wgmma_experts(format, 2, 256, 1024, 2, {200});        // down's K over more steps than stages
}

TEST_F(CudaMoe, Mxfp4WgmmaExpertsMatchReference) {
  check_wgmma_experts_shapes(WeightFormat::Mxfp4);
  check_wgmma_experts(WeightFormat::Mxfp4, 3, 512, 256, 2, {3, 100}, 15);  // block scales about 2^-20 .. 2^10
}

TEST_F(CudaMoe, Bf16WgmmaExpertsMatchReference) { check_wgmma_experts_shapes(WeightFormat::Plain); }

// The warp-specialised grouped GEMMs (moe_experts_specialized) over the same shapes: 128-row
// tiles, part-filled ones and tiles of 64 rows or fewer, experts without pairs, down's K over more
// steps than stages (MXFP4: than the codes' ring holds groups); bf16 each also with the row tiles
// in pairs of blocks sharing the weight lines (pairs with a full or a short second tile, an
// expert's odd last tile alone, two pairs and an odd tile at 600 pairs an expert); MXFP4 each
// also widened to bf16 first (moe_experts_widened), with and without the pairs. MXFP4 also with
// block scales far apart (the widening's two-multiply branch). The tiles also in persistent
// blocks (MXFP4 as they are and widened first), their sums bit for bit those of a block a tile (the same
// products in the same order), in 3 blocks that take every tile between them, with one pair of
// counters for every launch, zero after each.
void check_specialized_experts(WeightFormat format, int block_spread = 0) {
  const UnitCounters counters;
  struct Shape {
    int64_t E, hidden, inter;
    int top_k;
    std::initializer_list<int> tokens;
  };
  for (const Shape& c : {Shape{4, 6144, 2048, 2, {1, 20, 300}}, Shape{5, 512, 256, 3, {1, 13, 150}},
                         Shape{2, 512, 256, 2, {300}}, Shape{40, 256, 128, 2, {5, 70}},
                         Shape{260, 256, 128, 4, {64}}, Shape{2, 256, 1024, 2, {200}}, Shape{2, 256, 128, 2, {600}}}) {
    const Experts experts = make_experts(format, true, c.E, c.hidden, c.inter, 41 + c.E, block_spread);
    ASSERT_TRUE(cuda::moe_experts_specialized_supported(experts.view(), c.hidden, c.inter));
    for (const int n : c.tokens) {
      const auto ids = random_choices(n, static_cast<int>(c.E), c.top_k, 300 + n);
      // Variant 1: bf16 row tiles in pairs; MXFP4 experts widened first. Variant 2 (MXFP4): widened,
      // then the bf16 row tiles in pairs. Variant 3: the bf16 tiles persistent (MXFP4 widened
      // first). Variant 4 (MXFP4): persistent, as they are.
      using cuda::SpecializedTiles;
      std::vector<float> every_rows, unwidened_rows;  // a block a tile's: bf16 or widened; as they are
      for (const int variant : {0, 1, 2, 3, 4}) {
        const bool widened = variant > 0 && variant < 4 && format != WeightFormat::Plain;
        const SpecializedTiles tiles = variant >= 3                                    ? SpecializedTiles::kPersistent
                                       : (variant == 1 && !widened) || variant == 2 ? SpecializedTiles::kPaired
                                                                                     : SpecializedTiles::kEvery;
        if ((variant == 2 && !widened) || (variant == 4 && format == WeightFormat::Plain)) continue;
        std::vector<float> rows;
        EXPECT_LT(specialized_error(experts, random_values(n * c.hidden, 110 + n, 2.0f), ids, c.top_k, tiles, counters,
                                    widened, rows),
                  2e-3)
            << "format " << static_cast<int>(format) << ", " << c.E << " experts, " << n << " tokens, hidden "
            << c.hidden << ", inter " << c.inter << ", spread " << block_spread
            << (widened ? ", widened to bf16" : "") << ", tiles " << static_cast<int>(tiles);
        if (variant == 0) unwidened_rows = rows;
        if (tiles == SpecializedTiles::kEvery) every_rows = rows;
        if (tiles == SpecializedTiles::kPersistent) {
          const std::vector<float>& block_a_tile = variant == 4 ? unwidened_rows : every_rows;
          EXPECT_TRUE(rows == block_a_tile) << "persistent tiles against a block a tile: format "
                                          << static_cast<int>(format) << ", " << c.E << " experts, " << n
                                          << " tokens, hidden " << c.hidden << ", inter " << c.inter;
        }
      }
    }
  }
  EXPECT_EQ(counters.values(), std::vector<int32_t>({0, 0}));
  const Experts odd = make_experts(format, true, 2, 384, 128, 5);
  EXPECT_FALSE(cuda::moe_experts_specialized_supported(odd.view(), 384, 128));  // hidden not whole 256s
}

TEST_F(CudaMoe, Bf16SpecializedExpertsMatchReference) { check_specialized_experts(WeightFormat::Plain); }

TEST_F(CudaMoe, Mxfp4SpecializedExpertsMatchReference) {
  check_specialized_experts(WeightFormat::Mxfp4);
  check_specialized_experts(WeightFormat::Mxfp4, 15);  // block scales about 2^-20 .. 2^10
  const Experts packed = make_experts(WeightFormat::Mxfp4, false, 2, 256, 128, 5);
  EXPECT_FALSE(cuda::moe_experts_specialized_supported(packed.view(), 256, 128));  // not tiled
}

// The grouped GEMMs with the widened weights in wgmma's A registers (moe_experts_wgmma_rs) over
// the warp-specialised ones' shapes: tiles of 128 rows (N = 128) and of 64 or fewer (N = 64),
// part-filled tiles, experts without pairs, more experts than the tile search has threads, down's
// K over more steps than stages; and block scales far apart.
TEST_F(CudaMoe, Mxfp4WgmmaRsExpertsMatchReference) {
  struct Shape {
    int64_t E, hidden, inter;
    int top_k;
    std::initializer_list<int> tokens;
  };
  for (const int spread : {0, 15})
    for (const Shape& c : {Shape{4, 6144, 2048, 2, {1, 20, 300}}, Shape{5, 512, 256, 3, {1, 13, 150}},
                           Shape{2, 512, 256, 2, {300}}, Shape{40, 256, 128, 2, {5, 70}},
                           Shape{260, 256, 128, 4, {64}}, Shape{2, 256, 1024, 2, {200}}}) {
      if (spread > 0 && c.hidden > 512) continue;
      const Experts experts = make_experts(WeightFormat::Mxfp4, true, c.E, c.hidden, c.inter, 41 + c.E, spread);
      ASSERT_TRUE(cuda::moe_experts_wgmma_rs_supported(experts.view(), c.hidden, c.inter));
      for (const int n : c.tokens) {
        const auto ids = random_choices(n, static_cast<int>(c.E), c.top_k, 300 + n);
        EXPECT_LT(wgmma_rs_error(experts, random_values(n * c.hidden, 110 + n, 2.0f), ids, c.top_k), 2e-3)
            << c.E << " experts, " << n << " tokens, hidden " << c.hidden << ", inter " << c.inter << ", spread "
            << spread;
      }
    }
  const Experts packed = make_experts(WeightFormat::Mxfp4, false, 2, 256, 128, 5);
  EXPECT_FALSE(cuda::moe_experts_wgmma_rs_supported(packed.view(), 256, 128));  // not tiled
}

// The streamed decode kernels (moe_experts_stream) in each shape and chunk size (mma.sync and
// wgmma): GLM-5.2's widths with 1, 2 and about 20 pairs an expert (chunks of 8, 16 and 32 tokens,
// an expert's pairs over several chunks; odd step counts in the two-step slots), experts with no pairs, rows past a warp's last fragment (inter 384: the
// down rows end inside a block's tile), and block scales far apart.
void check_stream_experts(int64_t E, int64_t hidden, int64_t inter, int top_k, std::initializer_list<int> token_counts,
                          int block_spread = 0) {
  const Experts experts = make_experts(WeightFormat::Mxfp4, true, E, hidden, inter, 57 + E, block_spread);
  ASSERT_TRUE(cuda::moe_experts_stream_supported(experts.view(), hidden, inter));
  for (const int n : token_counts) {
    const auto ids = random_choices(n, static_cast<int>(E), top_k, 400 + n);
    const auto tokens = random_values(n * hidden, 120 + n, 2.0f);
    std::vector<float> reference;
    for (const int shape : {0, 1, 2, 3, 4})
      for (const int chunk : {8, 16, 32}) {
        EXPECT_LT(experts_error(experts, tokens, ids, top_k, true, -1, shape, chunk, &reference), 2e-3)
            << E << " experts, " << n << " tokens, hidden " << hidden << ", inter " << inter << ", spread "
            << block_spread << ", shape " << shape << ", chunks of " << chunk;
      }
  }
}

TEST_F(CudaMoe, Mxfp4StreamedExpertsMatchReference) {
  check_stream_experts(4, 6144, 2048, 2, {1, 4, 40});
  check_stream_experts(6, 384, 384, 3, {1, 50});
  check_stream_experts(30, 256, 128, 2, {3, 9}, 10);
  // Experts of 8 to 40 pairs: the wgmma kernels' chunks of 32 multiply 8, 16, 24 or 32 token
  // columns by their pairs (the rest of a chunk's lines neither copied nor read).
  check_stream_experts(5, 384, 256, 2, {37, 70});
}

// The grouped GEMMs' bf16 sums (ExpertSums::bf16) are their fp32 sums rounded to nearest even,
// bit for bit: the same accumulators, only the store differs. Each kernel over experts with
// part-filled row tiles (150 tokens over 5 experts, top-3: about 90 pairs an expert).
void expect_bf16_sums_rounded(const Experts& experts, const char* name,
                              const std::function<void(ExpertRun&, cuda::ExpertSums)>& launch) {
  const int n = 150, top_k = 3;
  auto tokens = random_values(n * experts.hidden, 140, 2.0f);
  for (float& v : tokens) v = round_bf16(v);
  const auto ids = random_choices(n, static_cast<int>(experts.E), top_k, 141);
  ExpertRun run(tokens, ids, experts.E, experts.hidden, experts.inter);
  launch(run, run.out.as<float>());
  const auto f32 = to_host<float>(run.out);
  std::vector<uint16_t> unset(f32.size(), 0xffff);  // a NaN, which no sum rounds to
  auto d_bf16 = to_device(unset);
  launch(run, d_bf16.as<uint16_t>());
  const auto bf16 = to_host<uint16_t>(d_bf16);
  int64_t differ = 0;
  for (size_t i = 0; i < f32.size(); ++i) differ += bf16[i] != f32_to_bf16(f32[i]);
  EXPECT_EQ(differ, 0) << name << ": of " << f32.size() << " sums";
}

TEST_F(CudaMoe, GroupedGemmsBf16SumsAreTheirFp32SumsRounded) {
  const int E = 5, top_k = 3;
  const int64_t hidden = 512, inter = 256;
  const Experts bf16 = make_experts(WeightFormat::Plain, true, E, hidden, inter, 51);
  const Experts mxfp4 = make_experts(WeightFormat::Mxfp4, true, E, hidden, inter, 52);
  const Experts fp8 = make_experts(WeightFormat::Fp8Block, true, E, hidden, inter, 53);
  auto plan_of = [](ExpertRun& run) { return run.buffers.plan(); };
  for (const int tile_rows : {64, 128})
    expect_bf16_sums_rounded(bf16, "moe_experts_wgmma", [&](ExpertRun& run, cuda::ExpertSums sums) {
      cuda::moe_experts_wgmma(run.d_x.as<uint16_t>(), hidden, inter, bf16.view(), plan_of(run), E, top_k, run.P,
                              run.act.as<uint16_t>(), sums, nullptr, tile_rows);
    });
  const UnitCounters counters;
  for (const Experts* experts : {&bf16, &mxfp4})
    expect_bf16_sums_rounded(*experts, "moe_experts_specialized", [&](ExpertRun& run, cuda::ExpertSums sums) {
      cuda::moe_experts_specialized(run.d_x.as<uint16_t>(), hidden, inter, experts->view(), plan_of(run), E, top_k,
                                    run.P, run.act.as<uint16_t>(), sums, nullptr);
    });
  expect_bf16_sums_rounded(bf16, "moe_experts_specialized (persistent)", [&](ExpertRun& run, cuda::ExpertSums sums) {
    cuda::moe_experts_specialized(run.d_x.as<uint16_t>(), hidden, inter, bf16.view(), plan_of(run), E, top_k, run.P,
                                  run.act.as<uint16_t>(), sums, nullptr, cuda::SpecializedTiles::kPersistent,
                                  counters.launch(0));
  });
  expect_bf16_sums_rounded(mxfp4, "moe_experts_wgmma_rs", [&](ExpertRun& run, cuda::ExpertSums sums) {
    cuda::DeviceBuffer staged(sizeof(uint16_t) * run.P * hidden);
    cuda::moe_experts_wgmma_rs(run.d_x.as<uint16_t>(), hidden, inter, mxfp4.view(), plan_of(run), E, top_k, run.P,
                               staged.as<uint32_t>(), run.act.as<uint16_t>(), sums, nullptr);
  });
  for (const cuda::Fp8ExpertGemm gemm :
       {cuda::Fp8ExpertGemm::kWarpSpecialized, cuda::Fp8ExpertGemm::kWide, cuda::Fp8ExpertGemm::kWidePersistent})
    expect_bf16_sums_rounded(fp8, "moe_experts_wgmma_fp8", [&](ExpertRun& run, cuda::ExpertSums sums) {
      const int64_t np = cuda::fp8_padded_tokens(run.P / top_k), pp = cuda::fp8_padded_tokens(run.P);
      cuda::DeviceBuffer token_codes(np * hidden), token_scales(sizeof(float) * np * hidden / 128),
          act_codes(pp * inter), act_scales(sizeof(float) * pp * inter / 128);
      cuda::moe_experts_wgmma_fp8(run.d_x.as<uint16_t>(), hidden, inter, fp8.view(), plan_of(run), E, top_k, run.P,
                                  {token_codes.as<uint8_t>(), token_scales.as<float>(), act_codes.as<uint8_t>(),
                                   act_scales.as<float>(), counters.launch(0)},
                                  run.act.as<uint16_t>(), sums, nullptr, gemm);
    });
  EXPECT_EQ(counters.values(), std::vector<int32_t>({0, 0}));
}

// moe_experts_wgmma_fp8 (W8A8) against reference_pair over the same E4M3 roundings of the
// tokens and of act. Each token's 128-column blocks differ in magnitude (1e-2 .. 1e2), so that
// every token scale matters; the weights' 128 x 128 blocks have scales of their own.
struct Fp8WgmmaRun {
  std::vector<float> rows;  // the experts' output rows in pair order
  double error;             // their relative L2 against the W8A8 reference
};
// `reference`: the W8A8 reference rows, made on the first call (empty) and kept for the next.
Fp8WgmmaRun fp8_wgmma_run(const Experts& experts, int n, const std::vector<int32_t>& ids, int top_k,
                          cuda::Fp8ExpertGemm gemm, std::vector<float>& reference, const UnitCounters& counters) {
  const int64_t hidden = experts.hidden, inter = experts.inter, E = experts.E;
  const int64_t P = static_cast<int64_t>(ids.size());
  auto tokens = random_values(n * hidden, 130 + n, 2.0f);
  for (int64_t i = 0; i < n * hidden; ++i)
    tokens[i] = round_bf16(tokens[i] * std::pow(10.0f, static_cast<float>((i / hidden + i % hidden / 128) % 5) - 2.0f));
  ExpertRun run(tokens, ids, E, hidden, inter);
  const int64_t np = cuda::fp8_padded_tokens(n), pp = cuda::fp8_padded_tokens(P);
  cuda::DeviceBuffer token_codes(np * hidden), token_scales(sizeof(float) * np * hidden / 128),
      act_codes(pp * inter), act_scales(sizeof(float) * pp * inter / 128);
  cuda::moe_experts_wgmma_fp8(run.d_x.as<uint16_t>(), hidden, inter, experts.view(), run.buffers.plan(),
                              static_cast<int>(E), top_k, P,
                              {token_codes.as<uint8_t>(), token_scales.as<float>(), act_codes.as<uint8_t>(),
                               act_scales.as<float>(), counters.launch()},
                              run.act.as<uint16_t>(), run.out.as<float>(), nullptr, gemm);
  std::vector<float> rows = run.rows();
  EXPECT_EQ(counters.values(), std::vector<int32_t>({0, 0})) << "after kernel " << static_cast<int>(gemm);
  if (reference.empty()) reference = reference_rows(experts, fp8_rounded_rows(tokens), ids, top_k, true);
  const double error = relative_l2(rows, reference);
  return {std::move(rows), error};
}

// GLM-5.2's widths; experts with several row tiles, the last part-filled (150 tokens over 5
// experts, top-3: 90 pairs an expert; 300 pairs an expert); most experts without pairs; more
// experts than the tile search has threads; more steps than stages in down (inter 1024) and an
// odd number of steps (hidden 384). Each case through every kernel; the 256-line tiles' sums,
// paired, unpaired or persistent (3 blocks taking every tile between them: 260 experts' one-step
// tiles, and 24 experts' 72 row tiles, 216 gate/up and 216 down units of 6 and 3 steps, so that
// a block's tiles start at stages other than 0 and mix 128-row tiles with last tiles of about 64
// rows, some of them only the first consumer's; its unit counters, shared by every launch of the
// test, left zero by each), equal the 128-line ones' bit for bit (the same products in the same order;
// hidden 384 takes the 128-line kernel for them, so there the check holds trivially). The pairs
// cover experts with one, two and three row tiles (an odd last tile split by lines), tiles of 64
// rows or fewer, and a pair of tiles whose second has 32 rows (160 pairs). Hopper's FP8 tensor
// cores keep about 14 bits in their own sums, so a 128-k step's sum is about 1e-3 off the double
// one; that moves some of act's bf16 and then E4M3 roundings (an E4M3 step is 1/16), which the
// reference makes from exact sums: 3.4e-3 .. 5.4e-3 on the H200. A wrong scale or tile is off by
// order one.
TEST_F(CudaMoe, Fp8WgmmaExpertsMatchW8a8Reference) {
  const UnitCounters counters;
  struct Case {
    int64_t E, hidden, inter;
    int top_k;
    std::vector<int> token_counts;
  };
  for (const Case& c : {Case{4, 6144, 2048, 2, {1, 20}}, Case{5, 512, 256, 3, {1, 13, 150}}, Case{2, 512, 256, 2, {300}},
                        Case{40, 256, 128, 2, {5, 70}}, Case{260, 256, 128, 4, {64}}, Case{2, 256, 1024, 2, {200}},
                        Case{2, 256, 128, 2, {160}}, Case{3, 384, 128, 2, {40}}, Case{24, 768, 384, 8, {960}}}) {
    const Experts experts = make_experts(WeightFormat::Fp8Block, true, c.E, c.hidden, c.inter, 61 + c.E, 3);
    ASSERT_TRUE(cuda::moe_experts_wgmma_fp8_supported(experts.view(), c.hidden, c.inter));
    for (const int n : c.token_counts) {
      const auto ids = random_choices(n, static_cast<int>(c.E), c.top_k, 500 + n);
      using cuda::Fp8ExpertGemm;
      std::vector<std::vector<float>> rows;
      std::vector<float> reference;
      for (const Fp8ExpertGemm gemm : {Fp8ExpertGemm::kBlockBarrier, Fp8ExpertGemm::kWarpSpecialized,
                                       Fp8ExpertGemm::kWide, Fp8ExpertGemm::kWidePaired,
                                       Fp8ExpertGemm::kWidePersistent}) {
        Fp8WgmmaRun run = fp8_wgmma_run(experts, n, ids, c.top_k, gemm, reference, counters);
        EXPECT_LT(run.error, 1e-2) << c.E << " experts, " << n << " tokens, hidden " << c.hidden << ", inter "
                                   << c.inter << ", kernel " << static_cast<int>(gemm);
        rows.push_back(std::move(run.rows));
      }
      for (int wide = 2; wide < 5; ++wide)
        EXPECT_TRUE(rows[wide] == rows[1]) << "256-line tiles (kernel " << wide << ") against 128-line ones: " << c.E
                                           << " experts, " << n << " tokens, hidden " << c.hidden << ", inter "
                                           << c.inter;
    }
  }
  EXPECT_EQ(counters.values(), std::vector<int32_t>({0, 0}));
  const Experts odd = make_experts(WeightFormat::Fp8Block, true, 2, 320, 128, 5);
  EXPECT_FALSE(cuda::moe_experts_wgmma_fp8_supported(odd.view(), 320, 128));  // hidden not whole 128s
  const Experts mxfp4 = make_experts(WeightFormat::Mxfp4, true, 2, 256, 128, 5);
  EXPECT_FALSE(cuda::moe_experts_wgmma_fp8_supported(mxfp4.view(), 256, 128));
}

TEST_F(CudaMoe, Mxfp4WgmmaExpertsNeedTheirWidths) {
  const Experts tiled = make_experts(WeightFormat::Mxfp4, true, 2, 384, 128, 5);
  EXPECT_FALSE(cuda::moe_experts_wgmma_supported(tiled.view(), 384, 128));  // hidden not a multiple of 256
  const Experts packed = make_experts(WeightFormat::Mxfp4, false, 2, 256, 128, 5);
  EXPECT_FALSE(cuda::moe_experts_wgmma_supported(packed.view(), 256, 128));  // the checkpoint's packing
}

// Tiled MXFP4 with block scales from about 2^-20 to 2^10: the scale codes of a step's four blocks
// differ, each multiplying its own block's partial sums.
TEST_F(CudaMoe, TiledMxfp4TakesBlockScalesOfAnyMagnitude) {
  const int64_t E = 3, hidden = 512, inter = 256;
  const int top_k = 2, n = 3;
  const Experts experts = make_experts(WeightFormat::Mxfp4, true, E, hidden, inter, 31, 15);
  ASSERT_TRUE(cuda::moe_experts_mma_supported(experts.view(), hidden, inter));
  EXPECT_LT(experts_error(experts, random_values(n * hidden, 8, 1.0f), {0, 1, 2, 0, 1, 2}, top_k, true), 2e-3);
}

// Inputs far from 1 (tiny, huge, and one outlier per token) keep their precision through the
// per-token fp16 staging of the tensor-core kernels.
TEST_F(CudaMoe, TensorCoreStagingKeepsInputsOfAnyScale) {
  for (WeightFormat format : {WeightFormat::Mxfp4, WeightFormat::Fp8Block}) {
    const int64_t E = 3, hidden = 256, inter = 128;
    const int top_k = 1, n = 5;
    const Experts experts = make_experts(format, true, E, hidden, inter, 21);
    ASSERT_TRUE(cuda::moe_experts_mma_supported(experts.view(), hidden, inter));
    for (float magnitude : {1e-6f, 1e4f}) {
      auto tokens = random_values(n * hidden, 7, magnitude);
      for (int t = 0; t < n; ++t) tokens[t * hidden + 3 * t] = 300.0f * magnitude;  // outliers
      EXPECT_LT(experts_error(experts, tokens, {0, 1, 2, 0, 1}, top_k, true), 2e-3)
          << "format " << static_cast<int>(format) << ", scale " << magnitude;
    }
  }
}

// MXFP4 packed (widths multiples of 32) and tiled (of 128), and FP8; one expert and a run of
// them in one launch; block scales alike and far apart (2^-15 .. 2^15 a block).
TEST_F(CudaMoe, DequantizedExpertsMatchHostDequantisation) {
  for (const auto& [format, tiled] : {std::pair{WeightFormat::Mxfp4, false}, std::pair{WeightFormat::Mxfp4, true},
                                      std::pair{WeightFormat::Fp8Block, false}}) {
    for (const int spread : {0, 15}) {
      const int64_t E = 3, hidden = tiled ? 384 : 320, inter = tiled ? 256 : 160;
      const Experts experts = make_experts(format, tiled, E, hidden, inter, 5, spread);
      for (const auto& [first, count] : {std::pair{0, 1}, std::pair{2, 1}, std::pair{1, 2}, std::pair{0, 3}}) {
        cuda::DeviceBuffer gate_up(sizeof(uint16_t) * count * 2 * inter * hidden),
            down(sizeof(uint16_t) * count * hidden * inter);
        cuda::dequantize_experts(experts.view(), first, count, hidden, inter, gate_up.as<uint16_t>(),
                                 down.as<uint16_t>(), nullptr);
        const auto got_gate_up = to_host<uint16_t>(gate_up), got_down = to_host<uint16_t>(down);
        std::vector<float> got(got_gate_up.size()),
            want(experts.gate_up.begin() + first * 2 * inter * hidden,
                 experts.gate_up.begin() + (first + count) * 2 * inter * hidden);
        for (size_t i = 0; i < got.size(); ++i) got[i] = bf16_to_f32(got_gate_up[i]);
        // MXFP4 values (two significant bits times a power of two) are exact in bf16.
        const double tolerance = format == WeightFormat::Mxfp4 ? 0.0 : 4e-3;
        const std::string which = " of experts " + std::to_string(first) + " + " + std::to_string(count) +
                                  (tiled ? ", tiled" : "") + ", spread " + std::to_string(spread);
        EXPECT_LE(relative_l2(got, want), tolerance) << "gate_up" << which;
        got.resize(got_down.size());
        for (size_t i = 0; i < got.size(); ++i) got[i] = bf16_to_f32(got_down[i]);
        want.assign(experts.down.begin() + first * hidden * inter,
                    experts.down.begin() + (first + count) * hidden * inter);
        EXPECT_LE(relative_l2(got, want), tolerance) << "down" << which;
      }
    }
  }
}
