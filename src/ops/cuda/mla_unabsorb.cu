// The un-absorption of MLA's attention output for an FP8 o_proj, warp-specialised: each head's
// latent sums times its value rows of kv_b_proj, written straight as the E4M3 rows o_proj's
// block-FP8 GEMM reads (Fp8Rows), for GLM-5's shapes (latent 512, v_head 256).
//
// Why this kernel: with cuBLAS the heads left as bf16 [T, H * 256] (268 MB at 8192 tokens) and a
// pass of their own read them back to quantise them (0.26 ms a layer on an H100 beside the
// GEMM's 0.30). Here a block takes 128 token rows of one head against its 256 value rows, so
// each row's two 128-column scale blocks lie in one consumer's accumulator: the epilogue rounds
// each sum to bf16 (as the bf16 heads were) and quantises it as quantize_fp8_rows does.
//
// Block: warpgroups 0 and 1 multiply rows 64 c .. of a tile (m64n256k16, a 64 x 256 fp32
// accumulator each), warpgroup 2's thread 0 copies by TMA. A tile's K (latent 512) is only 8
// steps of 64, so a block takes one tile after another (as many blocks as SMs), its ring running
// on into the next tile while the consumers store the last one's codes. kStages stages of:
//   tokens [128 rows] lines of 64 k       16 KB (rows past T: TMA's zeros)
//   values [256 rows] lines of 64 k       32 KB
// then the stages' full and empty barriers.
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
constexpr int kRows = 128, kStepK = 64, kSteps = kLatent / kStepK;
constexpr int kConsumerThreads = 256, kThreads = kConsumerThreads + 128;
constexpr int kLine = wgmma::kLineBytes;
constexpr int kTokenBytes = kRows * kLine;    // 16 KB
constexpr int kValueBytes = kValue * kLine;   // 32 KB
constexpr int kStageBytes = kTokenBytes + kValueBytes;
constexpr int kStages = 4;
constexpr int kSharedBytes = 1024 + kStages * kStageBytes + 2 * kStages * 8;  // 1024: alignment
static_assert(kSharedBytes <= 232448, "one block an SM");
constexpr int kEntryRegisters = 65536 / kThreads / 8 * 8;  // 168
constexpr int kConsumerRegisters = 232, kProducerRegisters = 40;
static_assert(kConsumerThreads * (kConsumerRegisters - kEntryRegisters) <= 128 * (kEntryRegisters - kProducerRegisters),
              "the consumers' registers come from the producer's");
static_assert(kValue == 2 * kFp8ScaleBlock, "a head's 256 outputs are two scale blocks");

// A block's items (persistent: item b, b + gridDim.x, ..), head-major so that the blocks running
// at once share a head's value rows in L2: item i is head i / tiles, row tile i % tiles.
struct Item {
  int row0, head;
};
__device__ __forceinline__ Item item_of(int i, int tiles) { return {i % tiles * kRows, i / tiles}; }

// Thread 0 of the producer warpgroup: each item's steps of 64 latent columns of its token rows and
// of its head's value rows into the ring, a stage once its consumers have handed it back (so the
// next item's first stages land while the consumers store the last one's codes).
__device__ __forceinline__ void produce(const CUtensorMap& tokens, const CUtensorMap& values, int items, int tiles,
                                        int head_rows, uint32_t stages, uint32_t full, uint32_t empty) {
  int count = 0;  // steps issued, over every item
  for (int i = static_cast<int>(blockIdx.x); i < items; i += static_cast<int>(gridDim.x)) {
    const Item item = item_of(i, tiles);
    for (int step = 0; step < kSteps; ++step, ++count) {
      const int stage = count % kStages;
      pipeline::barrier_wait(empty + 8 * stage, ((count / kStages) & 1) ^ 1);  // the first round passes
      const uint32_t at = stages + stage * kStageBytes;
      pipeline::barrier_arrive_expect_bytes(full + 8 * stage, kStageBytes);
      pipeline::tensor_copy_2d(at, &tokens, item.head * kLatent + step * kStepK, item.row0, full + 8 * stage);
      pipeline::tensor_copy_2d(at + kTokenBytes, &values, step * kStepK, item.head * head_rows, full + 8 * stage);
    }
  }
}

// Consumer c's steps of one item (`count`: the ring's steps before it): rows 64 c .. of the tile
// against the 256 value rows, one step's wgmma in flight while the next is issued, each stage
// handed back once its products are done (the item's last once they all are).
__device__ __forceinline__ void multiply(float (&acc)[128], uint32_t stages, uint32_t full, uint32_t empty,
                                         int consumer, int count) {
  const uint64_t token_descriptor = wgmma::descriptor(stages + 64 * consumer * kLine, 16, 1024);
  const uint64_t value_descriptor = wgmma::descriptor(stages + kTokenBytes, 16, 1024);
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] = 0.0f;
  for (int step = 0; step < kSteps; ++step, ++count) {
    const int stage = count % kStages;
    pipeline::barrier_wait(full + 8 * stage, (count / kStages) & 1);
    wgmma::pin(acc);
    wgmma::fence();
    const uint32_t at = stage * kStageBytes;
#pragma unroll
    for (int kk = 0; kk < kStepK / 16; ++kk)
      wgmma::m64n256k16<0>(acc, wgmma::descriptor_advanced(token_descriptor, at + kk * 32),
                           wgmma::descriptor_advanced(value_descriptor, at + kk * 32));
    wgmma::commit();
    wgmma::wait<1>();
    wgmma::pin(acc);
    if (step > 0) pipeline::release_stage<false>(empty + 8 * ((count - 1) % kStages));
  }
  wgmma::wait_all();
  wgmma::pin(acc);
  pipeline::release_stage<false>(empty + 8 * ((count - 1) % kStages));
}

// acc[4 j + e] of thread (warp, g, tq): tile row 64 c + 16 warp + g + 8 (e / 2), value column
// 8 j + 2 tq + e % 2. Each of the thread's two rows and two scale blocks (j < 16, j >= 16): its
// 32 sums rounded to bf16, the block's largest magnitude over the row's quad of lanes (two
// shuffles that every lane joins), then the codes and (lane tq 0) the scale. Rows from
// fp8_padded_tokens(T) on are not stored; rows T .. of it are the pad rows (zero sums: codes 0,
// scale 1).
__device__ __forceinline__ void store_codes(const float (&acc)[128], Fp8Rows out, int64_t padded, int row0,
                                            int head, int heads, int consumer) {
  const int u = threadIdx.x % 128, warp = u / 32, g = u % 32 / 4, tq = u % 4;
#pragma unroll
  for (int q = 0; q < 2; ++q) {
    const int64_t t = row0 + 64 * consumer + 16 * warp + g + 8 * q;
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      float v[16][2], amax = 0.0f;
#pragma unroll
      for (int j = 0; j < 16; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          v[j][e] = bf16_to_float(float_to_bf16(acc[4 * (16 * b + j) + 2 * q + e]));
          amax = fmaxf(amax, fabsf(v[j][e]));
        }
      const float scale = activation_scale_over_lanes<4>(amax);
      if (t >= padded) continue;
      uint8_t* const codes = out.codes + t * heads * kValue + head * kValue + b * kFp8ScaleBlock + 2 * tq;
#pragma unroll
      for (int j = 0; j < 16; ++j)
        *reinterpret_cast<uint16_t*>(codes + 8 * j) =
            static_cast<uint16_t>(e4m3_of(v[j][0], scale) | e4m3_of(v[j][1], scale) << 8);
      if (tq == 0) out.scales[(2 * head + b) * padded + t] = scale;
    }
  }
}

// Items: `tiles` row tiles of fp8_padded_tokens(T) = padded rows for each of `heads` heads, a
// block taking every gridDim.x-th. tokens: o [T, heads * 512] bf16 in boxes of 128 rows; values:
// the value rows, head h's 256 from row h * head_rows, in boxes of 256.
__global__ void __launch_bounds__(kThreads, 1)
    mla_unabsorb_fp8_kernel(const __grid_constant__ CUtensorMap tokens, const __grid_constant__ CUtensorMap values,
                            int tiles, int heads, int head_rows, Fp8Rows out, int64_t padded) {
  chained_grid_prologue();
  extern __shared__ __align__(16) uint8_t shared_raw[];
  const wgmma::AlignedShared aligned = wgmma::align_to_1024(shared_raw);
  const uint32_t stages = aligned.address;
  const uint32_t full = stages + kStages * kStageBytes, empty = full + 8 * kStages;
  // Full: thread 0's announcement of the TMA bytes. Empty: each consumer thread once.
  pipeline::init_ring<kStages, false>(full, empty, 1, kConsumerThreads);
  const int items = tiles * heads;
  // Broadcast from lane 0: the compiler then knows each warp takes one side of the branch.
  const int warpgroup = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / 128, 0);
  if (warpgroup == 2) {
    pipeline::shrink_registers<kProducerRegisters>();
    if (threadIdx.x == 256) produce(tokens, values, items, tiles, head_rows, stages, full, empty);
    return;
  }
  pipeline::grow_registers<kConsumerRegisters>();
  float acc[128];
  int count = 0;
  for (int i = static_cast<int>(blockIdx.x); i < items; i += static_cast<int>(gridDim.x), count += kSteps) {
    const Item item = item_of(i, tiles);
    multiply(acc, stages, full, empty, warpgroup, count);
    store_codes(acc, out, padded, item.row0, item.head, heads, warpgroup);
  }
}

}  // namespace

bool mla_unabsorb_fp8_supported(int64_t latent, int64_t v_dim) { return latent == kLatent && v_dim == kValue; }

void mla_unabsorb_fp8(const uint16_t* o, int64_t T, int heads, const uint16_t* w_uv, int64_t head_rows, Fp8Rows out,
                      cudaStream_t stream) {
  if (T <= 0 || heads <= 0) return;
  GLMS_CHECK(out.codes && out.scales && head_rows >= kValue, "mla_unabsorb_fp8: E4M3 rows and whole heads");
  const int64_t padded = fp8_padded_tokens(T);
  GLMS_CHECK(T < (int64_t{1} << 31), "mla_unabsorb_fp8: too many tokens");
  const CUtensorMap tokens = swizzled_rows_tensor_map(o, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, T, int64_t{heads} * kLatent,
                                                      kRows);
  const CUtensorMap values = swizzled_rows_tensor_map(w_uv, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                                                      (heads - 1) * head_rows + kValue, kLatent, kValue);
  check(cudaFuncSetAttribute(mla_unabsorb_fp8_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSharedBytes),
        "mla_unabsorb_fp8 shared memory");
  const int64_t tiles = (padded + kRows - 1) / kRows, items = tiles * heads;
  GLMS_CHECK(items < (int64_t{1} << 31), "mla_unabsorb_fp8: too many tokens and heads");
  const auto blocks = static_cast<unsigned>(std::min<int64_t>(items, multiprocessor_count()));
  launch_chained("mla_unabsorb_fp8 launch", mla_unabsorb_fp8_kernel, blocks, kThreads, kSharedBytes, stream, tokens,
                 values, static_cast<int>(tiles), heads, static_cast<int>(head_rows), out, padded);
}

}  // namespace glms::ops::cuda
