// Routed experts of prefill-sized batches with MXFP4 weights on Hopper's warpgroup tensor cores
// (W4A16): each projection is one grouped GEMM over the plan's grouped pairs, the weights
// widened to bf16 in shared memory, block scale included (exact: an E2M1 value times a power of
// two), the tokens bf16, fp32 sums. SwiGLU runs in the gate/up epilogue, so the gate and up sums
// never leave the SM.
//
// Why this shape: a block takes 64 grouped rows of one expert (wgmma's M) and 256 output
// features, 128 per warpgroup (N), and walks K in steps of 128 values, one 64-byte group of
// quant/mxfp4_tiles.h's layout a weight row. While the tensor cores multiply step s, the
// threads widen step s + 1's weights from registers into the other stage and load step s + 2's
// codes, and cp.async brings step s + 1's token rows: widening (about 2.5 integer and bf16 ops a
// weight) hides behind the wgmma of 64 tokens. The mma.sync kernels (moe_experts_mma.cu) widen
// in registers for every 8-token tile instead, and the bf16 fallback widened whole experts to
// global memory for cuBLAS.
//
// Shared memory (128-byte swizzle, wgmma.cuh), two stages of
//   tokens  [2 blocks of 64 k][64 rows] lines        16384 B
//   weights [2 blocks of 64 k][256 features] lines   65536 B
// For the gate/up projection warpgroup 0 takes 128 gate rows and warpgroup 1 the matching up
// rows, which hands its sums to warpgroup 0 through shared memory at the end.
//
// Each block finds its tile from plan.offsets (experts' row tiles in expert order), so the
// launch depends only on the pair count and needs no host copy (graph-capturable).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "core/error.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/moe.h"
#include "ops/cuda/wgmma.cuh"
#include "quant/mxfp4_tiles.h"

namespace glms::ops::cuda {

namespace {

using wgmma::descriptor;
using wgmma::swizzled;

constexpr int kThreads = 256;  // two warpgroups
constexpr int kTileRows = 64;
constexpr int kStepValues = quant::kMxfp4TileValues;  // 128 k a step
constexpr int kStepBytes = kStepValues / 2;            // a weight row's codes in a step
constexpr int kGroupFeatures = 128;                    // a warpgroup's N
constexpr int kLine = wgmma::kLineBytes;
constexpr int kTokenBlockBytes = kTileRows * kLine;                 // 64 k of 64 rows
constexpr int kTokenStageBytes = 2 * kTokenBlockBytes;              // 16384
constexpr int kWeightBlockBytes = 2 * kGroupFeatures * kLine;       // 64 k of 256 features
constexpr int kWeightStageBytes = 2 * kWeightBlockBytes;            // 65536
constexpr int kSharedBytes = 1024 + 2 * (kTokenStageBytes + kWeightStageBytes);  // 1024: alignment
static_assert(kSharedBytes <= 232448, "one block an SM");
static_assert(kTileRows * kGroupFeatures * 4 <= kWeightStageBytes, "the up sums fit a weight stage");

enum class Projection { kGateUp, kDown };

struct GroupedArgs {
  // kGateUp: token rows [n, k] read as x[sorted_pairs[p] / top_k]; kDown: act [pairs, k] by p.
  const uint16_t* x = nullptr;
  const int32_t* sorted_pairs = nullptr;
  int top_k = 1;
  const int32_t* offsets = nullptr;  // [num_experts + 1]: expert e's grouped rows
  int num_experts = 0;
  const uint8_t* codes = nullptr;   // [E, rows_per_expert, k / 2] tiled MXFP4
  const uint8_t* scales = nullptr;  // [E, rows_per_expert, k / 32] E8M0
  int64_t k = 0, rows_per_expert = 0;
  int64_t inter = 0;          // kGateUp: the up rows start here; act is [pairs, inter]
  uint16_t* act = nullptr;    // kGateUp output, bf16
  float* out = nullptr;       // kDown output [pairs, rows_per_expert] fp32
};

// The expert and first grouped row of row tile `tile` (each expert's rows in tiles of 64, the
// experts in order), into *expert (-1 past the last tile) and *first. Every thread calls it.
__device__ void find_tile(const int32_t* offsets, int num_experts, int tile, int* expert, int* first,
                          int* warp_sums) {
  const int per = (num_experts + kThreads - 1) / kThreads;
  const int e0 = min(num_experts, static_cast<int>(threadIdx.x) * per), e1 = min(num_experts, e0 + per);
  int mine = 0;
  for (int e = e0; e < e1; ++e) mine += (offsets[e + 1] - offsets[e] + kTileRows - 1) / kTileRows;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int inclusive = mine;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const int v = __shfl_up_sync(0xffffffffu, inclusive, d);
    if (lane >= d) inclusive += v;
  }
  if (lane == 31) warp_sums[warp] = inclusive;
  if (threadIdx.x == 0) *expert = -1;
  __syncthreads();
  int start = inclusive - mine;
  for (int w = 0; w < warp; ++w) start += warp_sums[w];
  if (tile >= start && tile < start + mine) {
    int left = tile - start;
    for (int e = e0; e < e1; ++e) {
      const int tiles = (offsets[e + 1] - offsets[e] + kTileRows - 1) / kTileRows;
      if (left < tiles) {
        *expert = e;
        *first = offsets[e] + left * kTileRows;
        break;
      }
      left -= tiles;
    }
  }
  __syncthreads();
}

// Four words of codes (one per MX block of the step) and their four scale codes, widened into
// 16-byte chunks 4 w + t (w < 4) of `line` of a weight stage: values 32 w + 8 t .. + 7 times
// 2^(scale_w - 127), in bf16.
__device__ __forceinline__ void widen_chunk(uint8_t* stage, int line, int t, const uint4& q, uint32_t scale_codes) {
  const __nv_bfloat162 two_to_126 = __halves2bfloat162(__ushort_as_bfloat16(0x7e80), __ushort_as_bfloat16(0x7e80));
  const uint32_t words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    const uint32_t code = (scale_codes >> (8 * w)) & 0xffu;
    const uint32_t scale_bits = code << 7 | code << 23;  // 2^(code - 127) twice in bf16
    const __nv_bfloat162 scale = *reinterpret_cast<const __nv_bfloat162*>(&scale_bits);
    uint32_t pairs[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t bits = quant::mxfp4_tile_pair_bf16(words[w], k);
      const __nv_bfloat162 v = __hmul2(__hmul2(*reinterpret_cast<const __nv_bfloat162*>(&bits), two_to_126), scale);
      pairs[k] = *reinterpret_cast<const uint32_t*>(&v);
    }
    const int chunk = 4 * w + t;  // of the step's 16; column block chunk / 8
    *reinterpret_cast<uint4*>(stage + (chunk / 8) * kWeightBlockBytes + swizzled(line, chunk % 8)) =
        make_uint4(pairs[0], pairs[1], pairs[2], pairs[3]);
  }
}

__device__ __forceinline__ uint4 load_codes(const uint8_t* p) {
  uint4 v;
  asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

template <Projection P>
__global__ void __launch_bounds__(kThreads, 1) mxfp4_grouped_kernel(GroupedArgs a) {
  extern __shared__ __align__(16) uint8_t shared_raw[];
  __shared__ int tile_expert, tile_first, warp_sums[kThreads / 32];
  find_tile(a.offsets, a.num_experts, blockIdx.y, &tile_expert, &tile_first, warp_sums);
  if (tile_expert < 0) return;
  const int e = tile_expert, first = tile_first, rows = min(kTileRows, a.offsets[e + 1] - first);

  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(shared_raw));
  const uint32_t pad = (1024u - (raw & 1023u)) & 1023u;
  const uint32_t tokens = raw + pad, weights = tokens + 2 * kTokenStageBytes;
  uint8_t* const weights_generic = shared_raw + pad + 2 * kTokenStageBytes;

  const int wg = threadIdx.x / 128, u = threadIdx.x % 128;
  const int64_t k = a.k, steps = k / kStepValues;
  // This warpgroup's 128 weight rows.
  const int64_t feature0 = P == Projection::kGateUp ? (wg == 0 ? 0 : a.inter) + int64_t{blockIdx.x} * kGroupFeatures
                                                    : int64_t{blockIdx.x} * 2 * kGroupFeatures + wg * kGroupFeatures;
  const int64_t row0 = int64_t{e} * a.rows_per_expert + feature0;
  // Widening: pass p covers rows 32 p + u / 4 of the warpgroup's, 16 bytes (t = u % 4) each.
  const int t = u % 4;
  const uint8_t* codes = a.codes + (row0 + u / 4) * (k / 2) + 16 * t;
  const uint8_t* scales = a.scales + (row0 + u / 4) * (k / 32);
  const int64_t pass_codes = 32 * (k / 2), pass_scales = 32 * (k / 32);
  // Token rows: this thread copies chunk c of rows threadIdx.x / 16 + 16 i.
  const int c = threadIdx.x % 16;
  const uint16_t* token_row[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = threadIdx.x / 16 + 16 * i;
    const int64_t source = r >= rows                     ? -1
                           : P == Projection::kGateUp ? a.sorted_pairs[first + r] / a.top_k
                                                        : first + r;
    token_row[i] = source < 0 ? nullptr : a.x + source * k + 8 * c;
  }
  auto load_tokens = [&](int64_t step, uint32_t stage) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = threadIdx.x / 16 + 16 * i;
      wgmma::copy_async_16(stage + (c / 8) * kTokenBlockBytes + swizzled(r, c % 8),
                           token_row[i] ? token_row[i] + step * kStepValues : a.x, token_row[i] ? 16 : 0);
    }
    wgmma::copy_async_commit();
  };
  uint4 q[4];
  uint32_t s[4];
  auto load_weights = [&](int64_t step) {
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      q[p] = load_codes(codes + p * pass_codes + step * kStepBytes);
      s[p] = __ldg(reinterpret_cast<const uint32_t*>(scales + p * pass_scales + step * 4));
    }
  };
  auto widen = [&](int stage) {
#pragma unroll
    for (int p = 0; p < 4; ++p)
      widen_chunk(weights_generic + stage * kWeightStageBytes, wg * kGroupFeatures + 32 * p + u / 4, t, q[p], s[p]);
  };

  float acc[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
  load_tokens(0, tokens);
  load_weights(0);
  widen(0);
  if (steps > 1) load_weights(1);
  for (int64_t step = 0; step < steps; ++step) {
    const int cur = static_cast<int>(step & 1);
    wgmma::copy_async_wait<0>();
    wgmma::fence_async_proxy();
    __syncthreads();  // this step's tokens and weights are in; both warpgroups finished the last step
    if (step + 1 < steps) load_tokens(step + 1, tokens + (cur ^ 1) * kTokenStageBytes);
    wgmma::pin(acc);
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < kStepValues / 16; ++kk) {
      const uint32_t column = (kk % 4) * 32;  // 16 k a step inside the 64-k block
      wgmma::m64n128k16<0>(
          acc, descriptor(tokens + cur * kTokenStageBytes + (kk / 4) * kTokenBlockBytes + column, 16, 1024),
          descriptor(weights + cur * kWeightStageBytes + (kk / 4) * kWeightBlockBytes + wg * kGroupFeatures * kLine +
                         column,
                     16, 1024));
    }
    wgmma::commit();
    if (step + 1 < steps) {
      widen(cur ^ 1);
      if (step + 2 < steps) load_weights(step + 2);
    }
    wgmma::wait_all();
    wgmma::pin(acc);
  }

  // acc[4 j + e]: row 16 warp + g + 8 (e / 2), feature 8 j + 2 tq + e % 2 of the warpgroup's.
  const int warp = u / 32, lane = u % 32, g = lane / 4, tq = lane % 4;
  if constexpr (P == Projection::kDown) {
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = 16 * warp + g + 8 * h;
        if (r < rows)
          *reinterpret_cast<float2*>(a.out + (first + r) * a.rows_per_expert + feature0 + 8 * j + 2 * tq) =
              make_float2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
      }
  } else {
    __syncthreads();  // the stages are free
    float* up = reinterpret_cast<float*>(weights_generic);  // [64 registers][128 threads]
    if (wg == 1) {
#pragma unroll
      for (int i = 0; i < 64; ++i) up[i * 128 + u] = acc[i];
    }
    __syncthreads();
    if (wg == 0) {
      const int64_t column0 = int64_t{blockIdx.x} * kGroupFeatures;
#pragma unroll
      for (int j = 0; j < 16; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = 16 * warp + g + 8 * h;
          if (r >= rows) continue;
          uint32_t packed = 0;
#pragma unroll
          for (int b = 0; b < 2; ++b) {
            const int i = 4 * j + 2 * h + b;
            const float gate = acc[i];
            packed |= static_cast<uint32_t>(float_to_bf16(gate / (1.0f + expf(-gate)) * up[i * 128 + u])) << (16 * b);
          }
          *reinterpret_cast<uint32_t*>(a.act + (first + r) * a.inter + column0 + 8 * j + 2 * tq) = packed;
        }
    }
  }
}

}  // namespace

bool moe_experts_wgmma_supported(const ExpertWeights& experts, int64_t hidden, int64_t inter) {
  return experts.format == WeightFormat::Mxfp4 && experts.mxfp4_tiled && hidden % (2 * kGroupFeatures) == 0 &&
         inter % kGroupFeatures == 0 && hidden % kStepValues == 0 && inter % kStepValues == 0;
}

void moe_experts_wgmma(const uint16_t* x, int64_t hidden, int64_t inter, const ExpertWeights& experts,
                       const MoePlan& plan, int num_experts, int top_k, int64_t num_pairs, uint16_t* act,
                       float* expert_out, cudaStream_t stream) {
  if (num_pairs <= 0 || num_experts <= 0) return;
  GLMS_CHECK(moe_experts_wgmma_supported(experts, hidden, inter),
             "moe_experts_wgmma: tiled MXFP4 experts with hidden a multiple of 256 and inter of 128");
  // Row tiles: at most one part-filled tile per expert beyond the full ones.
  const int64_t tiles = (num_pairs + kTileRows - 1) / kTileRows + std::min<int64_t>(num_experts, num_pairs);
  GLMS_CHECK(tiles <= 65535, "moe_experts_wgmma: too many pairs for one launch");
  GroupedArgs a;
  a.sorted_pairs = plan.sorted_pairs;
  a.top_k = top_k;
  a.offsets = plan.offsets;
  a.num_experts = num_experts;
  a.inter = inter;

  a.x = x;
  a.codes = static_cast<const uint8_t*>(experts.gate_up);
  a.scales = static_cast<const uint8_t*>(experts.gate_up_scales);
  a.k = hidden;
  a.rows_per_expert = 2 * inter;
  a.act = act;
  check(cudaFuncSetAttribute(mxfp4_grouped_kernel<Projection::kGateUp>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             kSharedBytes),
        "mxfp4_grouped gate_up shared memory");
  mxfp4_grouped_kernel<Projection::kGateUp>
      <<<dim3(static_cast<unsigned>(inter / kGroupFeatures), static_cast<unsigned>(tiles)), kThreads, kSharedBytes,
         stream>>>(a);
  check(cudaGetLastError(), "mxfp4_grouped gate_up launch");

  a.x = act;
  a.codes = static_cast<const uint8_t*>(experts.down);
  a.scales = static_cast<const uint8_t*>(experts.down_scales);
  a.k = inter;
  a.rows_per_expert = hidden;
  a.out = expert_out;
  check(cudaFuncSetAttribute(mxfp4_grouped_kernel<Projection::kDown>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             kSharedBytes),
        "mxfp4_grouped down shared memory");
  mxfp4_grouped_kernel<Projection::kDown>
      <<<dim3(static_cast<unsigned>(hidden / (2 * kGroupFeatures)), static_cast<unsigned>(tiles)), kThreads,
         kSharedBytes, stream>>>(a);
  check(cudaGetLastError(), "mxfp4_grouped down launch");
}

}  // namespace glms::ops::cuda
