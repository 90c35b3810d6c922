// MLA attention with absorbed weights over the paged bf16 latent cache, for decode and prefill
// tokens alike: each token attends over its own list of selected context positions (every
// causal position, or the DSA top-k), reading each cache row once per group of heads.
#pragma once

#include <cstddef>
#include <cstdint>

struct CUstream_st;
using cudaStream_t = CUstream_st*;

namespace glms::ops::cuda {

struct MlaAttentionArgs {
  const float* q_latent = nullptr;  // [T, H, latent] fp32: W_uk^T q_nope per head
  const float* q_rope = nullptr;    // rotated rope query of (t, h) at q_rope + (t * H + h) * q_rope_stride
  int64_t q_rope_stride = 0;
  const uint16_t* cache = nullptr;  // [num_slots, latent + rope] bf16 rows of this layer
  const int32_t* selected = nullptr;      // [T, max_selected] context positions each token attends
  const int32_t* num_selected = nullptr;  // [T]
  int max_selected = 0;
  const int32_t* block_tables = nullptr;    // [num_sequences, max_blocks] physical block ids
  int max_blocks = 0;
  const int32_t* token_sequence = nullptr;  // [T] sequence of each token
  int block_size = 0;
  int num_tokens = 0, num_heads = 0, latent_dim = 0, rope_dim = 0;
  int first_token = 0, launch_tokens = -1;  // tokens [first, first + launch) (-1: all) are computed
  float scale = 1.0f;          // softmax scale
  int num_splits = 1;          // context splits per (token, head group), merged by a second pass
  float* workspace = nullptr;  // mla_workspace_floats(...) floats when num_splits > 1
  float* out = nullptr;        // [T, H, latent] fp32: softmax-weighted sum of latents
};

// Floats of workspace mla_attention needs for `num_splits` > 1.
size_t mla_workspace_floats(int num_tokens, int num_heads, int latent_dim, int num_splits);

// A split count that fills the GPU for `num_tokens` tokens attending up to `max_context` positions.
int mla_num_splits(int num_tokens, int num_heads, int max_context);

// Limits of the kernel: latent_dim <= 512, rope_dim <= 128.
void mla_attention(const MlaAttentionArgs& args, cudaStream_t stream);

// Prefill attention for a chunk of one sequence's tokens through tensor-core GEMMs: the model
// gathers the context's cache rows once (mla_gather_context), packs the chunk's queries
// (mla_prefill_queries), computes every head's scores against the whole context with one
// batched GEMM, keeps each token's selected positions (mla_sparse_softmax: the others get
// probability zero), and multiplies the probabilities by the latents with a second GEMM. Dense
// scores cost more FLOPs than the sparse ones but run on tensor cores.

// out[j, :] = cache row of position j (j < context) of the sequence with `block_table`.
// out: [context, latent + rope] bf16.
void mla_gather_context(const uint16_t* cache, const int32_t* block_table, int block_size, int context, int row_size,
                        uint16_t* out, cudaStream_t stream);
// out[i, h, :] = bf16(scale * [q_latent[i, h, :], q_rope of (i, h)]) for the chunk's n tokens.
// q_latent: [n, H, latent] fp32 (the chunk's rows), q_rope as in MlaAttentionArgs.
void mla_prefill_queries(const float* q_latent, const float* q_rope, int64_t q_rope_stride, int n, int heads,
                         int latent_dim, int rope_dim, float scale, uint16_t* out, cudaStream_t stream);
// probs[h, i, j] = softmax over token i's selected positions of scores[h, i, :], zero elsewhere
// (probs must be zeroed first). scores: [H, n, context] fp32; probs: [H, n, context] bf16;
// selected/num_selected: the chunk's rows of the selection.
void mla_sparse_softmax(const float* scores, int n, int heads, int context, const int32_t* selected, int max_selected,
                        const int32_t* num_selected, uint16_t* probs, cudaStream_t stream);

}  // namespace glms::ops::cuda
