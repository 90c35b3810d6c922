// The DSA indexer on CUDA: scores every cached indexer key of a token's context, then keeps the
// top-k positions. Tokens whose context fits in top-k select every causal position.
#pragma once

#include <cstdint>

struct CUstream_st;
using cudaStream_t = CUstream_st*;

namespace glms::ops::cuda {

struct IndexerScoreArgs {
  const float* queries = nullptr;       // [T, heads, dim] fp32, rotated (unless rope_inv_freq)
  const float* head_weights = nullptr;  // [T, heads] fp32 (weights_proj output, unscaled)
  // This layer's keys: [num_slots, dim] bf16, or with key_scales ([num_slots] fp32) E4M3 codes
  // (the FP8 cache, kv_cache.h), a key's value code x its scale.
  const void* key_cache = nullptr;
  const float* key_scales = nullptr;
  const int32_t* block_tables = nullptr;  // [num_sequences, max_blocks]
  int max_blocks = 0;
  const int32_t* token_sequence = nullptr;  // [T]
  const int32_t* positions = nullptr;       // [T]: token t's context is positions 0..positions[t]
  int block_size = 0;
  int num_tokens = 0, heads = 0, dim = 0;
  int top_k = 0;             // tokens with context <= top_k are skipped (they select everything)
  float head_scale = 1.0f;   // 1 / sqrt(heads), applied to the head weights
  float softmax_scale = 1.0f;  // 1 / sqrt(dim)
  int max_context = 0;       // the batch's largest context (sizes the grid)
  float* scores = nullptr;   // [T, score_stride]: sum_h relu(q_h . k * softmax_scale) * w_h * head_scale
  int64_t score_stride = 0;
  int first_token = 0, launch_tokens = -1;  // tokens [first, first + launch) (-1: all) are scored
  // indexer_scores' lanes a key: 1, or 4 (32 heads or more: 8 heads a lane, more warps for few tokens)
  int threads_per_key = 1;
  // indexer_scores_decode_wgmma only: with rope_inv_freq ([rope_dim / 2]), the queries are not
  // rotated yet, and the kernel rotates each head's first rope_dim values as rope_rows(queries,
  // T, heads, dim, 0, rope_dim, positions, rope_inv_freq) would, to the bit, while it stages them.
  const float* rope_inv_freq = nullptr;
  int rope_dim = 0;
  // indexer_scores_decode_wgmma only: split the tokens' keys over no more blocks than the SMs
  // hold at once (else about four an SM). The scores are the same either way.
  bool decode_one_wave = false;
};
void indexer_scores(const IndexerScoreArgs& args, cudaStream_t stream);

class Gemm;

// Buffers of indexer_scores_gemm: keys [context, dim] fp32; head_scores `head_score_elements` fp32.
struct IndexerGemmWorkspace {
  float* keys = nullptr;
  float* head_scores = nullptr;
  int64_t head_score_elements = 0;
};

// The same scores for a prefill chunk of one sequence (tokens [first_token, first_token +
// launch_tokens), whose context is positions 0..context-1 of `block_table`, a device row): the
// sequence's keys are gathered once, one GEMM on TF32 tensor cores (fp32 sums) scores every
// (token, head) against every key, and a reduction applies relu, the head weights and the sum
// over heads (causal positions only). TF32 moves scores by about 1e-3 relative: only the top-k
// of near-tied positions can differ from the fp32 kernel's.
void indexer_scores_gemm(const IndexerScoreArgs& args, const int32_t* block_table, int context,
                         const IndexerGemmWorkspace& workspace, Gemm& gemm, cudaStream_t stream);

// The same scores on Hopper's warpgroup tensor cores for GLM-5's indexer (32 heads of 128),
// fused with the relu, head weights and sum over heads, so no per-head product reaches global
// memory (indexer_wgmma.cu): the sequence's keys gathered once as bf16 into workspace.keys, the
// queries rounded to bf16, fp32 sums. bf16 inputs move scores by about 4e-3 relative (TF32's
// 1e-3 above): again only near-tied positions can leave or join the top-k.
// With `fp8_operands`, DeepSeek-V3.2's FP8 indexer: each query row (token, head) and each key
// rounded to E4M3 with a scale of its own (amax / 448; an FP8 cache's keys are already so), the
// codes multiplied on the FP8 tensor cores; the scores are then those of the rounded operands
// (quant::round_index_key_fp8 on the host), within about 1e-3 relative.
bool indexer_scores_wgmma_supported(int heads, int dim);
void indexer_scores_wgmma(const IndexerScoreArgs& args, const int32_t* block_table, int context,
                          const IndexerGemmWorkspace& workspace, cudaStream_t stream, bool fp8_operands = false);

// The decode scores (indexer_scores' job) on Hopper's warpgroup tensor cores for GLM-5's indexer
// (32 heads of 128), fused with the relu, head weights and sum over heads (indexer_decode_wgmma.cu):
// a block per (token, share of its context) streams the token's keys through shared memory by
// its block table. bf16 queries, fp32 sums: scores within about 4e-3 relative of the fp32
// kernel's, as indexer_scores_wgmma's; FP8 keys are multiplied as their exact codes, then scaled.
// It takes the queries' rope itself (args.rope_inv_freq): a decode step's selection then starts
// with the scores' launch (behind a rope launch, the scores started about 5 us late in every
// full indexer layer of a batch-1 step on an H100, beside the absorption).
bool indexer_scores_decode_wgmma_supported(int heads, int dim);
void indexer_scores_decode_wgmma(const IndexerScoreArgs& args, cudaStream_t stream);

// Per token, the `top_k` largest of scores[t, 0..positions[t]] (ties: lower position first),
// written in increasing position order to selected[t, :] with num_selected[t] = top_k; tokens
// whose context is at most top_k get 0..positions[t] (their scores are not read).
// selected: [n, max_selected] int32. blocks_per_token (1, 2, 4 or 8): the blocks that share a
// token's selection, a thread block cluster (Hopper) when more than one, in steps of up to 16
// tokens (a token of at most 8192 positions, which one block holds in registers, the cluster's
// first block alone); larger steps take one block a token, and steps of 512 tokens or more
// (prefill chunks) select_top_k_prefill's kernel, whatever blocks_per_token says.
void select_top_k(const float* scores, int64_t score_stride, const int32_t* positions, int64_t n, int top_k,
                  int32_t* selected, int max_selected, int32_t* num_selected, cudaStream_t stream,
                  int blocks_per_token = 1);
// select_top_k's path for steps of 512 tokens or more (prefill chunks): one 256-thread block a
// token, the row read three times (top_k_prefill.cu). The same contract and result.
void select_top_k_prefill(const float* scores, int64_t score_stride, const int32_t* positions, int64_t n, int top_k,
                          int32_t* selected, int max_selected, int32_t* num_selected, cudaStream_t stream);

}  // namespace glms::ops::cuda
