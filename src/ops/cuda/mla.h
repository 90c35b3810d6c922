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

}  // namespace glms::ops::cuda
