// MLA attention with absorbed weights over the paged bf16 latent cache, for decode and prefill
// tokens alike: each token attends over its own list of selected context positions (every
// causal position, or the DSA top-k), through tensor-core GEMMs.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/kv_cache.h"

struct CUstream_st;
using cudaStream_t = CUstream_st*;

namespace glms::ops::cuda {

struct MlaAttentionArgs {
  // [T, H, mla_padded_row] bf16: scale * [W_uk^T q_nope, rotated q_rope] per head, zero-padded
  // (the absorption GEMM and mla_prepare_queries write them; the softmax scale is in them).
  const uint16_t* queries = nullptr;
  const void* cache = nullptr;  // this layer's rows in `storage` (kv_cache.h)
  CacheStorage storage = CacheStorage::kBf16;
  const int32_t* selected = nullptr;      // [T, max_selected] context positions each token attends
  const int32_t* num_selected = nullptr;  // [T]
  int max_selected = 0;
  const int32_t* block_tables = nullptr;    // [num_sequences, max_blocks] physical block ids
  int max_blocks = 0;                       // 0: every token reads the table's first row
  const int32_t* token_sequence = nullptr;  // [T] sequence of each token
  int block_size = 0;
  int num_tokens = 0, num_heads = 0, latent_dim = 0, rope_dim = 0;
  int first_token = 0, launch_tokens = -1;  // tokens [first, first + launch) (-1: all) are computed
  uint16_t* out = nullptr;  // [T, H, latent] bf16: softmax-weighted sum of latents, rounded once
  // bf16 rows in the wgmma pass, split or not: the warp-specialised kernel
  // (mla_attention_wgmma_specialized); false: mla_wgmma.cu's.
  bool warp_specialized = true;
  // That kernel with a ring of four stages of 32 rows whose steps the consumers score in turn
  // (mla_wgmma_ring.cu); false: two stages of 64 rows, each consumer scoring half of every step.
  bool ring_stages = false;
  // Two-stage kernel, one split a token (prefill chunks): a block an SM taking token after token,
  // the next token's rows and queries landing while this one's last steps and epilogue run;
  // false: a block a token. persistent_blocks > 0: that many blocks instead (tests, so that each
  // block takes several tokens).
  bool persistent = false;
  int persistent_blocks = 0;
  // The persistent launch with its two stages as one iteration of 128 rows, consumer c scoring
  // all 64 of stage c (m64n64: S within shared memory's rate; mla_wgmma_paired.cu); false: each
  // consumer scores 32 rows of every 64-row step.
  bool paired_stages = false;
  // With splits (decode batches of fewer tokens than SMs), a token's splits of bf16 rows as one
  // thread block cluster of the warp-specialised kernel where they are at most this many (0 ..
  // kMlaMaxClusterSplits; above 8 a non-portable cluster size), combined through distributed
  // shared memory in the same launch; otherwise partials in global memory and mla_merge_splits.
  int cluster_splits = 0;
};

class Gemm;

// Buffers of mla_attention_gathered. gathered: `gathered_elements` bf16; scores / probs:
// `score_elements` fp32 / bf16.
struct MlaGatherWorkspace {
  uint16_t* gathered = nullptr;
  int64_t gathered_elements = 0;
  float* scores = nullptr;
  uint16_t* probs = nullptr;
  int64_t score_elements = 0;
};

// Attention for tokens [first_token, first_token + launch_tokens): each token's selected rows are
// gathered as bf16 (FP8 rows widened) into [rows, latent + rope] (rows =
// `max_selected_in_step`, at least every token's count; rows past a token's count are zero and
// masked), then per token one GEMM scores all heads against its rows, a softmax runs per head,
// and a second GEMM sums the latents. Tokens go in chunks that fit the workspace; the launches
// depend only on the token count and `max_selected_in_step` (graph-capturable).
void mla_attention_gathered(const MlaAttentionArgs& args, int max_selected_in_step, const MlaGatherWorkspace& workspace,
                            Gemm& gemm, cudaStream_t stream);

// The same attention in one pass on tensor cores (mla_fused.cu): a block per (token, split of its
// selection) holds all heads' queries, gathers 64 selected rows at a time into shared memory,
// and keeps an online softmax; a second kernel merges the splits. `partials` (may be
// null: one split) holds the splits' sums: the number of splits is bounded so that
// launch_tokens * splits * num_heads * (latent + 2) floats fit `partial_elements`. Launches depend
// only on the token count and `max_selected_in_step` (graph-capturable).
// Where the shapes are GLM-5's (latent 512, rope 64) the pass runs on the warpgroup tensor cores
// (mla_attention_wgmma, its splits from mla_wgmma_splits) unless `allow_wgmma` is false; with
// `allow_wgmma_splits` false it does so only where each token's selection fits one split or
// there are mla_wgmma_min_tokens() tokens or more (a block per SM), the mma.sync kernel otherwise.
// FP8 rows: the mma.sync kernel widens them value by value (slow; it serves other shapes), the
// wgmma pass a tile at a time.
bool mla_attention_fused_supported(int num_heads, int latent_dim, int rope_dim);
int mla_padded_row(int latent_dim, int rope_dim);  // latent + rope rounded up to 16
void mla_attention_fused(const MlaAttentionArgs& args, int max_selected_in_step, float* partials,
                         int64_t partial_elements, cudaStream_t stream, bool allow_wgmma = true,
                         bool allow_wgmma_splits = true);

// The same attention on Hopper's wgmma (mla_wgmma.cu): a block per (token, split of its
// selection) streams the selected rows through shared memory in 64-row tiles, two in flight
// (FP8 rows: one tile's codes in flight while the last is widened to bf16 and multiplied). With
// `splits` > 1 the selections (at most max_selected_in_step rows) go in that many splits of
// whole tiles (fewer where that covers them), whose sums `partials` holds as mla_attention_fused's
// do, merged by mla_merge_splits.
bool mla_attention_wgmma_supported(int num_heads, int latent_dim, int rope_dim);  // H <= 64, 512 + 64
int mla_wgmma_min_tokens();  // the device's SM count
void mla_attention_wgmma(const MlaAttentionArgs& args, cudaStream_t stream,
                         int max_selected_in_step = 0, int splits = 1, float* partials = nullptr,
                         int64_t partial_elements = 0);
// The wgmma pass for bf16 rows (mla_wgmma_specialized.cu): a producer warpgroup gathers each
// token's rows 64 at a time into two stages while two consumer warpgroups score 32 rows each and
// share the P V products, the stages handed over through mbarriers; with args.ring_stages, 32
// rows at a time into a ring of four stages whose steps the consumers score in turn
// (mla_wgmma_ring.cu). With `splits` > 1 each
// token's selection goes in splits of rows_per_split rows (a multiple of 64) whose sums
// `partials` receives as mla_merge_splits reads them (the caller merges), or, where
// args.cluster_splits >= splits, one cluster a token that merges them itself (no partials).
void mla_attention_wgmma_specialized(const MlaAttentionArgs& args, cudaStream_t stream, int rows_per_split = 0,
                                     int splits = 1, float* partials = nullptr);
// The persistent kernel's tokens (one split each) with the two stages as one iteration of 128
// rows, consumer c scoring all of stage c (mla_wgmma_paired.cu).
void mla_attention_wgmma_paired(const MlaAttentionArgs& args, cudaStream_t stream);
// For benchmarks: that kernel's launch (the ring's with args.ring_stages), one split a token,
// with consumers that hand each stage back as soon as it lands and write nothing: the time the
// producer's gathers (queries and selected rows into shared memory) take on their own, the floor
// of the attention's time.
void mla_attention_copies_only(const MlaAttentionArgs& args, cudaStream_t stream);
// The split count for launch_tokens tokens of up to max_selected_in_step rows whose partials fit
// partial_elements floats: the fewest waves of a block per SM times a block's tiles
// (mla_splits_for on this device). cluster_limit: splits up to this many go as one cluster
// (mla_cluster_limit) and so cost no merge; 0 leaves them costed as partials and a merge.
int mla_wgmma_splits(int launch_tokens, int max_selected_in_step, int num_heads, int64_t partial_elements,
                     int cluster_limit = 0);
// That choice for launch_tokens tokens of `tiles` 64-row tiles on `sms` SMs, at most
// most_unclustered splits with partials: a block per SM, s splits cost the waves of blocks times
// a block's tiles (its queries load as one more), plus about two tiles' time for the merge's pass
// over the partials unless s <= cluster_limit; an equal cost keeps the unclustered count.
int mla_splits_for(int launch_tokens, int tiles, int sms, int most_unclustered, int cluster_limit);

// Splits' partials: [launch_tokens][splits][H][latent] unnormalised sums, then
// [launch_tokens][splits][H][2] (running max, sum of exponentials). out[token, h, :] = their
// softmax-weighted combination, over the splits that saw a selected row.
constexpr int kMlaMaxSplits = 512;
constexpr int kMlaMaxClusterSplits = 16;  // Hopper's largest (non-portable) cluster size
// The most splits of a token that go as one cluster merging them itself: args.cluster_splits
// (capped at 16) where the rows are bf16 in the warp-specialised kernel, else 0.
inline int mla_cluster_limit(const MlaAttentionArgs& args) {
  if (args.storage != CacheStorage::kBf16 || !args.warp_specialized) return 0;
  return args.cluster_splits < kMlaMaxClusterSplits ? args.cluster_splits : kMlaMaxClusterSplits;
}
// The largest cluster of a token's splits (16, 8, 4 or 2; else 0) the current device holds at
// once for the warp-specialised kernel (its two stages, or the ring): the most
// MlaAttentionArgs::cluster_splits may ask for there (CudaGlm5Model caps its option so).
int mla_largest_cluster_splits(bool ring_stages);
// Whether a token's `splits` go as one cluster.
inline bool mla_splits_clustered(const MlaAttentionArgs& args, int splits) {
  return splits > 1 && splits <= mla_cluster_limit(args);
}
void mla_merge_splits(const MlaAttentionArgs& args, int launch_tokens, int splits, const float* partials,
                      cudaStream_t stream);

// A decode or prefill step's query side before the absorption, in one pass over q ([T, H, qd]
// fp32, each head's nope columns then its rope columns, not yet rotated): q_nope[t, h, :nope] =
// bf16 of the nope columns (row stride qd: the absorption GEMM's input; its other columns are
// left as they are), and queries[t, h, latent ..) = bf16(scale * the rope columns rotated at
// positions[t] (interleaved pairs, as rope_rows)) then zeros to mla_padded_row. Columns
// [0, latent) of queries are the absorption's.
// The same from q in bf16 ([T, H, qd], rounded once from the q_b GEMM's sums), whose nope columns
// are already the absorption GEMM's input: only the rope columns are rotated into queries.
void mla_prepare_queries(const uint16_t* q, int num_tokens, int heads, int64_t qd, int64_t nope, int rope_dim,
                         const int32_t* positions, const float* inv_freq, int latent_dim, float scale,
                         uint16_t* queries, cudaStream_t stream);
void mla_prepare_queries(const float* q, int num_tokens, int heads, int64_t qd, int64_t nope, int rope_dim,
                         const int32_t* positions, const float* inv_freq, int latent_dim, float scale,
                         uint16_t* q_nope, uint16_t* queries, cudaStream_t stream);


// Prefill attention for a chunk of one sequence's tokens through tensor-core GEMMs: the model
// gathers the context's cache rows once (mla_gather_context), computes every head's scores
// against the whole context from the staged queries with one batched GEMM, keeps each token's
// selected positions (mla_sparse_softmax: the others get probability zero), and multiplies the
// probabilities by the latents with a second GEMM. Dense scores cost more FLOPs than the sparse
// ones but run on tensor cores.

// out[j, :] = cache row of position j (j < context) of the sequence with `block_table`, as bf16
// (FP8 rows widened: codes times their scale, rounded to bf16). out: [context, latent + rope].
void mla_gather_context(const void* cache, CacheStorage storage, const int32_t* block_table, int block_size,
                        int context, int latent_dim, int rope_dim, uint16_t* out, cudaStream_t stream);
// probs[h, i, j] = softmax over token i's selected positions of scores[h, i, :], zero elsewhere
// (probs must be zeroed first). scores: [H, n, context] fp32; probs: [H, n, context] bf16;
// selected/num_selected: the chunk's rows of the selection.
void mla_sparse_softmax(const float* scores, int n, int heads, int context, const int32_t* selected, int max_selected,
                        const int32_t* num_selected, uint16_t* probs, cudaStream_t stream);

// The attention output's heads for an FP8 o_proj (mla_unabsorb.cu): heads[t, h, :] = o[t, h, :] .
// W_uv[h]^T, each sum rounded to bf16 and the rows [T, heads * v_dim] left only as E4M3 rows
// (`out`: the codes and scales quantize_fp8_rows would make of those bf16 rows, pad rows
// included), which o_proj's block-FP8 GEMM reads. o: [T, heads, latent] bf16; W_uv[h]: the
// [v_dim, latent] bf16 rows from w_uv + h * head_rows * latent (kv_b_proj's value rows:
// w_uv = kv_b_proj + nope * latent, head_rows = nope + v_dim). GLM-5's shapes only (latent 512,
// v_dim 256); o and w_uv 16-byte aligned.
bool mla_unabsorb_fp8_supported(int64_t latent, int64_t v_dim);
void mla_unabsorb_fp8(const uint16_t* o, int64_t T, int heads, const uint16_t* w_uv, int64_t head_rows, Fp8Rows out,
                      cudaStream_t stream);

}  // namespace glms::ops::cuda
