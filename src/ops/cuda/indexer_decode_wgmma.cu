// The DSA indexer's decode scores on Hopper's warpgroup tensor cores, for GLM-5's indexer (32
// heads of 128), fused with the relu, the head weights and the sum over heads.
//
// Why this shape: indexer_scores keeps each key's 32 dot products in one thread's registers and
// makes 4096 fp32 FMAs a key, which bounds it by the FMA rate, not by the 256 bytes (or 132 in
// FP8) it reads a key: at 16k context a batch of 128 spent 2.5 ms of a 13.5 ms step on it (GLM-5.2
// width, 5 layers). A decode token has keys of its own sequence, so a block takes one token and a
// share of its context: its 32 queries (bf16) are wgmma's B operand, and 64 keys at a time, read
// through the token's block table by cp.async three tiles ahead, are the A operand of one
// m64n32k16 per 16 dims. A thread's accumulators are 8 heads of 2 keys; it weights and sums them,
// two shuffles over the quad finish the 32 heads, and only [token, key] scores leave the SM.
// FP8 keys come as codes, which bf16 holds exactly: they are widened without their scale, and a
// key's scale multiplies its sum (relu and the positive scale commute).
//
// Shared memory (128-byte swizzle, wgmma.cuh): queries [2 blocks of 64 dims][32 heads] 8 KB;
// key stages [3][2 blocks of 64 dims][64 keys] 48 KB (FP8: codes stages [3][64 keys x 128 B]
// and one bf16 stage); the stages' slots [3][64] int32, the weights [32] fp32. Small, so that
// several blocks share an SM and cover each other's waits.
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

constexpr int kThreads = 128;  // one warpgroup
constexpr int kHeads = 32, kDim = 128, kKeys = 64, kStages = 3;
constexpr int kLine = wgmma::kLineBytes;
constexpr int kQueryBlockBytes = kHeads * kLine;     // 64 dims of the 32 heads
constexpr int kQueryBytes = 2 * kQueryBlockBytes;    // 8192
constexpr int kKeyBlockBytes = kKeys * kLine;        // 64 dims of a tile's keys
constexpr int kKeyStageBytes = 2 * kKeyBlockBytes;   // 16384
constexpr int kCodesStageBytes = kKeys * kDim;       // 8192: a tile's FP8 codes, a key a 128-byte row

template <bool kFp8>
constexpr int shared_bytes() {  // 1024: alignment
  return 1024 + kQueryBytes + (kFp8 ? kKeyStageBytes + kStages * kCodesStageBytes : kStages * kKeyStageBytes) +
         kStages * kKeys * 4 + kHeads * 4;
}
static_assert(shared_bytes<false>() <= 60 * 1024 && shared_bytes<true>() <= 60 * 1024, "three blocks an SM or more");

// Thread (key r, half) widens its 64 codes (`row`) into its column block of a bf16 stage, exactly
// (no scale).
__device__ __forceinline__ void widen_codes(const uint8_t* row, uint8_t* block, int r) {
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    const uint4 c = *reinterpret_cast<const uint4*>(row + 16 * w);
    const uint2 v0 = e4m3x4_to_bf16x4(c.x, 1.0f), v1 = e4m3x4_to_bf16x4(c.y, 1.0f);
    const uint2 v2 = e4m3x4_to_bf16x4(c.z, 1.0f), v3 = e4m3x4_to_bf16x4(c.w, 1.0f);
    *reinterpret_cast<uint4*>(block + swizzled(r, 2 * w)) = make_uint4(v0.x, v0.y, v1.x, v1.y);
    *reinterpret_cast<uint4*>(block + swizzled(r, 2 * w + 1)) = make_uint4(v2.x, v2.y, v3.x, v3.y);
  }
}

// acc[4 n + e] = the dot product of key row0 + 8 (e / 2) of the stage at `keys` with head
// 8 n + 2 tq + e % 2's query (wgmma's accumulator layout), waited for.
__device__ __forceinline__ void score_keys(float (&acc)[16], uint32_t keys, uint32_t queries) {
#pragma unroll
  for (int i = 0; i < 16; ++i) acc[i] = 0.0f;
  wgmma::pin(acc);
  wgmma::fence();
#pragma unroll
  for (int kk = 0; kk < kDim / 16; ++kk) {
    const uint32_t column = (kk / 4) * kKeyBlockBytes + (kk % 4) * 32;
    wgmma::m64n32k16(acc, descriptor(keys + column, 16, 1024),
                     descriptor(queries + (kk / 4) * kQueryBlockBytes + (kk % 4) * 32, 16, 1024), 1);
  }
  wgmma::commit();
  wgmma::wait_all();
  wgmma::pin(acc);
}

// Each of this thread's two keys' sum over the 32 heads of relu(score) times the head's weight,
// the quad's four lanes' parts added (every lane of the quad holds both sums).
__device__ __forceinline__ void weighted_head_sums(const float (&acc)[16], const float* weights, int tq,
                                                   float (&sum)[2]) {
  sum[0] = sum[1] = 0.0f;
#pragma unroll
  for (int n = 0; n < 4; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) sum[e / 2] += fmaxf(acc[4 * n + e], 0.0f) * weights[8 * n + 2 * tq + e % 2];
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    sum[k] += __shfl_xor_sync(0xffffffffu, sum[k], 1);
    sum[k] += __shfl_xor_sync(0xffffffffu, sum[k], 2);
  }
}

// Grid (launched token, share of its key tiles: blockIdx.y, + gridDim.y, ...).
template <bool kFp8>
__global__ void __launch_bounds__(kThreads) indexer_decode_wgmma_kernel(IndexerScoreArgs a) {
  chained_grid_prologue();
  extern __shared__ __align__(16) uint8_t shared_raw[];
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(shared_raw));
  const uint32_t pad = (1024u - (raw & 1023u)) & 1023u;
  uint8_t* const base = shared_raw + pad;
  const uint32_t queries = raw + pad, stages = queries + kQueryBytes;
  // bf16: the ring of key stages; FP8: one bf16 stage, then the ring of codes stages.
  const uint32_t codes = stages + (kFp8 ? kKeyStageBytes : 0);
  const int ring_bytes = kFp8 ? kCodesStageBytes : kKeyStageBytes;
  int32_t* const slots = reinterpret_cast<int32_t*>(base + kQueryBytes + (kFp8 ? kKeyStageBytes : 0) + kStages * ring_bytes);
  float* const weights = reinterpret_cast<float*>(slots + kStages * kKeys);

  const int t = a.first_token + blockIdx.x, causal = a.positions[t] + 1;
  if (causal <= a.top_k) return;
  const int32_t* blocks = a.block_tables + static_cast<int64_t>(a.token_sequence[t]) * a.max_blocks;

  // The token's queries as bf16 lines (rotated first where asked, as rope_rows rotates), and the
  // head weights times both scales.
  const float position = static_cast<float>(a.positions[t]);
  for (int e = threadIdx.x; e < kHeads * kDim / 8; e += kThreads) {
    const int head = e / (kDim / 8), chunk = e % (kDim / 8);
    const float* from = a.queries + (static_cast<int64_t>(t) * kHeads + head) * kDim + 8 * chunk;
    float values[8];
    *reinterpret_cast<float4*>(values) = *reinterpret_cast<const float4*>(from);
    *reinterpret_cast<float4*>(values + 4) = *reinterpret_cast<const float4*>(from + 4);
    if (a.rope_inv_freq && 8 * chunk < a.rope_dim)
#pragma unroll
      for (int i = 0; i < 4; ++i) rotate_pair(values + 2 * i, a.rope_inv_freq[4 * chunk + i] * position);
    *reinterpret_cast<uint4*>(base + (chunk / 8) * kQueryBlockBytes + swizzled(head, chunk % 8)) = bf16x8_of(values);
  }
  if (threadIdx.x < kHeads)
    weights[threadIdx.x] = a.head_weights[static_cast<int64_t>(t) * kHeads + threadIdx.x] * a.head_scale * a.softmax_scale;

  // Tile `tile` of this block's share into ring stage `stage`: two threads a key, each half of
  // its row (bf16: one 64-dim column block; FP8: 64 codes); keys past the context are zeros.
  const int step = gridDim.y * kKeys;
  auto load_tile = [&](int tile, int stage) {
    const int r = threadIdx.x / 2, half = threadIdx.x % 2, j = blockIdx.y * kKeys + tile * step + r;
    const int32_t slot = j < causal ? blocks[j / a.block_size] * a.block_size + j % a.block_size : -1;
    if (half == 0) slots[stage * kKeys + r] = slot;
    const int bytes = slot >= 0 ? 16 : 0;
    if constexpr (kFp8) {
      const uint8_t* src = static_cast<const uint8_t*>(a.key_cache) + (slot >= 0 ? int64_t{slot} * kDim : 0) + 64 * half;
      const uint32_t dst = codes + stage * kCodesStageBytes + r * kDim + 64 * half;
#pragma unroll
      for (int c = 0; c < 4; ++c) wgmma::copy_async_16(dst + 16 * c, src + 16 * c, bytes);
    } else {
      const uint16_t* src = static_cast<const uint16_t*>(a.key_cache) + (slot >= 0 ? int64_t{slot} * kDim : 0) + 64 * half;
      const uint32_t dst = stages + stage * kKeyStageBytes + half * kKeyBlockBytes;
#pragma unroll
      for (int c = 0; c < 8; ++c) wgmma::copy_async_16(dst + swizzled(r, c), src + 8 * c, bytes);
    }
    wgmma::copy_async_commit();
  };
  const int tiles = max(0, (causal - static_cast<int>(blockIdx.y) * kKeys + step - 1) / step);  // this block's
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < tiles) load_tile(s, s);
    else wgmma::copy_async_commit();  // an empty group keeps the count of pending groups
  }

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;
  const int row0 = 16 * warp + g;  // this thread's keys in a tile: row0 and row0 + 8
  for (int tile = 0; tile < tiles; ++tile) {
    const int stage = tile % kStages;
    if (tile + kStages - 1 < tiles) load_tile(tile + kStages - 1, (tile + kStages - 1) % kStages);
    else wgmma::copy_async_commit();
    wgmma::copy_async_wait<kStages - 1>();  // this tile's group has landed
    wgmma::fence_async_proxy();
    __syncthreads();  // every thread's copies of it (and the queries, the slots) are in
    uint32_t keys = stages + stage * kKeyStageBytes;
    if constexpr (kFp8) {
      // Thread (key r, half) widens its 64 codes into its column block, exactly (no scale).
      const int r = threadIdx.x / 2, half = threadIdx.x % 2;
      widen_codes(base + kQueryBytes + kKeyStageBytes + stage * kCodesStageBytes + r * kDim + 64 * half,
                  base + kQueryBytes + half * kKeyBlockBytes, r);
      keys = stages;
      wgmma::fence_async_proxy();
      __syncthreads();  // the widened stage is whole
    }
    // The scales of this thread's keys, read while the tensor cores work.
    const int32_t slot0 = slots[stage * kKeys + row0], slot1 = slots[stage * kKeys + row0 + 8];
    float scale0 = 1.0f, scale1 = 1.0f;
    if constexpr (kFp8) {
      scale0 = slot0 >= 0 ? a.key_scales[slot0] : 0.0f;
      scale1 = slot1 >= 0 ? a.key_scales[slot1] : 0.0f;
    }

    float acc[16], sum[2];
    score_keys(acc, keys, queries);
    weighted_head_sums(acc, weights, tq, sum);
    const int j = blockIdx.y * kKeys + tile * step + row0 + 8 * tq;
    if (tq < 2 && j < causal) a.scores[static_cast<int64_t>(t) * a.score_stride + j] = tq == 0 ? sum[0] * scale0 : sum[1] * scale1;
    __syncthreads();  // every warp is done with this stage before a later tile's copies reuse it
  }
  wgmma::copy_async_wait<0>();
}

}  // namespace

bool indexer_scores_decode_wgmma_supported(int heads, int dim) { return heads == kHeads && dim == kDim; }

void indexer_scores_decode_wgmma(const IndexerScoreArgs& a, cudaStream_t stream) {
  const int launch_tokens = a.launch_tokens < 0 ? a.num_tokens - a.first_token : a.launch_tokens;
  if (launch_tokens <= 0 || a.max_context <= a.top_k) return;
  GLMS_CHECK(indexer_scores_decode_wgmma_supported(a.heads, a.dim), "indexer_scores_decode_wgmma: 32 heads of 128");
  GLMS_CHECK(!a.rope_inv_freq || (a.rope_dim % 8 == 0 && a.rope_dim <= kDim),
             "indexer_scores_decode_wgmma: a rope over whole chunks of 8 values");
  // Each block at least one tile of the longest context, and about four blocks an SM in all; or
  // with decode_one_wave as many as fit the SMs at once (three an SM with bf16 keys), so that no
  // second, part-filled wave follows.
  const int tiles = (a.max_context + kKeys - 1) / kKeys;
  auto launch = [&](auto kernel, int bytes) {
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
          "indexer_decode_wgmma shared memory");
    int resident = 4;
    if (a.decode_one_wave)
      check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, kThreads, bytes),
            "indexer_decode_wgmma occupancy");
    const int slots = std::max(resident, 1) * multiprocessor_count();
    const int shares =
        std::clamp(a.decode_one_wave ? slots / launch_tokens : (slots + launch_tokens - 1) / launch_tokens, 1, tiles);
    launch_chained("indexer_decode_wgmma launch", kernel, dim3(launch_tokens, shares), kThreads, bytes, stream, a);
  };
  if (a.key_scales) launch(indexer_decode_wgmma_kernel<true>, shared_bytes<true>());
  else launch(indexer_decode_wgmma_kernel<false>, shared_bytes<false>());
}

}  // namespace glms::ops::cuda
