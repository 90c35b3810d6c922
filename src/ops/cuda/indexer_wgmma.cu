// The DSA indexer's prefill scores on Hopper's warpgroup tensor cores, fused with the relu, the
// head weights and the sum over heads, for GLM-5's shapes (32 heads of 128).
//
// Why this shape: the GEMM path (indexer_scores_gemm) writes every (token, head, key) product to
// global memory and reads it back to reduce over heads: 4 bytes x 32 heads per score, which made
// the indexer a sixth of a long prefill. Here a block takes 8 tokens, their 256 (token, head)
// query rows in shared memory as bf16, and streams the sequence's keys (gathered once as bf16)
// through shared memory 128 at a time, the next tile by cp.async while the tensor cores score
// this one: warpgroup w computes S[64 keys, 256 (token, head)] for keys 64 w .. of the tile
// as two halves of 128 (token, head) lines (wgmma m64n128k16, keys as A so that a thread's
// accumulator row is one key and its columns run over heads), each its own commit group, so that
// the tensor cores multiply one half while the threads sum the other. Each thread weights and
// sums its 8 heads of each token in registers, two shuffles over the quad finish the 32, and only
// [token, key] scores leave the SM.
//
// With E4M3 operands (DeepSeek-V3.2's FP8 indexer) each query row is rounded to E4M3 with a
// scale of its own (amax / 448) and each key with one (as the FP8 cache stores it: its codes are
// read as they are; a bf16 cache's keys are rounded when they are gathered), wgmma m64n128k32
// multiplies the codes, the query scales go into the head weights and each key's scale
// multiplies its summed score (relu(s x) = s relu(x) for s >= 0).
//
// Shared memory (128-byte swizzle, wgmma.cuh), bf16 (E4M3: one block of 128 dims a line):
//   queries [2 blocks of 64 dims][256 lines: token * 32 + head]   65536 B (32768)
//   keys    [2 stages][2 blocks of 64 dims][128 keys]              65536 B (32768)
//   weights [8 tokens][4 lanes][4][2] fp32 (a lane's 8 heads of a token together)  1024 B
//   query scales [256 lines] fp32 (E4M3 only)                      1024 B
#include <cuda_runtime.h>

#include <algorithm>

#include "core/error.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/fp8.cuh"
#include "ops/cuda/indexer.h"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/wgmma.cuh"

namespace glms::ops::cuda {

namespace {

using wgmma::descriptor;
using wgmma::swizzled;

constexpr int kThreads = 256;  // two warpgroups
constexpr int kHeads = 32, kDim = 128, kTokens = 8, kKeys = 128;
constexpr int kLine = wgmma::kLineBytes;
constexpr int kQueryLines = kTokens * kHeads;                // 256: wgmma's N
constexpr int kQueryBlockBytes = kQueryLines * kLine;        // a line of every query row
constexpr int kKeyBlockBytes = kKeys * kLine;                // a line of a tile's keys
constexpr int kWeightBytes = kTokens * kHeads * 4;           // 1024

// The shared-memory plan by operand type: a 128-byte line holds 64 bf16 or 128 E4M3 dims.
template <bool kFp8>
struct Operands {
  static constexpr int kBlocks = kFp8 ? 1 : 2;  // lines a row
  static constexpr int kQueryBytes = kBlocks * kQueryBlockBytes;
  static constexpr int kKeyStageBytes = kBlocks * kKeyBlockBytes;
  static constexpr int kQueryScaleBytes = kFp8 ? kQueryLines * 4 : 0;
  static constexpr int kSharedBytes =
      1024 + kQueryBytes + 2 * kKeyStageBytes + kWeightBytes + kQueryScaleBytes;  // 1024: alignment
  static_assert(kSharedBytes <= 232448, "one block an SM");
};

// out[j, :] = the key of position j as bf16: 16 threads a key, 16 bytes out each (FP8 keys:
// eight codes times the key's scale, rounded to bf16).
__global__ void gather_keys_bf16_kernel(const void* key_cache, const float* key_scales, const int32_t* block_table,
                                        int block_size, int context, uint16_t* out) {
  chained_grid_prologue();
  const int j = blockIdx.x * 16 + threadIdx.x / 16, chunk = threadIdx.x % 16;
  if (j >= context) return;
  const int64_t slot = static_cast<int64_t>(block_table[j / block_size]) * block_size + j % block_size;
  uint4* dst = reinterpret_cast<uint4*>(out + static_cast<int64_t>(j) * kDim) + chunk;
  if (key_scales) {
    const uint2 codes = reinterpret_cast<const uint2*>(static_cast<const uint8_t*>(key_cache) + slot * kDim)[chunk];
    const float scale = key_scales[slot];
    const uint2 lo = e4m3x4_to_bf16x4(codes.x, scale), hi = e4m3x4_to_bf16x4(codes.y, scale);
    *dst = make_uint4(lo.x, lo.y, hi.x, hi.y);
  } else {
    *dst = reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(key_cache) + slot * kDim)[chunk];
  }
}

// codes[j, :] and scales[j] = the key of position j as E4M3 with one scale: 16 threads a key,
// eight codes each. FP8 cache keys are copied as they are; bf16 keys are rounded as the FP8
// cache rounds its keys (amax / 448; a key of zeros gets scale 0 and zero codes).
__global__ void gather_keys_fp8_kernel(const void* key_cache, const float* key_scales, const int32_t* block_table,
                                       int block_size, int context, uint8_t* codes, float* scales) {
  chained_grid_prologue();
  const int j = blockIdx.x * 16 + threadIdx.x / 16, chunk = threadIdx.x % 16;
  const bool valid = j < context;  // every lane takes part in the shuffles
  const int64_t slot =
      valid ? static_cast<int64_t>(block_table[j / block_size]) * block_size + j % block_size : 0;
  uint2* dst = reinterpret_cast<uint2*>(codes + static_cast<int64_t>(j) * kDim) + chunk;
  if (key_scales) {
    if (!valid) return;
    *dst = reinterpret_cast<const uint2*>(static_cast<const uint8_t*>(key_cache) + slot * kDim)[chunk];
    if (chunk == 0) scales[j] = key_scales[slot];
    return;
  }
  float v[8] = {};
  if (valid) {
    const uint4 bf16 = reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(key_cache) + slot * kDim)[chunk];
    const uint32_t words[4] = {bf16.x, bf16.y, bf16.z, bf16.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[2 * i] = __uint_as_float(words[i] << 16);
      v[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
    }
  }
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(v[i]));
#pragma unroll
  for (int offset = 8; offset > 0; offset /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
  if (!valid) return;
  const float scale = e4m3_scale_of(amax);
  uint32_t packed[2] = {0, 0};
#pragma unroll
  for (int i = 0; i < 8; ++i)
    packed[i / 4] |= static_cast<uint32_t>(scale > 0.0f ? e4m3_of(v[i], scale) : 0) << (8 * (i % 4));
  *dst = make_uint2(packed[0], packed[1]);
  if (chunk == 0) scales[j] = scale;
}

// The block's tokens token0 .. token0 + tokens - 1 into shared memory: their queries as bf16, or
// as E4M3 with a scale a (token, head) line into query_scales ([kQueryLines]; a warp a line, four
// values a lane), into the swizzled query lines at queries_generic (tokens past the chunk: zeros);
// and the head weights times the scales (relu(x * s) = s * relu(x) for the positive softmax
// scale, and the query scales) into weights ([kTokens][4][4][2]).
template <bool kFp8>
__device__ __forceinline__ void stage_queries(const IndexerScoreArgs& a, int token0, int tokens,
                                              uint8_t* queries_generic, float* weights, float* query_scales) {
  if constexpr (kFp8) {
    for (int line = threadIdx.x / 32; line < kQueryLines; line += kThreads / 32) {
      const int lane = threadIdx.x % 32, i = line / kHeads;
      float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (i < tokens)
        v = *reinterpret_cast<const float4*>(a.queries + (static_cast<int64_t>(token0) * kHeads + line) * kDim + 4 * lane);
      const float scale = e4m3_scale_of(warp_max(fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)))));
      const uint32_t packed =
          scale > 0.0f ? static_cast<uint32_t>(e4m3_of(v.x, scale)) | static_cast<uint32_t>(e4m3_of(v.y, scale)) << 8 |
                             static_cast<uint32_t>(e4m3_of(v.z, scale)) << 16 |
                             static_cast<uint32_t>(e4m3_of(v.w, scale)) << 24
                       : 0u;
      *reinterpret_cast<uint32_t*>(queries_generic + swizzled(line, lane / 4) + 4 * (lane % 4)) = packed;
      if (lane == 0) query_scales[line] = scale;
    }
    __syncthreads();  // the query scales are in
  } else {
    for (int e = threadIdx.x; e < kQueryLines * kDim / 8; e += kThreads) {
      const int line = e / (kDim / 8), chunk = e % (kDim / 8), i = line / kHeads;
      uint4 packed = make_uint4(0, 0, 0, 0);
      if (i < tokens) packed = bf16x8_of(a.queries + (static_cast<int64_t>(token0) * kHeads + line) * kDim + 8 * chunk);
      *reinterpret_cast<uint4*>(queries_generic + (chunk / 8) * kQueryBlockBytes + swizzled(line, chunk % 8)) = packed;
    }
  }
  if (threadIdx.x < kTokens * kHeads) {
    const int i = threadIdx.x / kHeads, h = threadIdx.x % kHeads;
    // Head h = 8 q + 2 lane + b sits at weights[i][lane][q][b].
    const int lane = (h % 8) / 2, q = h / 8, b = h % 2;
    const float query_scale = kFp8 ? query_scales[threadIdx.x] : 1.0f;
    weights[((i * 4 + lane) * 4 + q) * 2 + b] =
        i < tokens ? a.head_weights[static_cast<int64_t>(token0 + i) * kHeads + h] * a.head_scale * a.softmax_scale *
                         query_scale
                   : 0.0f;
  }
}

// The scores of a tile's 64 keys of this warpgroup (key 64 wg + 16 warp + g + 8 (e / 2) of the
// tile at j0) for half h of the block's tokens (4 h .. 4 h + 3): acc[4 n + e] holds query line
// 128 h + 8 n + 2 tq + e % 2. Relu, the head weights and the sum over each token's 32 heads (8 a
// thread, then the quad), written where the token scores that key (times its scale, E4M3 keys).
template <bool kFp8>
__device__ __forceinline__ void store_half_scores(const IndexerScoreArgs& a, const float (&acc)[64], int h, int token0,
                                                  int tokens, int j0, int context, const float* weights,
                                                  const float* key_scales) {
  const int u = threadIdx.x % 128, wg = threadIdx.x / 128, warp = u / 32, g = u % 32 / 4, tq = u % 4;
#pragma unroll
  for (int li = 0; li < kTokens / 2; ++li) {
    const int i = kTokens / 2 * h + li;  // token i's heads: this half's registers n = 4 li .. 4 li + 3
    const float4 w_lo = *reinterpret_cast<const float4*>(weights + (i * 4 + tq) * 8);
    const float4 w_hi = *reinterpret_cast<const float4*>(weights + (i * 4 + tq) * 8 + 4);
    const float w[8] = {w_lo.x, w_lo.y, w_lo.z, w_lo.w, w_hi.x, w_hi.y, w_hi.z, w_hi.w};
    float sum[2] = {0.0f, 0.0f};  // keys g and g + 8 of this warp's rows
#pragma unroll
    for (int q = 0; q < 4; ++q)
#pragma unroll
      for (int e = 0; e < 4; ++e) sum[e / 2] += fmaxf(acc[4 * (4 * li + q) + e], 0.0f) * w[2 * q + e % 2];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      sum[k] += __shfl_xor_sync(0xffffffffu, sum[k], 1);
      sum[k] += __shfl_xor_sync(0xffffffffu, sum[k], 2);
    }
    // Lane tq of the quad writes key g (tq 0) or g + 8 (tq 1) for this token.
    if (tq < 2 && i < tokens) {
      const int t = token0 + i, causal = a.positions[t] + 1;
      const int j = j0 + 64 * wg + 16 * warp + g + 8 * tq;
      if (causal > a.top_k && j < causal && j < context)
        a.scores[static_cast<int64_t>(t) * a.score_stride + j] = (tq == 0 ? sum[0] : sum[1]) * (kFp8 ? key_scales[j] : 1.0f);
    }
  }
}

// S[this warpgroup's 64 keys of the tile in `stage`, the 128 query lines of token half h] into
// acc, one commit group (wgmma m64n128: keys as A, so that a thread's accumulator row is a key).
template <bool kFp8>
__device__ __forceinline__ void score_half(float (&acc)[64], uint32_t stage, uint32_t queries, int h) {
  const int wg = threadIdx.x / 128;
  constexpr uint32_t kHalfLines = kQueryLines / 2 * kLine;  // the offset of half 1's query lines
  wgmma::fence();  // the epilogue read acc
  if constexpr (kFp8) {
#pragma unroll
    for (int kk = 0; kk < kDim / 32; ++kk)  // 32 dims (bytes) a step along the one line
      wgmma::m64n128k32_e4m3(acc, descriptor(stage + wg * 64 * kLine + 32 * kk, 16, 1024),
                             descriptor(queries + h * kHalfLines + 32 * kk, 16, 1024), kk > 0);
  } else {
#pragma unroll
    for (int kk = 0; kk < kDim / 16; ++kk) {
      const uint32_t column = (kk % 4) * 32;  // 16 dims a step inside the 64-dim block
      wgmma::m64n128k16<0>(acc, descriptor(stage + (kk / 4) * kKeyBlockBytes + wg * 64 * kLine + column, 16, 1024),
                           descriptor(queries + (kk / 4) * kQueryBlockBytes + h * kHalfLines + column, 16, 1024),
                           kk > 0);
    }
  }
  wgmma::commit();
}

// Block (8 tokens of the chunk, key tiles blockIdx.y, + gridDim.y, ...); keys: [context, 128]
// bf16, or E4M3 codes with key_scales [context] (kFp8). The token groups go out last first: the
// latest tokens score the most keys, and a causal chunk's longest blocks launched last left SMs
// idle behind them. A tile's scores are two halves of the tokens, each its own accumulators and
// commit group, so that the tensor cores multiply one half while the threads weight and sum the
// other: half 0 of tile n + 1 is issued before half 1 of tile n is summed.
template <bool kFp8>
__global__ void __launch_bounds__(kThreads, 1) indexer_wgmma_kernel(IndexerScoreArgs a, int first, int count,
                                                                    int context, const void* keys,
                                                                    const float* key_scales) {
  chained_grid_prologue();
  using O = Operands<kFp8>;
  constexpr int kQueryBytes = O::kQueryBytes, kKeyStageBytes = O::kKeyStageBytes;
  extern __shared__ __align__(16) uint8_t shared_raw[];
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(shared_raw));
  const uint32_t pad = (1024u - (raw & 1023u)) & 1023u;
  const uint32_t queries = raw + pad, key_stages = queries + kQueryBytes;
  uint8_t* const queries_generic = shared_raw + pad;
  float* const weights = reinterpret_cast<float*>(shared_raw + pad + kQueryBytes + 2 * kKeyStageBytes);
  float* const query_scales = weights + kTokens * kHeads;  // kFp8

  const int token0 = first + (gridDim.x - 1 - blockIdx.x) * kTokens, tokens = min(kTokens, first + count - token0);
  // Keys to score: the block's longest causal extent, none where every token selects all.
  int extent = 0;
  for (int i = 0; i < tokens; ++i) {
    const int causal = a.positions[token0 + i] + 1;
    if (causal > a.top_k) extent = max(extent, min(causal, context));
  }
  int j0 = blockIdx.y * kKeys;
  if (j0 >= extent) return;

  // A key is kRowBytes: 16-byte chunk `chunk` of key r goes to line block chunk / 8.
  constexpr int kRowBytes = kFp8 ? kDim : 2 * kDim, kChunks = kRowBytes / 16;
  const uint8_t* const key_bytes = static_cast<const uint8_t*>(keys);
  auto load_keys = [&](int tile_j0, uint32_t stage) {
    for (int e = threadIdx.x; e < kKeys * kChunks; e += kThreads) {
      const int r = e / kChunks, chunk = e % kChunks, j = tile_j0 + r;
      wgmma::copy_async_16(stage + (chunk / 8) * kKeyBlockBytes + swizzled(r, chunk % 8),
                           j < extent ? key_bytes + static_cast<int64_t>(j) * kRowBytes + 16 * chunk : key_bytes,
                           j < extent ? 16 : 0);
    }
    wgmma::copy_async_commit();
  };
  const int step = gridDim.y * kKeys;
  load_keys(j0, key_stages);  // the first tile's keys land while the queries are staged
  stage_queries<kFp8>(a, token0, tokens, queries_generic, weights, query_scales);
  wgmma::copy_async_wait<0>();
  wgmma::fence_async_proxy();
  __syncthreads();  // the first tile, the queries and the weights are in
  if (j0 + step < extent) load_keys(j0 + step, key_stages + kKeyStageBytes);

  float acc[2][64];  // token half h's scores of this warpgroup's keys (store_half_scores)
  score_half<kFp8>(acc[0], key_stages, queries, 0);
  score_half<kFp8>(acc[1], key_stages, queries, 1);
  for (int it = 0;; ++it, j0 += step) {
    wgmma::wait<1>();
    wgmma::pin(acc[0]);
    store_half_scores<kFp8>(a, acc[0], 0, token0, tokens, j0, context, weights, key_scales);
    wgmma::wait<0>();
    wgmma::pin(acc[1]);
    const bool more = j0 + step < extent;  // the same in every thread of the block
    const uint32_t next = key_stages + ((it + 1) & 1) * kKeyStageBytes;
    // Half 1's sums in each branch: after a join ptxas waits for the half issued in one of them.
    if (!more) {
      store_half_scores<kFp8>(a, acc[1], 1, token0, tokens, j0, context, weights, key_scales);
      break;
    }
    wgmma::copy_async_wait<0>();
    wgmma::fence_async_proxy();
    __syncthreads();  // the next tile is in; every warpgroup is done with this tile's stage
    if (j0 + 2 * step < extent) load_keys(j0 + 2 * step, key_stages + (it & 1) * kKeyStageBytes);
    score_half<kFp8>(acc[0], next, queries, 0);
    store_half_scores<kFp8>(a, acc[1], 1, token0, tokens, j0, context, weights, key_scales);
    score_half<kFp8>(acc[1], next, queries, 1);
  }
}

}  // namespace

bool indexer_scores_wgmma_supported(int heads, int dim) { return heads == kHeads && dim == kDim; }

void indexer_scores_wgmma(const IndexerScoreArgs& a, const int32_t* block_table, int context,
                          const IndexerGemmWorkspace& w, cudaStream_t stream, bool fp8_operands) {
  const int launch_tokens = a.launch_tokens < 0 ? a.num_tokens - a.first_token : a.launch_tokens;
  if (launch_tokens <= 0 || context <= a.top_k) return;
  GLMS_CHECK(indexer_scores_wgmma_supported(a.heads, a.dim), "indexer_scores_wgmma: 32 heads of 128");
  // The fp32 gather buffer ([context, 128] floats) holds the bf16 keys, or the E4M3 codes and
  // then (16-byte aligned) their scales.
  void* keys = w.keys;
  float* key_scales = nullptr;
  const int gather_blocks = (context + 15) / 16;
  if (fp8_operands) {
    key_scales = reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(w.keys) + (int64_t{context} * kDim + 15) / 16 * 16);
    launch_chained("gather_keys_fp8 launch", gather_keys_fp8_kernel, gather_blocks, 256, 0, stream, a.key_cache,
                   a.key_scales, block_table, a.block_size, context, static_cast<uint8_t*>(keys), key_scales);
  } else {
    launch_chained("gather_keys_bf16 launch", gather_keys_bf16_kernel, gather_blocks, 256, 0, stream, a.key_cache,
                   a.key_scales, block_table, a.block_size, context, static_cast<uint16_t*>(keys));
  }
  // Key tiles split over blockIdx.y until there are about two blocks an SM.
  const int token_blocks = (launch_tokens + kTokens - 1) / kTokens, key_tiles = (context + kKeys - 1) / kKeys;
  const int splits = std::clamp(2 * multiprocessor_count() / token_blocks, 1, key_tiles);
  auto launch = [&](auto* kernel, int shared_bytes) {
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, shared_bytes),
          "indexer_wgmma shared memory");
    launch_chained("indexer_wgmma launch", kernel, dim3(token_blocks, splits), kThreads, shared_bytes, stream, a,
                   a.first_token, launch_tokens, context, keys, key_scales);
  };
  if (fp8_operands) launch(indexer_wgmma_kernel<true>, Operands<true>::kSharedBytes);
  else launch(indexer_wgmma_kernel<false>, Operands<false>::kSharedBytes);
}

}  // namespace glms::ops::cuda
