// MLA attention in one pass over each token's selected cache rows, on tensor cores.
//
// Why this shape: the latent cache is shared by all heads (MQA in latent space), so a block
// takes one token and all its heads (up to 64 = four m16 tiles) and reads each selected row
// once for all of them. A block walks a split of the token's selection in tiles of 64 rows:
// the rows are gathered from the paged cache into shared memory, scores S = Q K^T come from
// mma.sync (bf16 in, fp32 sums), an online softmax keeps a running max and sum per head, and
// O += P V reuses the same rows' first `latent` columns as V. Decode batches are small, so the
// selection is split across blocks (about twice as many blocks as SMs) and a second kernel merges
// the splits' (max, sum, unnormalised output). Eight warps: warp w owns heads 16 (w % 4) .. +15;
// for the scores it takes rows 32 (w / 4) .. +31 of the tile, for P V latent columns of half w / 4.
// Queries come staged as padded bf16 rows (MlaAttentionArgs::queries), and rows come
// into shared memory by cp.async from cache offsets resolved a tile ahead, so that a block waits
// for memory once per tile rather than once per load.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/fp8.cuh"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/mla.h"

namespace glms::ops::cuda {

namespace {

constexpr int kHeadTile = 64;   // heads per block (zero queries pad fewer heads)
constexpr int kRowTile = 64;    // selected rows per tile
constexpr int kThreads = 256;   // eight warps
constexpr int kMaxLatent = 512;
constexpr int kMaxRow = 576;    // latent + rope
constexpr int kMaxColTiles = kMaxLatent / 16;  // n8 tiles per warp's half of the latent columns
constexpr int kProbStride = kRowTile + 8;      // bf16 elements per row of P in shared memory

// Shared-memory row stride (bf16 elements) for rows padded to whole k16 steps; the extra 8
// elements shift consecutive rows by four banks, so fragment loads do not conflict.
__host__ __device__ inline int padded_stride(int row) { return (row + 15) / 16 * 16 + 8; }

__host__ __device__ inline size_t shared_bytes(int row) {
  const size_t stride = static_cast<size_t>(padded_stride(row));
  return sizeof(uint16_t) * ((kHeadTile + kRowTile) * stride + kHeadTile * kProbStride) + sizeof(float) * 4 * kHeadTile;
}

__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 16 bytes global -> shared without passing through registers; src_bytes 0 writes zeros.
__device__ __forceinline__ void copy_async_16(void* shared, const void* global, int src_bytes) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(global), "r"(src_bytes));
}
__device__ __forceinline__ void copy_async_wait_all() {
  asm volatile("cp.async.commit_group;\n" ::);
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

// Four 8x8 bf16 matrices from shared memory, lane l giving the address of row l % 8 of matrix
// l / 8 (16 contiguous bytes). Plain: lane l receives (row l / 4, columns 2 (l % 4), +1) of each
// matrix, an mma A or B fragment register; transposed: (rows 2 (l % 4), +1, column l / 4).
__device__ __forceinline__ void load_matrices(uint32_t (&r)[4], const uint16_t* row_address) {
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(row_address));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}
__device__ __forceinline__ void load_matrices_transposed(uint32_t (&r)[4], const uint16_t* row_address) {
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(row_address));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}
__device__ __forceinline__ uint32_t pack_pair(uint16_t low, uint16_t high) {
  return static_cast<uint32_t>(low) | (static_cast<uint32_t>(high) << 16);
}

// A block's shared memory: the staged queries, the tile's rows, P and the two halves' per-head
// statistics; and a thread's place: warp w owns heads 16 (w % 4) .. +15 (head_tile) and, for the
// scores, rows 32 (w / 4) .. +31 of a tile, for P V latent columns of half w / 4.
struct FusedTile {
  uint16_t* queries;  // [64 heads, stride] bf16, pre-scaled
  uint16_t* rows;     // [64 rows, stride] bf16 cache rows
  uint16_t* probs;    // [64 heads, 72] bf16 exp(s - max)
  float* max_part;    // [2][64]
  float* sum_part;    // [2][64]
  int row, stride, k_steps, chunks;  // row: latent + rope; chunks: 16-byte pieces of a staged row
  int lane, g, tq, head_tile, half;
  int col_tiles, col_base;  // n8 tiles in this warp's half of the latent columns, its first column

  __device__ FusedTile(uint4* shared_raw, int latent, int rope) {
    row = latent + rope;
    stride = padded_stride(row);
    k_steps = (row + 15) / 16;
    chunks = k_steps * 2;
    queries = reinterpret_cast<uint16_t*>(shared_raw);
    rows = queries + kHeadTile * stride;
    probs = rows + kRowTile * stride;
    max_part = reinterpret_cast<float*>(probs + kHeadTile * kProbStride);
    sum_part = max_part + 2 * kHeadTile;
    const int warp = threadIdx.x / 32;
    lane = threadIdx.x % 32;
    g = lane / 4;
    tq = lane % 4;
    head_tile = warp % 4;
    half = warp / 4;
    col_tiles = (latent + 15) / 16;
    col_base = half * col_tiles * 8;
  }
  // Head of the tile this thread's fragment row h (0: g, 1: g + 8) holds.
  __device__ int head(int h) const { return head_tile * 16 + g + 8 * h; }
};

// The token's staged queries [H, 16 k_steps] into shared memory by cp.async; heads past H are
// zeros. Waited for with the first tile's rows.
__device__ __forceinline__ void stage_token_queries(const FusedTile& s, const uint16_t* token_queries, int H) {
  const int width = s.k_steps * 16;
  for (int e = threadIdx.x; e < kHeadTile * s.chunks; e += kThreads) {
    const int h = e / s.chunks, c = e % s.chunks;
    copy_async_16(s.queries + h * s.stride + c * 8, token_queries + (h < H ? h * width + c * 8 : 0), h < H ? 16 : 0);
  }
}

// Where a tile's rows come from: the cache in its storage, each row's offset in row_units (-1:
// past the selection, zeros). FP8 rows are widened value by value (this kernel serves shapes
// other than GLM-5's; the wgmma pass reads FP8 rows at speed); bf16 rows starting on 16-byte
// boundaries go by cp.async.
struct TileSource {
  const void* cache;
  bool fp8, vector_rows;
  int latent;
};

// The tile's 64 rows (offsets in row_start) into shared memory, padded with zeros to whole k16
// steps; cp.async copies are left in flight.
__device__ __forceinline__ void gather_tile_rows(const FusedTile& s, const TileSource& src, const int64_t* row_start) {
  const uint16_t* bf16_cache = static_cast<const uint16_t*>(src.cache);
  const uint8_t* fp8_cache = static_cast<const uint8_t*>(src.cache);
  for (int e = threadIdx.x; e < kRowTile * s.chunks; e += kThreads) {
    const int r = e / s.chunks, c = e % s.chunks;
    const int64_t start = row_start[r];
    uint16_t* dst = s.rows + r * s.stride + c * 8;
    if (src.vector_rows) {
      const bool live = start >= 0 && c * 8 < s.row;
      copy_async_16(dst, bf16_cache + (live ? start + c * 8 : 0), live ? 16 : 0);
    } else {
      uint16_t parts[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const int column = c * 8 + k;
        parts[k] = start < 0 || column >= s.row ? 0
                   : src.fp8                    ? float_to_bf16(fp8_row_value(fp8_cache + start, column, src.latent))
                                                : bf16_cache[start + column];
      }
      *reinterpret_cast<uint4*>(dst) = make_uint4(pack_pair(parts[0], parts[1]), pack_pair(parts[2], parts[3]),
                                                  pack_pair(parts[4], parts[5]), pack_pair(parts[6], parts[7]));
    }
  }
}

// S[16 heads, 32 rows] of this warp. A fragments: matrices (heads 0-7 | 8-15) x (k 0-7 | 8-15);
// B fragments of two n8 tiles per load: (rows 0-7 | 8-15 of the pair) x (k 0-7 | 8-15).
__device__ __forceinline__ void warp_scores(const FusedTile& s, float (&score)[4][4]) {
  const int lane = s.lane;
  const uint16_t* q_rows = s.queries + (s.head_tile * 16 + (lane / 8 % 2) * 8 + lane % 8) * s.stride + lane / 16 * 8;
  const uint16_t* k_rows = s.rows + (s.half * 32 + lane / 16 * 8 + lane % 8) * s.stride + lane / 8 % 2 * 8;
  for (int ks = 0; ks < s.k_steps; ++ks) {
    uint32_t q[4];
    load_matrices(q, q_rows + ks * 16);
#pragma unroll
    for (int pair = 0; pair < 2; ++pair) {
      uint32_t k[4];
      load_matrices(k, k_rows + pair * 16 * s.stride + ks * 16);
      mma_bf16(score[2 * pair], q, k[0], k[1]);
      mma_bf16(score[2 * pair + 1], q, k[2], k[3]);
    }
  }
}

// The online softmax over one tile: rows past the selection (tile + r >= end) get -inf, each
// head's max over the tile (the two halves' through max_part), P = bf16(exp(s - new max)) into
// shared memory and its sums (through sum_part) into the running sum. Returns in `rescale` what
// the output so far is multiplied by. Row `tile` is selected, so every head's new max is finite.
__device__ __forceinline__ void online_softmax_tile(const FusedTile& s, float (&score)[4][4], int tile, int end,
                                                    float (&run_max)[2], float (&run_sum)[2], float (&rescale)[2]) {
  float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int n = 0; n < 4; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = s.half * 32 + n * 8 + 2 * s.tq + (e & 1);
      if (tile + r >= end) score[n][e] = -INFINITY;
      tile_max[e / 2] = fmaxf(tile_max[e / 2], score[n][e]);
    }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 1));
    tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 2));
    if (s.tq == 0) s.max_part[s.half * kHeadTile + s.head(h)] = tile_max[h];
  }
  __syncthreads();
  float new_max[2], tile_sum[2] = {0.0f, 0.0f};
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    new_max[h] = fmaxf(run_max[h], fmaxf(s.max_part[s.head(h)], s.max_part[kHeadTile + s.head(h)]));
    rescale[h] = run_max[h] == -INFINITY ? 0.0f : __expf(run_max[h] - new_max[h]);
  }
#pragma unroll
  for (int n = 0; n < 4; ++n)
#pragma unroll
    for (int e = 0; e < 4; e += 2) {
      const int h = e / 2;
      const uint16_t p0 = float_to_bf16(__expf(score[n][e] - new_max[h]));
      const uint16_t p1 = float_to_bf16(__expf(score[n][e + 1] - new_max[h]));
      tile_sum[h] += bf16_to_float(p0) + bf16_to_float(p1);
      const int r = s.half * 32 + n * 8 + 2 * s.tq;
      *reinterpret_cast<uint32_t*>(s.probs + s.head(h) * kProbStride + r) = pack_pair(p0, p1);
    }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    tile_sum[h] += __shfl_xor_sync(0xffffffffu, tile_sum[h], 1);
    tile_sum[h] += __shfl_xor_sync(0xffffffffu, tile_sum[h], 2);
    if (s.tq == 0) s.sum_part[s.half * kHeadTile + s.head(h)] = tile_sum[h];
  }
  __syncthreads();
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    run_sum[h] = run_sum[h] * rescale[h] + s.sum_part[s.head(h)] + s.sum_part[kHeadTile + s.head(h)];
    run_max[h] = new_max[h];
  }
}

// O[16 heads, this half's columns] = O * rescale + P V. A: P as the scores' A; B transposed from
// the rows: (rows k 0-7 | 8-15) x (columns of n8 tile n | n + 1). An odd last tile loads one tile
// past it, inside the padded row, and leaves it unused.
__device__ __forceinline__ void accumulate_pv(const FusedTile& s, float (&out)[kMaxColTiles][4],
                                              const float (&rescale)[2]) {
#pragma unroll
  for (int n = 0; n < kMaxColTiles; ++n) {
    out[n][0] *= rescale[0];
    out[n][1] *= rescale[0];
    out[n][2] *= rescale[1];
    out[n][3] *= rescale[1];
  }
  const int lane = s.lane;
  const uint16_t* p_rows = s.probs + (s.head_tile * 16 + (lane / 8 % 2) * 8 + lane % 8) * kProbStride + lane / 16 * 8;
  const uint16_t* v_rows = s.rows + (lane / 8 % 2 * 8 + lane % 8) * s.stride + s.col_base + lane / 16 * 8;
#pragma unroll
  for (int ks = 0; ks < kRowTile / 16; ++ks) {
    uint32_t p[4];
    load_matrices(p, p_rows + ks * 16);
#pragma unroll
    for (int n = 0; n < kMaxColTiles; n += 2) {
      if (n >= s.col_tiles) break;
      uint32_t v[4];
      load_matrices_transposed(v, v_rows + ks * 16 * s.stride + n * 8);
      mma_bf16(out[n], p, v[0], v[1]);
      if (n + 1 < s.col_tiles) mma_bf16(out[n + 1], p, v[2], v[3]);
    }
  }
}

// The thread's outputs (heads head(h), columns col_base + 8 n + 2 tq (+ 1)): with one split the
// normalised bf16 output of token t; otherwise the unnormalised sums into partials at (i, split)
// and each head's (max, sum) after every split's sums.
__device__ __forceinline__ void store_split_output(const FusedTile& s, const MlaAttentionArgs& a, int t, int i,
                                                   int split, int splits, float* partials,
                                                   const float (&out)[kMaxColTiles][4], const float (&run_max)[2],
                                                   const float (&run_sum)[2]) {
  const int H = a.num_heads, L = a.latent_dim;
  const int64_t split_elements = static_cast<int64_t>(H) * L;
  uint16_t* const token_out = a.out + static_cast<int64_t>(t) * split_elements;
  float* const split_sums = partials + (static_cast<int64_t>(i) * splits + split) * split_elements;
  auto put = [&](int64_t e, float v) {
    if (splits == 1) token_out[e] = float_to_bf16(v);
    else split_sums[e] = v;
  };
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int head = s.head(h);
    if (head >= H) continue;
    const float norm = splits == 1 ? (run_sum[h] > 0.0f ? 1.0f / run_sum[h] : 0.0f) : 1.0f;
#pragma unroll
    for (int n = 0; n < kMaxColTiles; ++n) {
      if (n >= s.col_tiles) break;
      const int col = s.col_base + n * 8 + 2 * s.tq;
      if (col < L) put(static_cast<int64_t>(head) * L + col, out[n][2 * h] * norm);
      if (col + 1 < L) put(static_cast<int64_t>(head) * L + col + 1, out[n][2 * h + 1] * norm);
    }
    if (splits > 1 && s.half == 0 && s.tq == 0) {
      float* stats = partials + static_cast<int64_t>(gridDim.x) * splits * split_elements +
                     ((static_cast<int64_t>(i) * splits + split) * H + head) * 2;
      stats[0] = run_max[h];
      stats[1] = run_sum[h];
    }
  }
}

// Grid (token, split). Splits cover `rows_per_split` (a multiple of 64) selected rows each.
// With one split the block writes the normalised output (bf16); otherwise `partials` receives
// [token][split][head][latent] unnormalised sums followed by [token][split][head][2] (max, sum).
__global__ void __launch_bounds__(kThreads, 1)
    mla_fused_kernel(MlaAttentionArgs a, int rows_per_split, int splits, float* partials) {
  chained_grid_prologue();
  extern __shared__ uint4 shared_raw[];
  const FusedTile s(shared_raw, a.latent_dim, a.rope_dim);
  __shared__ int64_t row_start[kRowTile];  // cache offset (row_units) of each of the tile's rows, -1 past the selection

  const int i = blockIdx.x, t = a.first_token + i, split = blockIdx.y;
  const int count = a.num_selected[t];
  const int begin = split * rows_per_split, end = min(count, begin + rows_per_split);
  stage_token_queries(s, a.queries + static_cast<int64_t>(t) * a.num_heads * s.k_steps * 16, a.num_heads);

  float out[kMaxColTiles][4];
#pragma unroll
  for (int n = 0; n < kMaxColTiles; ++n) out[n][0] = out[n][1] = out[n][2] = out[n][3] = 0.0f;
  float run_max[2] = {-INFINITY, -INFINITY}, run_sum[2] = {0.0f, 0.0f};  // heads head(0) and head(1)
  const int32_t* chosen = a.selected + static_cast<int64_t>(t) * a.max_selected;
  const int32_t* blocks = a.block_tables + static_cast<int64_t>(a.token_sequence[t]) * a.max_blocks;
  const bool fp8 = a.storage == CacheStorage::kFp8;
  const TileSource source{a.cache, fp8, !fp8 && s.row % 8 == 0, a.latent_dim};
  const int64_t row_units = fp8 ? quant::kv_fp8_row_bytes(a.latent_dim, a.rope_dim) : s.row;  // bytes or bf16 values

  // Thread r < 64 resolves row r of the next tile while the block works on this one.
  auto resolve = [&](int j) -> int64_t {
    if (j >= end) return -1;
    const int position = chosen[j];
    return (static_cast<int64_t>(blocks[position / a.block_size]) * a.block_size + position % a.block_size) * row_units;
  };
  int64_t next_start = threadIdx.x < kRowTile ? resolve(begin + threadIdx.x) : -1;
  for (int tile = begin; tile < end; tile += kRowTile) {
    __syncthreads();  // the previous tile's readers are done
    if (threadIdx.x < kRowTile) row_start[threadIdx.x] = next_start;
    __syncthreads();
    gather_tile_rows(s, source, row_start);
    if (threadIdx.x < kRowTile) next_start = resolve(tile + kRowTile + threadIdx.x);
    copy_async_wait_all();
    __syncthreads();
    float score[4][4] = {};
    warp_scores(s, score);
    float rescale[2];
    online_softmax_tile(s, score, tile, end, run_max, run_sum, rescale);
    accumulate_pv(s, out, rescale);
  }
  store_split_output(s, a, t, i, split, splits, partials, out, run_max, run_sum);
}

// Block (token, head): out = sum_s e^(m_s - M) O_s / sum_s e^(m_s - M) l_s over the splits that
// saw a selected row (l_s > 0). The splits' weights are worked out by the whole block in shared
// memory (each thread's splits' statistics loaded at once: a thread walking 32 splits' statistics
// one after another was most of a batch-1 merge), so that the column loop's loads are
// independent of each other; with 16-byte rows a thread sums four columns per load, as a
// batch-1 merge reads 32 splits x 128 KB and is bound by how many loads are in flight.
constexpr int kMaxSplits = kMlaMaxSplits;
constexpr int kMergeThreads = 128;
__global__ void __launch_bounds__(kMergeThreads)
    mla_merge_splits_kernel(MlaAttentionArgs a, int launch_tokens, int splits, const float* partials) {
  chained_grid_prologue();
  __shared__ float weight[kMaxSplits];
  __shared__ float scratch[32];
  const int i = blockIdx.x, head = blockIdx.y, H = a.num_heads, L = a.latent_dim;
  const float* stats = partials + static_cast<int64_t>(launch_tokens) * splits * H * L;
  auto stat = [&](int s) { return stats + ((static_cast<int64_t>(i) * splits + s) * H + head) * 2; };
  // Thread j holds splits j + kMergeThreads m, m < kMaxSplits / kMergeThreads.
  constexpr int kPerThread = kMaxSplits / kMergeThreads;
  static_assert(kMaxSplits % kMergeThreads == 0, "whole rounds of splits a thread");
  float top_of[kPerThread], sum_of[kPerThread];
  float top = -INFINITY;
#pragma unroll
  for (int m = 0; m < kPerThread; ++m) {
    const int s = static_cast<int>(threadIdx.x) + kMergeThreads * m;
    const float2 v = s < splits ? make_float2(stat(s)[0], stat(s)[1]) : make_float2(-INFINITY, 0.0f);
    top_of[m] = v.y > 0.0f ? v.x : -INFINITY;
    sum_of[m] = v.y;
    top = fmaxf(top, top_of[m]);
  }
  top = warp_max(top);
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = top;
  __syncthreads();
  top = warp_max(threadIdx.x % 32 < kMergeThreads / 32 ? scratch[threadIdx.x % 32] : -INFINITY);
  float part = 0.0f;
#pragma unroll
  for (int m = 0; m < kPerThread; ++m) {
    const int s = static_cast<int>(threadIdx.x) + kMergeThreads * m;
    const float w = top_of[m] == -INFINITY ? 0.0f : __expf(top_of[m] - top);
    if (s < splits) weight[s] = w;
    part += w * sum_of[m];
  }
  const float total = block_sum(part, scratch);  // synchronises: weight[] is complete
  const float inv_total = total > 0.0f ? 1.0f / total : 0.0f;
  const int64_t split_stride = static_cast<int64_t>(H) * L;
  const float* column0 = partials + (static_cast<int64_t>(i) * splits * H + head) * L;
  uint16_t* dst = a.out + (static_cast<int64_t>(a.first_token + i) * H + head) * L;
  if (L % 4 == 0) {
    for (int k = 4 * threadIdx.x; k < L; k += 4 * blockDim.x) {
      float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 16
      for (int s = 0; s < splits; ++s) {
        const float4 v = *reinterpret_cast<const float4*>(column0 + s * split_stride + k);
        const float w = weight[s];
        sum.x += w * v.x, sum.y += w * v.y, sum.z += w * v.z, sum.w += w * v.w;
      }
      *reinterpret_cast<uint2*>(dst + k) =
          make_uint2(pack_bf16_pair(sum.x * inv_total, sum.y * inv_total),
                     pack_bf16_pair(sum.z * inv_total, sum.w * inv_total));
    }
    return;
  }
  for (int k = threadIdx.x; k < L; k += blockDim.x) {
    float sum = 0.0f;
#pragma unroll 8
    for (int s = 0; s < splits; ++s) sum += weight[s] * column0[s * split_stride + k];
    dst[k] = float_to_bf16(sum * inv_total);
  }
}

// Split counts that count clustered splits as free of the merge only for the ring: its steps
// pipeline within a block, so fewer, longer splits may pay there; with the two-stage kernel they
// measured slower (EP8 rank, batch 1: 32 splits and the merge 1.583 ms, 8 or 16 clustered 1.635
// / 1.656 ms a 5-layer step).
int wgmma_cluster_limit(const MlaAttentionArgs& a) { return a.ring_stages ? mla_cluster_limit(a) : 0; }

}  // namespace

bool mla_attention_fused_supported(int num_heads, int latent_dim, int rope_dim) {
  return num_heads >= 1 && num_heads <= kHeadTile && latent_dim >= 1 && latent_dim <= kMaxLatent && rope_dim >= 0 &&
         latent_dim + rope_dim <= kMaxRow;
}

int mla_padded_row(int latent_dim, int rope_dim) { return (latent_dim + rope_dim + 15) / 16 * 16; }

int mla_wgmma_min_tokens() { return multiprocessor_count(); }

void mla_merge_splits(const MlaAttentionArgs& a, int launch_tokens, int splits, const float* partials,
                      cudaStream_t stream) {
  launch_chained("mla_merge_splits launch", mla_merge_splits_kernel, dim3(launch_tokens, a.num_heads), kMergeThreads, 0,
                 stream, a, launch_tokens, splits, partials);
}

void mla_attention_fused(const MlaAttentionArgs& a, int max_selected_in_step, float* partials,
                         int64_t partial_elements, cudaStream_t stream, bool allow_wgmma, bool allow_wgmma_splits) {
  const int launch_tokens = a.launch_tokens < 0 ? a.num_tokens - a.first_token : a.launch_tokens;
  if (launch_tokens <= 0) return;
  GLMS_CHECK(mla_attention_fused_supported(a.num_heads, a.latent_dim, a.rope_dim),
             "mla_attention_fused: at most 64 heads, latent 512 and latent + rope 576");
  const int rows = std::max(1, max_selected_in_step);
  // About two blocks per SM in all, at least one 64-row tile per split, and partials that fit.
  const int64_t per_split = int64_t{launch_tokens} * a.num_heads * (a.latent_dim + 2);
  int splits = std::clamp((2 * multiprocessor_count() + launch_tokens - 1) / launch_tokens, 1,
                          std::min(kMaxSplits, (rows + kRowTile - 1) / kRowTile));
  splits = static_cast<int>(std::min<int64_t>(splits, partials ? partial_elements / per_split : 1));
  splits = std::max(splits, 1);
  const int rows_per_split = ((rows + splits - 1) / splits + kRowTile - 1) / kRowTile * kRowTile;
  splits = (rows + rows_per_split - 1) / rows_per_split;
  if (allow_wgmma && mla_attention_wgmma_supported(a.num_heads, a.latent_dim, a.rope_dim)) {
    if (allow_wgmma_splits) {
      const int wgmma_splits =
          partials ? mla_wgmma_splits(launch_tokens, rows, a.num_heads, partial_elements, wgmma_cluster_limit(a)) : 1;
      mla_attention_wgmma(a, stream, rows, wgmma_splits, partials, partial_elements);
      return;
    }
    if (splits == 1 || launch_tokens >= mla_wgmma_min_tokens()) {
      mla_attention_wgmma(a, stream);
      return;
    }
  }

  const size_t bytes = shared_bytes(a.latent_dim + a.rope_dim);
  // Per device (each rank's thread has its own), so set on every launch: a host call of a
  // microsecond.
  check(cudaFuncSetAttribute(mla_fused_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(shared_bytes(kMaxRow))),
        "cudaFuncSetAttribute(mla_fused_kernel)");
  launch_chained("mla_fused launch", mla_fused_kernel, dim3(launch_tokens, splits), kThreads, bytes, stream, a,
                 rows_per_split, splits, partials);
  if (splits > 1) mla_merge_splits(a, launch_tokens, splits, partials, stream);
}

}  // namespace glms::ops::cuda
