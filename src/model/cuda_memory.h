// What one CUDA rank of a GLM-5 model holds on its GPU besides the weights: the step workspaces
// (activations, the MoE plan and pairs, attention scratch, logits) and the paged cache, from the
// config, the rank's widths and the limits a step is sized for. It is plain arithmetic, built
// without CUDA: CudaGlm5Model allocates exactly these buffers (cuda/model.cpp) and `glmserve
// plan` sums the same sizes, so the two agree on what is left for the KV cache.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "io/model_config.h"
#include "kv/latent_cache.h"
#include "model/shard.h"

namespace glms::model {

// Quantised experts of a MoE layer whose (token, expert) pairs average at most this many per
// expert run on the tensor-core kernels in one pass over every data-parallel rank's rows; the
// per-pair buffers hold that many pairs per expert (cuda/model_impl.h says why the value).
constexpr int kSmallMoePairsPerExpertTensorCores = 64;
// CudaModelOptions::widened_experts_min_pairs by default (0: off), which `glmserve plan` sizes
// the workspaces by.
constexpr int kDefaultWidenedExpertsMinPairs = 1024;
// CudaModelOptions::bf16_moe_reduce_scatter by default, which `glmserve plan` counts the
// data-parallel collectives' bytes by.
constexpr bool kDefaultBf16MoeReduceScatter = false;
// The router logits' planes of a decode step (ops::cuda::kRouterProductPlanes, which the MoE
// block checks against this buffer's size), held for steps below 256 tokens, where the router
// terms take over by default (a longer step under a raised threshold takes the fp32 GEMM).
constexpr int64_t kCudaRouterPlanes = 8;
// Scores buffer of the GEMM attention path (fp32 [heads, chunk, context]), at most 1 GiB.
constexpr int64_t kPrefillScoreFloats = int64_t{1} << 28;
// What the cache leaves free of the memory budget: cuBLAS's lazily loaded kernels, captured
// graphs and NCCL's buffers come after the cache is sized.
constexpr int64_t kCudaMemoryMarginBytes = int64_t{3} << 29;  // 1.5 GiB
// The CUDA context, cuBLAS/cuBLASLt handles and workspaces and the loaded modules, in use before
// any buffer of ours: 0.71 GiB measured on the H200 (CUDA 13, driver 580, `glmserve serve`
// start-up, bench/results/cuda-memory-plan-20261202.json); the plan counts it, the model
// measures what is really in use.
constexpr int64_t kCudaRuntimeBytes = int64_t{727} << 20;

// What the step workspaces are sized for (model::CacheShape and CudaModelOptions carry them).
struct CudaStepLimits {
  int max_tokens = 2048;    // tokens per step
  int max_sequences = 64;   // sequences per step
  int max_logits = 64;      // logits rows per step
  int max_context = 4096;   // positions per sequence
  int block_size = 16;      // cache slots per block
  bool mtp = false;         // the MTP draft layer runs (its weights, workspace and cache)
  // CudaModelOptions::widened_experts_min_pairs: a rank whose steps can bring its tiled MXFP4
  // experts that many pairs per expert (its data-parallel ranks' rows, top_k each, over the
  // model's experts) holds every local expert's gate/up rows in bf16 (0: none).
  int widened_experts_min_pairs = kDefaultWidenedExpertsMinPairs;
};

// The widths of one rank's layers that size its buffers (the largest over its layers).
struct CudaRankWidths {
  int64_t heads = 1;          // attention heads on this rank
  int64_t mlp_inter = 0;      // dense MLP or shared expert intermediate columns on this rank
  int64_t local_experts = 1;  // routed experts per MoE layer on this rank
  int64_t expert_inter = 1;   // intermediate columns of each of them
  int64_t dp_ranks = 1;       // data-parallel ranks whose MoE rows this rank gathers (1: none)
  bool quantised_experts = false;  // MXFP4/FP8 experts (bf16 widening buffers for large batches)
  bool tiled_mxfp4_experts = false;  // MXFP4 experts in the tile layout (those the widened path takes)
  bool mtp_indexer = false;   // the MTP layer has its own indexer keys
  int64_t fp8_linear_cols = 0;  // the widest FP8 linear layer's input (0: none; their activations' codes)
};

// The widths a rank of `shard` has, from the config alone (what its weights will be).
// With `fp8_linears`, the linear layers that suit block FP8 are in it (CudaLinearWeights).
// `mxfp4_experts`: the quantised experts are MXFP4 (tiled where their widths allow).
CudaRankWidths cuda_rank_widths(const io::ModelConfig& config, const ModelShard& shard, bool quantised_experts,
                                bool mtp, bool fp8_linears = false, bool mxfp4_experts = false);

// Byte offsets of the per-step metadata inside one host staging buffer and its device copy.
struct MetadataLayout {
  // routed_tokens: one int, the step's tokens that route to experts (a data-parallel rank's own;
  // its padded batch's dummies and an idle rank's dummy token route nowhere).
  size_t token_ids, positions, token_sequence, logits_tokens, routed_tokens, slot_mapping, block_tables, total;
  MetadataLayout(int max_tokens, int max_logits, int max_sequences, int max_blocks) {
    auto align = [](size_t v) { return (v + 255) / 256 * 256; };
    size_t at = 0;
    slot_mapping = at;
    at = align(at + sizeof(int64_t) * max_tokens);
    token_ids = at;
    at = align(at + sizeof(int32_t) * max_tokens);
    positions = at;
    at = align(at + sizeof(int32_t) * max_tokens);
    token_sequence = at;
    at = align(at + sizeof(int32_t) * max_tokens);
    logits_tokens = at;
    at = align(at + sizeof(int32_t) * max_logits);
    routed_tokens = at;
    at = align(at + sizeof(int32_t));
    block_tables = at;  // last: a step uploads only the rows it uses
    total = at + sizeof(int32_t) * static_cast<size_t>(max_sequences) * max_blocks;
  }
};

// A step's structured-output token masks as one upload (a pinned staging buffer and its device
// copy, CudaWorkspaces::token_masks): the masked rows' logits row indices [max_logits] int32,
// then their masks [max_logits, words] uint32 (words = (vocab + 31) / 32; RowOutput::mask). A
// step copies the indices and the masks of the rows it masks, [0, words_at + rows * words * 4).
struct CudaMaskLayout {
  int64_t words, rows_at, words_at, total;
  CudaMaskLayout(int max_logits, int64_t vocab)
      : words((vocab + 31) / 32),
        rows_at(0),
        words_at((int64_t{4} * std::max(max_logits, 1) + 255) / 256 * 256),
        total(words_at + int64_t{4} * std::max(max_logits, 1) * words) {}
};

// Latent + rope elements rounded up to 16: the row of the fused attention's query scratch
// (cuda::mla_padded_row, which the model checks against this).
inline int64_t cuda_mla_padded_row(int64_t latent, int64_t rope) { return (latent + rope + 15) / 16 * 16; }

inline int cuda_max_blocks(const CudaStepLimits& limits) {
  return (limits.max_context + limits.block_size - 1) / limits.block_size;
}

// The device buffers of one rank's steps: Buffer is cuda::DeviceBuffer in the model and a byte
// count in the plan. Shapes are per step at most (T = max_tokens, H = heads on this rank,
// P = pair_capacity, dp = data-parallel ranks).
template <typename Buffer>
struct CudaWorkspaces {
  Buffer x, normed_f32, block_out;                 // [T, hidden] fp32
  Buffer normed_bf16;                              // [T, hidden] bf16
  Buffer q_resid, q_resid_bf16;                    // [T, q_lora]
  Buffer q, q_bf16;                                // [T, H, qk_head_dim]
  Buffer kv;                                       // [T, kv_lora + rope] fp32
  Buffer staged_queries;                           // [T, H, padded row] bf16 (ops::cuda::MlaAttentionArgs)
  Buffer o_bf16;                                   // [T, H, kv_lora] bf16 attention output
  Buffer heads_bf16;                               // [T, H, v_head_dim]
  Buffer index_q, index_k, index_w;                // indexer queries [T, ih, id], key [T, id], weights [T, ih]
  Buffer scores;                                   // [T, max_context] fp32 indexer scores
  Buffer selected, num_selected;                   // [T, topk] i32, [T]
  Buffer mlp_gate_up, mlp_act;                     // [T, 2 * mlp_inter] fp32, [T, mlp_inter] bf16
  Buffer router_logits;                            // [T, experts] fp32, or [planes, T, experts]
  Buffer expert_ids, expert_weights;               // [P]
  Buffer plan_counts, plan_offsets, plan_active, plan_num_active;  // per local expert (+1)
  Buffer sorted_pairs, pair_slot;                  // [plan_capacity]
  Buffer shared_out;                               // [T, hidden] fp32
  Buffer pair_x, pair_gate_up, pair_act, expert_out;  // per pair: [P, hidden], [P, 2 inter], [P, inter], [P, hidden]
  // (pair_gate_up also holds [widened_experts, 2 inter, hidden] bf16: the widened experts' path
  // leaves it unused otherwise)
  Buffer pair_scale;                               // [P] fp32: the streamed experts' staging unscale
  Buffer head_in, logits;                          // [max_logits, hidden] bf16, [max_logits, vocab] fp32
  Buffer logits_argmax, sample_rows_of, sample_params, sampled;  // per logits row
  Buffer token_masks;                              // CudaMaskLayout::total bytes (structured outputs)
  Buffer prefill_context;                          // [max_context, kv_lora + rope] bf16
  Buffer context_table;                            // [max_blocks] int32 0, 1, ...: prefill_context's block table
  Buffer prefill_scores, prefill_probs;            // [prefill_score_capacity] fp32 / bf16
  Buffer gathered_rows, gathered_keys;             // selected latent rows, [max_context, id] fp32
  Buffer gathered_ids, gathered_weights, gathered_x, routed_all, routed_local;  // [dp * T, ...] (dp > 1)
  Buffer expert_gate_up_bf16, expert_down_bf16;    // one expert widened to bf16 (quantised experts)
  Buffer h_prev;                                   // [T, hidden] fp32 (MTP)
  Buffer fp8_codes, fp8_scales;                    // FP8 linears' activations: [T, cols] E4M3, [cols / 128, T] fp32
  Buffer metadata;                                 // MetadataLayout::total bytes
  Buffer inv_freq;                                 // [rope / 2] fp32
  int64_t plan_capacity = 0;           // (token, expert) pairs a plan covers (every rank's rows)
  int64_t pair_capacity = 0;           // this rank's pairs the per-pair buffers hold
  int64_t gathered_capacity = 0;       // bf16 elements of gathered_rows
  int64_t prefill_score_capacity = 0;  // floats of prefill_scores
  int64_t widened_experts = 0;         // cuda_widened_experts: experts pair_gate_up holds in bf16 (0: none)
};

// One row's sampling parameters on the device (cuda::RowSampling: three 4-byte values, a
// 4-byte one and a double; the model asserts the size).
constexpr int64_t kCudaRowSamplingBytes = 24;

// Local experts whose gate/up rows pair_gate_up holds widened to bf16 (0: none): every one of a
// rank of tiled MXFP4 experts whose steps (T tokens on each of its data-parallel ranks, top_k
// each) can bring limits.widened_experts_min_pairs pairs an expert over the model's experts.
inline int64_t cuda_widened_experts(const io::ModelConfig& c, const CudaRankWidths& widths,
                                    const CudaStepLimits& limits, int64_t T) {
  const int64_t min_pairs = limits.widened_experts_min_pairs;
  const bool fits = widths.tiled_mxfp4_experts && min_pairs > 0 &&
                    widths.dp_ranks * T * c.num_experts_per_tok >= min_pairs * c.n_routed_experts;
  return fits ? widths.local_experts : 0;
}

// Makes every workspace buffer by calling make(bytes) (at least one byte each), in one place.
template <typename Buffer, typename Make>
void make_cuda_workspaces(CudaWorkspaces<Buffer>& w, const io::ModelConfig& c, const CudaRankWidths& widths,
                          const CudaStepLimits& limits, Make&& make) {
  // FP8 GEMMs write whole groups of 4 tokens (ops::cuda::fp8_padded_tokens): the per-token rows
  // are padded to them.
  const int64_t T = widths.fp8_linear_cols > 0 ? (int64_t{limits.max_tokens} + 3) / 4 * 4 : limits.max_tokens;
  const int64_t H = widths.heads, hidden = c.hidden_size;
  const int64_t qd = c.qk_head_dim(), L = c.kv_lora_rank, rd = c.qk_rope_head_dim, vd = c.v_head_dim;
  const int64_t K = c.num_experts_per_tok, E = c.n_routed_experts, E_local = widths.local_experts;
  const int64_t inter = widths.expert_inter, mlp_inter = widths.mlp_inter, ranks = widths.dp_ranks;
  const int64_t logits_rows = limits.max_logits, context = limits.max_context;
  // Data-parallel peers gather every rank's rows and run them at once, so that each expert's
  // weights are read once a step. The plan indexes every gathered pair; the per-pair rows
  // (inputs, activations, outputs) are for this rank's pairs: one rank's worth (T K) and a
  // quarter more for a step whose routing leans to this rank's experts (a step of more, counted
  // on the host, runs one source rank's rows at a time), or all of a decode step's gathered
  // pairs up to the tensor-core path's pairs per expert.
  w.plan_capacity = ranks * T * K;
  const int64_t rank_pairs = ranks > 1 ? T * K + T * K / 4 : T * K;
  w.pair_capacity = std::max(rank_pairs, std::min(ranks * T * K, int64_t{kSmallMoePairsPerExpertTensorCores} * E));
  const int64_t P = w.pair_capacity;
  auto f32 = [&](int64_t n) { return make(int64_t{4} * std::max<int64_t>(n, 1)); };
  auto bf16 = [&](int64_t n) { return make(int64_t{2} * std::max<int64_t>(n, 1)); };
  auto i32 = f32;
  w.x = f32(T * hidden);
  w.normed_f32 = f32(T * hidden);
  w.normed_bf16 = bf16(T * hidden);
  w.block_out = f32(T * hidden);
  w.q_resid = f32(T * c.q_lora_rank);
  w.q_resid_bf16 = bf16(T * c.q_lora_rank);
  w.q = f32(T * H * qd);
  w.q_bf16 = bf16(T * H * qd);
  w.kv = f32(T * (L + rd));
  w.staged_queries = bf16(T * H * cuda_mla_padded_row(L, rd));
  w.o_bf16 = bf16(T * H * L);
  w.heads_bf16 = bf16(T * H * vd);
  w.index_q = f32(T * c.index_n_heads * c.index_head_dim);
  w.index_k = f32(T * c.index_head_dim);
  w.index_w = f32(T * c.index_n_heads);
  w.scores = f32(T * context);
  w.selected = i32(T * c.index_topk);
  w.num_selected = i32(T);
  w.mlp_gate_up = f32(T * 2 * mlp_inter);
  w.mlp_act = bf16(T * mlp_inter);
  w.router_logits = f32(std::max(T, kCudaRouterPlanes * std::min<int64_t>(T, 256)) * E);
  w.expert_ids = i32(P);
  w.expert_weights = f32(P);
  w.plan_counts = i32(E_local + 1);
  w.plan_offsets = i32(E_local + 1);
  w.plan_active = i32(E_local);
  w.plan_num_active = i32(1);
  w.sorted_pairs = i32(w.plan_capacity);
  w.pair_slot = i32(w.plan_capacity);
  w.shared_out = f32(T * hidden);
  w.pair_x = bf16(P * hidden);
  w.widened_experts = cuda_widened_experts(c, widths, limits, T);  // their gate/up rows fit pair_gate_up too
  w.pair_gate_up = make(std::max(int64_t{4} * std::max<int64_t>(P * 2 * inter, 1),
                                 int64_t{2} * w.widened_experts * 2 * inter * hidden));
  w.pair_act = bf16(P * inter);
  w.expert_out = f32(P * hidden);
  w.pair_scale = f32(P);
  w.head_in = bf16(logits_rows * hidden);
  w.logits = f32(logits_rows * c.vocab_size);
  w.logits_argmax = i32(logits_rows);
  w.sample_rows_of = i32(logits_rows);
  w.sample_params = make(kCudaRowSamplingBytes * std::max<int64_t>(logits_rows, 1));
  w.sampled = i32(logits_rows);
  w.token_masks = make(CudaMaskLayout(limits.max_logits, c.vocab_size).total);
  w.prefill_score_capacity = std::min(kPrefillScoreFloats, T * H * context);
  w.prefill_context = bf16(context * (L + rd));
  w.context_table = i32(cuda_max_blocks(limits));
  w.prefill_scores = f32(w.prefill_score_capacity);
  w.prefill_probs = bf16(w.prefill_score_capacity);
  // Selected rows of up to 256 tokens at a time (decode batches; larger ones go in chunks).
  w.gathered_capacity = std::min<int64_t>(T, 256) * std::min<int64_t>(context, c.index_topk) * (L + rd);
  w.gathered_rows = bf16(w.gathered_capacity);
  w.gathered_keys = f32(context * c.index_head_dim);
  if (ranks > 1) {
    w.gathered_ids = i32(ranks * T * K);
    w.gathered_weights = f32(ranks * T * K);
    w.gathered_x = bf16(ranks * T * hidden);
    w.routed_all = f32(ranks * T * hidden);
    w.routed_local = f32(T * hidden);
  }
  // Quantised experts widen one expert at a time to bf16 for the large-batch GEMMs.
  if (widths.quantised_experts) {
    w.expert_gate_up_bf16 = bf16(2 * inter * hidden);
    w.expert_down_bf16 = bf16(hidden * inter);
  }
  if (limits.mtp) w.h_prev = f32(T * hidden);
  if (widths.fp8_linear_cols > 0) {
    w.fp8_codes = make(T * widths.fp8_linear_cols);
    w.fp8_scales = f32(T * ((widths.fp8_linear_cols + 127) / 128));
  }
  const MetadataLayout meta(limits.max_tokens, limits.max_logits, limits.max_sequences, cuda_max_blocks(limits));
  w.metadata = make(static_cast<int64_t>(meta.total));
  w.inv_freq = f32(rd / 2);
}

// What cudaMalloc takes for `bytes`: large buffers in whole 2 MiB pages, small ones packed.
inline int64_t cuda_allocation_bytes(int64_t bytes) {
  const int64_t unit = bytes >= (int64_t{1} << 20) ? int64_t{2} << 20 : 512;
  return (bytes + unit - 1) / unit * unit;
}

// Device bytes of the workspaces above (cuda_allocation_bytes of each).
int64_t cuda_workspace_bytes(const io::ModelConfig& config, const CudaRankWidths& widths,
                             const CudaStepLimits& limits);

// Device bytes of one slot's latent row and of its indexer key on one layer: bf16 for the
// "auto" cache, the FP8 layout of quant/kv_fp8.h for kFp8E4m3 (GLM-5: 1152 and 256 bytes, or
// 656 and 132).
int64_t cuda_cache_row_bytes(const io::ModelConfig& config, kv::CacheDtype dtype);
int64_t cuda_cache_key_bytes(const io::ModelConfig& config, kv::CacheDtype dtype);

// Cache bytes one slot (token) takes on a CUDA rank: every layer's latent row, the full indexer
// layers' keys, and with the MTP layer its row (and keys) too.
int64_t cuda_cache_bytes_per_token(const io::ModelConfig& config, kv::CacheDtype dtype = kv::CacheDtype::kAuto,
                                   bool mtp = false, bool mtp_indexer = false);

// Cache blocks that fit in `free_bytes` (what the budget leaves after everything in use and the
// margin), less the one block an idle data-parallel rank's dummy token writes.
int64_t cuda_cache_blocks_that_fit(int64_t free_bytes, int64_t bytes_per_token, int block_size);

}  // namespace glms::model
