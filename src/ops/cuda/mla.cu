// MLA decode/prefill attention on CUDA cores. One block serves one token, a group of 8 heads
// (one warp each) and one split of the token's selected positions. Positions are processed in
// tiles of 32 rows staged in shared memory as bf16, so each cache row is read from memory once
// per head group: a warp scores its head against the tile (lane = position), updates its online
// softmax, then accumulates p * latent with each lane owning latent dims lane + 32 j.
// Shared rows are padded to an odd number of 32-bit words, so that 32 lanes reading 32
// different rows at the same column hit 32 different banks.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/mla.h"

namespace glms::ops::cuda {

namespace {

constexpr int kHeadsPerBlock = 8;   // one warp per head
constexpr int kTile = 32;           // positions per shared tile (one per lane when scoring)
constexpr int kMaxLatentPerLane = 16;  // latent_dim <= 512
constexpr int kThreads = kHeadsPerBlock * 32;

struct SharedLayout {
  int row_size, row_stride;  // halfwords; row_stride / 2 is odd
  size_t q_bytes, tile_bytes;
  size_t total() const { return q_bytes + tile_bytes; }
};

SharedLayout shared_layout(int latent_dim, int rope_dim) {
  SharedLayout s;
  s.row_size = latent_dim + rope_dim;
  int words = (s.row_size + 1) / 2;
  if (words % 2 == 0) ++words;
  s.row_stride = 2 * words;
  s.q_bytes = static_cast<size_t>(kHeadsPerBlock) * s.row_size * sizeof(float);
  s.tile_bytes = static_cast<size_t>(kTile) * s.row_stride * sizeof(uint16_t);
  return s;
}

__global__ void __launch_bounds__(kThreads) mla_attention_kernel(MlaAttentionArgs a, SharedLayout s) {
  extern __shared__ float shared[];
  float* q = shared;  // [kHeadsPerBlock, row_size], pre-scaled
  uint16_t* tile = reinterpret_cast<uint16_t*>(reinterpret_cast<char*>(shared) + s.q_bytes);  // [kTile, row_stride]

  const int t = a.first_token + blockIdx.x, head0 = blockIdx.y * kHeadsPerBlock, split = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, head = head0 + warp;
  const int L = a.latent_dim;
  const bool head_valid = head < a.num_heads;

  for (int i = threadIdx.x; i < kHeadsPerBlock * s.row_size; i += kThreads) {
    const int h = head0 + i / s.row_size, k = i % s.row_size;
    float v = 0.0f;
    if (h < a.num_heads)
      v = k < L ? a.q_latent[(static_cast<int64_t>(t) * a.num_heads + h) * L + k]
                : a.q_rope[(static_cast<int64_t>(t) * a.num_heads + h) * a.q_rope_stride + (k - L)];
    q[i] = v * a.scale;
  }

  const int count = a.num_selected[t];
  const int chunk = ((count + a.num_splits - 1) / a.num_splits + kTile - 1) / kTile * kTile;
  const int begin = min(count, split * chunk), end = min(count, begin + chunk);
  const int32_t* selected = a.selected + static_cast<int64_t>(t) * a.max_selected;
  const int32_t* blocks = a.block_tables + static_cast<int64_t>(a.token_sequence[t]) * a.max_blocks;

  float m = -INFINITY, l = 0.0f;
  float o[kMaxLatentPerLane];
#pragma unroll
  for (int j = 0; j < kMaxLatentPerLane; ++j) o[j] = 0.0f;

  for (int tile_start = begin; tile_start < end; tile_start += kTile) {
    const int rows = min(kTile, end - tile_start);
    __syncthreads();  // the previous tile is fully consumed (and q is written, first time round)
    for (int i = threadIdx.x; i < rows * s.row_size; i += kThreads) {
      const int r = i / s.row_size, k = i % s.row_size;
      const int position = selected[tile_start + r];
      const int64_t slot = static_cast<int64_t>(blocks[position / a.block_size]) * a.block_size + position % a.block_size;
      tile[r * s.row_stride + k] = a.cache[slot * s.row_size + k];
    }
    __syncthreads();

    float score = -INFINITY;
    if (head_valid && lane < rows) {
      const float* qh = q + warp * s.row_size;
      const uint16_t* row = tile + lane * s.row_stride;
      float acc = 0.0f;
      for (int k = 0; k < s.row_size; ++k) acc += qh[k] * bf16_to_float(row[k]);
      score = acc;
    }
    const float m_new = fmaxf(m, warp_max(score));
    const float p = lane < rows ? __expf(score - m_new) : 0.0f;
    const float rescale = __expf(m - m_new);
    l = l * rescale + warp_sum(p);
    m = m_new;
#pragma unroll
    for (int j = 0; j < kMaxLatentPerLane; ++j) o[j] *= rescale;
    for (int r = 0; r < rows; ++r) {
      const float pr = __shfl_sync(0xffffffffu, p, r);
      const uint16_t* row = tile + r * s.row_stride;
#pragma unroll
      for (int j = 0; j < kMaxLatentPerLane; ++j) {
        const int d = lane + 32 * j;
        if (d < L) o[j] += pr * bf16_to_float(row[d]);
      }
    }
  }
  if (!head_valid) return;

  const int64_t th = static_cast<int64_t>(t) * a.num_heads + head;
  if (a.num_splits == 1) {
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxLatentPerLane; ++j) {
      const int d = lane + 32 * j;
      if (d < L) a.out[th * L + d] = o[j] * inv;
    }
    return;
  }
  // Partials: [T, H, splits, latent] sums, then [T, H, splits, 2] (max, denominator).
  float* partial = a.workspace + (th * a.num_splits + split) * L;
#pragma unroll
  for (int j = 0; j < kMaxLatentPerLane; ++j) {
    const int d = lane + 32 * j;
    if (d < L) partial[d] = o[j];
  }
  if (lane == 0) {
    float* stats = a.workspace + static_cast<int64_t>(a.num_tokens) * a.num_heads * a.num_splits * L +
                   (th * a.num_splits + split) * 2;
    stats[0] = m;
    stats[1] = l;
  }
}

// One block per (token, head): merges the splits' partial softmax sums.
__global__ void mla_combine_kernel(MlaAttentionArgs a) {
  const int64_t th = int64_t{a.first_token} * a.num_heads + blockIdx.x;
  const int L = a.latent_dim, S = a.num_splits;
  const float* stats = a.workspace + static_cast<int64_t>(a.num_tokens) * a.num_heads * S * L + th * S * 2;
  float m = -INFINITY;
  for (int s = 0; s < S; ++s) m = fmaxf(m, stats[2 * s]);
  float total = 0.0f;
  for (int s = 0; s < S; ++s)
    if (stats[2 * s + 1] > 0.0f) total += __expf(stats[2 * s] - m) * stats[2 * s + 1];
  const float inv = total > 0.0f ? 1.0f / total : 0.0f;
  for (int d = threadIdx.x; d < L; d += blockDim.x) {
    float sum = 0.0f;
    for (int s = 0; s < S; ++s)
      if (stats[2 * s + 1] > 0.0f) sum += __expf(stats[2 * s] - m) * a.workspace[(th * S + s) * L + d];
    a.out[th * L + d] = sum * inv;
  }
}

__global__ void gather_context_kernel(const uint16_t* cache, const int32_t* block_table, int block_size, int row_size,
                                      uint16_t* out) {
  const int j = blockIdx.x;
  const uint16_t* src = cache + (static_cast<int64_t>(block_table[j / block_size]) * block_size + j % block_size) * row_size;
  for (int k = threadIdx.x; k < row_size; k += blockDim.x) out[static_cast<int64_t>(j) * row_size + k] = src[k];
}

__global__ void prefill_queries_kernel(const float* q_latent, const float* q_rope, int64_t q_rope_stride, int heads,
                                       int latent_dim, int rope_dim, float scale, uint16_t* out) {
  const int64_t th = blockIdx.x;  // token * heads + head
  const int row = latent_dim + rope_dim;
  for (int k = threadIdx.x; k < row; k += blockDim.x) {
    const float v = k < latent_dim ? q_latent[th * latent_dim + k] : q_rope[th * q_rope_stride + (k - latent_dim)];
    out[th * row + k] = float_to_bf16(v * scale);
  }
}

// One warp per (head, token): max and sum over the selected positions, then the probabilities.
__global__ void sparse_softmax_kernel(const float* scores, int n, int heads, int context, const int32_t* selected,
                                      int max_selected, const int32_t* num_selected, uint16_t* probs) {
  const int64_t warp_id = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (warp_id >= int64_t{n} * heads) return;
  const int h = static_cast<int>(warp_id / n), i = static_cast<int>(warp_id % n);
  const float* row = scores + (static_cast<int64_t>(h) * n + i) * context;
  uint16_t* out = probs + (static_cast<int64_t>(h) * n + i) * context;
  const int32_t* chosen = selected + static_cast<int64_t>(i) * max_selected;
  const int count = num_selected[i];
  float m = -INFINITY;
  for (int k = lane; k < count; k += 32) m = fmaxf(m, row[chosen[k]]);
  m = warp_max(m);
  float sum = 0.0f;
  for (int k = lane; k < count; k += 32) sum += __expf(row[chosen[k]] - m);
  const float inv = 1.0f / warp_sum(sum);
  for (int k = lane; k < count; k += 32) out[chosen[k]] = float_to_bf16(__expf(row[chosen[k]] - m) * inv);
}

}  // namespace

void mla_gather_context(const uint16_t* cache, const int32_t* block_table, int block_size, int context, int row_size,
                        uint16_t* out, cudaStream_t stream) {
  if (context <= 0) return;
  gather_context_kernel<<<context, 128, 0, stream>>>(cache, block_table, block_size, row_size, out);
  check(cudaGetLastError(), "mla_gather_context launch");
}

void mla_prefill_queries(const float* q_latent, const float* q_rope, int64_t q_rope_stride, int n, int heads,
                         int latent_dim, int rope_dim, float scale, uint16_t* out, cudaStream_t stream) {
  if (n <= 0) return;
  prefill_queries_kernel<<<static_cast<unsigned>(n) * heads, 128, 0, stream>>>(q_latent, q_rope, q_rope_stride, heads,
                                                                               latent_dim, rope_dim, scale, out);
  check(cudaGetLastError(), "mla_prefill_queries launch");
}

void mla_sparse_softmax(const float* scores, int n, int heads, int context, const int32_t* selected, int max_selected,
                        const int32_t* num_selected, uint16_t* probs, cudaStream_t stream) {
  if (n <= 0) return;
  const int64_t threads = int64_t{n} * heads * 32;
  sparse_softmax_kernel<<<blocks_for(threads, 256), 256, 0, stream>>>(scores, n, heads, context, selected, max_selected,
                                                                     num_selected, probs);
  check(cudaGetLastError(), "mla_sparse_softmax launch");
}

size_t mla_workspace_floats(int num_tokens, int num_heads, int latent_dim, int num_splits) {
  if (num_splits <= 1) return 0;
  return static_cast<size_t>(num_tokens) * num_heads * num_splits * (latent_dim + 2);
}

int mla_num_splits(int num_tokens, int num_heads, int max_context) {
  static int num_sms = [] {
    int device = 0, sms = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    return std::max(sms, 1);
  }();
  const int blocks = num_tokens * ((num_heads + kHeadsPerBlock - 1) / kHeadsPerBlock);
  const int wanted = (2 * num_sms + blocks - 1) / blocks;
  const int max_useful = std::max(1, (max_context + 2 * kTile - 1) / (2 * kTile));  // two tiles per split at least
  return std::clamp(std::min(wanted, max_useful), 1, 64);
}

void mla_attention(const MlaAttentionArgs& args, cudaStream_t stream) {
  const int launch_tokens = args.launch_tokens < 0 ? args.num_tokens - args.first_token : args.launch_tokens;
  if (launch_tokens <= 0) return;
  GLMS_CHECK(args.latent_dim <= 32 * kMaxLatentPerLane, "mla_attention: latent_dim over 512");
  GLMS_CHECK(args.num_splits >= 1 && (args.num_splits == 1 || args.workspace), "mla_attention: splits need a workspace");
  const SharedLayout layout = shared_layout(args.latent_dim, args.rope_dim);
  check(cudaFuncSetAttribute(mla_attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(layout.total())),
        "mla_attention shared memory");
  const dim3 grid(launch_tokens, (args.num_heads + kHeadsPerBlock - 1) / kHeadsPerBlock, args.num_splits);
  mla_attention_kernel<<<grid, kThreads, layout.total(), stream>>>(args, layout);
  check(cudaGetLastError(), "mla_attention launch");
  if (args.num_splits > 1) {
    mla_combine_kernel<<<static_cast<unsigned>(launch_tokens) * args.num_heads, 128, 0, stream>>>(args);
    check(cudaGetLastError(), "mla_combine launch");
  }
}

}  // namespace glms::ops::cuda
