// Tiled MXFP4 experts of decode-sized batches (about 1 to 32 pairs an expert) on tensor cores:
// each warp streams the codes of its weight rows from memory exactly once per step and
// multiplies them against every one of the expert's tokens, which a small kernel staged as
// fp16 in memory beforehand.
//
// Why this shape: at 8 to 32 pairs an expert (a data-parallel rank's decode batch gathered from
// its peers) the kernels of moe_experts_mma.cu either stream each expert's weights once per
// 8-token chunk or stage 64-token slabs into shared memory between barriers, and both reach
// about a fifth of the memory bandwidth on the H200. Here nothing is shared between the warps
// of a block but the tokens' B fragments: a warp holds kFrags mma row fragments (16 weight
// rows each), whose codes and scales each lane copies into shared memory kStages - 1 steps
// ahead (cp.async: shared memory holds the steps in flight, which registers could not), while
// the block copies each step's B values (8 tokens x 128 k per tile of the staged fp16 rows)
// alongside; a warp reads each B fragment once per step for all of its fragments. (Measured
// on the H200 first: B straight from global memory left every step waiting on an L2 round trip,
// and a ring of 2-4 steps of codes in registers reached 1.1-1.5 TB/s at 16 pairs an expert.)
//
// Fragments and the tile layout are those of moe_experts_mma.cu (quant/mxfp4_tiles.h): lane
// 4g + t streams 16-byte chunk 4s + t of rows g and g + 8 of each fragment; word w of the chunk
// holds values 32 (4s + w) + 8t .. + 7, one MX block per w, so a block scale multiplies the
// fp32 partial sums of two mmas. gate/up: a fragment's rows g are gate rows and g + 8 the
// matching up rows, so SwiGLU runs in registers.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>

#include "core/error.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/moe.h"
#include "ops/cuda/moe_fragments.cuh"
#include "ops/cuda/moe_token_order.h"
#include "ops/cuda/wgmma.cuh"
#include "quant/mxfp4_tiles.h"

namespace glms::ops::cuda {

namespace {

constexpr int kStepValues = quant::kMxfp4TileValues;  // 128 values of a row a step
// From a row's step s to s + 1, in 16-byte chunks (the tile layout's 16-row fragments).
constexpr int64_t kTileStepChunks = quant::kMxfp4TileStepBytes / 16;
// A tiled row's first chunk ([*, k] tiled MXFP4 codes).
__device__ __forceinline__ int64_t tile_row_chunks(int64_t row, int64_t k) {
  return quant::mxfp4_tile_row_offset(row, k) / 16;
}
constexpr float kMxfp4Unscale = 16384.0f;             // the fp16 pairs are code x 2^-14
constexpr int kStageThreads = 256;

// staged[p, :] = fp16 pairs of row(p) of src ([*, dim] bf16) times the row's power-of-two
// multiplier, unscale[p] = 2^14 / multiplier, for the grouped pairs p < offsets[num_experts];
// row(p) = sorted_pairs[p] / top_k (token rows) or p (rows already grouped). Block per pair.
__global__ void __launch_bounds__(kStageThreads)
    stage_pairs_kernel(const uint16_t* src, int64_t dim, const int32_t* sorted_pairs, int top_k,
                       const int32_t* offsets, int num_experts, uint32_t* staged, float* unscale) {
  chained_grid_prologue();
  const int p = blockIdx.x;
  if (p >= offsets[num_experts]) return;
  const int64_t row = sorted_pairs ? sorted_pairs[p] / top_k : p;
  const uint4* in = reinterpret_cast<const uint4*>(src + row * dim);
  const int64_t chunks = dim / 8;
  float largest = 0.0f;
  for (int64_t c = threadIdx.x; c < chunks; c += kStageThreads) largest = fmaxf(largest, bf16x8_max_abs(in[c]));
  __shared__ float warp_max[kStageThreads / 32];
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) largest = fmaxf(largest, __shfl_xor_sync(0xffffffffu, largest, d));
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = largest;
  __syncthreads();
  float row_max = 0.0f;
#pragma unroll
  for (int w = 0; w < kStageThreads / 32; ++w) row_max = fmaxf(row_max, warp_max[w]);
  const float multiplier = token_multiplier(__float_as_uint(row_max));
  if (threadIdx.x == 0) unscale[p] = kMxfp4Unscale / multiplier;
  uint4* out = reinterpret_cast<uint4*>(staged + p * (dim / 2));
  for (int64_t c = threadIdx.x; c < chunks; c += kStageThreads) out[c] = bf16x8_to_scaled_fp16(in[c], multiplier);
}

enum class Projection { kGateUp, kDown };

struct StreamArgs {
  const uint32_t* staged = nullptr;  // [pairs, k / 2] fp16 pairs in grouped order
  const float* unscale = nullptr;    // [pairs]
  int64_t k = 0;                     // values a weight row
  const uint8_t* codes = nullptr;    // [E, rows_per_expert, k / 2] tiled MXFP4
  const uint8_t* scales = nullptr;   // [E, rows_per_expert, k / 32] E8M0
  int64_t rows_per_expert = 0;       // 2 inter (gate/up) or hidden (down)
  int64_t outputs = 0;               // inter (gate/up: act columns) or hidden (down)
  MoePlan plan;
  uint16_t* act = nullptr;  // gate/up output [pairs, inter] bf16
  float* out = nullptr;     // down output [pairs, hidden] fp32
};

// The weight rows a warp's fragments cover: gate/up 8 intermediate rows a fragment (gate rows
// and their up rows), down 16 rows.
template <Projection kProj>
constexpr int kOutputsPerFragment = kProj == Projection::kGateUp ? 8 : 16;

// A fragment's two rows for one pair, each row past a.outputs left out: gate/up, act[pair,
// base + g] = bf16(silu(row_a) * row_b) (row a the gate, b the up row of the same index), or with
// kPermutedAct at staged_position(base + g) (moe_token_order.h: the wgmma down kernel then reads
// act as its staged rows); down, out[pair, base + g] = row_a, out[pair, base + 8 + g] = row_b.
template <Projection kProj, bool kPermutedAct = false>
__device__ __forceinline__ void store_pair_rows(const StreamArgs& a, int64_t pair, int64_t base, int g, float row_a,
                                                float row_b) {
  if constexpr (kProj == Projection::kGateUp) {
    const int64_t column = kPermutedAct ? staged_position(base + g) : base + g;
    if (base + g < a.outputs) a.act[pair * a.outputs + column] = float_to_bf16(silu_mul(row_a, row_b));
  } else {
    float* row = a.out + pair * a.outputs;
    if (base + g < a.outputs) row[base + g] = row_a;
    if (base + 8 + g < a.outputs) row[base + 8 + g] = row_b;
  }
}

// global -> shared without passing through registers: 16 bytes (L2 only).
__device__ __forceinline__ void copy_async_16(void* shared, const void* global) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(global));
}
// 4- or 8-byte copy, global to shared (L1 allocating: a row's later scale words share the line).
template <int kBytes>
__device__ __forceinline__ void copy_async_small(void* shared, const void* global) {
  static_assert(kBytes == 4 || kBytes == 8, "4 or 8 bytes");
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(dst), "l"(global), "n"(kBytes));
}
__device__ __forceinline__ void copy_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void copy_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// A step's B values in shared memory: [8 kTiles tokens][16 chunks of 8 fp16 values]. Odd token
// rows have their chunks' bit 2 flipped, so that the two token rows one 8-lane phase of a
// 16-byte load reads (chunks 4w .. 4w + 3 of tokens g, g + 1) fall in different banks.
__device__ __forceinline__ int b_chunk(int token, int chunk) { return token * 16 + (chunk ^ ((token & 1) << 2)); }

// One slot of the ring (a step, 128 values of k), in 16-byte units: the chunk's B values, then
// each warp's codes [warp][fragment][row a, b][lane], then its scale words likewise (4 bytes).
template <int kFrags, int kTiles, int kWarps>
struct Slot {
  static constexpr int kB = kTiles * 8 * 16;
  static constexpr int kCodes = kWarps * kFrags * 2 * 32;
  static constexpr int kScales = kWarps * kFrags * 2 * 32 / 4;
  static constexpr int kUnits = kB + kCodes + kScales;
};

template <int kFrags, int kStages, int kTiles, int kWarps>
constexpr size_t stream_shared_bytes() {
  return sizeof(uint4) * kStages * Slot<kFrags, kTiles, kWarps>::kUnits;
}

// This lane's rows of its warp's fragment from first_output on: a = g, b = g + 8 (gate/up: the
// up row of a's index; rows past the end repeat the last, never written), their first code chunk
// (plus the lane's t) and scale word in expert e.
template <Projection kProj>
__device__ __forceinline__ void lane_rows(const StreamArgs& a, int e, int64_t first_output, int g, int t,
                                          const uint4*& codes_a, const uint4*& codes_b, const uint32_t*& scales_a,
                                          const uint32_t*& scales_b) {
  int64_t ra = min(first_output + g, a.outputs - 1), rb;
  if constexpr (kProj == Projection::kGateUp) rb = ra + a.outputs;
  else rb = min(first_output + 8 + g, a.outputs - 1);
  ra += static_cast<int64_t>(e) * a.rows_per_expert;
  rb += static_cast<int64_t>(e) * a.rows_per_expert;
  codes_a = reinterpret_cast<const uint4*>(a.codes) + tile_row_chunks(ra, a.k) + t;
  codes_b = reinterpret_cast<const uint4*>(a.codes) + tile_row_chunks(rb, a.k) + t;
  scales_a = reinterpret_cast<const uint32_t*>(a.scales) + quant::mxfp4_tile_scale_word(ra, a.k);
  scales_b = reinterpret_cast<const uint32_t*>(a.scales) + quant::mxfp4_tile_scale_word(rb, a.k);
}

// The same for each of a warp's kFrags fragments, kOutputsPerFragment outputs apart.
template <Projection kProj, int kFrags>
__device__ __forceinline__ void lane_fragment_rows(const StreamArgs& a, int e, int64_t first_output, int g, int t,
                                                   const uint4* (&codes)[kFrags][2],
                                                   const uint32_t* (&scales)[kFrags][2]) {
#pragma unroll
  for (int f = 0; f < kFrags; ++f)
    lane_rows<kProj>(a, e, first_output + f * kOutputsPerFragment<kProj>, g, t, codes[f][0], codes[f][1], scales[f][0],
                     scales[f][1]);
}

// This thread's B copies of a chunk of `count` tokens (`tiles` tiles of 8), the same units every
// step: unit i = 16 token + chunk of 8 values (-1 past the chunk's tiles) and step 0's source
// (tokens past `count` repeat the last, never read back).
template <int kCopies, int kWarps>
__device__ __forceinline__ void b_copy_units(const StreamArgs& a, int chunk, int count, int tiles,
                                             const uint32_t* (&source)[kCopies], int (&unit)[kCopies]) {
  const int64_t staged_words = a.k / 2;
#pragma unroll
  for (int n = 0; n < kCopies; ++n) {
    const int i = threadIdx.x + n * kWarps * 32, token = i / 16, c = i % 16;
    unit[n] = i < tiles * 8 * 16 ? b_chunk(token, c) : -1;
    source[n] = a.staged + (chunk + min(token, count - 1)) * staged_words + 4 * c;
  }
}

// One step into `slot`: this lane's codes and scale words (where its warp has rows) and this
// thread's B units, each source then advanced a step.
template <int kFrags, int kTiles, int kWarps, int kCopies>
__device__ __forceinline__ void copy_step(uint4* slot, bool has_rows, int lane_codes, const uint4* (&codes)[kFrags][2],
                                          const uint32_t* (&scales)[kFrags][2], const uint32_t* (&b_source)[kCopies],
                                          const int (&b_unit)[kCopies]) {
  using S = Slot<kFrags, kTiles, kWarps>;
  if (has_rows) {
    uint32_t* slot_scales = reinterpret_cast<uint32_t*>(slot + S::kB + S::kCodes);
#pragma unroll
    for (int f = 0; f < kFrags; ++f)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        copy_async_16(slot + S::kB + lane_codes + (2 * f + r) * 32, codes[f][r]);
        copy_async_small<4>(slot_scales + lane_codes + (2 * f + r) * 32, scales[f][r]);
        codes[f][r] += kTileStepChunks;
        scales[f][r] += quant::kMxfp4TileScaleStepWords;
      }
  }
#pragma unroll
  for (int n = 0; n < kCopies; ++n) {
    if (b_unit[n] >= 0) copy_async_16(slot + b_unit[n], b_source[n]);
    b_source[n] += kStepValues / 2;
  }
}

// This lane's codes and scale words of each fragment's two rows, from a landed slot.
template <int kFrags, int kTiles, int kWarps>
__device__ __forceinline__ void read_lane_codes(const uint4* slot, int lane_codes, uint4 (&codes)[kFrags][2],
                                                uint32_t (&scales)[kFrags][2]) {
  using S = Slot<kFrags, kTiles, kWarps>;
  const uint32_t* slot_scales = reinterpret_cast<const uint32_t*>(slot + S::kB + S::kCodes);
#pragma unroll
  for (int f = 0; f < kFrags; ++f)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      codes[f][r] = slot[S::kB + lane_codes + (2 * f + r) * 32];
      scales[f][r] = slot_scales[lane_codes + (2 * f + r) * 32];
    }
}

// A chunk's sums out, each token's times its unscale: C of fragment f, tile j holds rows g, g + 8
// at tokens 8j + 2t, + 1 (tokens past `count` left out).
template <Projection kProj, int kFrags, int kTiles>
__device__ __forceinline__ void store_chunk(const StreamArgs& a, int64_t first_output, int chunk, int count, int g,
                                            int t, const float (&acc)[kFrags][kTiles][4]) {
#pragma unroll
  for (int f = 0; f < kFrags; ++f) {
    const int64_t base = first_output + f * kOutputsPerFragment<kProj>;
#pragma unroll
    for (int j = 0; j < kTiles; ++j)
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int token = 8 * j + 2 * t + i;
        if (token >= count) continue;
        const int64_t pair = chunk + token;
        const float unscale = __ldg(a.unscale + pair);
        store_pair_rows<kProj>(a, pair, base, g, acc[f][j][i] * unscale, acc[f][j][2 + i] * unscale);
      }
  }
}

// Block (active expert slot, output tile); warp w takes outputs (tile * kWarps + w) *
// kFrags * kOutputsPerFragment onwards; the expert's pairs go in chunks of 8 kTiles tokens.
// Each step is copied into a ring of kStages shared-memory slots kStages - 1 steps ahead
// (cp.async): every lane its own codes and scale words, the block the chunk's B values. A lane
// reads back only the codes it copied, so those need no barrier; B does: one barrier a step,
// which also frees the slot a step refills.
template <Projection kProj, int kFrags, int kStages, int kTiles, int kWarps>
__global__ void __launch_bounds__(kWarps * 32) stream_experts_kernel(StreamArgs a) {
  chained_grid_prologue();
  using S = Slot<kFrags, kTiles, kWarps>;
  extern __shared__ uint4 ring[];  // [kStages][S::kUnits]
  if (static_cast<int>(blockIdx.x) >= *a.plan.num_active) return;
  constexpr int kPerFragment = kOutputsPerFragment<kProj>;
  if (static_cast<int64_t>(blockIdx.y) * kWarps * kFrags * kPerFragment >= a.outputs) return;  // the whole block
  const int e = a.plan.active_experts[blockIdx.x];
  const int begin = a.plan.offsets[e], end = a.plan.offsets[e + 1];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t first_output = (static_cast<int64_t>(blockIdx.y) * kWarps + warp) * kFrags * kPerFragment;
  const bool has_rows = first_output < a.outputs;  // a warp without rows still copies B and waits

  const int64_t steps = a.k / kStepValues;
  const uint4* codes[kFrags][2];
  const uint32_t* scales[kFrags][2];
  lane_fragment_rows<kProj, kFrags>(a, e, first_output, g, t, codes, scales);
  const int lane_codes = warp * kFrags * 2 * 32 + lane;  // + (2f + r) * 32: this lane's unit of (f, r)
  // B reads: token 8j + g's chunk 4w + t sits at unit 16 (8j + g) + t + (4w ^ flip).
  const int b_flip = (g & 1) << 2;
  // B copies: this thread's (token, chunk) units of a step, the same every step.
  constexpr int kCopies = (kTiles * 8 * 16 + kWarps * 32 - 1) / (kWarps * 32);

  for (int chunk = begin; chunk < end; chunk += 8 * kTiles) {
    const int count = min(8 * kTiles, end - chunk), tiles = (count + 7) / 8;
    float acc[kFrags][kTiles][4];
#pragma unroll
    for (int f = 0; f < kFrags; ++f)
#pragma unroll
      for (int j = 0; j < kTiles; ++j) acc[f][j][0] = acc[f][j][1] = acc[f][j][2] = acc[f][j][3] = 0.0f;

    // What the next issue() copies, advanced a step each call: this lane's codes and scale
    // words, and this thread's B units (source of step 0 + a step's stride, slot unit).
    const uint4* next_codes[kFrags][2];
    const uint32_t* next_scales[kFrags][2];
#pragma unroll
    for (int f = 0; f < kFrags; ++f)
#pragma unroll
      for (int r = 0; r < 2; ++r) next_codes[f][r] = codes[f][r], next_scales[f][r] = scales[f][r];
    const uint32_t* b_source[kCopies];
    int b_unit[kCopies];
    b_copy_units<kCopies, kWarps>(a, chunk, count, tiles, b_source, b_unit);
    int issued = 0, issue_slot = 0;  // steps issued; the slot the next one fills
    // The next step into its slot; one commit group a call (empty past the last step).
    auto issue = [&]() {
      if (issued < steps) {
        copy_step<kFrags, kTiles, kWarps, kCopies>(ring + issue_slot * S::kUnits, has_rows, lane_codes, next_codes,
                                                    next_scales, b_source, b_unit);
        ++issued;
        issue_slot = issue_slot + 1 == kStages ? 0 : issue_slot + 1;
      }
      copy_async_commit();
    };
#pragma unroll
    for (int u = 0; u + 1 < kStages; ++u) issue();
    int read_slot = 0;
    for (int64_t s = 0; s < steps; ++s) {
      copy_async_wait<kStages - 2>();  // this thread's copies of step s have landed
      __syncthreads();                 // everyone's have, and step s - 1's slot is free
      issue();
      const uint4* slot = ring + read_slot * S::kUnits;
      read_slot = read_slot + 1 == kStages ? 0 : read_slot + 1;
      if (!has_rows) continue;
      uint4 w_codes[kFrags][2];
      uint32_t w_scales[kFrags][2];
      read_lane_codes<kFrags, kTiles, kWarps>(slot, lane_codes, w_codes, w_scales);
      const uint4* b_lane = slot + 16 * g + t;
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        uint4 xv[kTiles];
#pragma unroll
        for (int j = 0; j < kTiles; ++j)
          if (j < tiles) xv[j] = b_lane[128 * j + ((4 * w) ^ b_flip)];
#pragma unroll
        for (int f = 0; f < kFrags; ++f) {
          const uint32_t qa = word_of(w_codes[f][0], w), qb = word_of(w_codes[f][1], w);
          const uint32_t a0[4] = {quant::mxfp4_tile_pair(qa, 0), quant::mxfp4_tile_pair(qb, 0),
                                  quant::mxfp4_tile_pair(qa, 1), quant::mxfp4_tile_pair(qb, 1)};
          const uint32_t a1[4] = {quant::mxfp4_tile_pair(qa, 2), quant::mxfp4_tile_pair(qb, 2),
                                  quant::mxfp4_tile_pair(qa, 3), quant::mxfp4_tile_pair(qb, 3)};
          const float scale_a = e8m0_byte_scale(w_scales[f][0], w), scale_b = e8m0_byte_scale(w_scales[f][1], w);
#pragma unroll
          for (int j = 0; j < kTiles; ++j) {
            if (j >= tiles) break;
            float part[4];
            mma_f16_zero(part, a0, xv[j].x, xv[j].y);
            mma_f16_add(part, a1, xv[j].z, xv[j].w);
            acc[f][j][0] = fmaf(part[0], scale_a, acc[f][j][0]);
            acc[f][j][1] = fmaf(part[1], scale_a, acc[f][j][1]);
            acc[f][j][2] = fmaf(part[2], scale_b, acc[f][j][2]);
            acc[f][j][3] = fmaf(part[3], scale_b, acc[f][j][3]);
          }
        }
      }
    }
    copy_async_wait<0>();
    __syncthreads();  // the next chunk refills the slots

    if (has_rows) store_chunk<kProj, kFrags, kTiles>(a, first_output, chunk, count, g, t, acc);
  }
}

// ---- The same on warpgroup tensor cores: weights from registers, tokens from shared memory ----
//
// Why: the mma.sync kernel above issues about 420 instructions per warp for each KB of codes (an
// FFMA per block scale and token tile, B fragments loaded per tile), which bounds it at about
// 1.4 TB/s. Here a lane widens its codes once into wgmma's A registers with the block scale
// multiplied in (bf16, exact: an E2M1 value times a power of two), and one wgmma per 16 k
// multiplies them against all of the chunk's tokens, which the tensor cores read from shared
// memory themselves: no scale FMAs, no B loads, one instruction where mma.sync took one per 8
// tokens. A warpgroup's four warps are the M = 64 rows of its wgmma, each warp one fragment of
// 16 weight rows as above (gate rows g and up rows g + 8, or 16 down rows).
//
// wgmma reads B in its stored k order, so the tokens are staged with each 32-value MX block
// permuted to the order in which a lane's widened pairs sit in the A layout
// (stage_pairs_permuted_kernel for the gate/up projection's rows, the gate/up kernel's own stores
// for the down projection's; moe_token_order.h).
//
// Pipeline: a ring of kStages slots each holding kSub steps (128 k each): the chunk's token
// lines (64-k blocks, 128-byte swizzle), each lane's codes and scale words, copied kStages - 1
// slots ahead. Two steps a slot: with the rows one after another that made each row's copy 128
// contiguous bytes, a whole line, where one step read 64 (at 16 pairs an expert 370 us against
// 435 on the H200); the tile layout's 16-row fragments now make each step's rows 512 contiguous
// bytes a warp either way, and one step a slot has not been measured since. A slot's steps are
// committed as groups of their own, so that the first step's wgmmas run while the second step
// widens; a warpgroup waits for its slot's last group before widening the next slot (its A
// registers and ring slot are then free); the other warpgroup and resident blocks fill that
// wait. A chunk's wgmmas are as wide as its pairs rounded up to 8 (multiply_step).

// The wgmma kernels' token rows: staged[p, :] = bf16 pairs of row(p) of src ([*, dim] bf16) with
// each 32-value block's pairs in the A layout's order, for the grouped pairs p <
// offsets[num_experts]; row(p) as stage_pairs_kernel. Block per pair, a thread per 32 values.
__global__ void __launch_bounds__(kStageThreads)
    stage_pairs_permuted_kernel(const uint16_t* src, int64_t dim, const int32_t* sorted_pairs, int top_k,
                                const int32_t* offsets, int num_experts, uint32_t* staged) {
  chained_grid_prologue();
  const int p = blockIdx.x;
  if (p >= offsets[num_experts]) return;
  const int64_t row = sorted_pairs ? sorted_pairs[p] / top_k : p;
  const uint4* in = reinterpret_cast<const uint4*>(src + row * dim);
  uint4* out = reinterpret_cast<uint4*>(staged + p * (dim / 2));
  for (int64_t block = threadIdx.x; block < dim / 32; block += kStageThreads) {
    uint32_t pairs[16], permuted[16];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const uint4 v = in[4 * block + c];
      pairs[4 * c] = v.x, pairs[4 * c + 1] = v.y, pairs[4 * c + 2] = v.z, pairs[4 * c + 3] = v.w;
    }
#pragma unroll
    for (int q = 0; q < 16; ++q) permuted[q] = pairs[staged_source_pair(q)];
#pragma unroll
    for (int c = 0; c < 4; ++c)
      out[4 * block + c] = make_uint4(permuted[4 * c], permuted[4 * c + 1], permuted[4 * c + 2], permuted[4 * c + 3]);
  }
}

// One slot of the wgmma kernels' ring, in bytes: kSub steps (128 k each) of the chunk's token
// lines [2 kSub blocks of 64 k][kTokens lines], then each lane's codes [sub-step][warp][row a,
// b][lane] (16 bytes), then its scale words [warp][row a, b][lane] (4 kSub bytes: the sub-steps'
// words side by side). A multiple of 1024, so every slot's token blocks stay aligned
// for the swizzle.
template <int kTokens, int kWarps, int kSub>
struct WgmmaSlot {
  static constexpr int kTokenBlock = kTokens * wgmma::kLineBytes;
  static constexpr int kCodes = 2 * kSub * kTokenBlock;
  static constexpr int kScales = kCodes + kSub * kWarps * 2 * 32 * 16;
  static constexpr int kBytes = kScales + kWarps * 2 * 32 * 4 * kSub;
  static_assert(kBytes % 1024 == 0, "slots keep the 1024-byte alignment");
};

template <int kStages, int kTokens, int kWarps, int kSub>
constexpr size_t stream_wgmma_shared_bytes() {
  return 1024 + size_t{kStages} * WgmmaSlot<kTokens, kWarps, kSub>::kBytes;  // 1024: alignment
}

// The token lines a chunk of `count` tokens multiplies: count rounded up to wgmma's 8 columns.
__device__ __forceinline__ int chunk_width(int count) { return (count + 7) / 8 * 8; }

// This thread's token copies of a chunk of `count` tokens, the same units every step: unit i =
// 16 line + chunk of 8 values, its offset in a step's swizzled token blocks (-1 past the chunk's
// `width` lines, chunk_width(count), which no wgmma reads) and step 0's source (lines past
// `count` repeat the last, their sums never stored).
template <int kTokens, int kWarps, int kSub, int kCopies>
__device__ __forceinline__ void token_copy_units(const StreamArgs& a, int chunk, int count, int width,
                                                 const uint32_t* (&source)[kCopies], int (&offset)[kCopies]) {
  using S = WgmmaSlot<kTokens, kWarps, kSub>;
  const int64_t staged_words = a.k / 2;
#pragma unroll
  for (int n = 0; n < kCopies; ++n) {
    const int i = threadIdx.x + n * kWarps * 32, line = i / 16, c = i % 16;
    offset[n] = line < width ? (c / 8) * S::kTokenBlock + static_cast<int>(wgmma::swizzled(line, c % 8)) : -1;
    source[n] = a.staged + (chunk + min(line, count - 1)) * staged_words + 4 * c;
  }
}

// A chunk's sums out: acc[4 j + i] is row a (i < 2) or b at token 8 j + 2 t + i % 2 (tokens past
// `count` left out); gate/up's act in the staged rows' order, for the down kernel to read as is.
template <Projection kProj, int kTokens>
__device__ __forceinline__ void store_wgmma_chunk(const StreamArgs& a, int64_t first_output, int chunk, int count, int g,
                                                  int t, const float (&acc)[kTokens / 2]) {
#pragma unroll
  for (int j = 0; j < kTokens / 8; ++j)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int token = 8 * j + 2 * t + i;
      if (token >= count) continue;
      store_pair_rows<kProj, true>(a, chunk + token, first_output, g, acc[4 * j + i], acc[4 * j + 2 + i]);
    }
}

// Sub-step u of a landed slot: this lane's codes of its units (unit_a, unit_b) times their
// blocks' scales (scale words scale_a, scale_b) widened into the A registers of the sub-step's
// eight wgmmas, frag[8 u .. 8 u + 7]: one multiply a pair where every scale code of the warp's
// slot is at most 128 (one_multiply), else two. The choice is made once a slot, not a branch a
// pair, so that ptxas can interleave the widening.
template <int kTokens, int kWarps, int kSub>
__device__ __forceinline__ void widen_wgmma_step(const uint8_t* slot, int unit_a, int unit_b, int u, bool one_multiply,
                                                 uint32_t scale_a, uint32_t scale_b, uint32_t (&frag)[8 * kSub][4]) {
  using S = WgmmaSlot<kTokens, kWarps, kSub>;
  const uint8_t* codes = slot + S::kCodes + u * kWarps * 64 * 16;
  const uint4 codes_a = *reinterpret_cast<const uint4*>(codes + unit_a * 16);
  const uint4 codes_b = *reinterpret_cast<const uint4*>(codes + unit_b * 16);
  if (one_multiply) widen_mxfp4_fragments<true>(codes_a, codes_b, scale_a, scale_b, frag, 8 * u);
  else widen_mxfp4_fragments<false>(codes_a, codes_b, scale_a, scale_b, frag, 8 * u);
}

// Sub-step u's eight wgmmas of a landed slot over the chunk's first `width` token lines (8 to
// kTokens, a multiple of 8; uniform over the block): a chunk of an expert's last few pairs
// multiplies no more columns than it holds, so that the tensor cores' work and the token copies
// (token_copy_units) scale with the pairs, not with kTokens.
template <int kTokens, int kWarps, int kSub>
__device__ __forceinline__ void multiply_step(int width, uint32_t slot, int u, const uint32_t (&frag)[8 * kSub][4],
                                              float (&acc)[kTokens / 2]) {
  using S = WgmmaSlot<kTokens, kWarps, kSub>;
  // Each wgmma's descriptor is one add to the slot's low word: building each from its address
  // took six uniform instructions a wgmma, a sixth of a slot's instructions.
  const uint64_t slot_descriptor = wgmma::descriptor(slot, 16, 1024);
  const uint32_t low = static_cast<uint32_t>(slot_descriptor);
  const uint64_t high = slot_descriptor & 0xffffffff00000000ull;
  auto multiply = [&](auto columns) {
#pragma unroll
    for (int ks = 8 * u; ks < 8 * u + 8; ++ks)
      wgmma::rs_m64k16<decltype(columns)::value>(
          acc, frag[ks], high | (low + (((ks / 4) * S::kTokenBlock + (ks % 4) * 32) >> 4)));
  };
  static_assert(kTokens == 8 || kTokens == 16 || kTokens == 32, "chunks of 8, 16 or 32 tokens");
  using Eight = std::integral_constant<int, 8>;
  using Sixteen = std::integral_constant<int, 16>;
  if constexpr (kTokens == 8) {
    multiply(Eight{});
  } else if constexpr (kTokens == 16) {
    if (width <= 8) multiply(Eight{});
    else multiply(Sixteen{});
  } else {
    if (width <= 8) multiply(Eight{});
    else if (width <= 16) multiply(Sixteen{});
    else if (width <= 24) multiply(std::integral_constant<int, 24>{});
    else multiply(std::integral_constant<int, 32>{});
  }
}

// A landed slot through the tensor cores: each sub-step widened, then its wgmmas issued and
// committed as a group, so that a two-step slot's first wgmmas run while its second step widens
// (the warp then waits for the last group alone; 1-2% at 16 and 31 pairs an expert on an H100).
template <int kTokens, int kWarps, int kSub>
__device__ __forceinline__ void multiply_slot(const uint8_t* slot_generic, uint32_t slot, int unit_a, int unit_b,
                                              int width, uint32_t (&frag)[8 * kSub][4], float (&acc)[kTokens / 2]) {
  using S = WgmmaSlot<kTokens, kWarps, kSub>;
  uint32_t sa[kSub], sb[kSub];
  if constexpr (kSub == 1) {
    sa[0] = *reinterpret_cast<const uint32_t*>(slot_generic + S::kScales + unit_a * 4);
    sb[0] = *reinterpret_cast<const uint32_t*>(slot_generic + S::kScales + unit_b * 4);
  } else {
    const uint2 wa = *reinterpret_cast<const uint2*>(slot_generic + S::kScales + unit_a * 8);
    const uint2 wb = *reinterpret_cast<const uint2*>(slot_generic + S::kScales + unit_b * 8);
    sa[0] = wa.x, sa[1] = wa.y, sb[0] = wb.x, sb[1] = wb.y;
  }
  uint32_t large = 0;
#pragma unroll
  for (int u = 0; u < kSub; ++u) large |= __vcmpgtu4(sa[u], 0x80808080u) | __vcmpgtu4(sb[u], 0x80808080u);
  const bool one_multiply = !__any_sync(0xffffffffu, large != 0);
#pragma unroll
  for (int u = 0; u < kSub; ++u) {
    widen_wgmma_step<kTokens, kWarps, kSub>(slot_generic, unit_a, unit_b, u, one_multiply, sa[u], sb[u], frag);
#pragma unroll
    for (int ks = 8 * u; ks < 8 * u + 8; ++ks) wgmma::pin(frag[ks]);  // written before the fence
    wgmma::fence();
    multiply_step<kTokens, kWarps, kSub>(width, slot, u, frag, acc);
    wgmma::commit();
  }
}

// Block (active expert slot, output tile) as stream_experts_kernel; kWarps / 4 warpgroups, warp
// w of the block the outputs (tile * kWarps + w) * kOutputsPerFragment onwards (rows past the
// end repeat the last and are never written). a.staged holds stage_pairs_permuted_kernel's rows
// (gate/up) or act as the gate/up kernel wrote it (down).
// A slot holds kSub steps (the steps must be a multiple of kSub).
template <Projection kProj, int kStages, int kTokens, int kWarps, int kSub>
__global__ void __launch_bounds__(kWarps * 32, 2) stream_wgmma_kernel(StreamArgs a) {
  chained_grid_prologue();
  static_assert(kStages >= 2 && kWarps % 4 == 0 && (kSub == 1 || kSub == 2), "whole warpgroups, 1 or 2 steps a slot");
  using S = WgmmaSlot<kTokens, kWarps, kSub>;
  extern __shared__ __align__(16) uint8_t shared_raw[];
  if (static_cast<int>(blockIdx.x) >= *a.plan.num_active) return;
  constexpr int kPerFragment = kOutputsPerFragment<kProj>;
  if (static_cast<int64_t>(blockIdx.y) * kWarps * kPerFragment >= a.outputs) return;
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(shared_raw));
  const uint32_t pad = (1024u - (raw & 1023u)) & 1023u;
  const uint32_t ring = raw + pad;
  uint8_t* ring_generic = shared_raw + pad;

  const int e = a.plan.active_experts[blockIdx.x];
  const int begin = a.plan.offsets[e], end = a.plan.offsets[e + 1];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t first_output = (static_cast<int64_t>(blockIdx.y) * kWarps + warp) * kPerFragment;
  const int64_t steps = a.k / kStepValues, slots = steps / kSub;
  const uint4 *codes_a, *codes_b;
  const uint32_t *scales_a, *scales_b;
  lane_rows<kProj>(a, e, first_output, g, t, codes_a, codes_b, scales_a, scales_b);
  const int unit_a = warp * 64 + lane, unit_b = unit_a + 32;  // this lane's code / scale units
  // Token copies: unit i = 16 line + chunk of a step, kTokens lines of 16 chunks.
  constexpr int kCopies = (kTokens * 16 + kWarps * 32 - 1) / (kWarps * 32);

  for (int chunk = begin; chunk < end; chunk += kTokens) {
    const int count = min(kTokens, end - chunk), width = chunk_width(count);
    float acc[kTokens / 2];
#pragma unroll
    for (int i = 0; i < kTokens / 2; ++i) acc[i] = 0.0f;
    const uint4* next_a = codes_a;
    const uint4* next_b = codes_b;
    const uint32_t* next_scale_a = scales_a;
    const uint32_t* next_scale_b = scales_b;
    const uint32_t* token_source[kCopies];
    int token_offset[kCopies];
    token_copy_units<kTokens, kWarps, kSub, kCopies>(a, chunk, count, width, token_source, token_offset);
    int issued = 0, issue_slot = 0;
    auto issue = [&]() {  // the next slot's steps into it; one commit group a call
      if (issued < slots) {
        const uint32_t slot = ring + issue_slot * S::kBytes;
#pragma unroll
        for (int u = 0; u < kSub; ++u) {
          const uint32_t codes = slot + S::kCodes + u * kWarps * 64 * 16;
          wgmma::copy_async_16(codes + unit_a * 16, next_a + u * kTileStepChunks, 16);
          wgmma::copy_async_16(codes + unit_b * 16, next_b + u * kTileStepChunks, 16);
#pragma unroll
          for (int n = 0; n < kCopies; ++n)
            if (token_offset[n] >= 0)
              wgmma::copy_async_16(slot + 2 * u * S::kTokenBlock + token_offset[n], token_source[n] + u * kStepValues / 2, 16);
        }
        uint8_t* scales = ring_generic + issue_slot * S::kBytes + S::kScales;
#pragma unroll
        for (int u = 0; u < kSub; ++u) {  // a row's scale words of consecutive steps are 64 bytes apart
          copy_async_small<4>(scales + (unit_a * kSub + u) * 4, next_scale_a + u * quant::kMxfp4TileScaleStepWords);
          copy_async_small<4>(scales + (unit_b * kSub + u) * 4, next_scale_b + u * quant::kMxfp4TileScaleStepWords);
        }
        next_a += kSub * kTileStepChunks, next_b += kSub * kTileStepChunks;
        next_scale_a += kSub * quant::kMxfp4TileScaleStepWords, next_scale_b += kSub * quant::kMxfp4TileScaleStepWords;
#pragma unroll
        for (int n = 0; n < kCopies; ++n) token_source[n] += kSub * kStepValues / 2;
        ++issued;
        issue_slot = issue_slot + 1 == kStages ? 0 : issue_slot + 1;
      }
      wgmma::copy_async_commit();
    };
#pragma unroll
    for (int u = 0; u + 1 < kStages; ++u) issue();

    int read_slot = 0;
    uint32_t frag[8 * kSub][4];  // A registers of the slot's wgmmas (16 k each)
    for (int64_t s = 0; s < slots; ++s) {
      // Slot s has landed; every warp has finished slot s - 1 (its wgmmas included), so that
      // ring position takes slot s + kStages - 1.
      wgmma::copy_async_wait<kStages - 2>();
      wgmma::fence_async_proxy();
      __syncthreads();
      issue();
      const uint32_t slot = ring + read_slot * S::kBytes;
      const uint8_t* slot_generic = ring_generic + read_slot * S::kBytes;
      read_slot = read_slot + 1 == kStages ? 0 : read_slot + 1;
      multiply_slot<kTokens, kWarps, kSub>(slot_generic, slot, unit_a, unit_b, width, frag, acc);
      wgmma::wait_all();
    }
    wgmma::pin(acc);
    wgmma::copy_async_wait<0>();
    __syncthreads();  // the next chunk refills the slots

    store_wgmma_chunk<kProj, kTokens>(a, first_output, chunk, count, g, t, acc);
  }
}

// A grid of (max_active experts, output tiles of outputs_per_block) blocks of `threads`.
void launch_over_outputs(void (*kernel)(StreamArgs), const StreamArgs& args, int max_active, int64_t outputs_per_block,
                         int threads, size_t shared, cudaStream_t stream) {
  const dim3 grid(max_active, static_cast<unsigned>((args.outputs + outputs_per_block - 1) / outputs_per_block));
  // Per device (each rank's thread has its own), so set on every launch: a host call of a microsecond.
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)),
        "stream_experts shared memory");
  launch_chained("stream_experts launch", kernel, grid, threads, shared, stream, args);
}

template <Projection kProj, int kStages, int kTokens, int kWarps, int kSub>
void launch_stream_wgmma(const StreamArgs& args, int max_active, cudaStream_t stream) {
  constexpr size_t kShared = stream_wgmma_shared_bytes<kStages, kTokens, kWarps, kSub>();
  static_assert(kShared <= 227 * 1024, "one block an SM at least");
  launch_over_outputs(stream_wgmma_kernel<kProj, kStages, kTokens, kWarps, kSub>, args, max_active,
                      int64_t{kWarps} * kOutputsPerFragment<kProj>, kWarps * 32, kShared, stream);
}

template <Projection kProj, int kStages, int kTokens, int kWarps, int kSub>
void launch_stream_wgmma_steps(const StreamArgs& args, int max_active, cudaStream_t stream) {
  // Two steps a slot need an even step count; odd ones take the same ring a step a slot.
  if (kSub == 2 && (args.k / kStepValues) % 2 != 0)
    launch_stream_wgmma<kProj, kStages, kTokens, kWarps, 1>(args, max_active, stream);
  else
    launch_stream_wgmma<kProj, kStages, kTokens, kWarps, kSub>(args, max_active, stream);
}

// Tokens a chunk (8, 16 or 32) by the chunk the batch's pairs per expert call for. (64 measured
// slower than two chunks of 32 at 31 pairs an expert: 648 against 583 us.)
template <Projection kProj, int kStages, int kWarps, int kSub>
void launch_wgmma_for_tokens(const StreamArgs& args, int chunk_tokens, int max_active, cudaStream_t stream) {
  if (chunk_tokens <= 8) launch_stream_wgmma_steps<kProj, kStages, 8, kWarps, kSub>(args, max_active, stream);
  else if (chunk_tokens <= 16) launch_stream_wgmma_steps<kProj, kStages, 16, kWarps, kSub>(args, max_active, stream);
  else launch_stream_wgmma_steps<kProj, kStages, 32, kWarps, kSub>(args, max_active, stream);
}

template <Projection kProj, int kFrags, int kStages, int kTiles, int kWarps>
void launch_stream(const StreamArgs& args, int max_active, cudaStream_t stream) {
  constexpr size_t kShared = stream_shared_bytes<kFrags, kStages, kTiles, kWarps>();
  static_assert(kShared <= 227 * 1024, "one block an SM at least");
  launch_over_outputs(stream_experts_kernel<kProj, kFrags, kStages, kTiles, kWarps>, args, max_active,
                      int64_t{kWarps} * kFrags * kOutputsPerFragment<kProj>, kWarps * 32, kShared, stream);
}

// kTiles by the chunk the batch's pairs per expert call for.
template <Projection kProj, int kFrags, int kStages, int kWarps>
void launch_for_tokens(const StreamArgs& args, int chunk_tokens, int max_active, cudaStream_t stream) {
  if (chunk_tokens <= 8) launch_stream<kProj, kFrags, kStages, 1, kWarps>(args, max_active, stream);
  else if (chunk_tokens <= 16) launch_stream<kProj, kFrags, kStages, 2, kWarps>(args, max_active, stream);
  else launch_stream<kProj, kFrags, kStages, 4, kWarps>(args, max_active, stream);
}

template <Projection kProj>
void launch_shape(const StreamArgs& args, MoeStreamShape shape, int chunk_tokens, int max_active,
                  cudaStream_t stream) {
  switch (shape) {
    case MoeStreamShape::kFrags1Stages8: return launch_for_tokens<kProj, 1, 8, 4>(args, chunk_tokens, max_active, stream);
    case MoeStreamShape::kFrags2Stages6: return launch_for_tokens<kProj, 2, 6, 4>(args, chunk_tokens, max_active, stream);
    case MoeStreamShape::kFrags1Stages6Warps8:
      return launch_for_tokens<kProj, 1, 6, 8>(args, chunk_tokens, max_active, stream);
    case MoeStreamShape::kWgmmaStages6Warps8:
      return launch_wgmma_for_tokens<kProj, 6, 8, 1>(args, chunk_tokens, max_active, stream);
    case MoeStreamShape::kWgmmaPairsStages3Warps8:
      return launch_wgmma_for_tokens<kProj, 3, 8, 2>(args, chunk_tokens, max_active, stream);
  }
}

}  // namespace

void moe_stage_pairs_permuted(const uint16_t* src, int64_t dim, const int32_t* sorted_pairs, int top_k,
                              const MoePlan& plan, int num_experts, int64_t num_pairs, uint32_t* staged,
                              cudaStream_t stream) {
  if (num_pairs <= 0) return;
  GLMS_CHECK(dim % 32 == 0, "moe_stage_pairs_permuted: rows of whole 32-value blocks");
  launch_chained("stage_pairs_permuted launch", stage_pairs_permuted_kernel, static_cast<unsigned>(num_pairs),
                 kStageThreads, 0, stream, src, dim, sorted_pairs, top_k, plan.offsets, num_experts, staged);
}

bool moe_experts_stream_supported(const ExpertWeights& experts, int64_t hidden, int64_t inter) {
  return experts.format == WeightFormat::Mxfp4 && experts.mxfp4_tiled && quant::mxfp4_tiles_fit(hidden) &&
         quant::mxfp4_tiles_fit(inter);
}

void moe_experts_stream(const uint16_t* x, int64_t hidden, int64_t inter, const ExpertWeights& experts,
                        const MoePlan& plan, int num_experts, int top_k, int64_t num_pairs, int chunk_tokens,
                        int max_active, const MoeStreamBuffers& buffers, uint16_t* act, float* expert_out,
                        cudaStream_t stream, MoeStreamShape shape) {
  if (max_active <= 0 || num_pairs <= 0) return;
  GLMS_CHECK(moe_experts_stream_supported(experts, hidden, inter),
             "moe_experts_stream: tiled MXFP4 experts with widths multiples of 128");
  const unsigned stage_blocks = static_cast<unsigned>(num_pairs);
  const bool wgmma = shape >= MoeStreamShape::kWgmmaStages6Warps8;
  // The token rows as the kernels read them: fp16 with a power-of-two scale each (mma.sync) or
  // bf16 in the wgmma A layout's k order.
  auto stage = [&](const uint16_t* src, int64_t dim, const int32_t* sorted_pairs, int pair_top_k) {
    if (wgmma)
      moe_stage_pairs_permuted(src, dim, sorted_pairs, pair_top_k, plan, num_experts, num_pairs, buffers.staged,
                               stream);
    else
      launch_chained("stage_pairs launch", stage_pairs_kernel, stage_blocks, kStageThreads, 0, stream, src, dim,
                     sorted_pairs, pair_top_k, plan.offsets, num_experts, buffers.staged, buffers.unscale);
  };
  StreamArgs args;
  args.plan = plan;
  args.staged = buffers.staged;
  args.unscale = buffers.unscale;

  stage(x, hidden, plan.sorted_pairs, top_k);
  args.k = hidden;
  args.codes = static_cast<const uint8_t*>(experts.gate_up);
  args.scales = static_cast<const uint8_t*>(experts.gate_up_scales);
  args.rows_per_expert = 2 * inter;
  args.outputs = inter;
  args.act = act;
  launch_shape<Projection::kGateUp>(args, shape, chunk_tokens, max_active, stream);

  // The wgmma gate/up kernels wrote act in the staged rows' order already.
  if (wgmma) args.staged = reinterpret_cast<const uint32_t*>(act);
  else stage(act, inter, nullptr, 1);
  args.k = inter;
  args.codes = static_cast<const uint8_t*>(experts.down);
  args.scales = static_cast<const uint8_t*>(experts.down_scales);
  args.rows_per_expert = hidden;
  args.outputs = hidden;
  args.act = nullptr;
  args.out = expert_out;
  launch_shape<Projection::kDown>(args, shape, chunk_tokens, max_active, stream);
}

}  // namespace glms::ops::cuda
