// The un-absorption of MLA's attention output for an FP8 o_proj, warp-specialised: each head's
// latent sums times its value rows of kv_b_proj, written straight as the E4M3 rows o_proj's
// block-FP8 GEMM reads (Fp8Rows), for GLM-5's shapes (latent 512, v_head 256).
//
// Why this kernel: with cuBLAS the heads left as bf16 [T, H * 256] (268 MB at 8192 tokens) and a
// pass of their own read them back to quantise them. Here each block keeps half of one head's
// value rows in shared memory (128 rows x all 512 latent columns, copied once) and streams that
// head's token rows past them: a step of 64 k reads 16 KB of a 128-row tile's token rows, where a
// tile of the same rows against all 256 value rows read 48 KB, the value rows again every tile.
// The 128 value rows are one 128-column scale block of every output row, so a 64-row tile's
// sums are quantised within one consumer's accumulator.
//
// Block: warpgroups 0 and 1 multiply rows 64 c .. of each 128-row token tile of the block's share
// (m64n128k16, a 64 x 128 fp32 accumulator each); warpgroup 2's thread 0 copies the value rows,
// then the tiles' token rows by TMA into one ring, 64 latent columns a stage, as deep as the
// value rows leave room for. The epilogue (each sum rounded to bf16, as the bf16 heads were, and
// each row quantised as quantize_fp8_rows does) of one tile runs a row at a time between the next
// tile's steps, beside its products (docs/performance.md, "The un-absorption with a head's value
// rows held", has why).
//
// Shared memory (1024-aligned, wgmma's 128-byte swizzle):
//   values [8 steps of 64 k][128 rows] lines             128 KB
//   ring   [kRingStages][128 rows] lines of 64 k         16 KB a stage
//   barriers: values_full, then the ring's full and empty ones
#include <cuda_runtime.h>

#include <algorithm>

#include "core/error.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/fp8.cuh"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/linear_fp8.h"
#include "ops/cuda/mla.h"
#include "ops/cuda/pipeline.cuh"
#include "ops/cuda/tensor_map.h"
#include "ops/cuda/wgmma.cuh"

namespace glms::ops::cuda {

namespace {

constexpr int kLatent = 512, kValue = 256;
constexpr int kStepK = 64, kSteps = kLatent / kStepK;
constexpr int kConsumers = 2, kConsumerThreads = 128 * kConsumers, kThreads = kConsumerThreads + 128;
constexpr int kLine = wgmma::kLineBytes;
constexpr int kHalf = 128;      // value rows a block keeps
constexpr int kTileRows = 128;  // a tile's token rows: 64 a consumer
constexpr int kRingStages = 6;
constexpr int kValueStepBytes = kHalf * kLine;         // 16 KB
constexpr int kValueBytes = kSteps * kValueStepBytes;  // 128 KB
constexpr int kTokenStageBytes = kTileRows * kLine;    // 16 KB
constexpr int kRingBytes = kRingStages * kTokenStageBytes;
constexpr int kBarrierBytes = 8 * (1 + 2 * kRingStages);
constexpr int kSharedBytes = 1024 + kValueBytes + kRingBytes + kBarrierBytes;
static_assert(kSharedBytes <= 232448, "one block an SM");
constexpr int kEntryRegisters = 65536 / kThreads / 8 * 8;  // 168
constexpr int kConsumerRegisters = 232, kProducerRegisters = 40;
static_assert(kConsumerThreads * (kConsumerRegisters - kEntryRegisters) <= 128 * (kEntryRegisters - kProducerRegisters),
              "the consumers' registers come from the producer's");
static_assert(kValue == 2 * kHalf && kHalf == kFp8ScaleBlock && kHalf == kLine,
              "a block's value rows are one scale block of a row: one 128-byte line of codes");

// A block's share: value rows half * 128 .. of head `head`, token tiles [first_tile, end_tile).
struct Share {
  int head, half, first_tile, end_tile;
};
// Blocks 2 * heads * chunks: block b takes (head, half) pair b % (2 heads) and chunk b / (2 heads)
// of the tiles, so that both halves of a head read its token rows at about the same time.
__device__ __forceinline__ Share share_of(int block, int heads, int tiles, int chunks) {
  const int pairs = 2 * heads, chunk = block / pairs, pair = block % pairs;
  const int per_chunk = (tiles + chunks - 1) / chunks;
  return {pair / 2, pair % 2, chunk * per_chunk, min(tiles, (chunk + 1) * per_chunk)};
}

// Thread 0 of the producer warpgroup: the share's token tiles into the ring, 64 latent columns a
// stage, each stage once both consumers have handed it back.
__device__ __forceinline__ void produce_tokens(const CUtensorMap& tokens, const Share& share, uint32_t ring,
                                               uint32_t full, uint32_t empty) {
  int count = 0;  // stages issued
  for (int tile = share.first_tile; tile < share.end_tile; ++tile)
    for (int step = 0; step < kSteps; ++step, ++count) {
      const int stage = count % kRingStages;
      pipeline::barrier_wait(empty + 8 * stage, ((count / kRingStages) & 1) ^ 1);  // the first round passes
      pipeline::barrier_arrive_expect_bytes(full + 8 * stage, kTokenStageBytes);
      pipeline::tensor_copy_2d(ring + stage * kTokenStageBytes, &tokens, share.head * kLatent + step * kStepK,
                               tile * kTileRows, full + 8 * stage);
    }
}

// Row q (0: the thread's row 16 warp + g, 1: that + 8) of a consumer's 64 x 128 sums `acc`, rows
// from row0: acc[4 j + 2 q + e] holds value column 128 half + 8 j + 2 tq + e of that row. Its 32
// sums rounded to bf16, the row's largest magnitude over its quad of lanes (two shuffles that
// every lane joins), then the codes and (lane tq 0) the scale. Rows from fp8_padded_tokens(T) on
// are not stored; rows T .. of it are the pad rows (zero sums: codes 0, scale 1).
template <int q>
__device__ __forceinline__ void store_row(const float (&acc)[64], Fp8Rows out, int64_t padded, int row0,
                                          const Share& share, int heads) {
  const int u = threadIdx.x % 128, warp = u / 32, g = u % 32 / 4, tq = u % 4;
  const int64_t t = row0 + 16 * warp + g + 8 * q;
  float v[16][2], amax = 0.0f;
#pragma unroll
  for (int j = 0; j < 16; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      v[j][e] = bf16_to_float(float_to_bf16(acc[4 * j + 2 * q + e]));
      amax = fmaxf(amax, fabsf(v[j][e]));
    }
  const float scale = activation_scale_over_lanes<4>(amax);
  if (t >= padded) return;
  uint8_t* const codes = out.codes + t * heads * kValue + share.head * kValue + share.half * kHalf + 2 * tq;
#pragma unroll
  for (int j = 0; j < 16; ++j)
    *reinterpret_cast<uint16_t*>(codes + 8 * j) =
        static_cast<uint16_t>(e4m3_of(v[j][0], scale) | e4m3_of(v[j][1], scale) << 8);
  if (tq == 0) out.scales[(2 * share.head + share.half) * padded + t] = scale;
}

// A consumer's place: its ring and value rows, the ring's stages before its tile, and the first
// row of the tile before it, whose sums wait for their codes (last_row0 < 0: none).
struct TileRun {
  uint32_t ring, values, full, empty;
  int consumer, count, last_row0;
};

// Consumer c's product of rows 64 c .. of a tile (its first stage the ring's `count`-th) into acc,
// one step's wgmma in flight while the next is issued, each stage handed back once its products
// are done; the last tile's codes (`last`, its rows from last_row0) are written a row at a time
// between the steps, so that the epilogue runs beside the tensor cores rather than after them.
__device__ __forceinline__ void multiply_tile(float (&acc)[64], const float (&last)[64], const TileRun& run,
                                              Fp8Rows out, int64_t padded, const Share& share, int heads) {
  const uint64_t token_descriptor = wgmma::descriptor(run.ring + run.consumer * 64 * kLine, 16, 1024);
  const uint64_t value_descriptor = wgmma::descriptor(run.values, 16, 1024);
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
  int count = run.count;
  for (int step = 0; step < kSteps; ++step, ++count) {
    const int stage = count % kRingStages;
    pipeline::barrier_wait(run.full + 8 * stage, (count / kRingStages) & 1);
    wgmma::pin(acc);
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < kStepK / 16; ++kk)
      wgmma::m64n128k16<0>(acc, wgmma::descriptor_advanced(token_descriptor, stage * kTokenStageBytes + kk * 32),
                           wgmma::descriptor_advanced(value_descriptor, step * kValueStepBytes + kk * 32));
    wgmma::commit();
    if (run.last_row0 >= 0 && step == 1) store_row<0>(last, out, padded, run.last_row0, share, heads);
    if (run.last_row0 >= 0 && step == 4) store_row<1>(last, out, padded, run.last_row0, share, heads);
    wgmma::wait<1>();
    wgmma::pin(acc);
    if (step > 0) pipeline::release_stage<false>(run.empty + 8 * ((count - 1) % kRingStages));
  }
  wgmma::wait_all();
  wgmma::pin(acc);
  pipeline::release_stage<false>(run.empty + 8 * ((count - 1) % kRingStages));
}

// tokens: o [T, heads * 512] bf16 in boxes of 128 rows; values: the value rows, head h's 256 from
// row h * head_rows, in boxes of 128. `tiles` 128-row tiles of the padded rows, in `chunks`.
__global__ void __launch_bounds__(kThreads, 1)
    mla_unabsorb_fp8_kernel(const __grid_constant__ CUtensorMap tokens, const __grid_constant__ CUtensorMap values,
                            int tiles, int chunks, int heads, int head_rows, Fp8Rows out, int64_t padded) {
  chained_grid_prologue();
  extern __shared__ __align__(16) uint8_t shared_raw[];
  const uint32_t values_at = wgmma::align_to_1024(shared_raw).address, ring = values_at + kValueBytes;
  const uint32_t values_full = ring + kRingBytes, full = values_full + 8, empty = full + 8 * kRingStages;
  if (threadIdx.x == 0) {
    pipeline::barrier_init(values_full, 1);
    for (int s = 0; s < kRingStages; ++s) {
      pipeline::barrier_init(full + 8 * s, 1);
      pipeline::barrier_init(empty + 8 * s, kConsumerThreads);
    }
    pipeline::barrier_init_fence();
  }
  __syncthreads();
  const Share share = share_of(static_cast<int>(blockIdx.x), heads, tiles, chunks);
  // Broadcast from lane 0: the compiler then knows each warp takes one side of the branch.
  const int warpgroup = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / 128, 0);
  if (warpgroup == kConsumers) {
    pipeline::shrink_registers<kProducerRegisters>();
    if (threadIdx.x != kConsumerThreads) return;
    pipeline::barrier_arrive_expect_bytes(values_full, kValueBytes);
    for (int step = 0; step < kSteps; ++step)
      pipeline::tensor_copy_2d(values_at + step * kValueStepBytes, &values, step * kStepK,
                               share.head * head_rows + share.half * kHalf, values_full);
    produce_tokens(tokens, share, ring, full, empty);
    return;
  }
  pipeline::grow_registers<kConsumerRegisters>();
  pipeline::barrier_wait(values_full, 0);
  // The sums of the tile in the tensor cores, and the last tile's, whose codes are written while
  // the next tile's products run (copied out after its products are waited for, so that no
  // register the epilogue reads is a wgmma's destination).
  float acc[64], last[64];
  TileRun run{ring, values_at, full, empty, warpgroup, 0, -1};
  for (int tile = share.first_tile; tile < share.end_tile; ++tile, run.count += kSteps) {
    multiply_tile(acc, last, run, out, padded, share, heads);
#pragma unroll
    for (int i = 0; i < 64; ++i) last[i] = acc[i];
    run.last_row0 = tile * kTileRows + 64 * warpgroup;
  }
  if (run.last_row0 >= 0) {
    store_row<0>(last, out, padded, run.last_row0, share, heads);
    store_row<1>(last, out, padded, run.last_row0, share, heads);
  }
}

}  // namespace

bool mla_unabsorb_fp8_supported(int64_t latent, int64_t v_dim) { return latent == kLatent && v_dim == kValue; }

void mla_unabsorb_fp8(const uint16_t* o, int64_t T, int heads, const uint16_t* w_uv, int64_t head_rows, Fp8Rows out,
                      cudaStream_t stream) {
  if (T <= 0 || heads <= 0) return;
  GLMS_CHECK(out.codes && out.scales && head_rows >= kValue, "mla_unabsorb_fp8: E4M3 rows and whole heads");
  const int64_t padded = fp8_padded_tokens(T);
  GLMS_CHECK(padded + kTileRows < (int64_t{1} << 31), "mla_unabsorb_fp8: too many tokens");
  const CUtensorMap tokens = swizzled_rows_tensor_map(o, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, T, int64_t{heads} * kLatent,
                                                      kTileRows);
  const CUtensorMap values = swizzled_rows_tensor_map(w_uv, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                                                      (heads - 1) * head_rows + kValue, kLatent, kHalf);
  check(cudaFuncSetAttribute(mla_unabsorb_fp8_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSharedBytes),
        "mla_unabsorb_fp8 shared memory");
  // One wave where the heads leave SMs over: each (head, half) pair's tiles split into chunks.
  const int64_t tiles = (padded + kTileRows - 1) / kTileRows, pairs = 2 * int64_t{heads};
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(tiles, multiprocessor_count() / pairs));
  GLMS_CHECK(pairs * chunks < (int64_t{1} << 31), "mla_unabsorb_fp8: too many heads");
  launch_chained("mla_unabsorb_fp8 launch", mla_unabsorb_fp8_kernel, static_cast<unsigned>(pairs * chunks), kThreads,
                 kSharedBytes, stream, tokens, values, static_cast<int>(tiles), static_cast<int>(chunks), heads,
                 static_cast<int>(head_rows), out, padded);
}

}  // namespace glms::ops::cuda
