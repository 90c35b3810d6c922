// Sparse MLA attention for prefill chunks with bf16 rows, warp-specialised: a producer
// warpgroup gathers each token's selected latent rows into shared memory while two consumer
// warpgroups multiply, for GLM-5's shapes (64 heads, latent 512, rope 64).
//
// Why this shape: mla_wgmma.cu's kernel splits every 64-row tile between its two warpgroups (S
// as m64n32 over half the rows each, both waiting for every copy, softmax and barrier together),
// so the tensor cores idle while either the copies or the softmax run, and m64n32 reads shared
// memory at 1.5x the bytes per product of m64n64. Here the tiles go in pairs: consumer 0 scores
// tile 2p and consumer 1 tile 2p + 1, each S = Q K^T as m64n64 over all 64 rows of its tile;
// each keeps the output for half the latent columns (consumer 0 columns 0..255, consumer 1
// 256..511, 64 x 256 fp32 in registers) and adds P V for both tiles: its own tile's P from
// registers (the S accumulators become the A operand), the other's from shared memory. The two
// exchange their running maxima through shared memory once a pair, so both tiles' P share one
// maximum. While one consumer runs its softmax the other's wgmma run, and the producer refills a
// half of a tile as soon as the consumers that read it are done (mbarriers per half tile).
//
// Shared memory (128-byte swizzled lines as wgmma.cuh describes; a column block is 64 columns,
// one line per head or row):
//   queries [9 column blocks][64 heads]                 73728 B
//   tiles   [2][9 column blocks][64 rows]              147456 B  (tile 0's rope block holds
//                                                                 consumer 0's P once it has scored)
//   probs   [64 heads] lines of consumer 1's P           8192 B
//   barriers, the row maxima [64], the row sums [2][64]
// Half tiles: "left" = column blocks 0..3 (latent 0..255), "right" = blocks 4..8 (latent
// 256..511 and the rope). Who reads what: consumer b's S reads all of tile b; consumer 0's P V
// reads both tiles' left halves, consumer 1's both right halves (and consumer 0's P in tile 0's
// rope block). So tile 0 left is free after consumer 0's own P V, tile 0 right after consumer
// 1's P V of tile 0, tile 1 right after consumer 1's own P V, tile 1 left after consumer 0's P V
// of tile 1; the producer refills the halves in the order they free up.
#include <cuda_runtime.h>

#include <cmath>

#include "core/error.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/mla.h"
#include "ops/cuda/pipeline.cuh"
#include "ops/cuda/wgmma.cuh"

namespace glms::ops::cuda {

namespace {

using wgmma::copy_async_16;
using wgmma::descriptor;
using wgmma::swizzled;

constexpr int kHeads = 64, kLatent = 512, kRope = 64, kRow = kLatent + kRope;
constexpr int kTileRows = 64, kColumnBlocks = kRow / 64, kLeftBlocks = 4;
constexpr int kThreads = 384;  // consumers: warpgroups 0 and 1; producer: warpgroup 2
constexpr int kLineBytes = wgmma::kLineBytes;
constexpr int kBlockBytes = kTileRows * kLineBytes;               // one column block of a tile: 8192
constexpr int kTileBytes = kColumnBlocks * kBlockBytes;           // 73728
constexpr int kQueryBytes = kColumnBlocks * kHeads * kLineBytes;  // 73728
constexpr int kProbBytes = kHeads * kLineBytes;                   // 8192
constexpr int kOutLineBytes = kLatent * 2 + 16;  // a head's bf16 output staged in shared memory
static_assert(kHeads * kOutLineBytes <= kQueryBytes, "the staged output fits the queries' region");

// Barriers: queries landed; [tile][half] ready (the producer's copies landed) and free (its
// consumer is done reading).
enum Barrier { kQueriesReady, kReady, kFree = kReady + 4, kBarriers = kFree + 4 };
constexpr int kSmallBytes = 8 * kBarriers + sizeof(float) * 3 * kHeads;
constexpr int kSharedBytes = 1024 + kQueryBytes + 2 * kTileBytes + kProbBytes + kSmallBytes;  // 1024: alignment
static_assert(kSharedBytes <= 232448, "one block an SM");
constexpr int kConsumerRegisters = 232, kProducerRegisters = 40;
static_assert(2 * 128 * kConsumerRegisters + 128 * kProducerRegisters <= 65536, "the register file");

// Named barriers between the consumers (256 threads): consumer 0's maxima posted, the joint
// maxima posted (by consumer 1), consumer 0's P stored, consumer 1's P stored, the epilogue.
enum Named { kMaxima0 = 1, kMaxima, kProbs0, kProbs1, kEpilogue };
constexpr int kConsumerThreads = 256;

__device__ __forceinline__ int half_index(int tile, int half) { return 2 * tile + half; }

// The producer: thread t copies 16-byte chunk t % 8 of each 128-byte line of rows t / 8 + 16 i
// (i = 0..3), so that eight threads read one line of a row and each row's lines are one source.
struct Producer {
  const MlaAttentionArgs& a;
  const int32_t* chosen;  // this token's selected positions
  const int32_t* blocks;  // its sequence's block table
  int count;              // its selected rows
  int chunk, row0;

  __device__ int32_t slot_of_row(int j) const {
    if (j >= count) return -1;
    const int32_t position = chosen[j];
    return blocks[position / a.block_size] * a.block_size + position % a.block_size;
  }
  // Column blocks [first, last) of this thread's rows of a tile into `tile_base`.
  __device__ void copy(uint32_t tile_base, const int32_t (&slots)[4], int first, int last) const {
    const uint16_t* cache = static_cast<const uint16_t*>(a.cache);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int row = row0 + 16 * i;
      const uint16_t* src = cache + (slots[i] >= 0 ? static_cast<int64_t>(slots[i]) * kRow : 0) + chunk * 8;
      const uint32_t dst = tile_base + swizzled(row, chunk);
      const int bytes = slots[i] >= 0 ? 16 : 0;
      for (int b = first; b < last; ++b) copy_async_16(dst + b * kBlockBytes, src + b * 64, bytes);
    }
  }
};

// The consumers' per-thread view: warp w of the warpgroup, lane (g, tq); accumulator rows
// (heads) 16 w + g and 16 w + g + 8.
struct ConsumerLane {
  int warp, g, tq;
  __device__ int head(int h) const { return 16 * warp + g + 8 * h; }
};

// S[64 heads, 64 rows of a tile] over column blocks [first, last) (36 k16 steps for all).
__device__ __forceinline__ void score_blocks(float (&s)[32], uint32_t queries, uint32_t tile, int first, int last,
                                             bool fresh) {
#pragma unroll
  for (int b = first; b < last; ++b)
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t column = b * kBlockBytes + k * 32;
      wgmma::m64n64k16(s, descriptor(queries + column, 16, 1024), descriptor(tile + column, 16, 1024),
                       fresh && b == first && k == 0 ? 0 : 1);
    }
}

// Rows of the tile at or past `valid` get -inf; each head's maximum over the tile's rows.
__device__ __forceinline__ void mask_and_max(float (&s)[32], int valid, const ConsumerLane& lane, float (&tile_max)[2]) {
  tile_max[0] = tile_max[1] = -INFINITY;
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (8 * n + 2 * lane.tq + (e & 1) >= valid) s[4 * n + e] = -INFINITY;
      tile_max[e / 2] = fmaxf(tile_max[e / 2], s[4 * n + e]);
    }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 1));
    tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 2));
  }
}

// s becomes exp(s - max) in fp32; p the same rounded to bf16 as the A operand of four k16 steps
// (rs_m64n8k16's layout: S columns 8 n + 2 tq are k 2 tq of step n / 2, + 8 for odd n); the
// rounded values are added to `sum`.
__device__ __forceinline__ void exponentiate(float (&s)[32], const float (&max)[2], uint32_t (&p)[4][4],
                                             float (&sum)[2]) {
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      s[4 * n + 2 * h] = __expf(s[4 * n + 2 * h] - max[h]);
      s[4 * n + 2 * h + 1] = __expf(s[4 * n + 2 * h + 1] - max[h]);
      const uint32_t pair = pack_bf16_pair(s[4 * n + 2 * h], s[4 * n + 2 * h + 1]);
      p[n / 2][2 * (n % 2) + h] = pair;
      sum[h] += __uint_as_float(pair << 16) + __uint_as_float(pair & 0xffff0000u);
    }
}

// P (fp32, times factor[h]) as bf16 lines of 64 rows a head, for the other consumer's P V.
__device__ __forceinline__ void store_probs(uint8_t* probs, const float (&s)[32], const float (&factor)[2],
                                            const ConsumerLane& lane) {
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int column = 8 * n + 2 * lane.tq;
      *reinterpret_cast<uint32_t*>(probs + swizzled(lane.head(h), column / 8) + (column % 8) * 2) =
          pack_bf16_pair(s[4 * n + 2 * h] * factor[h], s[4 * n + 2 * h + 1] * factor[h]);
    }
}

__device__ __forceinline__ void scale_rows(float (&o)[128], const float (&factor)[2]) {
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    o[4 * j] *= factor[0];
    o[4 * j + 1] *= factor[0];
    o[4 * j + 2] *= factor[1];
    o[4 * j + 3] *= factor[1];
  }
}

// V of a tile for this consumer's 256 columns, MN-major (a line holds 64 latent columns of one
// row), 16 rows a k step.
__device__ __forceinline__ uint64_t value_descriptor(uint32_t tile, int consumer, int k) {
  return descriptor(tile + consumer * kLeftBlocks * kBlockBytes + k * 16 * kLineBytes, kBlockBytes, 1024);
}

// Grid: one block a launched token. a.queries: [T, H, 576] bf16, pre-scaled; a.out: [T, H, 512].
__global__ void __launch_bounds__(kThreads, 1) mla_wgmma_specialized_kernel(MlaAttentionArgs a) {
  extern __shared__ __align__(16) uint8_t shared_raw[];
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(shared_raw));
  const uint32_t pad = (1024u - (raw & 1023u)) & 1023u;
  uint8_t* const generic = shared_raw + pad;
  const uint32_t queries = raw + pad, tiles = queries + kQueryBytes, probs1 = tiles + 2 * kTileBytes;
  const uint32_t barriers = probs1 + kProbBytes;
  float* const row_max = reinterpret_cast<float*>(generic + (barriers - queries) + 8 * kBarriers);  // [64]
  float* const row_sum = row_max + kHeads;                                                         // [2][64]
  auto barrier = [&](int index) { return barriers + 8 * index; };
  auto tile_at = [&](int b) { return tiles + b * kTileBytes; };
  const uint32_t probs0 = tile_at(0) + 8 * kBlockBytes;  // tile 0's rope block

  const int t = a.first_token + blockIdx.x, H = a.num_heads;
  const int count = a.num_selected[t];
  const int pairs = (count + 2 * kTileRows - 1) / (2 * kTileRows);
  if (threadIdx.x == 0) {
    pipeline::barrier_init(barrier(kQueriesReady), 128);
    for (int i = 0; i < 4; ++i) {
      pipeline::barrier_init(barrier(kReady + i), 128);
      pipeline::barrier_init(barrier(kFree + i), 128);
    }
    pipeline::barrier_init_fence();
  }
  __syncthreads();
  // Broadcast from lane 0: the compiler then knows each warp takes one side of the branches on it
  // (wgmma in a path it thinks divergent are serialised).
  const int warpgroup = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / 128, 0), index = threadIdx.x % 128;

  if (warpgroup == 2) {
    pipeline::shrink_registers<kProducerRegisters>();
    if (pairs == 0) return;
    Producer producer{a, a.selected + static_cast<int64_t>(t) * a.max_selected,
                      a.block_tables + static_cast<int64_t>(a.token_sequence[t]) * a.max_blocks, count, index % 8,
                      index / 8};
    // The token's queries (heads past H: zeros).
    const uint16_t* token_queries = a.queries + static_cast<int64_t>(t) * H * kRow;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int head = producer.row0 + 16 * i;
      const uint16_t* src = token_queries + (head < H ? head * kRow : 0) + producer.chunk * 8;
      const uint32_t dst = queries + swizzled(head, producer.chunk);
      for (int b = 0; b < kColumnBlocks; ++b) copy_async_16(dst + b * kBlockBytes, src + b * 64, head < H ? 16 : 0);
    }
    pipeline::barrier_arrive_on_copies(barrier(kQueriesReady));
    int32_t slots[2][4];  // this thread's rows of the pair's two tiles
    auto look_up = [&](int p) {
#pragma unroll
      for (int b = 0; b < 2; ++b)
#pragma unroll
        for (int i = 0; i < 4; ++i) slots[b][i] = producer.slot_of_row((2 * p + b) * kTileRows + producer.row0 + 16 * i);
    };
    look_up(0);
    for (int p = 0; p < pairs; ++p) {
      const uint32_t parity = (p & 1) ^ 1;  // the previous pair's phase
      // In the order the halves free up: tile 0 left, tile 1 right, tile 0 right, tile 1 left.
      const int order[4][2] = {{0, 0}, {1, 1}, {0, 1}, {1, 0}};
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int b = order[k][0], half = order[k][1];
        pipeline::barrier_wait(barrier(kFree + half_index(b, half)), parity);
        producer.copy(tile_at(b), slots[b], half ? kLeftBlocks : 0, half ? kColumnBlocks : kLeftBlocks);
        pipeline::barrier_arrive_on_copies(barrier(kReady + half_index(b, half)));
      }
      if (p + 1 < pairs) look_up(p + 1);
    }
    return;
  }

  pipeline::grow_registers<kConsumerRegisters>();
  const int consumer = warpgroup;
  const ConsumerLane lane{index / 32, index % 32 / 4, index % 4};
  const uint32_t own_tile = tile_at(consumer), other_tile = tile_at(consumer ^ 1);
  float out[128];  // O[heads, 256 consumer + 8 j + 2 tq (+1)] at out[4 j + ...], relative to run_max
#pragma unroll
  for (int k = 0; k < 128; ++k) out[k] = 0.0f;
  float run_max[2] = {-INFINITY, -INFINITY}, run_sum[2] = {0.0f, 0.0f};
  float s[32];
  uint32_t p[4][4];
  auto wait_ready = [&](int b, int half, int pair) {
    pipeline::barrier_wait(barrier(kReady + half_index(b, half)), pair & 1);
    wgmma::fence_async_proxy();  // the copies' writes, for the tensor cores' reads
  };
  // S of this consumer's tile of pair `pair`: consumer 0 left half first (the first copied),
  // consumer 1 right half first.
  // (Column bounds known at compile time: wgmma in loops of run-time bounds are serialised.)
  auto issue_scores = [&](int pair) {
    wgmma::pin(s);
    wgmma::fence();
    if (consumer == 0) {
      wait_ready(0, 0, pair);
      score_blocks(s, queries, own_tile, 0, kLeftBlocks, true);
      wait_ready(0, 1, pair);
      score_blocks(s, queries, own_tile, kLeftBlocks, kColumnBlocks, false);
    } else {
      wait_ready(1, 1, pair);
      score_blocks(s, queries, own_tile, kLeftBlocks, kColumnBlocks, true);
      wait_ready(1, 0, pair);
      score_blocks(s, queries, own_tile, 0, kLeftBlocks, false);
    }
    wgmma::commit();
  };
  if (pairs > 0) pipeline::barrier_wait(barrier(kQueriesReady), 0);

  for (int pair = 0; pair < pairs; ++pair) {
    const int tile = 2 * pair + consumer;
    if (consumer == 0) {
      if (pair == 0) {
        issue_scores(0);
        wgmma::wait<0>();
        wgmma::pin(s);
      }
      float tile_max[2], own_max[2], factor[2];
      mask_and_max(s, count - tile * kTileRows, lane, tile_max);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        own_max[h] = fmaxf(run_max[h], tile_max[h]);  // finite: the pair's first row is selected
        factor[h] = run_max[h] == -INFINITY ? 0.0f : __expf(run_max[h] - own_max[h]);
        run_sum[h] *= factor[h];
      }
      __syncwarp();
      if (lane.tq == 0)
        for (int h = 0; h < 2; ++h) row_max[lane.head(h)] = own_max[h];
      pipeline::named_arrive(kMaxima0, kConsumerThreads);
      scale_rows(out, factor);
      exponentiate(s, own_max, p, run_sum);
      // O += P V over this tile's left half, P from registers.
      wgmma::pin(out);
      wgmma::fence();
#pragma unroll
      for (int k = 0; k < 4; ++k) wgmma::rs_m64n256k16_mn(out, p[k], value_descriptor(own_tile, 0, k));
      wgmma::commit();
      // The joint maxima (consumer 1 posts them); this tile's P relative to them for consumer 1.
      pipeline::named_sync(kMaxima, kConsumerThreads);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float joint = row_max[lane.head(h)];
        factor[h] = __expf(own_max[h] - joint);
        run_max[h] = joint;
        run_sum[h] *= factor[h];
      }
      store_probs(generic + (probs0 - queries), s, factor, lane);
      wgmma::fence_async_proxy();
      pipeline::named_arrive(kProbs0, kConsumerThreads);
      wgmma::wait<0>();
      wgmma::pin(out);
      pipeline::barrier_arrive(barrier(kFree + half_index(0, 0)));
      scale_rows(out, factor);
      // O += P' V over the other tile's left half, consumer 1's P from shared memory.
      pipeline::named_sync(kProbs1, kConsumerThreads);
      wgmma::fence();
#pragma unroll
      for (int k = 0; k < 4; ++k)
        wgmma::m64n256k16<1>(out, descriptor(probs1 + k * 32, 16, 1024), value_descriptor(other_tile, 0, k));
      wgmma::commit();
      if (pair + 1 < pairs) {
        issue_scores(pair + 1);
        wgmma::wait<1>();
      } else {
        wgmma::wait<0>();
      }
      pipeline::barrier_arrive(barrier(kFree + half_index(1, 0)));
      wgmma::wait<0>();
      wgmma::pin(out);
      wgmma::pin(s);
    } else {
      issue_scores(pair);
      wgmma::wait<0>();
      wgmma::pin(s);
      float tile_max[2], factor[2], joint[2];
      mask_and_max(s, count - tile * kTileRows, lane, tile_max);
      pipeline::named_sync(kMaxima0, kConsumerThreads);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        joint[h] = fmaxf(row_max[lane.head(h)], tile_max[h]);
        factor[h] = run_max[h] == -INFINITY ? 0.0f : __expf(run_max[h] - joint[h]);
        run_max[h] = joint[h];
        run_sum[h] *= factor[h];
      }
      __syncwarp();
      if (lane.tq == 0)
        for (int h = 0; h < 2; ++h) row_max[lane.head(h)] = joint[h];
      pipeline::named_arrive(kMaxima, kConsumerThreads);
      scale_rows(out, factor);
      exponentiate(s, joint, p, run_sum);
      // O += P V over this tile's right half (latent 256..511), P from registers.
      wgmma::pin(out);
      wgmma::fence();
#pragma unroll
      for (int k = 0; k < 4; ++k) wgmma::rs_m64n256k16_mn(out, p[k], value_descriptor(own_tile, 1, k));
      wgmma::commit();
      const float one[2] = {1.0f, 1.0f};
      store_probs(generic + (probs1 - queries), s, one, lane);
      wgmma::fence_async_proxy();
      // O += P' V over tile 0's right half, consumer 0's P from tile 0's rope block.
      pipeline::named_sync(kProbs0, kConsumerThreads);
      wgmma::fence();
#pragma unroll
      for (int k = 0; k < 4; ++k)
        wgmma::m64n256k16<1>(out, descriptor(probs0 + k * 32, 16, 1024), value_descriptor(other_tile, 1, k));
      wgmma::commit();
      pipeline::named_arrive(kProbs1, kConsumerThreads);
      wgmma::wait<1>();
      pipeline::barrier_arrive(barrier(kFree + half_index(1, 1)));
      wgmma::wait<0>();
      wgmma::pin(out);
      pipeline::barrier_arrive(barrier(kFree + half_index(0, 1)));
    }
  }

  // Each head's sum over both consumers' rows, then the normalised output staged in the
  // queries' region (every wgmma reading it finished before the pairs' last barriers).
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    run_sum[h] += __shfl_xor_sync(0xffffffffu, run_sum[h], 1);
    run_sum[h] += __shfl_xor_sync(0xffffffffu, run_sum[h], 2);
    if (lane.tq == 0) row_sum[consumer * kHeads + lane.head(h)] = run_sum[h];
  }
  pipeline::named_sync(kEpilogue, kConsumerThreads);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int head = lane.head(h);
    const float total = row_sum[head] + row_sum[kHeads + head];
    const float norm = total > 0.0f ? 1.0f / total : 0.0f;
    uint8_t* line = generic + head * kOutLineBytes + 2 * (256 * consumer + 2 * lane.tq);
#pragma unroll
    for (int j = 0; j < 32; ++j)
      *reinterpret_cast<uint32_t*>(line + 16 * j) = pack_bf16_pair(out[4 * j + 2 * h] * norm, out[4 * j + 2 * h + 1] * norm);
  }
  pipeline::named_sync(kEpilogue, kConsumerThreads);
  // The token's [H, 512] bf16 output is contiguous: whole 16-byte chunks, consecutive threads
  // consecutive chunks.
  constexpr int kChunksPerHead = kLatent / 8;
  uint4* token_out = reinterpret_cast<uint4*>(a.out + static_cast<int64_t>(t) * H * kLatent);
  for (int c = threadIdx.x; c < H * kChunksPerHead; c += kConsumerThreads)
    token_out[c] = *reinterpret_cast<const uint4*>(generic + c / kChunksPerHead * kOutLineBytes + c % kChunksPerHead * 16);
}

}  // namespace

void mla_attention_wgmma_specialized(const MlaAttentionArgs& a, cudaStream_t stream) {
  const int launch_tokens = a.launch_tokens < 0 ? a.num_tokens - a.first_token : a.launch_tokens;
  if (launch_tokens <= 0) return;
  GLMS_CHECK(mla_attention_wgmma_supported(a.num_heads, a.latent_dim, a.rope_dim) && a.storage == CacheStorage::kBf16,
             "mla_attention_wgmma_specialized: bf16 rows, at most 64 heads, latent 512 and rope 64");
  check(cudaFuncSetAttribute(mla_wgmma_specialized_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSharedBytes),
        "cudaFuncSetAttribute(mla_wgmma_specialized_kernel)");
  mla_wgmma_specialized_kernel<<<launch_tokens, kThreads, kSharedBytes, stream>>>(a);
  check(cudaGetLastError(), "mla_wgmma_specialized launch");
}

}  // namespace glms::ops::cuda
