// MLA attention on tensor cores. The latent cache is shared by all heads (MQA in latent space),
// so a token's attention is two small GEMMs: its heads' queries [H, 576] against its selected
// rows [rows, 576], and the probabilities [H, rows] against the rows' latents [rows, 512]. The
// kernels here gather rows into contiguous buffers and run the softmax between the cuBLAS
// calls; decode tokens gather their own selections, prefill chunks their sequence's context
// (FP8 rows widened to bf16 on the way).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "core/error.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/device_math.cuh"
#include "ops/cuda/fp8.cuh"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/mla.h"

namespace glms::ops::cuda {

namespace {

// dst[0, latent + rope) = the row of `slot` as bf16, `lanes` threads from `lane` on.
__device__ __forceinline__ void copy_row_bf16(const void* cache, CacheStorage storage, int64_t slot, int latent_dim,
                                              int rope_dim, uint16_t* dst, int lane, int lanes) {
  const int row_size = latent_dim + rope_dim;
  if (storage == CacheStorage::kBf16) {
    const uint16_t* src = static_cast<const uint16_t*>(cache) + slot * row_size;
    for (int k = lane; k < row_size; k += lanes) dst[k] = src[k];
  } else {
    const uint8_t* src = static_cast<const uint8_t*>(cache) + slot * quant::kv_fp8_row_bytes(latent_dim, rope_dim);
    for (int k = lane; k < row_size; k += lanes) dst[k] = float_to_bf16(fp8_row_value(src, k, latent_dim));
  }
}

__global__ void gather_context_kernel(const void* cache, CacheStorage storage, const int32_t* block_table,
                                      int block_size, int latent_dim, int rope_dim, uint16_t* out) {
  chained_grid_prologue();
  const int j = blockIdx.x;
  const int64_t slot = static_cast<int64_t>(block_table[j / block_size]) * block_size + j % block_size;
  copy_row_bf16(cache, storage, slot, latent_dim, rope_dim, out + static_cast<int64_t>(j) * (latent_dim + rope_dim),
                threadIdx.x, blockDim.x);
}

// mla_prepare_queries: a warp a (token, head) row: its nope columns to bf16 (fp32 q: four a lane
// at once where the row's width allows; bf16 q holds them already), its rope pairs rotated and
// scaled into the staged row, the staged row's padding zeroed. (A thread an element needed a
// 64-bit division each: 1.4 TB/s.)
template <typename Query>
__global__ void prepare_queries_kernel(const Query* q, int64_t num_rows, int heads, int64_t qd, int nope, int rope_dim,
                                       const int32_t* positions, const float* inv_freq, int latent_dim, int width,
                                       float scale, uint16_t* q_nope, uint16_t* queries) {
  chained_grid_prologue();
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t{gridDim.x} * blockDim.x / 32;
  for (int64_t th = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / 32; th < num_rows; th += warps) {
    const Query* row = q + th * qd;  // th = token * heads + head
    if constexpr (std::is_same_v<Query, float>) {
      uint16_t* const nope_out = q_nope + th * qd;
      if (nope % 4 == 0 && qd % 4 == 0) {
        for (int k = 4 * lane; k < nope; k += 128) {
          const float4 v = *reinterpret_cast<const float4*>(row + k);
          *reinterpret_cast<uint2*>(nope_out + k) = make_uint2(pack_bf16_pair(v.x, v.y), pack_bf16_pair(v.z, v.w));
        }
      } else {
        for (int k = lane; k < nope; k += 32) nope_out[k] = float_to_bf16(row[k]);
      }
    }
    uint16_t* const staged = queries + th * width + latent_dim;
    const float position = static_cast<float>(positions[th / heads]);
    for (int pair = lane; pair < rope_dim / 2; pair += 32) {
      float rotated[2] = {load_as_float(row + nope + 2 * pair), load_as_float(row + nope + 2 * pair + 1)};
      rotate_pair(rotated, inv_freq[pair] * position);
      staged[2 * pair] = float_to_bf16(rotated[0] * scale);
      staged[2 * pair + 1] = float_to_bf16(rotated[1] * scale);
    }
    for (int c = rope_dim + lane; c < width - latent_dim; c += 32) staged[c] = 0;
  }
}

// One warp per (head, token): max and sum over the selected positions, then the probabilities.
__global__ void sparse_softmax_kernel(const float* scores, int n, int heads, int context, const int32_t* selected,
                                      int max_selected, const int32_t* num_selected, uint16_t* probs) {
  chained_grid_prologue();
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

// Block (token, group of 8 rows), a warp per row: row j of the token's gathered buffer is the
// cache row of its j-th selected position, or zeros past its count.
__global__ void gather_selected_kernel(MlaAttentionArgs a, int rows, uint16_t* out) {
  chained_grid_prologue();
  const int i = blockIdx.x, t = a.first_token + i;
  const int j = blockIdx.y * 8 + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (j >= rows) return;
  const int row_size = a.latent_dim + a.rope_dim;
  uint16_t* dst = out + (static_cast<int64_t>(i) * rows + j) * row_size;
  if (j >= a.num_selected[t]) {
    for (int k = lane; k < row_size; k += 32) dst[k] = 0;
    return;
  }
  const int position = a.selected[static_cast<int64_t>(t) * a.max_selected + j];
  const int32_t* blocks = a.block_tables + static_cast<int64_t>(a.token_sequence[t]) * a.max_blocks;
  const int64_t slot = static_cast<int64_t>(blocks[position / a.block_size]) * a.block_size + position % a.block_size;
  copy_row_bf16(a.cache, a.storage, slot, a.latent_dim, a.rope_dim, dst, lane, 32);
}

// A warp per (token, head): softmax over the token's first count entries of its score row.
__global__ void dense_softmax_kernel(const float* scores, int n, int heads, int rows, const int32_t* num_selected,
                                     uint16_t* probs) {
  chained_grid_prologue();
  const int64_t warp_id = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (warp_id >= int64_t{n} * heads) return;
  const int i = static_cast<int>(warp_id / heads);
  const float* row = scores + warp_id * rows;
  uint16_t* out = probs + warp_id * rows;
  const int count = num_selected[i];
  float m = -INFINITY;
  for (int k = lane; k < count; k += 32) m = fmaxf(m, row[k]);
  m = warp_max(m);
  float sum = 0.0f;
  for (int k = lane; k < count; k += 32) sum += __expf(row[k] - m);
  const float inv = 1.0f / warp_sum(sum);
  for (int k = lane; k < rows; k += 32) out[k] = k < count ? float_to_bf16(__expf(row[k] - m) * inv) : 0;
}

}  // namespace

void mla_attention_gathered(const MlaAttentionArgs& a, int max_selected_in_step, const MlaGatherWorkspace& w,
                            Gemm& gemm, cudaStream_t stream) {
  const int launch_tokens = a.launch_tokens < 0 ? a.num_tokens - a.first_token : a.launch_tokens;
  if (launch_tokens <= 0) return;
  const int H = a.num_heads, L = a.latent_dim, row = a.latent_dim + a.rope_dim;
  const int64_t width = mla_padded_row(a.latent_dim, a.rope_dim);  // of a staged query
  const int rows = std::max(1, max_selected_in_step);
  const int64_t per_token_gathered = int64_t{rows} * row, per_token_scores = int64_t{H} * rows;
  const int chunk_cap = static_cast<int>(
      std::min<int64_t>(w.gathered_elements / per_token_gathered, w.score_elements / per_token_scores));
  GLMS_CHECK(chunk_cap >= 1, "mla_attention_gathered: the workspace holds no token");
  for (int done = 0; done < launch_tokens;) {
    const int n = std::min(chunk_cap, launch_tokens - done);
    MlaAttentionArgs chunk = a;
    chunk.first_token = a.first_token + done;
    const int first = chunk.first_token;
    launch_chained("gather_selected launch", gather_selected_kernel, dim3(n, (rows + 7) / 8), 256, 0, stream, chunk,
                   rows, w.gathered);
    // scores[i, h, :] = queries[first + i, h, :row] . gathered[i]^T   [n, H, rows] fp32
    gemm.batched(a.queries + first * H * width, H, width, int64_t{H} * width, w.gathered, rows, row, row,
                 per_token_gathered, false, w.scores, rows, per_token_scores, n, stream);
    const int64_t threads = int64_t{n} * H * 32;
    launch_chained("dense_softmax launch", dense_softmax_kernel, blocks_for(threads, 256), 256, 0, stream, w.scores, n,
                   H, rows, a.num_selected + first, w.probs);
    // out[first + i, h, :] = probs[i, h, :] . gathered[i][:, :latent]
    gemm.batched_to_bf16(w.probs, H, rows, per_token_scores, w.gathered, rows, L, row, per_token_gathered, true,
                         a.out + int64_t{first} * H * L, L, int64_t{H} * L, n, stream);
    done += n;
  }
}

void mla_gather_context(const void* cache, CacheStorage storage, const int32_t* block_table, int block_size,
                        int context, int latent_dim, int rope_dim, uint16_t* out, cudaStream_t stream) {
  if (context <= 0) return;
  launch_chained("mla_gather_context launch", gather_context_kernel, context, 128, 0, stream, cache, storage,
                 block_table, block_size, latent_dim, rope_dim, out);
}

namespace {

template <typename Query>
void launch_prepare_queries(const Query* q, int num_tokens, int heads, int64_t qd, int64_t nope, int rope_dim,
                            const int32_t* positions, const float* inv_freq, int latent_dim, float scale,
                            uint16_t* q_nope, uint16_t* queries, cudaStream_t stream) {
  if (num_tokens <= 0) return;
  GLMS_CHECK(rope_dim % 2 == 0 && nope + rope_dim <= qd, "mla_prepare_queries: an even rope inside each head's row");
  const int width = mla_padded_row(latent_dim, rope_dim);
  const int64_t num_rows = int64_t{num_tokens} * heads;
  launch_chained("mla_prepare_queries launch", prepare_queries_kernel<Query>, elementwise_blocks(num_rows * 32, 256),
                 256, 0, stream, q, num_rows, heads, qd, static_cast<int>(nope), rope_dim, positions, inv_freq,
                 latent_dim, width, scale, q_nope, queries);
}

}  // namespace

void mla_prepare_queries(const float* q, int num_tokens, int heads, int64_t qd, int64_t nope, int rope_dim,
                         const int32_t* positions, const float* inv_freq, int latent_dim, float scale,
                         uint16_t* q_nope, uint16_t* queries, cudaStream_t stream) {
  launch_prepare_queries(q, num_tokens, heads, qd, nope, rope_dim, positions, inv_freq, latent_dim, scale, q_nope,
                         queries, stream);
}

void mla_prepare_queries(const uint16_t* q, int num_tokens, int heads, int64_t qd, int64_t nope, int rope_dim,
                         const int32_t* positions, const float* inv_freq, int latent_dim, float scale,
                         uint16_t* queries, cudaStream_t stream) {
  launch_prepare_queries(q, num_tokens, heads, qd, nope, rope_dim, positions, inv_freq, latent_dim, scale, nullptr,
                         queries, stream);
}

void mla_sparse_softmax(const float* scores, int n, int heads, int context, const int32_t* selected, int max_selected,
                        const int32_t* num_selected, uint16_t* probs, cudaStream_t stream) {
  if (n <= 0) return;
  const int64_t threads = int64_t{n} * heads * 32;
  launch_chained("mla_sparse_softmax launch", sparse_softmax_kernel, blocks_for(threads, 256), 256, 0, stream, scores,
                 n, heads, context, selected, max_selected, num_selected, probs);
}

}  // namespace glms::ops::cuda
