// Sparse MLA attention on Hopper's warpgroup tensor cores (wgmma), for GLM-5's shapes: up to 64
// heads, latent 512, rope 64. Prefill chunks and large decode batches.
//
// Why this shape: a prefill token attends over up to index_topk of its context's latent rows,
// and all its heads read the same rows (MQA in latent space), so a block takes one token and
// its 64 heads and streams the token's selected rows through shared memory in tiles of 64,
// gathering the next tile by cp.async while the tensor cores work on this one. The two
// warpgroups split each tile: for the scores S = Q K^T warpgroup w takes rows 32w .. 32w + 31
// against all 64 heads (wgmma m64n32k16 over the 576 columns); the running max of the online
// softmax goes through shared memory; the probabilities go to shared memory as bf16, and each
// warpgroup adds P V for its half of the 512 latent columns (two m64n128k16 a 16-row step), its
// 64 x 256 fp32 sums in registers. A decode batch has fewer tokens than SMs, so a token's
// selection is split over blocks (splits of whole tiles) and mla_merge_splits combines their
// (max, sum, unnormalised output); mla_wgmma_splits picks the count. The mma.sync kernel
// (mla_fused.cu) moves every operand through registers with ldmatrix, which bounds it by
// shared-memory bandwidth on these shapes; wgmma reads both operands from shared memory itself.
//
// Shared memory, in the 128-byte swizzle wgmma reads (16-byte chunk c of 128-byte line r lies
// at chunk c ^ (r % 8); lines in 1024-byte-aligned groups of 8). A "column block" is 64 bf16
// columns, one line per head or row:
//   queries [9 column blocks][64 heads] lines            73728 B
//   rows    [2 stages][9 column blocks][64 rows] lines  147456 B
//   probs   [64 heads] lines of 64 bf16 probabilities      8192 B
//   slots [64] int32, row maxima [2][64], row sums [2][64] fp32
// For S both operands are K-major (a line holds 64 of the 576 columns of one head or row); for
// P V the rows are the B operand read MN-major (a line holds 64 latent columns of one row).
//
// FP8 rows (656 bytes: 512 E4M3 codes, 4 fp32 scales, the rope key in bf16) come by cp.async
// into a codes stage and are widened into one bf16 stage of the layout above before the tile's
// wgmmas (codes times scale, rounded to bf16): the next tile's codes load while this tile is
// multiplied. The widening needs a stage of its own, so there is one bf16 stage, not two:
//   queries 73728 | rows [1 stage] 73728 | codes [64 rows of 656] 41984 | probs 8192 | small
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/fp8.cuh"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/mla.h"
#include "ops/cuda/wgmma.cuh"

namespace glms::ops::cuda {

namespace {

using wgmma::copy_async_16;
using wgmma::swizzled;
using wgmma::descriptor;

constexpr int kHeads = 64, kLatent = 512, kRope = 64, kRow = kLatent + kRope;
constexpr int kTileRows = 64;
constexpr int kThreads = 256;  // two warpgroups
constexpr int kLineBytes = wgmma::kLineBytes, kColumnBlocks = kRow / 64;
constexpr int kChunksPerRow = kRow / 8;                                  // 72 16-byte chunks a cache row
constexpr int kBlockBytes = kTileRows * kLineBytes;                      // one column block of a tile
constexpr int kQueryBytes = kColumnBlocks * kHeads * kLineBytes;         // 73728
constexpr int kTileBytes = kColumnBlocks * kBlockBytes;                  // 73728
constexpr int kOutLineBytes = kLatent * 2 + 16;  // a head's bf16 output staged in shared memory
static_assert(kHeads * kOutLineBytes <= kQueryBytes, "the staged output fits the queries' region");
constexpr int kProbBytes = kHeads * kLineBytes;                          // 8192
constexpr int kSmallBytes = sizeof(int32_t) * kTileRows + sizeof(float) * 4 * kHeads;
constexpr int kFp8RowBytes = quant::kv_fp8_row_bytes(kLatent, kRope);        // 656
constexpr int kFp8ScalesOffset = quant::kv_fp8_scales_offset(kLatent);       // 512
constexpr int kFp8RopeOffset = quant::kv_fp8_rope_offset(kLatent);           // 528
constexpr int kFp8Chunks = kFp8RowBytes / 16;                                // 41
constexpr int kCodesBytes = kTileRows * kFp8RowBytes;                        // 41984
static_assert(kFp8RowBytes % 16 == 0 && kFp8RopeOffset % 16 == 0 && kLatent == 4 * quant::kKvFp8GroupValues,
              "a thread widens one scale group of a row, its rope chunks 16-byte aligned");

// The bf16 stages and the codes stage of a storage, and the shared memory they make.
__host__ __device__ constexpr int stages_of(CacheStorage storage) { return storage == CacheStorage::kBf16 ? 2 : 1; }
__host__ __device__ constexpr int codes_bytes_of(CacheStorage storage) { return storage == CacheStorage::kBf16 ? 0 : kCodesBytes; }
__host__ __device__ constexpr int shared_bytes_of(CacheStorage storage) {  // 1024: alignment
  return 1024 + kQueryBytes + stages_of(storage) * kTileBytes + codes_bytes_of(storage) + kProbBytes + kSmallBytes;
}
static_assert(kRow % 64 == 0 && shared_bytes_of(CacheStorage::kBf16) <= 232448 &&
                  shared_bytes_of(CacheStorage::kFp8) <= 232448,
              "one block an SM");

// 64 lines of 576 bf16 values (a head's query or a cache row each) into the column blocks at
// `base`: chunk c of line l to column block c / 8. Thread t copies line t / 4, chunks t % 4 + 4 j,
// so that it needs one source row and each copy's addresses are constant offsets from two bases
// (the integer work of a tile's 4608 copies is what the multiplying warps pay for).
// `line_source`: this thread's line; `live` false writes zeros.
__device__ __forceinline__ void copy_lines(uint32_t base, const uint16_t* line_source, bool live) {
  static_assert(kThreads == 4 * kTileRows && kTileRows == kHeads && kChunksPerRow % 8 == 0,
                "four threads a line (a row of a tile or a head's query), two chunks of a line's eight");
  const int line = threadIdx.x / 4, q = threadIdx.x % 4;
  const uint32_t even = base + swizzled(line, q), odd = base + swizzled(line, q + 4);
  const uint16_t* src = line_source + q * 8;
  const int bytes = live ? 16 : 0;
#pragma unroll
  for (int j = 0; j < kChunksPerRow / 4; ++j)  // chunk q + 4 j: column block j / 2, chunk q + 4 (j % 2) of the line
    copy_async_16((j & 1 ? odd : even) + (j / 2) * kBlockBytes, src + 32 * j, bytes);
}

// The tile's 64 cache rows (slot -1: zeros) into a stage: bf16 rows into the swizzled lines, FP8
// rows as they are stored into the codes stage (row r at r * 656; four threads a row).
template <CacheStorage kStorage>
__device__ __forceinline__ void load_tile(uint32_t stage, const int32_t* slot, const void* cache) {
  const int32_t s = slot[threadIdx.x / 4];
  if constexpr (kStorage == CacheStorage::kBf16) {
    copy_lines(stage, static_cast<const uint16_t*>(cache) + (s >= 0 ? static_cast<int64_t>(s) * kRow : 0), s >= 0);
  } else {
    const int line = threadIdx.x / 4, q = threadIdx.x % 4;
    const uint8_t* src = static_cast<const uint8_t*>(cache) + (s >= 0 ? static_cast<int64_t>(s) * kFp8RowBytes : 0);
    const uint32_t dst = stage + line * kFp8RowBytes;
    for (int c = q; c < kFp8Chunks; c += 4) copy_async_16(dst + 16 * c, src + 16 * c, s >= 0 ? 16 : 0);
  }
}

// The codes stage's 64 FP8 rows into the bf16 stage's swizzled lines. Thread (line t / 4, q = t
// % 4) widens scale group q of its row (latent columns 128 q .. + 127: 16-byte chunks 16 q .. + 15)
// and rope chunks 2 q, 2 q + 1. It takes its eight 16-code words in the order (j + 2 q) % 8, so
// that the four threads of a row read different banks (rows are 656 bytes apart: 4 banks).
__device__ __forceinline__ void widen_tile(uint8_t* stage, const uint8_t* codes) {
  const int line = threadIdx.x / 4, q = threadIdx.x % 4;
  const uint8_t* row = codes + line * kFp8RowBytes;
  const float scale = reinterpret_cast<const float*>(row + kFp8ScalesOffset)[q];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int w = (j + 2 * q) % 8;
    const uint4 c = *reinterpret_cast<const uint4*>(row + 128 * q + 16 * w);
    const uint2 v0 = e4m3x4_to_bf16x4(c.x, scale), v1 = e4m3x4_to_bf16x4(c.y, scale);
    const uint2 v2 = e4m3x4_to_bf16x4(c.z, scale), v3 = e4m3x4_to_bf16x4(c.w, scale);
    const int chunk = 16 * q + 2 * w;  // of the row's 72; column block chunk / 8
    uint8_t* block = stage + (chunk / 8) * kBlockBytes;
    *reinterpret_cast<uint4*>(block + swizzled(line, chunk % 8)) = make_uint4(v0.x, v0.y, v1.x, v1.y);
    *reinterpret_cast<uint4*>(block + swizzled(line, chunk % 8 + 1)) = make_uint4(v2.x, v2.y, v3.x, v3.y);
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int chunk = 2 * q + i;  // of the rope key's 8, column block 8
    *reinterpret_cast<uint4*>(stage + 8 * kBlockBytes + swizzled(line, chunk)) =
        *reinterpret_cast<const uint4*>(row + kFp8RopeOffset + 16 * chunk);
  }
}

// The block's shared memory, aligned to 1024 bytes: the queries (their region holds the normalised
// rows at the end), the bf16 stages, the FP8 codes stage, P, and the small arrays; as shared-window
// addresses for the copies and wgmma descriptors, and generic pointers for the threads' own use.
template <CacheStorage kStorage>
struct SharedLayout {
  static constexpr int kStageBytes = stages_of(kStorage) * kTileBytes;
  uint32_t queries, rows, codes, probs;
  uint8_t* generic;              // the queries' region
  uint8_t* rows_generic;         // the bf16 stages
  const uint8_t* codes_generic;  // the FP8 codes stage
  uint8_t* probs_generic;        // P, [64 heads, 64 rows] bf16 in swizzled lines
  int32_t* slot;                 // [64]: the tile's rows' cache slots
  float* max_part;               // [2][64]: each warpgroup's max a head
  float* sum_part;               // [2][64]: each warpgroup's sum a head
  __device__ __forceinline__ explicit SharedLayout(uint8_t* shared_raw) {
    const wgmma::AlignedShared aligned = wgmma::align_to_1024(shared_raw);
    queries = aligned.address, rows = queries + kQueryBytes, codes = rows + kStageBytes;
    probs = codes + codes_bytes_of(kStorage);
    generic = aligned.generic;
    rows_generic = generic + kQueryBytes;
    codes_generic = rows_generic + kStageBytes;
    probs_generic = generic + (probs - queries);
    slot = reinterpret_cast<int32_t*>(probs_generic + kProbBytes);
    max_part = reinterpret_cast<float*>(slot + kTileRows);
    sum_part = max_part + 2 * kHeads;
  }
};

// The split's selected rows: a row's context position (-1 past the split's `count` rows of
// `chosen`), and a position's cache slot through the sequence's block table.
struct SplitSelection {
  const int32_t* chosen;
  const int32_t* blocks;
  int count, block_size;
  __device__ __forceinline__ int32_t position_of(int j) const { return j < count ? chosen[j] : -1; }
  __device__ __forceinline__ int32_t slot_of(int32_t position) const {
    return position < 0 ? -1 : blocks[position / block_size] * block_size + position % block_size;
  }
};

// The token's queries (token_queries, [H, 576]; heads past H: zeros) and the split's first tile
// (into `first_stage`: the bf16 rows or the FP8 codes), one cp.async group; thread r < 64 then
// holds row r's slot of the next tile and position of the one after.
template <CacheStorage kStorage>
__device__ __forceinline__ void issue_first_tile(const uint16_t* token_queries, int H, uint32_t queries,
                                                 uint32_t first_stage, int32_t* slot, const SplitSelection& lookup,
                                                 const void* cache, int32_t* next_slot, int32_t* next_position) {
  const int query_head = threadIdx.x / 4;
  copy_lines(queries, token_queries + (query_head < H ? query_head * kRow : 0), query_head < H);
  if (threadIdx.x < kTileRows) {
    slot[threadIdx.x] = lookup.slot_of(lookup.position_of(threadIdx.x));
    *next_position = lookup.position_of(kTileRows + threadIdx.x);
  }
  __syncthreads();
  load_tile<kStorage>(first_stage, slot, cache);
  wgmma::copy_async_commit();
  if (threadIdx.x < kTileRows) {
    *next_slot = lookup.slot_of(*next_position);
    *next_position = lookup.position_of(2 * kTileRows + threadIdx.x);
  }
  __syncthreads();  // every thread has read slot for tile 0 before the loop overwrites it
}

// The copies of one step of the tile loop: `slot` becomes the next tile's (thread r < 64 holds its
// row r's cache slot in `next_slot`), and the next tile's rows (bf16: into the other stage) or
// codes (FP8: after this tile's codes are widened into the bf16 stage) are issued as one cp.async
// group. The bf16 path still waits for this tile's group after this.
template <CacheStorage kStorage>
__device__ __forceinline__ void copy_tile_rows(int tile, int tiles, uint32_t rows, uint32_t codes,
                                               uint8_t* rows_generic, const uint8_t* codes_generic, int32_t* slot,
                                               int32_t next_slot, const void* cache) {
  if constexpr (kStorage == CacheStorage::kFp8) {
    wgmma::copy_async_wait<0>();  // this tile's codes (and the queries) have landed
    // Every thread has issued this tile's copies (which read slot) before the last barrier.
    if (threadIdx.x < kTileRows) slot[threadIdx.x] = next_slot;
    __syncthreads();  // every thread's codes are in; the stage's readers (last tile's P V) are done
    widen_tile(rows_generic, codes_generic);
    wgmma::fence_async_proxy();
    __syncthreads();  // the stage is this tile's; the codes stage is free for the next
    if (tile + 1 < tiles) load_tile<kStorage>(codes, slot, cache);
    wgmma::copy_async_commit();
  } else {
    // Every thread has issued this tile's copies (which read slot) before the last barrier.
    if (threadIdx.x < kTileRows) slot[threadIdx.x] = next_slot;
    __syncthreads();  // slot is the next tile's; the other stage's readers (last tile's P V) are done
    if (tile + 1 < tiles) load_tile<kStorage>(rows + ((tile + 1) & 1) * kTileBytes, slot, cache);
    wgmma::copy_async_commit();
  }
}

// After the split's last tile: each head's sum over both warpgroups' columns (sum_part, [2][64] in
// shared memory), then with several splits the unnormalised rows of launched token i's split and
// their (max, sum) into `partials`, with one the normalised bf16 rows into shared memory at
// `generic` (the queries' region) for the block's store.
__device__ __forceinline__ void write_split_rows(const float (&out)[2][64], const float (&run_max)[2],
                                                 float (&run_sum)[2], const int (&head_row)[2], int H, int i,
                                                 int split, int splits, float* sum_part, float* partials,
                                                 uint8_t* generic) {
  const int wg = threadIdx.x / 128, lane = threadIdx.x % 32, tq = lane % 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    run_sum[h] += __shfl_xor_sync(0xffffffffu, run_sum[h], 1);
    run_sum[h] += __shfl_xor_sync(0xffffffffu, run_sum[h], 2);
    if (tq == 0) sum_part[wg * kHeads + head_row[h]] = run_sum[h];
  }
  __syncthreads();
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int head = head_row[h];
    if (head >= H) continue;
    const float total = sum_part[head] + sum_part[kHeads + head];
    const int64_t split_row = static_cast<int64_t>(i) * splits + split;
    const int column0 = 256 * wg + 2 * tq;
    if (splits > 1) {
      float* dst = partials + (split_row * H + head) * kLatent + column0;
      if (wg == 0 && tq == 0) {
        float* stats = partials + static_cast<int64_t>(gridDim.x) * splits * H * kLatent + (split_row * H + head) * 2;
        stats[0] = run_max[h];
        stats[1] = total;
      }
#pragma unroll
      for (int half = 0; half < 2; ++half)
#pragma unroll
        for (int j = 0; j < 16; ++j)
          *reinterpret_cast<float2*>(dst + 128 * half + 8 * j) =
              make_float2(out[half][4 * j + 2 * h], out[half][4 * j + 2 * h + 1]);
      continue;
    }
    // One split: the normalised row into shared memory (the queries' region: every wgmma of the
    // block finished before the barrier above), lines padded so a warp's 8 heads take distinct banks.
    const float norm = total > 0.0f ? 1.0f / total : 0.0f;
    uint8_t* line = generic + head * kOutLineBytes + 2 * column0;
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int j = 0; j < 16; ++j)
        *reinterpret_cast<uint32_t*>(line + 2 * (128 * half + 8 * j)) =
            pack_bf16_pair(out[half][4 * j + 2 * h] * norm, out[half][4 * j + 2 * h + 1] * norm);
  }
}

// One split's normalised rows from shared memory (`rows`: write_split_rows's padded lines) to
// the token's [H, 512] bf16 output, which is contiguous: whole 16-byte chunks, consecutive threads
// consecutive chunks (a thread's pairs alone would write half sectors).
__device__ __forceinline__ void store_token_output(const uint8_t* rows, int H, uint16_t* token_out) {
  constexpr int kChunksPerHead = kLatent / 8;
  for (int c = threadIdx.x; c < H * kChunksPerHead; c += kThreads)
    reinterpret_cast<uint4*>(token_out)[c] =
        *reinterpret_cast<const uint4*>(rows + c / kChunksPerHead * kOutLineBytes + c % kChunksPerHead * 16);
}

// S[64 heads, rows 32 wg .. +31] of the tile in `stage` over the 36 k16 steps of the row.
__device__ __forceinline__ void tile_scores(float (&score)[16], uint32_t queries, uint32_t stage, int wg) {
#pragma unroll
  for (int k = 0; k < 16; ++k) score[k] = 0.0f;
  wgmma::pin(score);
  wgmma::fence();
#pragma unroll
  for (int ks = 0; ks < kRow / 16; ++ks) {
    const uint32_t column = (ks / 4) * kBlockBytes + (ks % 4) * 32;
    wgmma::m64n32k16(score, descriptor(queries + column, 16, 1024),
                     descriptor(stage + column + wg * 32 * kLineBytes, 16, 1024), ks > 0);
  }
  wgmma::commit();
  wgmma::wait_all();
  wgmma::pin(score);
}

// O *= each head's rescale: heads head_row[0] at out[..][4 j], [4 j + 1], head_row[1] at the next two.
__device__ __forceinline__ void rescale_output(float (&out)[2][64], const float (&rescale)[2]) {
#pragma unroll
  for (int half = 0; half < 2; ++half)
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      out[half][4 * j] *= rescale[0];
      out[half][4 * j + 1] *= rescale[0];
      out[half][4 * j + 2] *= rescale[1];
      out[half][4 * j + 3] *= rescale[1];
    }
}

// O[:, 256 wg .. +255] += P[64 heads, 64 rows] V[64 rows, those columns] (V: the tile's rows in
// `stage`).
__device__ __forceinline__ void accumulate_pv(float (&out)[2][64], uint32_t probs, uint32_t stage, int wg) {
  wgmma::pin(out[0]);
  wgmma::pin(out[1]);
  wgmma::fence();
#pragma unroll
  for (int ks = 0; ks < kTileRows / 16; ++ks) {
    const uint64_t p = descriptor(probs + ks * 32, 16, 1024);
#pragma unroll
    for (int half = 0; half < 2; ++half)
      wgmma::m64n128k16<1>(out[half], p,
                           descriptor(stage + (4 * wg + 2 * half) * kBlockBytes + ks * 16 * kLineBytes, kBlockBytes, 1024));
  }
  wgmma::commit();
  wgmma::wait_all();
  wgmma::pin(out[0]);
  wgmma::pin(out[1]);
}

// Grid (launched token, split); a split covers selected rows [split * rows_per_split, + rows_per_split).
// a.queries: [T, H, 576] bf16, pre-scaled. With one split the block writes the normalised output
// (bf16); otherwise `partials` as mla_merge_splits reads them.
template <CacheStorage kStorage>
__global__ void __launch_bounds__(kThreads, 1)
    mla_wgmma_kernel(MlaAttentionArgs a, int rows_per_split, int splits, float* partials) {
  chained_grid_prologue();
  constexpr bool kFp8 = kStorage == CacheStorage::kFp8;
  extern __shared__ __align__(16) uint8_t shared_raw[];
  const SharedLayout<kStorage> shared(shared_raw);
  const uint32_t queries = shared.queries, rows = shared.rows, codes = shared.codes, probs = shared.probs;
  uint8_t* const generic = shared.generic;
  int32_t* const slot = shared.slot;

  const int i = blockIdx.x, t = a.first_token + i, split = blockIdx.y;
  const int wg = threadIdx.x / 128, warp = threadIdx.x / 32 % 4, lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;
  const int head_row[2] = {16 * warp + g, 16 * warp + g + 8};  // this thread's heads in S, P and O
  const int H = a.num_heads, begin = split * rows_per_split;
  const int count = max(0, min(a.num_selected[t] - begin, rows_per_split));  // this split's rows
  const int32_t* chosen = a.selected + static_cast<int64_t>(t) * a.max_selected + begin;
  const int32_t* blocks = a.block_tables + static_cast<int64_t>(a.token_sequence[t]) * a.max_blocks;
  // Thread r < 64 looks up row r of a tile in two steps an iteration apart (the position two
  // tiles ahead, the slot one tile ahead), so that neither dependent load waits in the loop: in
  // decode both come from memory, about a microsecond each.
  const SplitSelection lookup{chosen, blocks, count, a.block_size};
  int32_t next_slot = -1, next_position = -1;  // of this thread's row of the next tile / the one after
  issue_first_tile<kStorage>(a.queries + static_cast<int64_t>(t) * H * kRow, H, queries, kFp8 ? codes : rows, slot,
                             lookup, a.cache, &next_slot, &next_position);

  float out[2][64];  // O[heads, 256 wg + 128 half + 8 j + 2 tq (+1)] at out[half][4 j + ...]
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int k = 0; k < 64; ++k) out[h][k] = 0.0f;
  float run_max[2] = {-INFINITY, -INFINITY}, run_sum[2] = {0.0f, 0.0f};  // sums over this thread's columns
  const int tiles = (count + kTileRows - 1) / kTileRows;
  for (int tile = 0; tile < tiles; ++tile) {
    const uint32_t stage = rows + (kFp8 ? 0 : (tile & 1) * kTileBytes);
    copy_tile_rows<kStorage>(tile, tiles, rows, codes, shared.rows_generic, shared.codes_generic, slot, next_slot,
                             a.cache);
    if (threadIdx.x < kTileRows) {  // used by the next iterations
      next_slot = lookup.slot_of(next_position);
      next_position = lookup.position_of((tile + 3) * kTileRows + threadIdx.x);
    }
    if constexpr (!kFp8) {
      wgmma::copy_async_wait<1>();  // all but the next tile's group: this tile (and the queries) have landed
      wgmma::fence_async_proxy();
      __syncthreads();
    }

    float score[16];
    tile_scores(score, queries, stage, wg);

    // Rows past the selection get -inf; each head's max over this warpgroup's rows, then both.
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < 4; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (tile * kTileRows + 32 * wg + 8 * n + 2 * tq + (e & 1) >= count) score[4 * n + e] = -INFINITY;
        tile_max[e / 2] = fmaxf(tile_max[e / 2], score[4 * n + e]);
      }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 1));
      tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 2));
      if (tq == 0) shared.max_part[wg * kHeads + head_row[h]] = tile_max[h];
    }
    __syncthreads();
    // The tile's first row is selected and lies in warpgroup 0's half: every new max is finite.
    float new_max[2], rescale[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      new_max[h] = fmaxf(run_max[h], fmaxf(shared.max_part[head_row[h]], shared.max_part[kHeads + head_row[h]]));
      rescale[h] = run_max[h] == -INFINITY ? 0.0f : __expf(run_max[h] - new_max[h]);
      run_max[h] = new_max[h];
      run_sum[h] *= rescale[h];
    }
#pragma unroll
    for (int n = 0; n < 4; ++n)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint16_t p0 = float_to_bf16(__expf(score[4 * n + 2 * h] - new_max[h]));
        const uint16_t p1 = float_to_bf16(__expf(score[4 * n + 2 * h + 1] - new_max[h]));
        run_sum[h] += bf16_to_float(p0) + bf16_to_float(p1);
        const int column = 32 * wg + 8 * n + 2 * tq;
        *reinterpret_cast<uint32_t*>(shared.probs_generic + swizzled(head_row[h], column / 8) + (column % 8) * 2) =
            static_cast<uint32_t>(p0) | static_cast<uint32_t>(p1) << 16;
      }
    rescale_output(out, rescale);
    wgmma::fence_async_proxy();
    __syncthreads();  // P complete

    accumulate_pv(out, probs, stage, wg);
  }
  wgmma::copy_async_wait<0>();  // a split without rows still issued its first tile

  write_split_rows(out, run_max, run_sum, head_row, H, i, split, splits, shared.sum_part, partials, generic);
  if (splits > 1) return;
  __syncthreads();
  store_token_output(generic, H, a.out + static_cast<int64_t>(t) * H * kLatent);
}

}  // namespace

bool mla_attention_wgmma_supported(int num_heads, int latent_dim, int rope_dim) {
  return num_heads >= 1 && num_heads <= kHeads && latent_dim == kLatent && rope_dim == kRope;
}

int mla_splits_for(int launch_tokens, int tiles, int sms, int most_unclustered, int cluster_limit) {
  auto clustered = [&](int s) { return s > 1 && s <= cluster_limit; };
  // (cost, clustered): a tie keeps the unclustered count.
  auto cost = [&](int s) {
    const int tiles_per_split = (tiles + s - 1) / s;
    const int64_t waves = (int64_t{launch_tokens} * s + sms - 1) / sms;
    return std::make_pair(waves * (tiles_per_split + 1) + (s > 1 && !clustered(s) ? 2 : 0), clustered(s) ? 1 : 0);
  };
  int best = 1;
  const int most = std::min(tiles, kMlaMaxSplits);
  for (int s = 2; s <= most; ++s) {
    if (s > most_unclustered && !clustered(s)) continue;  // past the partials: only as one cluster
    if (cost(s) < cost(best)) best = s;
  }
  return best;
}

int mla_wgmma_splits(int launch_tokens, int max_selected_in_step, int num_heads, int64_t partial_elements,
                     int cluster_limit) {
  const int tiles = std::max(1, (max_selected_in_step + kTileRows - 1) / kTileRows);
  const int64_t per_split = int64_t{launch_tokens} * num_heads * (kLatent + 2);
  const int most_unclustered = static_cast<int>(std::min<int64_t>(kMlaMaxSplits, partial_elements / per_split));
  return mla_splits_for(launch_tokens, tiles, multiprocessor_count(), most_unclustered, cluster_limit);
}

void mla_attention_wgmma(const MlaAttentionArgs& a, cudaStream_t stream, int max_selected_in_step,
                         int splits, float* partials, int64_t partial_elements) {
  const int launch_tokens = a.launch_tokens < 0 ? a.num_tokens - a.first_token : a.launch_tokens;
  if (launch_tokens <= 0) return;
  GLMS_CHECK(mla_attention_wgmma_supported(a.num_heads, a.latent_dim, a.rope_dim),
             "mla_attention_wgmma: at most 64 heads, latent 512 and rope 64");
  // Whole tiles a split; the count that covers max_selected_in_step with them.
  const int tiles = std::max(1, (max_selected_in_step + kTileRows - 1) / kTileRows);
  const int tiles_per_split = splits > 1 ? (tiles + splits - 1) / splits : 0;
  splits = splits > 1 ? (tiles + tiles_per_split - 1) / tiles_per_split : 1;
  const int rows_per_split = splits > 1 ? tiles_per_split * kTileRows : a.max_selected;
  // A token's splits as one cluster where they are few enough (fewer splits of more tiles each
  // measured slower than more splits and the merge launch: EP8 rank, batch 1, 32 splits against
  // clusters of 8 or 16 splits, attention.core 0.091 against 0.129 / 0.122 ms over 5 layers).
  if (mla_splits_clustered(a, splits)) {
    mla_attention_wgmma_specialized(a, stream, rows_per_split, splits, nullptr);
    return;
  }
  const int64_t partials_needed = int64_t{launch_tokens} * splits * a.num_heads * (kLatent + 2);
  GLMS_CHECK(splits == 1 || (partials && partials_needed <= partial_elements),
             "mla_attention_wgmma: splits need partials of launch_tokens x splits x heads x (latent + 2) floats");
  // bf16 rows go to the warp-specialised kernel, split or not (EP8 rank, 5 layers, decode batch 64
  // at 2k: attention.core 0.388 -> 0.317 ms in 2 splits; batch 1 and 8 the same either way).
  if (a.storage == CacheStorage::kBf16 && a.warp_specialized) {
    mla_attention_wgmma_specialized(a, stream, rows_per_split, splits, partials);
    if (splits > 1) mla_merge_splits(a, launch_tokens, splits, partials, stream);
    return;
  }
  auto launch = [&](auto kernel, int shared_bytes) {
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, shared_bytes),
          "cudaFuncSetAttribute(mla_wgmma_kernel)");
    launch_chained("mla_wgmma launch", kernel, dim3(launch_tokens, splits), kThreads, shared_bytes, stream, a,
                   rows_per_split, splits, partials);
  };
  if (a.storage == CacheStorage::kFp8)
    launch(mla_wgmma_kernel<CacheStorage::kFp8>, shared_bytes_of(CacheStorage::kFp8));
  else
    launch(mla_wgmma_kernel<CacheStorage::kBf16>, shared_bytes_of(CacheStorage::kBf16));
  if (splits > 1) mla_merge_splits(a, launch_tokens, splits, partials, stream);
}

}  // namespace glms::ops::cuda
