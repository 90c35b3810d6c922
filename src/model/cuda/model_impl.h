// Private to the CUDA model (model.cpp, attention.cpp, moe.cpp): CudaGlm5Model::Impl,
// the device state and step functions behind the public class, and the constants they share.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "model/cuda/expert_path.h"
#include "model/cuda/model.h"
#include "model/cuda_memory.h"
#include "model/cuda/step.h"
#include "model/cuda/weights.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/indexer.h"
#include "ops/cuda/linear_fp8.h"
#include "ops/cuda/mla.h"
#include "ops/cuda/moe.h"
#include "quant/kv_fp8.h"

namespace glms::model {

namespace cuda = ops::cuda;
using cuda::DeviceBuffer;
using cuda_step::PhaseTimer;
using cuda_step::StepShape;

namespace cuda_impl {

constexpr float kLatentNormEps = 1e-6f;  // q_a_layernorm / kv_a_layernorm (RMSNorm default)
constexpr float kIndexerNormEps = 1e-6f;

// Sequences with at least this many tokens in a step (prefill chunks) attend through the
// prefill path; the other tokens (decodes, short chunks) in runs through mla_attention_fused or
// the gathered-row GEMMs.
constexpr int kPrefillGemmTokens = 32;
// A graphed step (decode, MTP verify) runs every token as one run, as it would eager.
static_assert(kGraphedSequenceTokens < kPrefillGemmTokens, "graphed sequences take the short-run path");
// A long prefill chunk attends in the fused pass when the dense path would score more than
// this many times the rows the fused pass reads. Per (token, row) the fused pass costs about
// 2.6x the dense GEMMs on the H200 at GLM-5.2 width (prefill 2k from position 0, context = top-k:
// dense 9.0 ms, fused 12.3 ms; 8k: dense 103 ms, fused 75.5 ms).
constexpr double kFusedPrefillWorkRatio = 3.0;
// The same for the wgmma pass (CudaModelOptions::wgmma_attention).
constexpr double kFusedPrefillWorkRatioWgmma = 1.0;

template <typename T>
T* as(const DeviceBuffer& buffer) {
  return static_cast<T*>(buffer.data());
}

}  // namespace cuda_impl

using namespace cuda_impl;

// The workspace buffers (model/cuda_memory.h: shapes and sizes) are members of the base.
struct CudaGlm5Model::Impl : CudaWorkspaces<DeviceBuffer> {
  io::ModelConfig config;
  CudaModelOptions options;
  CudaWeights weights;
  Peers peers;  // tensor- and data-parallel peers (none: the whole model on this device)
  cuda::Stream stream;
  cuda::Gemm gemm;
  // The side branches of a short step, on their own stream and cuBLAS handle: the indexer's
  // selection (options.overlap_indexer_tokens), forked after the attention's projections and
  // joined before the attention core; the shared expert (options.overlap_shared_expert_tokens),
  // forked after the layer's norm and joined before the combine.
  cuda::Stream side_stream;
  cuda::Gemm side_gemm;
  cuda::Event indexer_fork, indexer_join, shared_fork, shared_join;
  std::unique_ptr<cuda::Fp8Gemm> fp8_gemm;  // made where a linear layer is FP8 (main stream only)
  DeviceBuffer expert_unit_counters;  // the persistent expert GEMMs' [2] (cuda::PersistentLaunch::unit_counters)
  int max_blocks = 0;  // block-table width
  int64_t num_slots = 0;
  MetadataLayout meta;
  cuda::PinnedBuffer staging;
  cuda::PinnedBuffer offsets_host;  // MoE group offsets for the large-batch path
  cuda::PinnedBuffer mask_staging;  // CudaMaskLayout::total bytes: a step's token masks on their way up
  // Per layer (the MTP layer's last), in cache_storage(): latent rows [num_slots, latent + rope]
  // bf16 or FP8 rows of cuda_cache_row_bytes; indexer keys of full indexer layers (else empty)
  // [num_slots, index_dim] bf16, or E4M3 codes then [num_slots] fp32 scales (key_scales).
  std::vector<DeviceBuffer> latent_cache;
  std::vector<DeviceBuffer> index_keys;
  std::map<StepShape, std::unique_ptr<cuda::Graph>> graphs;
  PhaseTimer timer;
  // This step's top-k is every position and a layer has written it (run_step and mtp_step start
  // over; CudaModelOptions::reuse_step_selection).
  bool step_selects_all_written = false;
  // cuBLASLt refused to run an FP8 GEMM with bf16 outputs that its heuristic offered
  // (linear_to_bf16 then keeps the fp32 rows).
  bool fp8_bf16_refused = false;

  int64_t workspace_bytes = 0;    // device memory make_cuda_workspaces took (cuda_allocation_bytes)
  CudaRankWidths rank_widths;     // what sized them (from the weights)
  CudaStepLimits step_limits;
  CudaMemoryReport memory;        // the budget and what was in use when the cache was sized
  ForwardBatch idle_batch;        // the one dummy token an idle data-parallel rank runs
  ForwardBatch padded_batch;      // a data-parallel decode or verify step padded for its graph (padded_for_graph)
  int unpadded_dp_graphs = 0;     // graphs of data-parallel steps keyed by every rank's own sizes
  std::vector<int32_t> step_dp_tokens;  // every data-parallel rank's tokens in the step being run
  const ForwardBatch* batch = nullptr;  // the step being run (host view; null inside graph capture)

  Impl(const io::ModelConfig& c, const CudaModelOptions& o, CudaWeights w, Peers p)
      : config(c),
        options(o),
        weights(std::move(w)),
        peers(p),
        max_blocks((o.max_context + o.block_size - 1) / o.block_size),
        meta(o.max_tokens, o.max_logits, o.max_sequences, max_blocks) {
    gemm.set_small_batch_gemv(o.small_batch_gemv_tokens);
    side_gemm.set_small_batch_gemv(o.small_batch_gemv_tokens);
    gemm.set_skinny_gemm(o.skinny_gemm_tokens, o.skinny_group_tokens);
    side_gemm.set_skinny_gemm(o.skinny_gemm_tokens, o.skinny_group_tokens);
  }

  void allocate();
  // The widths the step buffers are sized by: the widest layer of this rank (and the MTP layer's).
  CudaRankWidths widths_of_rank(bool with_mtp) const;
  // Cache blocks of bytes_per_slot a slot that --gpu-memory-utilization leaves (memory records
  // the budget); fails with what to change where none fit.
  int cache_blocks_that_fit(int64_t bytes_per_slot);
  // The latent rows and indexer keys of options.num_blocks blocks, every layer's.
  void allocate_cache(bool with_mtp, bool mtp_indexer);
  // The step's metadata: `batch` runs, its first `real_sequences` the caller's (the others dummies
  // in the block after the usable ones), `routed_tokens` of its tokens routed to experts.
  void upload_metadata(const ForwardBatch& batch, int routed_tokens, int real_sequences);
  void run_step(const StepShape& shape);
  // A block output still to be added to x: sum + addend (either null), added by the next norm.
  struct PendingOutput {
    const float* sum = nullptr;
    const float* addend = nullptr;
    const uint16_t* sum_bf16 = nullptr;  // in place of sum: bf16 rows (a data-parallel rank's MoE sums)
  };
  // One decoder layer over x.
  void layer_step(const DecoderLayerDevice& layer, int l, const StepShape& shape, PendingOutput& pending);
  // The MTP layer over the uploaded batch: h_prev (device, [T, hidden] fp32) is the target's
  // hidden state of each token's position; leaves the logits and x (the block's output).
  void mtp_step(const StepShape& shape);
  // Checks, uploads the batch and h_prev ([tokens, hidden] host fp32), and runs mtp_step.
  void run_mtp(const ForwardBatch& batch, const float* h_prev);
  // Layer l's attention block over normed_bf16 (attention.cpp); `normed_quantised`: fp8_codes
  // hold normed_bf16's E4M3 rows (the input norm wrote them, where fp8_gemm_takes q_a). Returns
  // the block's output for the next norm to add (block_out), or nullptr where o_proj has added
  // it into x already (adds_into_residual).
  const float* attention(const DecoderLayerDevice& layer, int l, const StepShape& shape, bool normed_quantised);
  // Its parts in order: the projections of the normed rows and of the q residual, with the
  // latent row cached (returns whether q is left in bf16, q_bf16, or fp32, q); the indexer's keys
  // cached and its top-k selected; q absorbed and staged for the attention passes; the un-absorbed
  // heads through o_proj.
  bool project_attention_inputs(const DecoderLayerDevice& layer, int l, const StepShape& shape, bool normed_quantised);
  void write_projection_rows(const DecoderLayerDevice& layer, int l, int T);
  // On stream `s` with `g` (the main stream's or the side branch's).
  void select_positions(const DecoderLayerDevice& layer, int l, const StepShape& shape, cudaStream_t s, cuda::Gemm& g);
  void absorb_queries(const AttentionDevice& w, int T, bool bf16_queries);
  const float* attention_output(const AttentionDevice& w, int T);
  // Layer l's attention over the latent cache for the step's staged queries, into o_bf16: runs of
  // short chunks and decode tokens through the fused or gathered-row passes, long prefill chunks
  // through the fused pass or dense scores (`heads`: this rank's).
  void attention_core(int l, const StepShape& shape, int heads);
  // The DSA indexer's scores of layer l's keys for the step's tokens past top-k (its queries and
  // head weights already projected), into `scores`: decode runs and prefill chunks by their kernels.
  void score_indexer_keys(int l, const StepShape& shape, cudaStream_t s, cuda::Gemm& g);
  // The MoE block (moe.cpp): whole, it adds into x (returns nothing pending); sharded, it leaves
  // the block's output summed over every peer: in block_out, or (data-parallel without tensor
  // parallelism) as this rank's routed sums plus its shared expert's, for the next norm to add.
  // `normed_quantised`: fp8_codes hold normed_bf16's E4M3 rows (where fp8_gemm_takes the shared
  // expert's gate/up), for the shared expert.
  PendingOutput moe(const DecoderLayerDevice& layer, const StepShape& shape, bool normed_quantised);
  // The shared expert into shared_out, or added into x (`into_residual`, main stream only);
  // x_quantised as dense_mlp's.
  void moe_shared_expert(const MoeDevice& m, int T, bool on_side_stream, bool into_residual = false,
                         bool x_quantised = false);
  // Scores the router for T tokens and picks their experts; rows [T, rows) of expert_ids become
  // padding (-1), and with data-parallel peers so do the tokens past the step's routed count (the
  // metadata's, read on the device). With RouterPath::kTerms, the post-attention norm has left
  // its input as bf16 terms (normed_bf16 and pair_x); else as normed_f32.
  void moe_route(const MoeDevice& m, int T, int rows);
  // How a step of T tokens scores the router: the first of these that applies.
  enum class RouterPath {
    kTerms,    // three bf16 GEMMs over the input's terms (gemm.linear_f32_terms)
    kProduct,  // ops::cuda::router_product's planes
    kGemv,     // ops::cuda::gemv_f32_bf16
    kFp32,     // the fp32 copy through gemm.linear_f32
  };
  RouterPath router_path(const MoeDevice& m, int T) const;
  // The routed experts of this rank over `rows` tokens x [rows, hidden] bf16 with their routing
  // (ids, weights [rows, top_k]; `routed_rows` of them are tokens, the rest padding); out
  // [rows, hidden] (+)= shared (when given; ready once `shared_ready` is, where it is on the side
  // stream) + their sums, fp32 rows or (neither accumulated nor with shared) bf16 rows. Returns
  // false, having written nothing, where a large step's pairs on this rank outnumber the per-pair
  // buffers (the caller then runs fewer rows at a time).
  // `tokens_staged`: the W8A8 staging's token rows hold x's E4M3 rows (stage_fp8_expert_tokens).
  bool moe_experts(const MoeDevice& m, const uint16_t* x, const int32_t* ids, const float* weights, int rows,
                   int routed_rows, const StepShape& shape, cuda::ExpertSums out, bool accumulate, const float* shared,
                   const cuda::Event* shared_ready, bool tokens_staged = false);
  // Copies fp8_codes' E4M3 rows of normed_bf16 (T rows, as the post-attention norm wrote them for
  // the shared expert, whose own FP8 GEMMs then overwrite them) into the W8A8 staging's token
  // rows, so that block-FP8 routed experts skip their quantisation pass; false, copying nothing,
  // where the experts are not block FP8 on the W8A8 GEMMs or the staging does not fit. The copy
  // is made before moe_experts picks its path: a path that turns out not to be the W8A8 GEMMs'
  // (a step too short for them) leaves it unread.
  bool stage_fp8_expert_tokens(const MoeDevice& m, int T);
  bool moe_experts_per_expert_gemms(const MoeDevice& m, const uint16_t* x, const cuda::MoePlan& plan,
                                    const cuda::ExpertWeights& experts);
  // This rank's grouped pairs of `plan` (its offsets[num_experts]), read back to the host.
  int64_t local_pair_count(const cuda::MoePlan& plan, int num_experts);
  // The routed experts of a MoE layer as the expert kernels take them.
  static cuda::ExpertWeights routed_experts(const MoeDevice& m);
  // Whether MoE layers over `moe_tokens` rows (every data-parallel rank's) run without reading
  // anything back to the host, so that a decode step of them may be captured as a graph.
  bool moe_without_host_sync(int64_t moe_tokens) const;
  // Where the W8A8 expert GEMMs quantise `tokens` rows and `pairs` act rows (expert width inter);
  // none where the buffers they borrow are too small.
  std::optional<cuda::MoeFp8Staging> fp8_expert_staging(int64_t tokens, int64_t pairs, int64_t inter);
  // The W8A8 expert GEMMs' kernel (moe_experts_wgmma_fp8), as the options choose.
  cuda::Fp8ExpertGemm fp8_expert_gemm() const {
    return !options.specialized_fp8_experts ? cuda::Fp8ExpertGemm::kBlockBarrier
           : !options.wide_fp8_experts      ? cuda::Fp8ExpertGemm::kWarpSpecialized
           : options.paired_fp8_experts     ? cuda::Fp8ExpertGemm::kWidePaired
           : options.persistent_fp8_experts ? cuda::Fp8ExpertGemm::kWidePersistent
                                            : cuda::Fp8ExpertGemm::kWide;
  }
  // How the grouped expert GEMMs (moe_experts_specialized) launch their row tiles. bf16 weights
  // (and quantised ones widened first): in pairs where `paired`, else a block an SM where
  // options.persistent_bf16_experts, else a block a tile. MXFP4 tiles (widened by the producer,
  // never paired): a block an SM where options.persistent_mxfp4_experts, else a block a tile.
  cuda::SpecializedTiles specialized_tiles(bool paired, bool mxfp4_tiles = false) const {
    const bool persistent = mxfp4_tiles ? options.persistent_mxfp4_experts : options.persistent_bf16_experts;
    return paired && !mxfp4_tiles ? cuda::SpecializedTiles::kPaired
           : persistent           ? cuda::SpecializedTiles::kPersistent
                                  : cuda::SpecializedTiles::kEvery;
  }
  // Sums a block output [T, hidden] over the tensor-parallel peers.
  void sum_over_tp(float* block_output, int T);
  void prefill_attention(int sequence, int l, int heads);
  // Whether a long prefill chunk attends faster in the fused pass than through dense scores.
  bool fused_prefill_pays(const SequenceSlice& seq, int heads) const;  // heads: this rank's

  // Splits the step's tokens for the attention and indexer paths: long_sequence(index) for each
  // sequence with kPrefillGemmTokens or more tokens, short_run(first, count) for each run of
  // other tokens between them, in token order. Inside graph capture, one run of all tokens.
  template <typename ShortRun, typename LongSequence>
  void split_by_chunk_length(const StepShape& shape, ShortRun short_run, LongSequence long_sequence) const {
    if (!batch || !shape.host_sync_ok) {
      short_run(0, shape.num_tokens);
      return;
    }
    int run_start = 0;
    for (size_t index = 0; index < batch->sequences.size(); ++index) {
      const SequenceSlice& seq = batch->sequences[index];
      if (seq.num_tokens < kPrefillGemmTokens) continue;
      if (seq.first_token > run_start) short_run(run_start, seq.first_token - run_start);
      long_sequence(static_cast<int>(index));
      run_start = seq.first_token + seq.num_tokens;
    }
    if (shape.num_tokens > run_start) short_run(run_start, shape.num_tokens - run_start);
  }
  // How the cache's rows are stored (options.cache_dtype).
  cuda::CacheStorage cache_storage() const {
    return options.cache_dtype == kv::CacheDtype::kFp8E4m3 ? cuda::CacheStorage::kFp8 : cuda::CacheStorage::kBf16;
  }
  // Layer l's indexer key scales in an FP8 cache (null for bf16 keys or a layer without keys).
  float* key_scales(int l) const {
    if (cache_storage() != cuda::CacheStorage::kFp8 || index_keys[l].bytes() == 0) return nullptr;
    return reinterpret_cast<float*>(static_cast<char*>(index_keys[l].data()) +
                                    quant::kv_fp8_key_scales_offset(num_slots, config.index_head_dim));
  }
  // Whether the fused attention kernel takes this model's shapes.
  bool fused_attention() const {
    return cuda::mla_attention_fused_supported(config.num_attention_heads, config.kv_lora_rank,
                                               config.qk_rope_head_dim);
  }
  // Whether a step of T tokens adds w's product, a block's last linear layer, straight into the
  // residual stream x (accumulate_residual_min_tokens): no tensor-parallel sum, and FP8 weights
  // only above the FP8 GEMV's tokens (add_linear).
  bool adds_into_residual(const LinearDevice& w, int T) const {
    return !peers.tp && (!w.fp8() || T > cuda::kFp8GemvMaxTokens) && options.accumulate_residual_min_tokens > 0 &&
           T >= options.accumulate_residual_min_tokens;
  }
  // Whether a step of T tokens keeps its bf16 intermediates in bf16 (bf16_intermediates_min_tokens).
  bool bf16_intermediates(int T) const {
    return options.bf16_intermediates_min_tokens > 0 && T >= options.bf16_intermediates_min_tokens;
  }
  // Whether a step of T tokens writes its projections' rows in one launch
  // (fused_projection_rows_max_tokens).
  bool fused_projection_rows(int T) const { return T <= options.fused_projection_rows_max_tokens; }
  // out = down(silu(gate x) * up x) on `s` through `g` (mlp_gate_up and mlp_act are its scratch;
  // gate and up in bf16 where bf16_intermediates and linear_to_bf16 takes the weights, else
  // fp32); out += with `accumulate` (add_linear). `x_quantised`: fp8_codes hold x_bf16's E4M3
  // rows for gate/up.
  void dense_mlp(const MlpDevice& mlp, const uint16_t* x_bf16, int n, float* out, cuda::Gemm& g, cudaStream_t s,
                 bool accumulate = false, bool x_quantised = false);
  // y[n, w.rows] fp32 = x[n, w.cols] bf16 . w^T: bf16 weights through `g`; FP8 ones through
  // gemv_fp8 up to kFp8GemvMaxTokens tokens, else the activations quantised into fp8_codes and
  // fp8_gemm (so on the main stream only). `x_quantised`: fp8_codes already hold x, as the
  // previous FP8 GEMM of the same x or the norm that wrote x (fp8_gemm_takes) left them.
  void linear(const LinearDevice& w, const uint16_t* x, int n, float* y, cuda::Gemm& g, cudaStream_t s,
              bool x_quantised = false);
  // y[n, w.rows] bf16 = x . w^T, each fp32 sum rounded once: bf16 weights through `g`, FP8 ones
  // through fp8_gemm where it takes them with bf16 outputs (fp8_bf16_intermediates, more than
  // kFp8GemvMaxTokens tokens, the main stream, an algorithm for the shape). Returns false, having
  // done nothing, where it does not. `x_quantised` as linear's.
  bool linear_to_bf16(const LinearDevice& w, const uint16_t* x, int n, uint16_t* y, cuda::Gemm& g, cudaStream_t s,
                      bool x_quantised = false);
  // Whether linear() and linear_to_bf16() run w over n rows on the block-FP8 GEMM (so read their
  // input from fp8_codes), and those buffers as the E4M3 rows a norm writes for it where they do
  // (nothing where not): a long step's norms quantise their output in the same pass.
  bool fp8_gemm_takes(const LinearDevice& w, int n) const {
    return w.fp8() && fp8_gemm && n > cuda::kFp8GemvMaxTokens && w.cols <= rank_widths.fp8_linear_cols;
  }
  cuda::Fp8Rows fp8_input_rows(const LinearDevice& w, int n) {
    return fp8_gemm_takes(w, n) ? cuda::Fp8Rows{as<uint8_t>(fp8_codes), as<float>(fp8_scales)} : cuda::Fp8Rows{};
  }
  // y[n, w.rows] fp32 += x . w^T in the GEMM: bf16 weights through `g` (cuBLAS), FP8 ones of more
  // than kFp8GemvMaxTokens tokens through fp8_gemm on the main stream; `x_quantised` as linear's.
  void add_linear(const LinearDevice& w, const uint16_t* x, int n, float* y, cuda::Gemm& g, cudaStream_t s,
                  bool x_quantised = false);
  // The FP8 GEMM both take above the FP8 GEMV's tokens: x quantised into fp8_codes (unless
  // x_quantised), then y = or += (accumulate) the product, on the main stream.
  void fp8_gemm_product(const LinearDevice& w, const uint16_t* x, int n, float* y, cudaStream_t s, bool x_quantised,
                        bool accumulate);
  StepShape shape_of(const ForwardBatch& batch) const;
  // The batch a step runs: `step`, or the idle rank's dummy token when it has none.
  const ForwardBatch& runnable(const ForwardBatch& step) const;
  // Whether the peers' collectives can go into a graph (not those over host barriers: device copies).
  bool collectives_capturable() const {
    return (!peers.tp || peers.tp->graph_capturable()) && (!peers.dp || peers.dp->graph_capturable());
  }
  // Whether a data-parallel step runs as a graph, padded: every rank runs as many tokens a
  // sequence (decode, or verify of as many drafts), a logits row a token
  // (uniform_dp_sequence_tokens: what a padded graph needs on every rank alike).
  bool dp_step_graphable(const ForwardBatch& step, bool use_graph) const;
  // `step` padded to the largest rank's sequences with dummy ones (padded_batch).
  const ForwardBatch& padded_for_graph(const ForwardBatch& step);
  // Sets `batch` to the batch `step` runs (padded_for_graph's where `padded`, else runnable's)
  // and returns its shape (with the MoE gather's rows); prepare() uploads its metadata too.
  StepShape plan_step(const ForwardBatch& step, bool padded);
  StepShape prepare(const ForwardBatch& step, bool padded);
  // The key of the graph a step of `shape` replays (captured on its first step), or none where
  // it runs eager: too many tokens a sequence, experts that need the host, collectives that cannot
  // be captured, or no room left under max_decode_graphs.
  std::optional<StepShape> graph_key(const ForwardBatch& step, const StepShape& shape, bool use_graph) const;
  void launch(const ForwardBatch& batch, bool use_graph);
  // The step's logits [logits rows, vocab] and, when asked, x [tokens, hidden] (the hidden
  // states before the final norm), copied to the host.
  std::vector<float> take_outputs(const ForwardBatch& step, std::vector<float>* hidden_out) {
    std::vector<float> host_logits(step.logits_tokens.size() * static_cast<size_t>(config.vocab_size));
    cuda::copy_to_host_async(host_logits.data(), logits.data(), host_logits.size() * sizeof(float), stream.get());
    if (hidden_out) {
      hidden_out->resize(static_cast<size_t>(step.num_tokens()) * config.hidden_size);
      cuda::copy_to_host_async(hidden_out->data(), x.data(), hidden_out->size() * sizeof(float), stream.get());
    }
    stream.synchronize();
    timer.collect();
    return host_logits;
  }

  // The masked rows' RowOutput::mask applied to `logits` on the device (ops::cuda::
  // apply_token_masks), their row indices and words uploaded in one copy through mask_staging.
  // Outside any captured graph: it runs after the step's forward (replayed or not), before the
  // argmax and the draws; the previous step's copy out of mask_staging ended with its sync.
  void apply_token_masks(const std::vector<RowOutput>& outputs);
  // forward_selected's outputs of the step just run: every row's argmax made on the device, the
  // kSample rows drawn there (options.sample_on_device; otherwise their rows come back and are
  // drawn on the host), and the kLogits rows copied back; x too when asked.
  StepLogits take_selected_outputs(const std::vector<RowOutput>& outputs, const ForwardBatch& step,
                                   std::vector<float>* hidden_out);

  const int32_t* meta_i32(size_t offset) const {
    return reinterpret_cast<const int32_t*>(static_cast<const char*>(metadata.data()) + offset);
  }
  // The step's cache slot of each token ([T] int64, on the device).
  const int64_t* meta_slots() const {
    return reinterpret_cast<const int64_t*>(static_cast<const char*>(metadata.data()) + meta.slot_mapping);
  }
};

}  // namespace glms::model
