// The pieces the grouped expert GEMMs on wgmma share (moe_experts_wgmma.cu: bf16 and W4A16;
// moe_experts_wgmma_fp8.cu: W8A8; moe_experts_specialized.cu: bf16, warp-specialised): a block
// takes a tile of one expert's grouped rows (found from the plan's offsets on the device) and a
// slice of its output features; the two-warpgroup kernels' accumulators end in the SwiGLU
// (gate/up) or fp32 (down) epilogue below.
#pragma once

#include <cuda.h>  // CUtensorMap
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>  // offsetof
#include <cstdint>
#include <string>
#include <type_traits>

#include "core/error.h"

#include "ops/cuda/cuda_ops.h"  // multiprocessor_count
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/moe.h"
#include "ops/cuda/moe_tiles.h"
#include "ops/cuda/pipeline.cuh"
#include "ops/cuda/wgmma.cuh"
#include "quant/mxfp4_tiles.h"

namespace glms::ops::cuda::moe_grouped {

constexpr int kThreads = 256;  // two warpgroups

enum class Projection { kGateUp, kDown };

// The expert weights a kernel reads: tiled MXFP4 codes widened to bf16 in shared memory (W4A16),
// or bf16 rows copied as they are.
enum class WeightSource { kMxfp4, kBf16 };

// Word `q` of a tiled MXFP4 group (quant/mxfp4_tiles.h: eight values of one MX block) times its
// block scale 2^(scale_code - 127), as eight bf16 values (16 bytes) in order. Exact: an E2M1
// value times a power of two. mxfp4_tile_pair_bf16 gives the values times 2^-126; kOneMultiply
// (every scale code of the warp at most 128) multiplies by 2^(code - 1) in one step, which is a
// bf16 for those codes; larger codes take 2^126 and the scale in two.
template <bool kOneMultiply>
__device__ __forceinline__ uint4 widen_mxfp4_word(uint32_t q, uint32_t scale_code) {
  const __nv_bfloat162 two_to_126 = __halves2bfloat162(__ushort_as_bfloat16(0x7e80), __ushort_as_bfloat16(0x7e80));
  const uint32_t field = kOneMultiply ? scale_code + 126 : scale_code;  // bf16 exponent field
  const uint32_t scale_bits = field << 7 | field << 23;
  const __nv_bfloat162 scale = *reinterpret_cast<const __nv_bfloat162*>(&scale_bits);
  uint32_t pairs[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint32_t bits = quant::mxfp4_tile_pair_bf16(q, k);
    const __nv_bfloat162 codes_times_2_to_minus_126 = *reinterpret_cast<const __nv_bfloat162*>(&bits);
    const __nv_bfloat162 v = kOneMultiply ? __hmul2(codes_times_2_to_minus_126, scale)
                                          : __hmul2(__hmul2(codes_times_2_to_minus_126, two_to_126), scale);
    pairs[k] = *reinterpret_cast<const uint32_t*>(&v);
  }
  return make_uint4(pairs[0], pairs[1], pairs[2], pairs[3]);
}

// Bit 7 of each byte of `scale_codes` set where that code is above 128 (widen_mxfp4_word<true>
// is for codes up to 128): the byte's bit 7 and a low bit (code & 0x7f, plus 0x7f, reaches bit 7
// without carrying into the next byte).
__device__ __forceinline__ uint32_t scale_codes_above_128(uint32_t scale_codes) {
  return scale_codes & ((scale_codes & 0x7f7f7f7fu) + 0x7f7f7f7fu) & 0x80808080u;
}

// Whether a warp may take widen_mxfp4_word<true> for the four scale codes of `scale_codes`
// in every lane (all lanes call it).
__device__ __forceinline__ bool warp_scales_one_multiply(uint32_t scale_codes) {
  return !__any_sync(0xffffffffu, scale_codes_above_128(scale_codes) != 0);
}

// Where a tile's accumulators sit, each warpgroup a 64 x 128 wgmma accumulator:
//   64 rows:  x 256 features, warpgroup w the features 128 w ..; for gate/up warpgroup 0 takes
//     128 gate rows and warpgroup 1 the matching up rows, which hands its sums to warpgroup 0
//     through shared memory at the end.
//   128 rows: x 128 features, warpgroup w the rows 64 w ..; for gate/up the features are 64 gate
//     rows and the matching 64 up rows, so each thread holds both.
template <int kRows>
struct TileLayout {
  static_assert(kRows == 64 || kRows == 128, "64 or 128 rows a tile");
  static constexpr int kFeatures = kRows == 64 ? 256 : 128;  // weight rows (lines) a block
  static constexpr int kGroupRow0 = kRows == 64 ? 0 : 64;     // warpgroup w's first row: w times this
  static constexpr int kGroupLine0 = kRows == 64 ? 128 : 0;   // warpgroup w's first weight line
};

struct GroupedArgs {
  // kGateUp: token rows [n, k] read as x[sorted_pairs[p] / top_k]; kDown: act [pairs, k] by p.
  const uint16_t* x = nullptr;
  const int32_t* sorted_pairs = nullptr;
  int top_k = 1;
  const int32_t* offsets = nullptr;  // [num_experts + 1]: expert e's grouped rows
  int num_experts = 0;
  const uint8_t* codes = nullptr;   // MXFP4: [E, rows_per_expert, k / 2] tiled; FP8: [E, rows_per_expert, k]
  const uint8_t* scales = nullptr;  // MXFP4: [E, rows_per_expert, k / 32] E8M0
  const uint16_t* weights = nullptr;  // bf16: [E, rows_per_expert, k]
  // FP8 (W8A8): the token rows as E4M3 codes (indexed as x) with one fp32 scale a row and 128
  // columns, block b's at x_scales[b * x_scale_stride + row] (ops::cuda::quantize_fp8_rows); the
  // weights' E4M3 codes in `codes`, row r of the stacked weights with its block scales at
  // weight_scales[r * k / 128 ..].
  const uint8_t* x_codes = nullptr;
  const float* x_scales = nullptr;
  int64_t x_scale_stride = 0;
  const float* weight_scales = nullptr;
  int64_t k = 0, rows_per_expert = 0;
  int slices = 1;             // output slices a row tile (moe_experts_specialized's one-dimensional grid)
  int64_t inter = 0;          // kGateUp: the up rows start here; act is [pairs, inter]
  uint16_t* act = nullptr;    // kGateUp output, bf16
  // kGateUp of the W8A8 256-line tiles (whose 128 act columns a slice are one scale block): when
  // set, act leaves as E4M3 codes [pairs, inter] with scales [inter / 128][act_scale_stride], as
  // quantize_fp8_rows makes them from the bf16 act, instead of as bf16 (act is then unwritten).
  uint8_t* act_codes = nullptr;
  float* act_scales = nullptr;
  int64_t act_scale_stride = 0;
  float* out = nullptr;       // kDown output [pairs, rows_per_expert] fp32, or
  uint16_t* out_bf16 = nullptr;  // bf16 (ExpertSums: one of the two is set)
};

// The arguments both projections share: the plan's grouping and the outputs.
inline GroupedArgs grouped_args(const MoePlan& plan, int num_experts, int top_k, int64_t inter, uint16_t* act,
                                ExpertSums out) {
  GroupedArgs a;
  a.sorted_pairs = plan.sorted_pairs;
  a.top_k = top_k;
  a.offsets = plan.offsets;
  a.num_experts = num_experts;
  a.inter = inter;
  a.act = act;
  a.out = out.f32;
  a.out_bf16 = out.bf16;
  return a;
}

// `a` set for the gate/up projection of `experts` over the token rows x ([*, hidden]): its weights
// (bf16 rows, or MXFP4 codes and scales), K and rows per expert.
inline GroupedArgs gate_up_projection(GroupedArgs a, const uint16_t* x, const ExpertWeights& experts, int64_t hidden,
                                      int64_t inter) {
  a.x = x;
  a.weights = static_cast<const uint16_t*>(experts.gate_up);
  a.codes = static_cast<const uint8_t*>(experts.gate_up);
  a.scales = static_cast<const uint8_t*>(experts.gate_up_scales);
  a.k = hidden;
  a.rows_per_expert = 2 * inter;
  return a;
}

// The same for the down projection over a.act ([pairs, inter]).
inline GroupedArgs down_projection(GroupedArgs a, const ExpertWeights& experts, int64_t hidden, int64_t inter) {
  a.x = a.act;
  a.weights = static_cast<const uint16_t*>(experts.down);
  a.codes = static_cast<const uint8_t*>(experts.down);
  a.scales = static_cast<const uint8_t*>(experts.down_scales);
  a.k = inter;
  a.rows_per_expert = hidden;
  return a;
}

// The weight row of expert e that line `line` of a block's kFeatures lines is, the block's
// output slice `slice` (blockIdx.x unless given): gate/up, the first half the gate rows f0 + line
// and the second the up rows inter + f0 + line - half, f0 = slice * half; down, rows slice *
// kFeatures + line. Rows of the stacked [E, rows_per_expert, k] weights.
template <Projection P, int kFeatures>
__device__ __forceinline__ int64_t weight_row(const GroupedArgs& a, int e, int line, int64_t slice) {
  constexpr int kHalf = kFeatures / 2;
  const int64_t row = P == Projection::kGateUp ? (line < kHalf ? 0 : a.inter - kHalf) + slice * kHalf + line
                                               : slice * kFeatures + line;
  return int64_t{e} * a.rows_per_expert + row;
}
template <Projection P, int kFeatures>
__device__ __forceinline__ int64_t weight_row(const GroupedArgs& a, int e, int line) {
  return weight_row<P, kFeatures>(a, e, line, int64_t{blockIdx.x});
}

// Which weight line of a 256-line slice (weight_row<P, 256>'s `line`) stage line `stage_line`
// holds where a kernel stages the slice as four 64-line boxes: gate/up, box b = stage_line / 64
// is the gate rows of the slice's features 64 (b / 2) .. for even b and their up rows for odd b
// (so that each 128-line half holds whole features); down, the same line.
template <Projection P>
__device__ __forceinline__ int slice_line_of(int stage_line) {
  if constexpr (P == Projection::kDown) return stage_line;
  const int box = stage_line / 64;
  return box % 2 * 128 + 64 * (box / 2) + stage_line % 64;
}

// The warp-specialised kernels' token rows of a 128-row tile: producer thread `index` (of 128)
// copies 16-byte chunk index % 8 of the tile's rows index / 8 + 16 i by cp.async (rows past the
// tile's are skipped). Element: uint16_t, the bf16 rows of a.x; uint8_t, the E4M3 codes of
// a.x_codes.
template <Projection P, typename Element>
struct TokenCopies {
  static constexpr int kRows = 128, kThreads = 128;
  static constexpr int kCopies = kRows * 8 / kThreads, kRowStride = kThreads / 8;
  static constexpr int kPerChunk = 16 / static_cast<int>(sizeof(Element));  // elements a 16-byte chunk
  uint32_t at[kCopies];  // in 16-byte units: under 2^32 for any launch (checked on the host)
  uint32_t valid = 0;
  int line0, chunk;

  // The source row of the tile's row r (a token's for gate/up, a grouped pair's for down), -1
  // past the tile's rows.
  static __device__ __forceinline__ int32_t source_row(const GroupedArgs& a, int first, int rows, int r) {
    return r >= rows ? -1 : P == Projection::kGateUp ? a.sorted_pairs[first + r] / a.top_k : first + r;
  }
  __device__ __forceinline__ TokenCopies(const GroupedArgs& a, int index, int first, int rows)
      : line0(index / 8), chunk(index % 8) {
#pragma unroll
    for (int i = 0; i < kCopies; ++i) {
      const int32_t source = source_row(a, first, rows, line0 + kRowStride * i);
      at[i] = static_cast<uint32_t>(((source < 0 ? 0 : source * a.k) + kPerChunk * chunk) / kPerChunk);
      valid |= source < 0 ? 0u : 1u << i;
    }
  }
  // The step whose columns start at `offset` into the stage's token lines at `tokens`.
  __device__ __forceinline__ void copy(const GroupedArgs& a, uint32_t tokens, int64_t offset) const {
    const Element* rows_from;
    if constexpr (std::is_same<Element, uint8_t>::value) rows_from = a.x_codes;
    else rows_from = a.x;
#pragma unroll
    for (int i = 0; i < kCopies; ++i)
      if (valid >> i & 1)
        wgmma::copy_async_16(tokens + wgmma::swizzled(line0 + kRowStride * i, chunk),
                             rows_from + kPerChunk * int64_t{at[i]} + offset, 16);
  }
};

// A stage's 256 weight lines by TMA, four 64-line boxes of 128-byte lines (stage lines 64 b ..;
// box_row(b): the stacked weights' row of box b's first line), once the stage's empty barrier
// has passed `parity` (kPaired: at cluster scope): the producer's thread `index` 0 announces their
// bytes on the stage's full barrier and issues them. kPaired: this block's two boxes into both
// blocks of the pair (`rank`: this block's in it), or (`half` >= 0, an odd last tile) the two
// boxes of that half of the lines into this block alone. more_bytes: what the caller's own
// tensor copies into the stage bring, announced with the weights' (its thread 0 issues them).
template <bool kPaired, int kPairBlocks, typename BoxRow>
__device__ __forceinline__ void copy_weight_boxes(uint32_t weights, const CUtensorMap& map, int64_t offset,
                                                  BoxRow box_row, uint32_t full, uint32_t empty, uint32_t parity,
                                                  int index, int rank, int half, uint32_t more_bytes = 0) {
  constexpr int kBoxBytes = 64 * wgmma::kLineBytes, kBytes = 4 * kBoxBytes;
  if constexpr (kPaired) {
    pipeline::barrier_wait_cluster(empty, parity);
    if (index == 0) {
      const bool whole = half < 0;
      pipeline::barrier_arrive_expect_bytes(full, (whole ? kBytes : kBytes / 2) + more_bytes);
      const int box0 = 2 * (whole ? rank : half);
      for (int box = box0; box < box0 + 2; ++box)
        pipeline::tensor_copy_2d_multicast(weights + (whole ? box : box - box0) * kBoxBytes, &map,
                                           static_cast<int>(offset), box_row(box), full,
                                           whole ? (1u << kPairBlocks) - 1 : 1u << rank);
    }
  } else {
    pipeline::barrier_wait(empty, parity);
    if (index == 0) {
      pipeline::barrier_arrive_expect_bytes(full, kBytes + more_bytes);
      for (int box = 0; box < 4; ++box)
        pipeline::tensor_copy_2d(weights + box * kBoxBytes, &map, static_cast<int>(offset), box_row(box), full);
    }
  }
}

// A block's work: rows [first, first + rows) of the grouped pairs, all of expert `expert` (-1:
// none, past the last unit), and its output slice; half = -1, or (an odd last tile of kPairs)
// the half of the slice's weight lines it takes.
struct RowTile {
  int expert, first, rows, slice, half = -1;
};

using moe_tiles::TileSet;

// A thread's share of the experts, split in order over the block's kBlockThreads threads: its
// experts [e0, e1), their units (units_of(e) each) and the units of every expert before them (a
// scan over the block). Every thread of the block calls it; it synchronises the block.
struct ThreadExperts {
  int e0, e1, units, first_unit;
};
template <int kBlockThreads, typename UnitsOf>
__device__ __forceinline__ ThreadExperts thread_experts(int num_experts, UnitsOf units_of) {
  __shared__ int warp_sums[kBlockThreads / 32];
  const int per = (num_experts + kBlockThreads - 1) / kBlockThreads;
  ThreadExperts t;
  t.e0 = min(num_experts, static_cast<int>(threadIdx.x) * per);
  t.e1 = min(num_experts, t.e0 + per);
  t.units = 0;
  for (int e = t.e0; e < t.e1; ++e) t.units += units_of(e);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int inclusive = t.units;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const int v = __shfl_up_sync(0xffffffffu, inclusive, d);
    if (lane >= d) inclusive += v;
  }
  if (lane == 31) warp_sums[warp] = inclusive;
  __syncthreads();
  t.first_unit = inclusive - t.units;
  for (int w = 0; w < warp; ++w) t.first_unit += warp_sums[w];
  return t;
}

// Unit `unit` of the experts' units, the experts in order, expert e having u(e) = (its units of
// `set`) x `slices`: unit i of expert e is that set's unit i % u0(e) of slice i / u0(e). `rank`:
// the block's rank in its cluster (kPairs). Every thread of the block (kBlockThreads of them)
// calls it; it synchronises the block.
template <int kRows, int kBlockThreads, TileSet kSet = TileSet::kEvery>
__device__ RowTile unit_of_block(const int32_t* offsets, int num_experts, int unit, int slices, int rank = 0) {
  __shared__ int tile_expert, tile_first, tile_slice, tile_half;
  auto tiles_of = [&](int e) { return moe_tiles::tiles_of(offsets[e + 1] - offsets[e], kRows); };
  if (threadIdx.x == 0) tile_expert = -1;
  const ThreadExperts mine = thread_experts<kBlockThreads>(
      num_experts, [&](int e) { return moe_tiles::units_of(kSet, tiles_of(e)) * slices; });
  const int e0 = mine.e0, e1 = mine.e1, start = mine.first_unit;
  if (unit >= start && unit < start + mine.units) {
    int left = unit - start;
    for (int e = e0; e < e1; ++e) {
      const int tiles = tiles_of(e), units = moe_tiles::units_of(kSet, tiles);
      if (left < units * slices) {
        tile_expert = e;
        tile_first = offsets[e] + moe_tiles::tile_of(kSet, tiles, left % units, rank) * kRows;
        tile_slice = left / units;
        tile_half = moe_tiles::splits_lines(kSet, tiles, left % units) ? rank : -1;
        break;
      }
      left -= units * slices;
    }
  }
  __syncthreads();
  if (tile_expert < 0) return {-1, 0, 0, 0};
  return {tile_expert, tile_first, min(kRows, offsets[tile_expert + 1] - tile_first), tile_slice, tile_half};
}

// For kernels whose blocks take many units (persistent): every expert's first unit of the
// kEvery set in unit_of_block's numbering (expert e has tiles(e) x slices units, the experts in
// order) into first_unit[0 .. num_experts], first_unit[num_experts] being the units in all (in
// shared memory). Every thread of the block (kBlockThreads of them) calls it; it synchronises
// the block.
template <int kRows, int kBlockThreads>
__device__ void expert_first_units(const int32_t* offsets, int num_experts, int slices, int* first_unit) {
  auto units_of = [&](int e) { return moe_tiles::tiles_of(offsets[e + 1] - offsets[e], kRows) * slices; };
  const ThreadExperts mine = thread_experts<kBlockThreads>(num_experts, units_of);
  int start = mine.first_unit;
  for (int e = mine.e0; e < mine.e1; ++e) {
    first_unit[e] = start;
    start += units_of(e);
  }
  if (threadIdx.x == kBlockThreads - 1) first_unit[num_experts] = start;  // the last thread's end: the total
  __syncthreads();
}

// Unit `unit` (< first_unit[num_experts]) as unit_of_block<kRows, *, kEvery> gives it, found by a
// binary search of expert_first_units' table (no block synchronisation: a thread alone may ask).
template <int kRows>
__device__ __forceinline__ RowTile unit_of(const int32_t* offsets, const int* first_unit, int num_experts, int unit) {
  int lo = 0, hi = num_experts - 1;  // the last expert whose first unit is at most `unit`
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (first_unit[mid] <= unit) lo = mid;
    else hi = mid - 1;
  }
  const int e = lo, left = unit - first_unit[e];
  const int tiles = moe_tiles::tiles_of(offsets[e + 1] - offsets[e], kRows);
  const int first = offsets[e] + left % tiles * kRows;
  return {e, first, min(kRows, offsets[e + 1] - first), left / tiles};
}

// Persistent grouped GEMMs (a block an SM taking tile after tile): producer thread 0 claims the
// next unit from a counter in global memory, in unit order, so that the blocks running at any
// time hold neighbouring units as a block-per-tile launch's do, and an expert slice's row tiles
// read its weight lines from HBM once between them (the others from L2). Blocks that took every
// gridDim.x-th unit drifted apart and read them about once a row tile: an H100 run timed the W8A8
// experts of a prefill of 8192 at 38.4 ms against 25.2 block per tile.
// counters[0]: the next unit, counters[1]: the blocks done claiming; zero at launch, and the last
// block done sets them back to zero. A claim reaches the producer warpgroup through named barrier
// kClaimBarrier (a kernel using these keeps it free) and the consumers through two slots, each
// with a full barrier the claimer arrives on and an empty one that every consumer thread arrives
// on once it has read the slot.
struct TileClaims {
  uint64_t full[2], empty[2];
  RowTile tile[2];
};
constexpr int kTileClaimsBytes = (static_cast<int>(sizeof(TileClaims)) + 15) / 16 * 16;
constexpr int kClaimBarrier = 1;
// Slot `slot`'s full and empty barriers, of the claims at shared address `address`.
__device__ __forceinline__ uint32_t claim_full(uint32_t address, int slot) {
  return address + static_cast<uint32_t>(offsetof(TileClaims, full)) + 8 * slot;
}
__device__ __forceinline__ uint32_t claim_empty(uint32_t address, int slot) {
  return address + static_cast<uint32_t>(offsetof(TileClaims, empty)) + 8 * slot;
}

// The slots' barriers, set up by thread 0 (`address`: the claims' in shared memory); the ring's
// init_ring, after it, fences them and meets the block.
__device__ __forceinline__ void init_tile_claims(uint32_t address, int consumer_threads) {
  if (threadIdx.x != 0) return;
  for (int slot = 0; slot < 2; ++slot) {
    pipeline::barrier_init(claim_full(address, slot), 1);
    pipeline::barrier_init(claim_empty(address, slot), consumer_threads);
  }
}

// The producer warpgroup's n-th tile (each of its 128 threads calls it, `index` its own): claimed
// by thread 0 once the consumers have read the slot's tile before it, through
// expert_first_units' table; expert -1 once the units are all claimed.
template <int kRows>
__device__ __forceinline__ RowTile claim_tile(TileClaims* claims, uint32_t address, int n, int* counters, int units,
                                              const int32_t* offsets, const int* first_unit, int num_experts,
                                              int index) {
  const int slot = n % 2;
  if (index == 0) {
    pipeline::barrier_wait(claim_empty(address, slot), ((n / 2) & 1) ^ 1);  // the first round passes
    const int unit = atomicAdd(counters, 1);
    claims->tile[slot] = unit < units ? unit_of<kRows>(offsets, first_unit, num_experts, unit) : RowTile{-1, 0, 0, 0};
    pipeline::barrier_arrive(claim_full(address, slot));
  }
  pipeline::named_sync(kClaimBarrier, 128);  // the warpgroup reads it before its next claim's barrier
  return claims->tile[slot];
}

// The consumers' n-th tile (every consumer thread calls it).
__device__ __forceinline__ RowTile claimed_tile(const TileClaims* claims, uint32_t address, int n) {
  const int slot = n % 2;
  pipeline::barrier_wait(claim_full(address, slot), (n / 2) & 1);
  const RowTile tile = claims->tile[slot];
  pipeline::barrier_arrive(claim_empty(address, slot));
  return tile;
}

// After the producer's last claim (expert -1), by its thread `index` 0: the block counts itself
// done, and the last block sets the counters back to zero.
__device__ __forceinline__ void finish_tile_claims(int* counters, int index) {
  if (index != 0) return;
  __threadfence();  // this block's claims before its count
  if (atomicAdd(counters + 1, 1) == static_cast<int>(gridDim.x) - 1) {
    __threadfence();  // every block's count (and so its claims) before the reset
    atomicExch(counters, 0);
    atomicExch(counters + 1, 0);
  }
}

// A persistent block's producer warpgroup (each of its 128 threads calls it): tile after tile
// claimed (claim_tile), each handed to produce(tile, ring) with the steps its ring took before
// it, then the block counted done.
template <int kRows, typename Produce>
__device__ __forceinline__ void produce_claimed_tiles(const GroupedArgs& a, TileClaims* claims, uint32_t address,
                                                      int* counters, const int* first_unit, int units, int steps,
                                                      Produce produce) {
  const int index = static_cast<int>(threadIdx.x) % 128;
  for (int n = 0, ring = 0;; ++n, ring += steps) {
    const RowTile tile = claim_tile<kRows>(claims, address, n, counters, units, a.offsets, first_unit, a.num_experts,
                                           index);
    if (tile.expert < 0) break;
    produce(tile, ring);
  }
  finish_tile_claims(counters, index);
}

// Its consumer warpgroups (every consumer thread calls it): tile after tile as claimed, each
// handed to consume(tile, ring).
template <typename Consume>
__device__ __forceinline__ void consume_claimed_tiles(const TileClaims* claims, uint32_t address, int steps,
                                                      Consume consume) {
  for (int n = 0, ring = 0;; ++n, ring += steps) {
    const RowTile tile = claimed_tile(claims, address, n);
    // Broadcast from lane 0: the compiler then knows the tile loop around the wgmma is uniform.
    if (__shfl_sync(0xffffffffu, tile.expert, 0) < 0) break;
    consume(tile, ring);
  }
}

// A persistent launch's dynamic shared memory (the kernel's ring of ring_bytes, then the claims
// and expert_first_units' table) and blocks (a block an SM, or launch.max_blocks, and at most
// `units`), checked (`what`: the kernel, for the errors).
struct PersistentGrid {
  int shared_bytes;
  unsigned blocks;
};
inline PersistentGrid persistent_grid(const char* what, int ring_bytes, int num_experts, int64_t units,
                                      const PersistentLaunch& launch) {
  const int shared_bytes = ring_bytes + kTileClaimsBytes + static_cast<int>(sizeof(int)) * (num_experts + 1);
  // 64: expert_first_units' static shared memory beside the dynamic.
  GLMS_CHECK(shared_bytes + 64 <= 232448, std::string(what) + ": too many experts for one block's table");
  GLMS_CHECK(launch.unit_counters != nullptr, std::string(what) + ": needs its unit counters");
  const int grid = launch.max_blocks > 0 ? launch.max_blocks : multiprocessor_count();
  return {shared_bytes, static_cast<unsigned>(std::min<int64_t>(units, grid))};
}

// This block's row tile (blockIdx.y of the experts' row tiles of kRows rows, the experts in
// order) for the slice blockIdx.x.
template <int kRows, int kBlockThreads = kThreads>
__device__ RowTile row_tile_of_block(const int32_t* offsets, int num_experts) {
  RowTile tile = unit_of_block<kRows, kBlockThreads>(offsets, num_experts, static_cast<int>(blockIdx.y), 1);
  tile.slice = static_cast<int>(blockIdx.x);
  return tile;
}

// Down sums v0, v1 at elements index, index + 1 of the output (index even), in its type.
__device__ __forceinline__ void store_out_pair(const GroupedArgs& a, int64_t index, float v0, float v1) {
  if (a.out_bf16) *reinterpret_cast<uint32_t*>(a.out_bf16 + index) = pack_bf16_pair(v0, v1);
  else *reinterpret_cast<float2*>(a.out + index) = make_float2(v0, v1);
}
__device__ __forceinline__ void store_out(const GroupedArgs& a, int64_t index, float v) {
  if (a.out_bf16) a.out_bf16[index] = float_to_bf16(v);
  else a.out[index] = v;
}

// acc[4 j + e] of thread (warp, g, tq) of warpgroup wg: row wg * kGroupRow0 + 16 warp + g +
// 8 (e / 2), weight line wg * kGroupLine0 + 8 j + 2 tq + e % 2 of the block's.
template <Projection P, int kRows>
__device__ __forceinline__ void epilogue(const GroupedArgs& a, const float (&acc)[64], int first, int rows,
                                         uint8_t* shared) {
  using S = TileLayout<kRows>;
  const int wg = threadIdx.x / 128, u = threadIdx.x % 128, warp = u / 32, lane = u % 32, g = lane / 4, tq = lane % 4;
  const int row0 = wg * S::kGroupRow0 + 16 * warp + g;
  if constexpr (P == Projection::kDown) {
    const int64_t feature0 = int64_t{blockIdx.x} * S::kFeatures + wg * S::kGroupLine0 + 2 * tq;
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = row0 + 8 * h;
        if (r < rows)
          store_out_pair(a, (first + r) * a.rows_per_expert + feature0 + 8 * j, acc[4 * j + 2 * h],
                         acc[4 * j + 2 * h + 1]);
      }
    return;
  }
  // act[row, f0 + i] = bf16(silu(gate_i) * up_i) for the block's kHalf features i.
  auto write_act = [&](int r, int feature, float gate0, float up0, float gate1, float up1) {
    const uint32_t packed = static_cast<uint32_t>(float_to_bf16(silu_mul(gate0, up0))) |
                            static_cast<uint32_t>(float_to_bf16(silu_mul(gate1, up1))) << 16;
    *reinterpret_cast<uint32_t*>(a.act + (first + r) * a.inter + int64_t{blockIdx.x} * (S::kFeatures / 2) + feature) =
        packed;
  };
  if constexpr (kRows == 128) {
    // Lines 0..63 gate, 64..127 up: feature i's up sum is 8 registers-groups on, in this thread.
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = row0 + 8 * h, i = 4 * j + 2 * h;
        if (r < rows) write_act(r, 8 * j + 2 * tq, acc[i], acc[i + 32], acc[i + 1], acc[i + 33]);
      }
  } else {
    __syncthreads();  // the stages are free
    float* up = reinterpret_cast<float*>(shared);  // [64 registers][128 threads] of warpgroup 1
    if (wg == 1) {
#pragma unroll
      for (int i = 0; i < 64; ++i) up[i * 128 + u] = acc[i];
    }
    __syncthreads();
    if (wg == 1) return;
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = row0 + 8 * h, i = 4 * j + 2 * h;
        if (r < rows) write_act(r, 8 * j + 2 * tq, acc[i], up[i * 128 + u], acc[i + 1], up[(i + 1) * 128 + u]);
      }
  }
}

}  // namespace glms::ops::cuda::moe_grouped
