// Whether MXFP4 expert weights widened to E5M2 for Hopper's FP8 warpgroup tensor cores stream
// faster than widened to bf16 as the streamed decode kernels do (moe_experts_stream.cu's wgmma
// shapes), at an EP8 rank's batch-64 sizes: 32 experts of --rows x --cols (gate/up 4096 x 6144,
// down 6144 x 2048), --tokens tokens an expert (16 at batch 64); `--experts 7 --tokens 1,2` is a
// batch-1 rank's, for comparison with cuda_fp8_widening's mma.sync kernels at the same shape.
//
// Why not mma.sync: cuda_fp8_widening measured E5M2 codes through mma.m16n8k32 at 1.3-1.7x the
// fp16 kernel's time on an H100, because sm_90 has no FP8 mma.sync: ptxas turns each into
// conversions to fp16 and two fp16 mmas (about ten more instructions an mma; its SASS on sm_89
// has none). wgmma's FP8 forms are native.
//
// Both kernels have one frame: 256 threads, two warpgroups of 64 weight rows, each warp one
// 16-row fragment of the tile layout (quant/mxfp4_tiles.h: lane (g, t) streams 16-byte chunk t
// of rows g and g + 8 every 128-k step, straight into registers 8 steps ahead); a block
// takes --row-tiles tiles of 128 rows of one expert over 2048 k (the k splits sum into the
// output by atomics), with that k range of the expert's tokens copied whole into shared memory
// first, as the lines wgmma reads (128-byte swizzle), staged beforehand on the host. A step's
// wgmmas are committed as a group, and the A registers are double-buffered, so that they run
// while the next step widens. The modes differ in the widening and the wgmma:
//   bf16: the production widening (moe_fragments.cuh's widen_mxfp4_fragments: codes to bf16
//         pairs, the block scale multiplied in) and eight m64nNk16 a step, N the tokens; the
//         tokens staged bf16 in moe_token_order.h's order.
//   fp8:  each word in an FP8 tile layout (below) and four m64nNk32 E5M2 x E4M3 a step, N twice
//         the tokens: every token as two E4M3 terms (value x 2^m = term 0 + term 1, m putting
//         its largest magnitude in [2^7, 2^8); two E4M3 terms hold the 8 significant bits of
//         bf16 where the value is normal) on lines 2j and 2j + 1, so the two sums of a token sit
//         side by side in one lane's accumulators.
//   fp8-promoted: fp8 with each step's four wgmmas into a fresh accumulator, added into the
//         fp32 sums once they land (the FP8 tensor cores keep fewer bits in their own sums, so
//         DeepSeek-V3's kernels promote every 128 k).
// The FP8 widening: a block's scale goes into a table of the 8 E2M1 magnitudes as E5M2 bytes
// (value x 2^(scale - 127 + c), c a bias that keeps every entry normal; two registers: byte m
// of (t0, t1) is magnitude code m), built with two integer multiply-adds from the scale byte,
// and one prmt a register picks four magnitudes by their 3-bit codes; the signs are or-ed in.
// FP8 tile word (codes L0..L7 of the bf16 layout's word: values 8t .. 8t + 7 of a block):
//   magnitude of L_i at bits 4i .. 4i + 2 (nibble i); sign of L_i (i < 4) at bit 8i + 7, of
//   L_i (i >= 4) at bit 8(i - 4) + 3,
// so that `word & 0x77777777` holds the selectors of L0..L3 in its low half and of L4..L7 in its
// high half, and `word & 0x80808080`, `(word << 4) & 0x80808080` the two registers' signs: seven
// instructions a word and three a table, against about twelve a word in bf16. The A registers
// of an m64nNk32: a[0] = row g, k 4t .. 4t + 3 (L0..L3), a[2] = row g, k 16 + 4t .. (L4..L7),
// a[1], a[3] the same for row g + 8; the tokens are staged in that k order.
// Every output is checked against a double product on the host. Prints one line a case; --json
// FILE writes them.
// Usage: cuda_fp8_wgmma_widening [--experts 32] [--rows 4096] [--cols 6144] [--tokens 8,16,32]
//        [--row-tiles 2] [--json FILE]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "micro_cuda.h"
#include "micro_options.h"
#include "mxfp4_reference.h"
#include "ops/cuda/moe_fragments.cuh"
#include "ops/cuda/moe_token_order.h"
#include "ops/cuda/wgmma.cuh"
#include "quant/formats.h"
#include "quant/mxfp4_tiles.h"

namespace {

using glms::benchmarks::check;
using glms::benchmarks::to_device;
using glms::ops::cuda::widen_mxfp4_fragments;
using glms::ops::cuda::word_of;
namespace quant = glms::quant;
namespace wgmma = glms::ops::cuda::wgmma;

constexpr int kThreads = 256, kWarps = kThreads / 32, kTileRows = 16 * kWarps;
constexpr int kSplitSteps = 16;  // 128-k steps a block takes
enum Mode : int { kBf16 = 0, kFp8 = 1, kFp8Promoted = 2 };
// Steps whose codes are in flight: 8, or 4 and 2 where the promoted sums of 32 and 64 lines would
// otherwise spill (it divides kSplitSteps, so that ring slots repeat from tile to tile).
template <int kMode, int kLines>
constexpr int kAhead = kMode != kFp8Promoted || kLines < 32 ? 8 : kLines < 64 ? 4 : 2;
constexpr int64_t kStepChunks = quant::kMxfp4TileStepBytes / 16;
const char* const kModeNames[] = {"bf16", "fp8", "fp8-promoted"};

// E5M2 bytes of the E2M1 magnitudes 0, 0.5, 1, 1.5 and 2, 3, 4, 6 (scale exponent 0).
constexpr uint32_t kTable0 = 0x3e3c3800u, kTable1 = 0x46444240u;

struct Problem {
  const uint4* codes;      // [experts * rows, cols / 2] tiled: the bf16 or the FP8 tile words
  const uint32_t* scales;  // tiled E8M0 scale words
  const uint8_t* staged;   // [experts][cols / 128 steps][step bytes] the mode's token lines
  const float* unscale;    // [experts, tokens] what a token's sums are multiplied by (fp8)
  float* out;              // [experts, tokens, rows], summed over the k splits
  int64_t rows, cols;
  int tokens, row_tiles;
  uint32_t table0, table1;  // the FP8 tables' addends for the scale bias
};

// A step's token lines: bf16 two blocks of 64 k, FP8 one of 128 k, each kLines lines of 128 bytes.
template <int kMode, int kLines>
constexpr int kStepBytes = (kMode == kBf16 ? 2 : 1) * kLines * 128;

// d[64 x N] (+)= A[64 x 32] B[32 x N]: A E5M2 from registers, B E4M3 K-major in shared memory
// (N = 8, 16, 32 or 64).
template <int N>
__device__ __forceinline__ void rs_e5m2_e4m3(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t b, int accumulate) {
#define F4(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
  if constexpr (N == 8) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n8k32.f32.e5m2.e4m3 {%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, p, 1, 1;\n}\n"
        : F4(0)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
  } else if constexpr (N == 16) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k32.f32.e5m2.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7}, "
        "{%8, %9, %10, %11}, %12, p, 1, 1;\n}\n"
        : F4(0), F4(4)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
  } else if constexpr (N == 32) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k32.f32.e5m2.e4m3 " GLMS_WGMMA_D16 ", {%16, %17, %18, %19}, %20, p, 1, 1;\n}\n"
        : F4(0), F4(4), F4(8), F4(12)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
  } else {
    static_assert(N == 64, "N of 8, 16, 32 or 64");
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k32.f32.e5m2.e4m3 " GLMS_WGMMA_D32 ", {%32, %33, %34, %35}, %36, p, 1, 1;\n}\n"
        : F4(0), F4(4), F4(8), F4(12), F4(16), F4(20), F4(24), F4(28)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
  }
#undef F4
}

// One block's FP8 tile word as the E5M2 registers of L0..L3 (`low`) and L4..L7 (`high`), the
// block's E8M0 code `scale` folded in through the table.
__device__ __forceinline__ void widen_fp8_word(uint32_t word, uint32_t scale, const Problem& p, uint32_t& low,
                                               uint32_t& high) {
  const uint32_t t0 = scale * 0x04040400u + p.table0, t1 = scale * 0x04040404u + p.table1;
  const uint32_t selectors = word & 0x77777777u;
  low = __byte_perm(t0, t1, selectors) | (word & 0x80808080u);
  high = __byte_perm(t0, t1, selectors >> 16) | ((word << 4) & 0x80808080u);
}

template <int kMode, int kLines>
__device__ __forceinline__ void store_tile(const Problem& p, int e, int64_t row, const float (&acc)[kLines / 2]) {
  const int t = threadIdx.x % 4;
#pragma unroll
  for (int j = 0; j < kLines / 8; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t r = row + 8 * (i / 2);
      if constexpr (kMode == kBf16) {
        const int token = 8 * j + 2 * t + i % 2;
        if (token < p.tokens) atomicAdd(p.out + (int64_t{e} * p.tokens + token) * p.rows + r, acc[4 * j + i]);
      } else if (i % 2 == 0) {  // columns 2 token + term
        const int token = 4 * j + t;
        if (token < p.tokens)
          atomicAdd(p.out + (int64_t{e} * p.tokens + token) * p.rows + r,
                    (acc[4 * j + i] + acc[4 * j + i + 1]) * p.unscale[e * p.tokens + token]);
      }
    }
}

// The split's token lines (kSplitSteps steps of kStepBytes from `staged`) into shared memory,
// swizzled, as one cp.async group (the caller waits for it once its first codes are on their way).
template <int kBytes>
__device__ __forceinline__ void copy_token_lines(const uint8_t* staged, uint32_t shared_address) {
  for (int i = threadIdx.x; i < kSplitSteps * kBytes / 16; i += kThreads)
    wgmma::copy_async_16(shared_address + wgmma::swizzled(i / 8, i % 8), staged + 16 * i, 16);
  wgmma::copy_async_commit();
}

template <int kMode, int kLines>
__global__ void __launch_bounds__(kThreads, 1) rows_kernel(Problem p) {
  constexpr int kBytes = kStepBytes<kMode, kLines>;
  extern __shared__ __align__(16) uint8_t shared_raw[];
  const wgmma::AlignedShared shared = wgmma::align_to_1024(shared_raw);
  const int e = blockIdx.y, warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
  const int64_t steps = p.cols / 128, first_step = int64_t{blockIdx.z} * kSplitSteps;
  constexpr int kRing = kAhead<kMode, kLines>;
  static_assert(kSplitSteps % kRing == 0 && kLines % 8 == 0, "whole ring turns a split, whole 8-line groups");
  copy_token_lines<kBytes>(p.staged + (int64_t{e} * steps + first_step) * kBytes, shared.address);
  const uint64_t tokens_descriptor = wgmma::descriptor(shared.address, 16, 1024);
  // Row g of this warp's fragment in tile `tile` of the block; row g + 8 is 8 rows x 64 bytes on.
  auto codes_of = [&](int tile) {
    const int64_t row = int64_t{e} * p.rows + (int64_t{blockIdx.x} * p.row_tiles + tile) * kTileRows + 16 * warp + g;
    return p.codes + quant::mxfp4_tile_row_offset(row, p.cols) / 16 + t + first_step * kStepChunks;
  };
  auto scales_of = [&](int tile) {
    const int64_t row = int64_t{e} * p.rows + (int64_t{blockIdx.x} * p.row_tiles + tile) * kTileRows + 16 * warp + g;
    return p.scales + quant::mxfp4_tile_scale_word(row, p.cols) + first_step * quant::kMxfp4TileScaleStepWords;
  };
  uint4 ring_a[kRing], ring_b[kRing];
  uint32_t ring_sa[kRing], ring_sb[kRing];
  auto load = [&](const uint4* codes, const uint32_t* scales, int s, int slot) {
    ring_a[slot] = __ldg(codes + kStepChunks * s);
    ring_b[slot] = __ldg(codes + kStepChunks * s + 32);
    ring_sa[slot] = __ldg(scales + quant::kMxfp4TileScaleStepWords * s);
    ring_sb[slot] = __ldg(scales + quant::kMxfp4TileScaleStepWords * s + 8);
  };
#pragma unroll
  for (int s = 0; s < kRing; ++s) load(codes_of(0), scales_of(0), s, s);
  wgmma::copy_async_wait<0>();
  wgmma::fence_async_proxy();
  __syncthreads();

  constexpr int kFrags = kMode == kBf16 ? 8 : 4;  // wgmmas a step
  uint32_t frag[2][kFrags][4];
  // part: fp8-promoted's sums of a step, written afresh by the step's first wgmma.
  float acc[kLines / 2], part[2][kLines / 2];
#pragma unroll
  for (int i = 0; i < kLines / 2; ++i) part[0][i] = part[1][i] = 0.0f;
  for (int tile = 0; tile < p.row_tiles; ++tile) {
    const uint4* codes = codes_of(tile);
    const uint32_t* scales = scales_of(tile);
    const bool next = tile + 1 < p.row_tiles;
    const uint4* next_codes = codes_of(next ? tile + 1 : tile);
    const uint32_t* next_scales = scales_of(next ? tile + 1 : tile);
#pragma unroll
    for (int i = 0; i < kLines / 2; ++i) acc[i] = 0.0f;
#pragma unroll
    for (int s = 0; s < kSplitSteps; ++s) {
      const int slot = s % kRing, buffer = s % 2;
      const uint4 ca = ring_a[slot], cb = ring_b[slot];
      const uint32_t sa = ring_sa[slot], sb = ring_sb[slot];
      if (s + kRing < kSplitSteps) load(codes, scales, s + kRing, slot);
      else if (next) load(next_codes, next_scales, s + kRing - kSplitSteps, slot);
      const uint64_t step_descriptor = tokens_descriptor + ((s * kBytes) >> 4);
      if constexpr (kMode == kBf16) {
        widen_mxfp4_fragments<true, kFrags>(ca, cb, sa, sb, frag[buffer], 0);
#pragma unroll
        for (int j = 0; j < kFrags; ++j) wgmma::pin(frag[buffer][j]);
        wgmma::fence();
#pragma unroll
        for (int j = 0; j < kFrags; ++j)
          wgmma::rs_m64k16<kLines>(acc, frag[buffer][j], step_descriptor + (((j / 4) * kLines * 128 + (j % 4) * 32) >> 4));
      } else {
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          widen_fp8_word(word_of(ca, w), __byte_perm(sa, 0, 0x4440 + w), p, frag[buffer][w][0], frag[buffer][w][2]);
          widen_fp8_word(word_of(cb, w), __byte_perm(sb, 0, 0x4440 + w), p, frag[buffer][w][1], frag[buffer][w][3]);
          wgmma::pin(frag[buffer][w]);
        }
        wgmma::fence();
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          if constexpr (kMode == kFp8) rs_e5m2_e4m3<kLines>(acc, frag[buffer][w], step_descriptor + ((w * 32) >> 4), 1);
          else rs_e5m2_e4m3<kLines>(part[buffer], frag[buffer][w], step_descriptor + ((w * 32) >> 4), w > 0);
        }
      }
      wgmma::commit();
      wgmma::wait<1>();  // step s - 1's group has landed: its A registers (and partial sums) are free
      if constexpr (kMode == kFp8Promoted) {
        if (s > 0) {
          wgmma::pin(part[1 - buffer]);
#pragma unroll
          for (int i = 0; i < kLines / 2; ++i) acc[i] += part[1 - buffer][i];
        }
      }
    }
    wgmma::wait_all();
    if constexpr (kMode == kFp8Promoted) {
      wgmma::pin(part[(kSplitSteps - 1) % 2]);
#pragma unroll
      for (int i = 0; i < kLines / 2; ++i) acc[i] += part[(kSplitSteps - 1) % 2][i];
    }
    wgmma::pin(acc);
    store_tile<kMode, kLines>(p, e, int64_t{(blockIdx.x * p.row_tiles + tile)} * kTileRows + 16 * warp + g, acc);
  }
}

// ---- host ----

uint8_t nibble(const std::vector<uint8_t>& packed, int64_t row, int64_t cols, int64_t k) {
  const uint8_t byte = packed[row * cols / 2 + k / 2];
  return k % 2 ? byte >> 4 : byte & 15;
}

// The checkpoint-layout codes in the FP8 tile layout (the bf16 tile layout's words, bits as above).
std::vector<uint8_t> fp8_tiles(const glms::benchmarks::Mxfp4Problem& h) {
  const int64_t all_rows = int64_t{h.experts} * h.rows;
  std::vector<uint8_t> tiled(h.packed.size());
  for (int64_t row = 0; row < all_rows; ++row)
    for (int64_t s = 0; s < h.cols / 128; ++s)
      for (int t = 0; t < 4; ++t)
        for (int w = 0; w < 4; ++w) {
          uint32_t word = 0;
          for (int i = 0; i < 8; ++i) {
            const uint32_t code = nibble(h.packed, row, h.cols, 128 * s + 32 * w + 8 * t + i);
            word |= (code & 7u) << (4 * i);
            word |= (code >> 3) << (i < 4 ? 8 * i + 7 : 8 * (i - 4) + 3);
          }
          const int64_t at = quant::mxfp4_tile_row_offset(row, h.cols) + s * quant::kMxfp4TileStepBytes + 16 * t + 4 * w;
          std::memcpy(&tiled[at], &word, 4);
        }
  return tiled;
}

// Where value v (< 32) of an MX block sits in the k order of the FP8 A registers.
int fp8_position(int v) {
  const int t = v / 8, i = v % 8;
  return i < 4 ? 4 * t + i : 16 + 4 * t + i - 4;
}

// The tokens as each mode's lines: [experts][steps][blocks][lines][128 bytes], and each token's
// multiplier of the sums (fp8: 2^-bias / its term multiplier).
std::vector<uint8_t> stage_tokens(const glms::benchmarks::Mxfp4Problem& h, int tokens, int mode, int lines, int bias,
                                  std::vector<float>& unscale) {
  const int64_t steps = h.cols / 128;
  const int64_t step_bytes = (mode == kBf16 ? 2 : 1) * int64_t{lines} * 128;
  std::vector<uint8_t> staged(h.experts * steps * step_bytes, 0);
  unscale.assign(int64_t{h.experts} * tokens, 1.0f);
  for (int e = 0; e < h.experts; ++e)
    for (int j = 0; j < tokens; ++j) {
      const uint16_t* x = &h.x[(int64_t{e} * tokens + j) * h.cols];
      float largest = 0.0f;
      for (int64_t k = 0; k < h.cols; ++k) largest = std::max(largest, std::fabs(glms::benchmarks::bf16_value(x[k])));
      int exponent = 0;
      std::frexp(largest, &exponent);  // largest in [2^(exponent - 1), 2^exponent)
      const float multiplier = largest > 0.0f ? std::ldexp(1.0f, 8 - exponent) : 1.0f;
      if (mode != kBf16) unscale[e * tokens + j] = std::ldexp(1.0f, -bias) / multiplier;
      for (int64_t k = 0; k < h.cols; ++k) {
        uint8_t* step = &staged[(e * steps + k / 128) * step_bytes];
        const int v = static_cast<int>(k % 128);
        if (mode == kBf16) {
          const int at = static_cast<int>(glms::ops::cuda::staged_position(v));
          std::memcpy(step + (at / 64 * lines + j) * 128 + at % 64 * 2, &x[k], 2);
        } else {
          const int at = v / 32 * 32 + fp8_position(v % 32);
          float rest = glms::benchmarks::bf16_value(x[k]) * multiplier;
          for (int term = 0; term < 2; ++term) {
            const uint8_t code = quant::f32_to_minifloat(quant::MiniFloat::E4M3, rest);
            step[(2 * j + term) * 128 + at] = code;
            rest -= quant::minifloat_to_f32(quant::MiniFloat::E4M3, code);
          }
        }
      }
    }
  return staged;
}

using Kernel = void (*)(Problem);

template <int kMode>
Kernel kernel_for(int lines) {
  if (lines == 8) return rows_kernel<kMode, 8>;
  if (lines == 16) return rows_kernel<kMode, 16>;
  if (lines == 32) return rows_kernel<kMode, 32>;
  if constexpr (kMode != kBf16)  // bf16 takes at most 32 tokens a chunk, as the streamed kernels do
    if (lines == 64) return rows_kernel<kMode, 64>;
  return nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  namespace bm = glms::benchmarks;
  bm::Mxfp4Shape shape{32, 4096, 6144, {8, 16, 32}, ""};
  int row_tiles = 2;
  bm::OptionHandlers options = bm::mxfp4_shape_options(shape);
  options["--row-tiles"] = [&](const char* v) { row_tiles = std::atoi(v); };
  if (!bm::parse_options(argc, argv, options)) return 2;
  const int experts = shape.experts;
  const int64_t rows = shape.rows, cols = shape.cols, all_rows = int64_t{experts} * rows;
  if (rows % (kTileRows * row_tiles) != 0 || cols % (128 * kSplitSteps) != 0) {
    std::fprintf(stderr, "rows must be a multiple of %d (--row-tiles x 128), cols of %d\n", kTileRows * row_tiles,
                 128 * kSplitSteps);
    return 2;
  }
  if (!bm::has_cuda_device()) return 77;
  std::mt19937_64 rng(7);
  bm::Mxfp4Problem h = bm::random_mxfp4_rows(experts, rows, cols, rng);
  const std::vector<uint8_t> tiled = bm::tiled_codes(h), tiled_scales = bm::tiled_scales(h);
  // Scale codes 118..122 with bias 10: table exponents 1..5 over 2^-14, every entry normal.
  constexpr int kBias = 10;
  const uint32_t table0 = kTable0 + static_cast<uint32_t>(kBias - 127) * 0x04040400u;
  const uint32_t table1 = kTable1 + static_cast<uint32_t>(kBias - 127) * 0x04040404u;
  uint8_t* codes_bf16 = to_device(tiled);
  uint8_t* codes_fp8 = to_device(fp8_tiles(h));
  const uint32_t* scales = reinterpret_cast<const uint32_t*>(to_device(tiled_scales));
  bm::WideningReport report(shape, static_cast<double>(tiled.size() + tiled_scales.size()), 13,
                            "\"row_tiles\": " + std::to_string(row_tiles) + ", ");
  for (const int tokens : shape.token_counts) {
    bm::random_tokens(h, tokens, rng);
    float* out = nullptr;
    const size_t out_bytes = sizeof(float) * all_rows * tokens;
    check(cudaMalloc(&out, out_bytes), "cudaMalloc");
    for (const int mode : {kBf16, kFp8, kFp8Promoted}) {
      const int lines = (mode == kBf16 ? tokens + 7 : 2 * tokens + 7) / 8 * 8;
      const Kernel kernel = mode == kBf16 ? kernel_for<kBf16>(lines)
                            : mode == kFp8 ? kernel_for<kFp8>(lines)
                                           : kernel_for<kFp8Promoted>(lines);
      if (!kernel) {
        std::printf("%-13s %6d  (no kernel for %d lines)\n", kModeNames[mode], tokens, lines);
        continue;
      }
      std::vector<float> unscale;
      uint8_t* staged = to_device(stage_tokens(h, tokens, mode, lines, kBias, unscale));
      float* unscale_device = to_device(unscale);
      const Problem p{reinterpret_cast<const uint4*>(mode == kBf16 ? codes_bf16 : codes_fp8), scales, staged,
                      unscale_device, out, rows, cols, tokens, row_tiles, table0, table1};
      const size_t shared = static_cast<size_t>(kSplitSteps) * (mode == kBf16 ? 2 : 1) * lines * 128 + 1024;
      check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)),
            "shared memory");
      const dim3 grid(static_cast<unsigned>(rows / (kTileRows * row_tiles)), static_cast<unsigned>(experts),
                      static_cast<unsigned>(cols / (128 * kSplitSteps)));
      // The k splits add into the output: zeroed before each launch.
      const double us = bm::median_time_us([&] { kernel<<<grid, kThreads, shared>>>(p); },
                                           [&] { check(cudaMemset(out, 0, out_bytes), "memset"); });
      std::vector<float> host_out(all_rows * tokens);
      check(cudaMemcpy(host_out.data(), out, out_bytes, cudaMemcpyDeviceToHost), "download");
      report.add(kModeNames[mode], tokens, us, bm::relative_error(h, host_out, tokens, 16));
      check(cudaFree(staged), "cudaFree");
      check(cudaFree(unscale_device), "cudaFree");
    }
    check(cudaFree(out), "cudaFree");
  }
  report.write();
  return 0;
}
