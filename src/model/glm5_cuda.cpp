#include "model/glm5_cuda.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <string>

#include "core/dtype.h"
#include "core/error.h"
#include "model/glm5_cuda_step.h"
#include "model/glm5_cuda_weights.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/indexer.h"
#include "ops/cuda/mla.h"
#include "ops/cuda/moe.h"

namespace glms::model {

namespace cuda = ops::cuda;
using cuda::DeviceBuffer;
using cuda_step::MetadataLayout;
using cuda_step::PhaseTimer;
using cuda_step::StepShape;

namespace {

constexpr float kLatentNormEps = 1e-6f;  // q_a_layernorm / kv_a_layernorm (RMSNorm default)
constexpr float kIndexerNormEps = 1e-6f;

// Batches whose (token, expert) pairs average at most this many per expert run the experts as
// weight-streaming kernels (no host synchronisation, graph-capturable); larger ones as
// per-expert cuBLAS GEMMs over the grouped rows. Measured at GLM-5.2 width on the H200
// (bench-step, docs/performance.md): bf16 GEMVs stream each expert once per 8 tokens, so 8;
// quantised experts on tensor cores stream 8 tokens per mma chunk while the GEMM path first
// widens every expert to bf16 (about 45 ms per 4 MoE layers), so 32: at 16 pairs per expert
// (prefill 512) the experts took 79 ms through widening and 33 ms on tensor cores, at 32 pairs
// 62 ms on tensor cores, at 64 pairs 81 ms through widening.
constexpr int kSmallMoePairsPerExpert = 8;
constexpr int kSmallMoePairsPerExpertTensorCores = 32;

// Sequences with at least this many tokens in a step (prefill chunks) attend through the
// tensor-core GEMM path; the others through the split-K kernel.
constexpr int kPrefillGemmTokens = 32;

// Scores buffer of the GEMM attention path (fp32 [heads, chunk, context]), at most 1 GiB.
constexpr int64_t kPrefillScoreFloats = int64_t{1} << 28;

template <typename T>
T* as(const DeviceBuffer& buffer) {
  return static_cast<T*>(buffer.data());
}

}  // namespace

struct CudaGlm5Model::Impl {
  io::ModelConfig config;
  CudaModelOptions options;
  CudaWeights weights;
  cuda::Stream stream;
  cuda::Gemm gemm;
  int max_blocks = 0;  // block-table width
  int64_t num_slots = 0;
  MetadataLayout meta;
  cuda::PinnedBuffer staging;
  DeviceBuffer metadata;
  cuda::PinnedBuffer offsets_host;  // MoE group offsets for the large-batch path
  std::vector<DeviceBuffer> latent_cache;  // per layer [num_slots, latent + rope] bf16
  std::vector<DeviceBuffer> index_keys;    // per full layer [num_slots, index_dim] fp32, else empty
  DeviceBuffer inv_freq;                   // [rope / 2]
  std::map<StepShape, std::unique_ptr<cuda::Graph>> graphs;
  PhaseTimer timer;

  // Activations, sized for options.max_tokens (see allocate_workspace for shapes).
  DeviceBuffer x, normed_f32, normed_bf16, block_out, q_resid, q_resid_bf16, q, q_bf16, kv, q_latent, o_latent,
      o_bf16, heads_out, heads_bf16, index_q, index_k, index_w, scores, selected, num_selected,
      mlp_gate_up, mlp_act, router_logits, expert_ids, expert_weights, plan_counts, plan_offsets, plan_active,
      plan_num_active, sorted_pairs, pair_slot, shared_out, pair_x, pair_gate_up, pair_act, expert_out, head_in,
      logits, prefill_context, prefill_queries, prefill_scores, prefill_probs, gathered_rows, gathered_keys,
      expert_gate_up_bf16, expert_down_bf16, h_prev;
  int64_t gathered_capacity = 0;  // bf16 elements of gathered_rows
  int64_t prefill_score_capacity = 0;  // floats
  const ForwardBatch* batch = nullptr;  // the step being run (host view; null inside graph capture)

  Impl(const io::ModelConfig& c, const CudaModelOptions& o, CudaWeights w)
      : config(c),
        options(o),
        weights(std::move(w)),
        max_blocks((o.max_context + o.block_size - 1) / o.block_size),
        meta(o.max_tokens, o.max_logits, o.max_sequences, max_blocks) {
    gemm.set_small_batch_gemv(o.small_batch_gemv_tokens);
  }

  void allocate();
  void upload_metadata(const ForwardBatch& batch);
  void run_step(const StepShape& shape);
  // One decoder layer over x (pending: a block output still to be added to x).
  void layer_step(const DecoderLayerDevice& layer, int l, const StepShape& shape, const float*& pending);
  // The MTP layer over the uploaded batch: h_prev (device, [T, hidden] fp32) is the target's
  // hidden state of each token's position; leaves the logits and x (the block's output).
  void mtp_step(const StepShape& shape);
  void attention(const DecoderLayerDevice& layer, int l, const StepShape& shape);
  void moe(const DecoderLayerDevice& layer, const StepShape& shape);
  void prefill_attention(int sequence, int l, float scale);

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
  // Whether the fused attention kernel takes this model's shapes.
  bool fused_attention() const {
    return cuda::mla_attention_fused_supported(config.num_attention_heads, config.kv_lora_rank,
                                                                          config.qk_rope_head_dim);
  }
  void dense_mlp(const MlpDevice& mlp, const uint16_t* x_bf16, int n, float* out);
  StepShape shape_of(const ForwardBatch& batch) const;
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

  const int32_t* meta_i32(size_t offset) const {
    return reinterpret_cast<const int32_t*>(static_cast<const char*>(metadata.data()) + offset);
  }
};

void CudaGlm5Model::Impl::allocate() {
  const io::ModelConfig& c = config;
  const int64_t T = options.max_tokens, H = c.num_attention_heads, hidden = c.hidden_size;
  const int64_t qd = c.qk_head_dim(), L = c.kv_lora_rank, rd = c.qk_rope_head_dim, vd = c.v_head_dim;
  const int64_t K = c.num_experts_per_tok, E = c.n_routed_experts, P = T * K, inter = c.moe_intermediate_size;
  int64_t mlp_inter = 0;
  for (const DecoderLayerDevice& layer : weights.layers) {
    if (!layer.is_moe) mlp_inter = std::max(mlp_inter, layer.mlp.inter);
    else mlp_inter = std::max(mlp_inter, layer.moe.shared.inter);
  }
  auto f32 = [](int64_t n) { return DeviceBuffer(sizeof(float) * std::max<int64_t>(n, 1)); };
  auto bf16 = [](int64_t n) { return DeviceBuffer(sizeof(uint16_t) * std::max<int64_t>(n, 1)); };
  auto i32 = [](int64_t n) { return DeviceBuffer(sizeof(int32_t) * std::max<int64_t>(n, 1)); };
  x = f32(T * hidden);
  normed_f32 = f32(T * hidden);
  normed_bf16 = bf16(T * hidden);
  block_out = f32(T * hidden);
  q_resid = f32(T * c.q_lora_rank);
  q_resid_bf16 = bf16(T * c.q_lora_rank);
  q = f32(T * H * qd);
  q_bf16 = bf16(T * H * qd);
  kv = f32(T * (L + rd));
  q_latent = f32(T * H * L);
  o_latent = f32(T * H * L);
  o_bf16 = bf16(T * H * L);
  heads_out = f32(T * H * vd);
  heads_bf16 = bf16(T * H * vd);
  index_q = f32(T * c.index_n_heads * c.index_head_dim);
  index_k = f32(T * c.index_head_dim);
  index_w = f32(T * c.index_n_heads);
  scores = f32(T * options.max_context);
  selected = i32(T * c.index_topk);
  num_selected = i32(T);
  mlp_gate_up = f32(T * 2 * mlp_inter);
  mlp_act = bf16(T * mlp_inter);
  router_logits = f32(T * E);
  expert_ids = i32(P);
  expert_weights = f32(P);
  plan_counts = i32(E + 1);
  plan_offsets = i32(E + 1);
  plan_active = i32(E);
  plan_num_active = i32(1);
  sorted_pairs = i32(P);
  pair_slot = i32(P);
  shared_out = f32(T * hidden);
  pair_x = bf16(P * hidden);
  pair_gate_up = f32(P * 2 * inter);
  pair_act = bf16(P * inter);
  expert_out = f32(P * hidden);
  head_in = bf16(int64_t{options.max_logits} * hidden);
  logits = f32(int64_t{options.max_logits} * c.vocab_size);
  prefill_score_capacity = std::min(kPrefillScoreFloats, T * H * options.max_context);
  prefill_context = bf16(int64_t{options.max_context} * (L + rd));
  prefill_queries = bf16(T * H * cuda::mla_padded_row(static_cast<int>(L), static_cast<int>(rd)));
  prefill_scores = f32(prefill_score_capacity);
  prefill_probs = bf16(prefill_score_capacity);
  // Selected rows of up to 256 tokens at a time (decode batches; larger ones go in chunks).
  gathered_capacity = std::min<int64_t>(T, 256) * std::min(options.max_context, c.index_topk) * (L + rd);
  gathered_rows = bf16(gathered_capacity);
  gathered_keys = f32(int64_t{options.max_context} * c.index_head_dim);
  offsets_host = cuda::PinnedBuffer(sizeof(int32_t) * (E + 1));
  // Quantised experts widen one expert at a time to bf16 for the large-batch GEMMs.
  auto quantised = [](const DecoderLayerDevice& layer) {
    return layer.is_moe && layer.moe.experts_format != ops::WeightFormat::Plain;
  };
  const bool quantised_experts =
      std::any_of(weights.layers.begin(), weights.layers.end(), quantised) ||
      std::any_of(weights.mtp.begin(), weights.mtp.end(), [&](const MtpDevice& m) { return quantised(m.block); });
  if (quantised_experts) {
    expert_gate_up_bf16 = bf16(2 * inter * hidden);
    expert_down_bf16 = bf16(hidden * inter);
  }
  staging = cuda::PinnedBuffer(meta.total);
  metadata = DeviceBuffer(meta.total);

  std::vector<float> freq(rd / 2);
  for (int i = 0; i < rd / 2; ++i)
    freq[i] = 1.0f / std::pow(static_cast<float>(c.rope_theta), static_cast<float>(2 * i) / static_cast<float>(rd));
  inv_freq = f32(rd / 2);
  inv_freq.upload(freq.data(), sizeof(float) * freq.size());

  // The cache gets what is left, less a margin for cuBLAS and the CUDA context.
  const int64_t row_bytes = sizeof(uint16_t) * (L + rd);
  const bool with_mtp = options.mtp && !weights.mtp.empty();
  const int64_t mtp_bytes_per_slot =
      with_mtp ? row_bytes + (weights.mtp[0].block.attention.has_indexer ? int64_t{sizeof(float)} * c.index_head_dim : 0)
               : 0;
  const int64_t bytes_per_slot = cuda_cache_bytes_per_token(c) + mtp_bytes_per_slot;
  int num_blocks = options.num_blocks;
  if (num_blocks <= 0) {
    const auto [free_bytes, total_bytes] = cuda::memory_info();
    const int64_t margin = int64_t{2} << 30;
    const int64_t usable = std::max<int64_t>(0, static_cast<int64_t>(free_bytes) - margin);
    const int64_t fit = usable / (bytes_per_slot * options.block_size);
    num_blocks = static_cast<int>(std::min<int64_t>(fit, int64_t{options.max_sequences} * max_blocks));
    if (num_blocks <= 0) fail("no device memory left for the KV cache (" + std::to_string(free_bytes >> 20) + " MiB free)");
  }
  options.num_blocks = num_blocks;
  num_slots = int64_t{num_blocks} * options.block_size;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    latent_cache.emplace_back(row_bytes * num_slots);
    index_keys.emplace_back(c.indexer_full[l] ? sizeof(float) * c.index_head_dim * num_slots : 0);
  }
  // The MTP layer's own cache sits after the decoder layers' (index num_hidden_layers), with the
  // same slots.
  if (with_mtp) {
    latent_cache.emplace_back(row_bytes * num_slots);
    index_keys.emplace_back(weights.mtp[0].block.attention.has_indexer ? sizeof(float) * c.index_head_dim * num_slots : 0);
    h_prev = f32(T * hidden);
  }
}

StepShape CudaGlm5Model::Impl::shape_of(const ForwardBatch& batch) const {
  StepShape shape;
  shape.num_tokens = batch.num_tokens();
  shape.num_sequences = static_cast<int>(batch.sequences.size());
  shape.num_logits = static_cast<int>(batch.logits_tokens.size());
  for (int32_t p : batch.positions) shape.max_context = std::max(shape.max_context, p + 1);
  shape.selects_all = shape.max_context <= config.index_topk;
  return shape;
}

void CudaGlm5Model::Impl::upload_metadata(const ForwardBatch& batch) {
  const io::ModelConfig& c = config;
  const int T = batch.num_tokens(), S = static_cast<int>(batch.sequences.size());
  const int R = static_cast<int>(batch.logits_tokens.size());
  GLMS_CHECK(T > 0, "empty batch");
  if (T > options.max_tokens)
    fail("the step has " + std::to_string(T) + " tokens; this CUDA model was set up for at most " +
         std::to_string(options.max_tokens) + " (max_tokens)");
  if (S > options.max_sequences)
    fail("the step has " + std::to_string(S) + " sequences; at most " + std::to_string(options.max_sequences));
  if (R > options.max_logits)
    fail("the step asks for " + std::to_string(R) + " logits rows; at most " + std::to_string(options.max_logits));
  stream.synchronize();  // the previous step's copy out of the staging buffer has finished
  timer.collect();
  char* base = static_cast<char*>(staging.data());
  auto* slot_mapping = reinterpret_cast<int64_t*>(base + meta.slot_mapping);
  auto* token_ids = reinterpret_cast<int32_t*>(base + meta.token_ids);
  auto* positions = reinterpret_cast<int32_t*>(base + meta.positions);
  auto* token_sequence = reinterpret_cast<int32_t*>(base + meta.token_sequence);
  auto* logits_tokens = reinterpret_cast<int32_t*>(base + meta.logits_tokens);
  auto* block_tables = reinterpret_cast<int32_t*>(base + meta.block_tables);
  for (int t = 0; t < T; ++t) {
    const int32_t id = batch.token_ids[t];
    if (id < 0 || id >= c.vocab_size)
      fail("token id " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(c.vocab_size) + ")");
    if (batch.positions[t] < 0 || batch.positions[t] >= options.max_context)
      fail("position " + std::to_string(batch.positions[t]) + " is past this CUDA model's max_context " +
           std::to_string(options.max_context));
    if (batch.slot_mapping[t] < 0 || batch.slot_mapping[t] >= num_slots)
      fail("cache slot " + std::to_string(batch.slot_mapping[t]) + " is outside the device cache");
    token_ids[t] = id;
    positions[t] = batch.positions[t];
    token_sequence[t] = batch.token_sequence[t];
    slot_mapping[t] = batch.slot_mapping[t];
  }
  std::copy(batch.logits_tokens.begin(), batch.logits_tokens.end(), logits_tokens);
  for (int s = 0; s < S; ++s) {
    const std::vector<int32_t>& table = batch.sequences[s].block_table;
    if (static_cast<int>(table.size()) > max_blocks) fail("a sequence's block table is longer than max_context allows");
    int32_t* row = block_tables + static_cast<int64_t>(s) * max_blocks;
    for (size_t b = 0; b < table.size(); ++b) {
      if (table[b] < 0 || table[b] >= options.num_blocks) fail("block id " + std::to_string(table[b]) + " is outside the device cache");
      row[b] = table[b];
    }
    std::fill(row + table.size(), row + max_blocks, 0);
  }
  cuda::copy_to_device_async(metadata.data(), staging.data(),
                             meta.block_tables + sizeof(int32_t) * static_cast<size_t>(S) * max_blocks, stream.get());
}

void CudaGlm5Model::Impl::dense_mlp(const MlpDevice& mlp, const uint16_t* x_bf16, int n, float* out) {
  const int64_t hidden = config.hidden_size;
  gemm.linear(x_bf16, n, as<uint16_t>(mlp.gate_up), 2 * mlp.inter, hidden, as<float>(mlp_gate_up), stream.get());
  cuda::silu_mul_to_bf16(as<float>(mlp_gate_up), n, mlp.inter, as<uint16_t>(mlp_act), stream.get());
  gemm.linear(as<uint16_t>(mlp_act), n, as<uint16_t>(mlp.down), hidden, mlp.inter, out, stream.get());
}

void CudaGlm5Model::Impl::attention(const DecoderLayerDevice& layer, int l, const StepShape& shape) {
  const io::ModelConfig& c = config;
  const AttentionDevice& w = layer.attention;
  const int T = shape.num_tokens, H = c.num_attention_heads;
  const int64_t hidden = c.hidden_size, qd = c.qk_head_dim(), nope = c.qk_nope_head_dim, rd = c.qk_rope_head_dim;
  const int64_t L = c.kv_lora_rank, vd = c.v_head_dim, q_lora = c.q_lora_rank;
  cudaStream_t s = stream.get();
  const int32_t* positions = meta_i32(meta.positions);
  const auto* slots = reinterpret_cast<const int64_t*>(static_cast<const char*>(metadata.data()) + meta.slot_mapping);
  const int32_t* block_tables = meta_i32(meta.block_tables);
  const int32_t* token_sequence = meta_i32(meta.token_sequence);
  const uint16_t* x = as<uint16_t>(normed_bf16);

  // The projections of x (q_a, kv_a and the indexer's wk and head weights), then those of the
  // normed q residual (q_b, the indexer's wq_b): one grouped launch each at decode sizes. When
  // every token's context fits index_topk the top-k is every position: the indexer's query
  // side is skipped, its keys are still cached for later steps.
  const IndexerDevice& ix = w.indexer;
  const int IH = c.index_n_heads, ID = c.index_head_dim;
  const bool score_positions = w.has_indexer && !shape.selects_all;
  cuda::GemvOutput from_x[4] = {{as<uint16_t>(w.q_a_proj), q_lora, as<float>(q_resid)},
                                {as<uint16_t>(w.kv_a_proj), L + rd, as<float>(kv)},
                                {as<uint16_t>(ix.wk), ID, as<float>(index_k)},
                                {as<uint16_t>(ix.weights_proj), IH, as<float>(index_w)}};
  gemm.linear_group(x, T, hidden, from_x, w.has_indexer ? (score_positions ? 4 : 3) : 2, s);
  cuda::residual_rms_norm(as<float>(q_resid), nullptr, T, q_lora, as<float>(w.q_a_norm), kLatentNormEps, nullptr,
                          as<uint16_t>(q_resid_bf16), s);
  cuda::GemvOutput from_q[2] = {{as<uint16_t>(w.q_b_proj), H * qd, as<float>(q)},
                                {as<uint16_t>(ix.wq_b), int64_t{IH} * ID, as<float>(index_q)}};
  gemm.linear_group(as<uint16_t>(q_resid_bf16), T, q_lora, from_q, score_positions ? 2 : 1, s);
  cuda::rope_rows(as<float>(q), T, H, qd, nope, static_cast<int>(rd), positions, as<float>(inv_freq), s);
  uint16_t* cache = as<uint16_t>(latent_cache[l]);
  cuda::write_latent_cache(as<float>(kv), T, static_cast<int>(L), static_cast<int>(rd), as<float>(w.kv_a_norm),
                           kLatentNormEps, positions, slots, as<float>(inv_freq), cache, s);
  timer.mark("attention.projections", s);

  if (w.has_indexer && !score_positions) {
    cuda::write_indexer_keys(as<float>(index_k), T, ID, static_cast<int>(rd), as<float>(ix.k_norm_weight),
                             as<float>(ix.k_norm_bias), kIndexerNormEps, positions, slots, as<float>(inv_freq),
                             as<float>(index_keys[l]), s);
    // Scores are not read for contexts of at most top_k: every position is selected.
    cuda::select_top_k(as<float>(scores), options.max_context, positions, T, c.index_topk, as<int32_t>(selected),
                       c.index_topk, as<int32_t>(num_selected), s);
    timer.mark("attention.indexer", s);
  } else if (w.has_indexer) {
    cuda::rope_rows(as<float>(index_q), T, IH, ID, 0, static_cast<int>(rd), positions, as<float>(inv_freq), s);
    cuda::write_indexer_keys(as<float>(index_k), T, ID, static_cast<int>(rd), as<float>(ix.k_norm_weight),
                             as<float>(ix.k_norm_bias), kIndexerNormEps, positions, slots, as<float>(inv_freq),
                             as<float>(index_keys[l]), s);
    cuda::IndexerScoreArgs args;
    args.queries = as<float>(index_q);
    args.head_weights = as<float>(index_w);
    args.key_cache = as<float>(index_keys[l]);
    args.block_tables = block_tables;
    args.max_blocks = max_blocks;
    args.token_sequence = token_sequence;
    args.positions = positions;
    args.block_size = options.block_size;
    args.num_tokens = T;
    args.heads = IH;
    args.dim = ID;
    args.top_k = c.index_topk;
    args.head_scale = 1.0f / std::sqrt(static_cast<float>(IH));
    args.softmax_scale = 1.0f / std::sqrt(static_cast<float>(ID));
    args.max_context = shape.max_context;
    args.scores = as<float>(scores);
    args.score_stride = options.max_context;
    cuda::IndexerGemmWorkspace workspace;
    workspace.keys = as<float>(gathered_keys);
    workspace.head_scores = as<float>(prefill_scores);
    workspace.head_score_elements = prefill_score_capacity;
    split_by_chunk_length(
        shape,
        [&](int first, int count) {
          args.first_token = first;
          args.launch_tokens = count;
          cuda::indexer_scores(args, s);
        },
        [&](int index) {
          const SequenceSlice& seq = batch->sequences[index];
          cuda::IndexerScoreArgs chunk = args;
          chunk.first_token = seq.first_token;
          chunk.launch_tokens = seq.num_tokens;
          cuda::indexer_scores_gemm(chunk, block_tables + int64_t{index} * max_blocks, seq.context_len, workspace, gemm,
                                    s);
        });
    cuda::select_top_k(as<float>(scores), options.max_context, positions, T, c.index_topk, as<int32_t>(selected),
                       c.index_topk, as<int32_t>(num_selected), s);
    timer.mark("attention.indexer", s);
  }

  // Absorb W_uk into the queries, per head: q_latent[t, h] = q_nope[t, h] . W_uk[h] ([nope, L]).
  cuda::to_bf16(as<float>(q), as<uint16_t>(q_bf16), int64_t{T} * H * qd, s);
  const int64_t head_stride = (nope + vd) * L;  // kv_b_proj rows of one head: W_uk then W_uv
  gemm.batched(as<uint16_t>(q_bf16), T, H * qd, qd, as<uint16_t>(w.kv_b_proj), nope, L, L, head_stride, true,
               as<float>(q_latent), H * L, L, H, s);
  timer.mark("attention.absorb", s);

  cuda::MlaAttentionArgs args;
  args.q_latent = as<float>(q_latent);
  args.q_rope = as<float>(q) + nope;
  args.q_rope_stride = qd;
  args.cache = cache;
  args.selected = as<int32_t>(selected);
  args.num_selected = as<int32_t>(num_selected);
  args.max_selected = c.index_topk;
  args.block_tables = block_tables;
  args.max_blocks = max_blocks;
  args.token_sequence = token_sequence;
  args.block_size = options.block_size;
  args.num_tokens = T;
  args.num_heads = H;
  args.latent_dim = static_cast<int>(L);
  args.rope_dim = static_cast<int>(rd);
  args.scale = static_cast<float>(c.attention_scale());
  args.out = as<float>(o_latent);
  cuda::MlaGatherWorkspace gather;
  gather.gathered = as<uint16_t>(gathered_rows);
  gather.gathered_elements = gathered_capacity;
  gather.queries = as<uint16_t>(prefill_queries);
  gather.scores = as<float>(prefill_scores);
  gather.probs = as<uint16_t>(prefill_probs);
  gather.score_elements = prefill_score_capacity;
  const int max_selected_in_step = std::min(shape.max_context, c.index_topk);
  // Long prefill chunks attend over their gathered context; other tokens over their own
  // selections: runs of fused_attention_min_tokens or more in one fused pass (where the shapes
  // allow), shorter ones through the gathered-row GEMMs.
  split_by_chunk_length(
      shape,
      [&](int first, int count) {
        args.first_token = first;
        args.launch_tokens = count;
        if (fused_attention() && count >= options.fused_attention_min_tokens)
          cuda::mla_attention_fused(args, max_selected_in_step, as<uint16_t>(prefill_queries), as<float>(prefill_scores),
                                    prefill_score_capacity, s);
        else
          cuda::mla_attention_gathered(args, max_selected_in_step, gather, gemm, s);
      },
      [&](int index) {
        const SequenceSlice& seq = batch->sequences[index];
        if (!options.fused_prefill_attention || !fused_attention()) {
          prefill_attention(index, l, args.scale);
          return;
        }
        args.first_token = seq.first_token;
        args.launch_tokens = seq.num_tokens;
        cuda::mla_attention_fused(args, std::min(seq.context_len, c.index_topk), as<uint16_t>(prefill_queries),
                                  as<float>(prefill_scores), prefill_score_capacity, s);
      });
  timer.mark("attention.core", s);

  // Un-absorb W_uv per head, then o_proj.
  cuda::to_bf16(as<float>(o_latent), as<uint16_t>(o_bf16), int64_t{T} * H * L, s);
  gemm.batched(as<uint16_t>(o_bf16), T, H * L, L, as<uint16_t>(w.kv_b_proj) + nope * L, vd, L, L, head_stride, false,
               as<float>(heads_out), H * vd, vd, H, s);
  cuda::to_bf16(as<float>(heads_out), as<uint16_t>(heads_bf16), int64_t{T} * H * vd, s);
  gemm.linear(as<uint16_t>(heads_bf16), T, as<uint16_t>(w.o_proj), hidden, H * vd, as<float>(block_out), s);
  timer.mark("attention.output", s);
}

void CudaGlm5Model::Impl::prefill_attention(int sequence, int l, float scale) {
  const io::ModelConfig& c = config;
  const SequenceSlice& seq = batch->sequences[sequence];
  const int H = c.num_attention_heads, L = c.kv_lora_rank, rd = c.qk_rope_head_dim, row = L + rd;
  const int64_t qd = c.qk_head_dim(), nope = c.qk_nope_head_dim;
  cudaStream_t s = stream.get();
  const uint16_t* context_rows = as<uint16_t>(prefill_context);
  cuda::mla_gather_context(as<uint16_t>(latent_cache[l]), meta_i32(meta.block_tables) + int64_t{sequence} * max_blocks,
                           options.block_size, seq.context_len, row, as<uint16_t>(prefill_context), s);
  for (int done = 0; done < seq.num_tokens;) {
    const int first = seq.first_token + done;
    const int n = static_cast<int>(std::clamp<int64_t>(prefill_score_capacity / (int64_t{H} * seq.context_len), 1,
                                                       seq.num_tokens - done));
    const int context = batch->positions[first + n - 1] + 1;  // the chunk's causal extent
    cuda::mla_prefill_queries(as<float>(q_latent) + int64_t{first} * H * L, as<float>(q) + first * H * qd + nope, qd, n,
                              H, L, rd, scale, as<uint16_t>(prefill_queries), s);
    // scores[h] = queries[:, h, :] . context_rows^T   [H, n, context] fp32
    gemm.batched(as<uint16_t>(prefill_queries), n, int64_t{H} * row, row, context_rows, context, row, row, 0, false,
                 as<float>(prefill_scores), context, int64_t{n} * context, H, s);
    cuda::memset_async(prefill_probs.data(), 0, sizeof(uint16_t) * H * n * context, s);
    cuda::mla_sparse_softmax(as<float>(prefill_scores), n, H, context, as<int32_t>(selected) + int64_t{first} * c.index_topk,
                             c.index_topk, as<int32_t>(num_selected) + first, as<uint16_t>(prefill_probs), s);
    // o_latent[first + i, h, :] = probs[h, i, :] . context_rows[:, :latent]
    gemm.batched(as<uint16_t>(prefill_probs), n, context, int64_t{n} * context, context_rows, context, L, row, 0, true,
                 as<float>(o_latent) + int64_t{first} * H * L, int64_t{H} * L, L, H, s);
    done += n;
  }
}

void CudaGlm5Model::Impl::moe(const DecoderLayerDevice& layer, const StepShape& shape) {
  const io::ModelConfig& c = config;
  const MoeDevice& m = layer.moe;
  const int T = shape.num_tokens, K = c.num_experts_per_tok, E = c.n_routed_experts;
  const int64_t hidden = c.hidden_size, inter = c.moe_intermediate_size, P = int64_t{T} * K;
  cudaStream_t s = stream.get();
  gemm.linear_f32(as<float>(normed_f32), T, as<float>(m.router), E, hidden, as<float>(router_logits), s);
  cuda::MoeRouting routing;
  routing.num_experts = E;
  routing.top_k = K;
  routing.n_group = c.n_group;
  routing.topk_group = c.topk_group;
  routing.norm_topk_prob = c.norm_topk_prob;
  routing.routed_scaling_factor = c.routed_scaling_factor;
  cuda::moe_route(as<float>(router_logits), as<float>(m.correction_bias), T, routing, as<int32_t>(expert_ids),
                  as<float>(expert_weights), s);
  cuda::MoePlan plan;
  plan.counts = as<int32_t>(plan_counts);
  plan.offsets = as<int32_t>(plan_offsets);
  plan.active_experts = as<int32_t>(plan_active);
  plan.num_active = as<int32_t>(plan_num_active);
  plan.sorted_pairs = as<int32_t>(sorted_pairs);
  plan.pair_slot = as<int32_t>(pair_slot);
  cuda::moe_plan(as<int32_t>(expert_ids), P, E, plan, s);
  timer.mark("moe.routing", s);

  dense_mlp(m.shared, as<uint16_t>(normed_bf16), T, as<float>(shared_out));
  timer.mark("moe.shared", s);

  cuda::ExpertWeights experts;
  experts.format = m.experts_format;
  experts.gate_up = m.experts_gate_up.data();
  experts.gate_up_scales = m.experts_gate_up_scales.data();
  experts.down = m.experts_down.data();
  experts.down_scales = m.experts_down_scales.data();
  experts.scales_fit_fp16 = m.experts_scales_fit_fp16;
  const int small_pairs = cuda::moe_experts_mma_supported(experts, hidden, inter) ? kSmallMoePairsPerExpertTensorCores
                                                                               : kSmallMoePairsPerExpert;
  if (P <= int64_t{small_pairs} * E || !shape.host_sync_ok) {
    cuda::moe_experts_small(as<uint16_t>(normed_bf16), hidden, inter, experts, plan, E, K, T,
                            static_cast<int>(std::min<int64_t>(E, P)), as<uint16_t>(pair_act), as<float>(expert_out), s);
  } else {
    // Per-expert GEMMs over the grouped rows; the group offsets come back to the host first.
    // Quantised experts are widened to bf16 one at a time (same stream: the next widening waits
    // for this expert's GEMMs).
    cuda::copy_to_host_async(offsets_host.data(), plan.offsets, sizeof(int32_t) * (E + 1), s);
    stream.synchronize();
    const auto* offsets = static_cast<const int32_t*>(offsets_host.data());
    cuda::gather_rows(as<uint16_t>(normed_bf16), hidden, plan.sorted_pairs, P, K, as<uint16_t>(pair_x), s);
    for (int e = 0; e < E; ++e) {
      const int count = offsets[e + 1] - offsets[e];
      if (count == 0) continue;
      const uint16_t* gate_up = as<uint16_t>(m.experts_gate_up) + int64_t{e} * 2 * inter * hidden;
      const uint16_t* down = as<uint16_t>(m.experts_down) + int64_t{e} * hidden * inter;
      if (m.experts_format != ops::WeightFormat::Plain) {
        cuda::dequantize_expert(experts, e, hidden, inter, as<uint16_t>(expert_gate_up_bf16),
                                as<uint16_t>(expert_down_bf16), s);
        gate_up = as<uint16_t>(expert_gate_up_bf16);
        down = as<uint16_t>(expert_down_bf16);
      }
      gemm.linear(as<uint16_t>(pair_x) + int64_t{offsets[e]} * hidden, count, gate_up, 2 * inter, hidden,
                  as<float>(pair_gate_up) + int64_t{offsets[e]} * 2 * inter, s);
      cuda::silu_mul_to_bf16(as<float>(pair_gate_up) + int64_t{offsets[e]} * 2 * inter, count, inter,
                             as<uint16_t>(pair_act) + int64_t{offsets[e]} * inter, s);
      gemm.linear(as<uint16_t>(pair_act) + int64_t{offsets[e]} * inter, count, down, hidden, inter,
                  as<float>(expert_out) + int64_t{offsets[e]} * hidden, s);
    }
  }
  timer.mark("moe.experts", s);
  cuda::moe_combine(as<float>(x), as<float>(shared_out), as<float>(expert_out), plan.pair_slot, as<int32_t>(expert_ids),
                    as<float>(expert_weights), T, K, hidden, s);
  timer.mark("moe.combine", s);
}

void CudaGlm5Model::Impl::run_step(const StepShape& shape) {
  const io::ModelConfig& c = config;
  const int T = shape.num_tokens;
  const int64_t hidden = c.hidden_size;
  cudaStream_t s = stream.get();
  timer.mark("start", s);
  cuda::embed_rows(as<uint16_t>(weights.embed_tokens), meta_i32(meta.token_ids), T, hidden, as<float>(x), s);
  timer.mark("embed", s);
  const float* pending = nullptr;  // a block output not yet added to the residual stream
  for (int l = 0; l < c.num_hidden_layers; ++l) layer_step(weights.layers[l], l, shape, pending);
  cuda::residual_rms_norm(as<float>(x), pending, T, hidden, as<float>(weights.final_norm), c.rms_norm_eps, nullptr,
                          as<uint16_t>(normed_bf16), s);
  cuda::gather_rows(as<uint16_t>(normed_bf16), hidden, meta_i32(meta.logits_tokens), shape.num_logits, 1,
                    as<uint16_t>(head_in), s);
  gemm.linear(as<uint16_t>(head_in), shape.num_logits, as<uint16_t>(weights.lm_head), c.vocab_size, hidden,
              as<float>(logits), s);
  timer.mark("head", s);
}

void CudaGlm5Model::Impl::layer_step(const DecoderLayerDevice& layer, int l, const StepShape& shape,
                                     const float*& pending) {
  const io::ModelConfig& c = config;
  const int T = shape.num_tokens;
  const int64_t hidden = c.hidden_size;
  cudaStream_t s = stream.get();
  cuda::residual_rms_norm(as<float>(x), pending, T, hidden, as<float>(layer.input_norm), c.rms_norm_eps, nullptr,
                          as<uint16_t>(normed_bf16), s);
  timer.mark("norms", s);
  attention(layer, l, shape);
  cuda::residual_rms_norm(as<float>(x), as<float>(block_out), T, hidden, as<float>(layer.post_attention_norm),
                          c.rms_norm_eps, as<float>(normed_f32), as<uint16_t>(normed_bf16), s);
  timer.mark("norms", s);
  if (layer.is_moe) {
    moe(layer, shape);  // adds into x
    pending = nullptr;
  } else {
    dense_mlp(layer.mlp, as<uint16_t>(normed_bf16), T, as<float>(block_out));
    timer.mark("dense_mlp", s);
    pending = as<float>(block_out);
  }
}

// x = eh_proj(cat(enorm(embed(token)), hnorm(h_prev))) as two GEMMs (the second into block_out,
// added by the block's first norm), the decoder block over the MTP cache, shared_head.norm and
// shared_head.head, as Glm5Model::mtp_forward.
void CudaGlm5Model::Impl::mtp_step(const StepShape& shape) {
  const io::ModelConfig& c = config;
  const MtpDevice& m = weights.mtp[0];
  const int T = shape.num_tokens;
  const int64_t hidden = c.hidden_size;
  cudaStream_t s = stream.get();
  const DeviceBuffer& embed = m.embed_tokens.bytes() > 0 ? m.embed_tokens : weights.embed_tokens;
  cuda::embed_rows(as<uint16_t>(embed), meta_i32(meta.token_ids), T, hidden, as<float>(x), s);
  cuda::residual_rms_norm(as<float>(x), nullptr, T, hidden, as<float>(m.enorm), c.rms_norm_eps, nullptr,
                          as<uint16_t>(normed_bf16), s);
  gemm.linear(as<uint16_t>(normed_bf16), T, as<uint16_t>(m.eh_proj_embed), hidden, hidden, as<float>(x), s);
  cuda::residual_rms_norm(as<float>(h_prev), nullptr, T, hidden, as<float>(m.hnorm), c.rms_norm_eps, nullptr,
                          as<uint16_t>(normed_bf16), s);
  gemm.linear(as<uint16_t>(normed_bf16), T, as<uint16_t>(m.eh_proj_hidden), hidden, hidden, as<float>(block_out), s);
  const float* pending = as<float>(block_out);
  layer_step(m.block, c.num_hidden_layers, shape, pending);
  cuda::residual_rms_norm(as<float>(x), pending, T, hidden, as<float>(m.shared_head_norm), c.rms_norm_eps, nullptr,
                          as<uint16_t>(normed_bf16), s);
  cuda::gather_rows(as<uint16_t>(normed_bf16), hidden, meta_i32(meta.logits_tokens), shape.num_logits, 1,
                    as<uint16_t>(head_in), s);
  const DeviceBuffer& head = m.shared_head.bytes() > 0 ? m.shared_head : weights.lm_head;
  gemm.linear(as<uint16_t>(head_in), shape.num_logits, as<uint16_t>(head), c.vocab_size, hidden, as<float>(logits), s);
}

void CudaGlm5Model::Impl::launch(const ForwardBatch& step, bool use_graph) {
  upload_metadata(step);
  batch = &step;
  struct Reset {
    const ForwardBatch*& current;
    ~Reset() { current = nullptr; }
  } reset{batch};
  StepShape shape = shape_of(step);
  bool decode_only = true;
  for (const SequenceSlice& seq : step.sequences) decode_only = decode_only && seq.num_tokens == 1;
  const bool small_moe =
      int64_t{shape.num_tokens} * config.num_experts_per_tok <= int64_t{kSmallMoePairsPerExpert} * config.n_routed_experts;
  if (!use_graph || !decode_only || !small_moe) {
    run_step(shape);
    return;
  }
  // Graphs are keyed by the step's sizes (tokens, sequences, logits rows); their grids are
  // sized for the longest context allowed, so that any decode step of those sizes replays.
  shape.max_context = options.max_context;
  shape.host_sync_ok = false;
  std::unique_ptr<cuda::Graph>& graph = graphs[shape];
  if (!graph) {
    const bool timing = timer.enabled;
    timer.enabled = false;  // no events inside a captured graph
    graph = std::make_unique<cuda::Graph>();
    graph->begin_capture(stream.get());
    run_step(shape);
    graph->end_capture(stream.get());
    timer.enabled = timing;
  }
  graph->launch(stream.get());
}

int64_t cuda_cache_bytes_per_token(const io::ModelConfig& c) {
  return int64_t{sizeof(uint16_t)} * (c.kv_lora_rank + c.qk_rope_head_dim) * c.num_hidden_layers +
         int64_t{sizeof(float)} * c.index_head_dim * c.num_full_indexer_layers();
}

CudaGlm5Model::CudaGlm5Model(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

namespace {
CudaModelOptions resolved(CudaModelOptions options) {
  if (options.max_logits <= 0) options.max_logits = options.max_sequences;
  return options;
}
}  // namespace

CudaGlm5Model::CudaGlm5Model(const ModelWeights& weights, const CudaModelOptions& options) {
  impl_ = std::make_unique<Impl>(weights.config, resolved(options), upload_weights(weights));
  impl_->allocate();
}

std::unique_ptr<CudaGlm5Model> CudaGlm5Model::synthetic(const io::ModelConfig& config, uint64_t seed,
                                                        const CudaModelOptions& options,
                                                        ops::WeightFormat experts_format) {
  auto impl = std::make_unique<Impl>(config, resolved(options),
                                     synthetic_weights(config, seed, experts_format, options.mtp));
  impl->allocate();
  return std::unique_ptr<CudaGlm5Model>(new CudaGlm5Model(std::move(impl)));
}

CudaGlm5Model::~CudaGlm5Model() = default;

const io::ModelConfig& CudaGlm5Model::config() const { return impl_->config; }
const CudaModelOptions& CudaGlm5Model::options() const { return impl_->options; }
int64_t CudaGlm5Model::weight_bytes() const { return impl_->weights.bytes; }
int64_t CudaGlm5Model::cache_bytes() const {
  int64_t total = 0;
  for (const DeviceBuffer& b : impl_->latent_cache) total += static_cast<int64_t>(b.bytes());
  for (const DeviceBuffer& b : impl_->index_keys) total += static_cast<int64_t>(b.bytes());
  return total;
}

std::vector<float> CudaGlm5Model::forward(const ForwardBatch& batch, bool use_graph, std::vector<float>* last_hidden) {
  impl_->launch(batch, use_graph);
  return impl_->take_outputs(batch, last_hidden);
}

bool CudaGlm5Model::has_mtp() const {
  const Impl& m = *impl_;
  return m.options.mtp && !m.weights.mtp.empty() && m.weights.mtp[0].block.attention.has_indexer;
}

std::vector<float> CudaGlm5Model::mtp_forward(const ForwardBatch& batch, const float* h_prev, std::vector<float>* h_out) {
  Impl& m = *impl_;
  if (m.weights.mtp.empty()) fail("this model has no MTP layer on the device");
  if (!m.options.mtp) fail("the MTP layer's cache was not allocated (CudaModelOptions::mtp)");
  // Without its own indexer the layer would attend over another step's token selection.
  if (!m.weights.mtp[0].block.attention.has_indexer)
    fail("the MTP layer has no indexer weights: it cannot select its own top-k");
  m.upload_metadata(batch);
  const int64_t bytes = sizeof(float) * int64_t{batch.num_tokens()} * m.config.hidden_size;
  cuda::copy_to_device_async(m.h_prev.data(), h_prev, static_cast<size_t>(bytes), m.stream.get());
  m.batch = &batch;
  struct Reset {
    const ForwardBatch*& current;
    ~Reset() { current = nullptr; }
  } reset{m.batch};
  m.mtp_step(m.shape_of(batch));
  return m.take_outputs(batch, h_out);
}

void CudaGlm5Model::forward_on_device(const ForwardBatch& batch, bool use_graph) { impl_->launch(batch, use_graph); }

void CudaGlm5Model::synchronize() {
  impl_->stream.synchronize();
  impl_->timer.collect();
}

void CudaGlm5Model::set_phase_timing(bool on) { impl_->timer.enabled = on; }

std::vector<std::pair<std::string, double>> CudaGlm5Model::take_phase_times() {
  impl_->stream.synchronize();
  return impl_->timer.take();
}

void CudaGlm5Model::fill_cache_random(uint64_t seed) {
  for (size_t l = 0; l < impl_->latent_cache.size(); ++l) {
    DeviceBuffer& cache = impl_->latent_cache[l];
    cuda::fill_uniform_bf16(as<uint16_t>(cache), static_cast<int64_t>(cache.bytes() / sizeof(uint16_t)), seed + 2 * l,
                            1.0f, impl_->stream.get());
    DeviceBuffer& keys = impl_->index_keys[l];
    cuda::fill_uniform_f32(as<float>(keys), static_cast<int64_t>(keys.bytes() / sizeof(float)), seed + 2 * l + 1, 1.0f,
                           impl_->stream.get());
  }
  impl_->stream.synchronize();
}

}  // namespace glms::model
