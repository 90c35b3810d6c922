#include "model/cuda/model.h"

#include <numeric>

#include "model/cuda/model_impl.h"
#include "model/cuda/out_of_memory.h"

namespace glms::model {

static_assert(sizeof(cuda::RowSampling) == kCudaRowSamplingBytes, "model/cuda_memory.h sizes RowSampling");

namespace {
// A device buffer of `bytes`; out of memory names `what` (the part of the rank that did not fit,
// and the flags that size it).
DeviceBuffer allocate_naming(int64_t bytes, const std::string& what) {
  return naming_what_did_not_fit(what, [bytes] { return DeviceBuffer(static_cast<size_t>(bytes)); });
}
}  // namespace

CudaRankWidths CudaGlm5Model::Impl::widths_of_rank(bool with_mtp) const {
  // Routing covers the model's experts; the plan and the expert buffers only this rank's.
  CudaRankWidths widths;
  widths.dp_ranks = peers.dp ? peers.dp->size() : 1;
  auto add_fp8_cols = [&](const LinearDevice& w) {
    if (w.fp8()) widths.fp8_linear_cols = std::max(widths.fp8_linear_cols, w.cols);
  };
  auto add_widths = [&](const DecoderLayerDevice& layer) {
    widths.heads = std::max<int64_t>(widths.heads, layer.attention.heads);
    const AttentionDevice& a = layer.attention;
    for (const LinearDevice* w : {&a.q_a_proj, &a.q_b_proj, &a.kv_a_proj, &a.o_proj}) add_fp8_cols(*w);
    const MlpDevice& mlp = layer.is_moe ? layer.moe.shared : layer.mlp;
    add_fp8_cols(mlp.gate_up);
    add_fp8_cols(mlp.down);
    if (!layer.is_moe) {
      widths.mlp_inter = std::max(widths.mlp_inter, layer.mlp.inter);
      return;
    }
    widths.mlp_inter = std::max(widths.mlp_inter, layer.moe.shared.inter);
    widths.local_experts = std::max<int64_t>(widths.local_experts, layer.moe.num_experts);
    widths.expert_inter = std::max(widths.expert_inter, layer.moe.expert_inter);
    widths.quantised_experts |= layer.moe.experts_format != ops::WeightFormat::Plain;
    widths.tiled_mxfp4_experts |= layer.moe.experts_mxfp4_tiled;
  };
  for (const DecoderLayerDevice& layer : weights.layers) add_widths(layer);
  for (const MtpDevice& m : weights.mtp) add_widths(m.block);
  widths.mtp_indexer = with_mtp && weights.mtp[0].block.attention.has_indexer;
  return widths;
}

int CudaGlm5Model::Impl::cache_blocks_that_fit(int64_t bytes_per_slot) {
  // The budget is a fraction of the whole device, as vLLM's; what is in use now (the context,
  // weights, workspaces, communicators) comes out of it, and the cache gets what is left less a
  // margin (model/cuda_memory.h).
  const auto [free_bytes, total_bytes] = cuda::memory_info();
  const int64_t budget = static_cast<int64_t>(options.gpu_memory_utilization * static_cast<double>(total_bytes));
  const int64_t used = static_cast<int64_t>(total_bytes - free_bytes);
  const int64_t fit =
      cuda_cache_blocks_that_fit(budget - used - kCudaMemoryMarginBytes, bytes_per_slot, options.block_size);
  const int num_blocks = static_cast<int>(std::min<int64_t>(fit, int64_t{1} << 30));
  if (num_blocks <= 0)
    fail("no device memory left for the KV cache: " + std::to_string(used >> 20) + " MiB in use of a budget of " +
         std::to_string(budget >> 20) + " MiB (--gpu-memory-utilization " +
         std::to_string(options.gpu_memory_utilization) + " of " + std::to_string(total_bytes >> 20) +
         " MiB): raise --gpu-memory-utilization, lower --max-num-batched-tokens or --max-model-len, or use more GPUs");
  memory.device_total = static_cast<int64_t>(total_bytes);
  memory.budget = budget;
  memory.in_use = used;
  return num_blocks;
}

void CudaGlm5Model::Impl::allocate() {
  const io::ModelConfig& c = config;
  const bool with_mtp = options.mtp && !weights.mtp.empty();
  const CudaRankWidths widths = widths_of_rank(with_mtp);
  GLMS_CHECK(cuda::mla_padded_row(c.kv_lora_rank, c.qk_rope_head_dim) ==
                 cuda_mla_padded_row(c.kv_lora_rank, c.qk_rope_head_dim),
             "model/cuda_memory.h's padded row differs from the fused attention's");
  CudaStepLimits limits;
  limits.max_tokens = options.max_tokens;
  limits.max_sequences = options.max_sequences;
  limits.max_logits = options.max_logits;
  limits.max_context = options.max_context;
  limits.block_size = options.block_size;
  limits.mtp = with_mtp;
  limits.widened_experts_min_pairs = options.widened_experts_min_pairs;
  workspace_bytes = 0;
  const std::string step_buffers = "the step buffers of " + std::to_string(limits.max_tokens) + " tokens and " +
                                   std::to_string(limits.max_sequences) +
                                   " sequences (--max-num-batched-tokens, --max-num-seqs)";
  make_cuda_workspaces(*this, c, widths, limits, [this, &step_buffers](int64_t bytes) {
    workspace_bytes += cuda_allocation_bytes(bytes);
    return allocate_naming(bytes, step_buffers);
  });
  rank_widths = widths;
  step_limits = limits;
  {
    std::vector<int32_t> identity(cuda_max_blocks(limits));
    std::iota(identity.begin(), identity.end(), 0);
    context_table.upload(identity.data(), sizeof(int32_t) * identity.size());
  }
  if (widths.fp8_linear_cols > 0) fp8_gemm = std::make_unique<cuda::Fp8Gemm>();
  expert_unit_counters = cuda::zeroed_buffer(cuda::kUnitCounterBytes);
  const int64_t rd = c.qk_rope_head_dim;
  offsets_host = cuda::PinnedBuffer(sizeof(int32_t) * (widths.local_experts + 1));
  staging = cuda::PinnedBuffer(meta.total);
  mask_staging = cuda::PinnedBuffer(static_cast<size_t>(CudaMaskLayout(limits.max_logits, c.vocab_size).total));

  std::vector<float> freq(rd / 2);
  for (int i = 0; i < rd / 2; ++i)
    freq[i] = 1.0f / std::pow(static_cast<float>(c.rope_theta), static_cast<float>(2 * i) / static_cast<float>(rd));
  inv_freq.upload(freq.data(), sizeof(float) * freq.size());

  const int64_t bytes_per_slot = cuda_cache_bytes_per_token(c, options.cache_dtype, with_mtp, widths.mtp_indexer);
  if (options.num_blocks <= 0) options.num_blocks = cache_blocks_that_fit(bytes_per_slot);
  allocate_cache(with_mtp, widths.mtp_indexer);
}

void CudaGlm5Model::Impl::allocate_cache(bool with_mtp, bool mtp_indexer) {
  const io::ModelConfig& c = config;
  const int num_blocks = options.num_blocks;
  const int64_t row_bytes = cuda_cache_row_bytes(c, options.cache_dtype);
  // One block more than the engine's: the slots an idle data-parallel rank's dummy token writes.
  num_slots = int64_t{num_blocks + 1} * options.block_size;
  idle_batch = ForwardBatch();
  idle_batch.add_sequence({0}, 0, {num_blocks}, options.block_size, false);
  idle_batch.logits_tokens.clear();
  // FP8 keys: the codes of every slot, then (16-byte aligned) their scales.
  const int64_t key_bytes = cache_storage() == cuda::CacheStorage::kFp8
                                ? quant::kv_fp8_key_scales_offset(num_slots, c.index_head_dim) + 4 * num_slots
                                : cuda_cache_key_bytes(c, options.cache_dtype) * num_slots;
  const std::string cache = "a KV cache of " + std::to_string(num_blocks) +
                            " blocks (--kv-cache-memory, --gpu-memory-utilization)";
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    latent_cache.push_back(allocate_naming(row_bytes * num_slots, cache));
    index_keys.push_back(allocate_naming(c.indexer_full[l] ? key_bytes : 0, cache));
  }
  // The MTP layer's own cache sits after the decoder layers' (index num_hidden_layers), with the
  // same slots.
  if (with_mtp) {
    latent_cache.push_back(allocate_naming(row_bytes * num_slots, cache));
    index_keys.push_back(allocate_naming(mtp_indexer ? key_bytes : 0, cache));
  }
}

namespace {
// Rows each data-parallel rank adds to the MoE gather: the most tokens any rank runs, rounded up
// (to 8, then 16 and every multiple of 32), so that decode graphs are reused across steps.
int moe_gather_rows(const std::vector<int32_t>& dp_tokens, int max_tokens) {
  int most = 1;
  for (int32_t n : dp_tokens) most = std::max(most, n);
  const int rounded = most <= 8 ? 8 : most <= 16 ? 16 : (most + 31) / 32 * 32;
  return std::min(rounded, max_tokens);
}
}  // namespace

StepShape CudaGlm5Model::Impl::shape_of(const ForwardBatch& batch) const {
  StepShape shape;
  shape.num_tokens = batch.num_tokens();
  shape.num_sequences = static_cast<int>(batch.sequences.size());
  shape.num_logits = static_cast<int>(batch.logits_tokens.size());
  for (int32_t p : batch.positions) shape.max_context = std::max(shape.max_context, p + 1);
  shape.selects_all = shape.max_context <= config.index_topk;
  return shape;
}

void CudaGlm5Model::Impl::upload_metadata(const ForwardBatch& batch, int routed_tokens, int real_sequences) {
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
  *reinterpret_cast<int32_t*>(base + meta.routed_tokens) = routed_tokens;
  for (int s = 0; s < S; ++s) {
    const std::vector<int32_t>& table = batch.sequences[s].block_table;
    if (static_cast<int>(table.size()) > max_blocks) fail("a sequence's block table is longer than max_context allows");
    const int usable_blocks = s < real_sequences ? options.num_blocks : options.num_blocks + 1;  // dummies: the one after
    int32_t* row = block_tables + static_cast<int64_t>(s) * max_blocks;
    for (size_t b = 0; b < table.size(); ++b) {
      if (table[b] < 0 || table[b] >= usable_blocks) fail("block id " + std::to_string(table[b]) + " is outside the device cache");
      row[b] = table[b];
    }
    std::fill(row + table.size(), row + max_blocks, 0);
  }
  cuda::copy_to_device_async(metadata.data(), staging.data(),
                             meta.block_tables + sizeof(int32_t) * static_cast<size_t>(S) * max_blocks, stream.get());
}

void CudaGlm5Model::Impl::dense_mlp(const MlpDevice& mlp, const uint16_t* x_bf16, int n, float* out, cuda::Gemm& g,
                                    cudaStream_t s, bool accumulate, bool x_quantised) {
  // down's FP8 GEMM reads SwiGLU's E4M3 rows (the FP8 GEMM runs on the main stream only), and
  // then nothing reads act in bf16.
  const cuda::Fp8Rows act_fp8 = s == stream.get() ? fp8_input_rows(mlp.down, n) : cuda::Fp8Rows{};
  const bool act_quantised = act_fp8.codes != nullptr;
  uint16_t* const act_bf16 = act_quantised ? nullptr : as<uint16_t>(mlp_act);
  if (bf16_intermediates(n) && linear_to_bf16(mlp.gate_up, x_bf16, n, as<uint16_t>(mlp_gate_up), g, s, x_quantised)) {
    cuda::silu_mul_to_bf16(as<uint16_t>(mlp_gate_up), n, mlp.inter, act_bf16, s, act_fp8);
  } else {
    linear(mlp.gate_up, x_bf16, n, as<float>(mlp_gate_up), g, s, x_quantised);
    cuda::silu_mul_to_bf16(as<float>(mlp_gate_up), n, mlp.inter, act_bf16, s, act_fp8);
  }
  if (accumulate)
    add_linear(mlp.down, as<uint16_t>(mlp_act), n, out, g, s, act_quantised);
  else
    linear(mlp.down, as<uint16_t>(mlp_act), n, out, g, s, act_quantised);
}

void CudaGlm5Model::Impl::linear(const LinearDevice& w, const uint16_t* x, int n, float* y, cuda::Gemm& g,
                                 cudaStream_t s, bool x_quantised) {
  if (!w.fp8()) {
    g.linear(x, n, as<uint16_t>(w.w), w.rows, w.cols, y, s);
    return;
  }
  if (n <= cuda::kFp8GemvMaxTokens) {
    cuda::gemv_fp8(x, n, as<uint8_t>(w.w), as<float>(w.scales), w.rows, w.cols, y, 0, s);
    return;
  }
  fp8_gemm_product(w, x, n, y, s, x_quantised, /*accumulate=*/false);
}

bool CudaGlm5Model::Impl::linear_to_bf16(const LinearDevice& w, const uint16_t* x, int n, uint16_t* y, cuda::Gemm& g,
                                         cudaStream_t s, bool x_quantised) {
  if (!w.fp8()) {
    g.linear_to_bf16(x, n, as<uint16_t>(w.w), w.rows, w.cols, y, s);
    return true;
  }
  if (!options.fp8_bf16_intermediates || fp8_bf16_refused || !fp8_gemm || s != stream.get() ||
      n <= cuda::kFp8GemvMaxTokens || w.cols > rank_widths.fp8_linear_cols ||
      !fp8_gemm->has_bf16_output(n, w.rows, w.cols))
    return false;
  if (!x_quantised) cuda::quantize_fp8_rows(x, n, w.cols, as<uint8_t>(fp8_codes), as<float>(fp8_scales), s);
  try {
    fp8_gemm->linear_to_bf16(as<uint8_t>(fp8_codes), as<float>(fp8_scales), n, as<uint8_t>(w.w),
                             as<float>(w.scales), w.rows, w.cols, y, s);
  } catch (const Error&) {
    // An algorithm the heuristic offered that cuBLASLt then refused to run: fp32 rows from here on.
    fp8_bf16_refused = true;
    return false;
  }
  return true;
}

void CudaGlm5Model::Impl::fp8_gemm_product(const LinearDevice& w, const uint16_t* x, int n, float* y, cudaStream_t s,
                                           bool x_quantised, bool accumulate) {
  GLMS_CHECK(fp8_gemm && s == stream.get() && w.cols <= rank_widths.fp8_linear_cols && n > cuda::kFp8GemvMaxTokens,
             "an FP8 linear layer of GEMV size, off the main stream or wider than its activations' buffer");
  if (!x_quantised) cuda::quantize_fp8_rows(x, n, w.cols, as<uint8_t>(fp8_codes), as<float>(fp8_scales), s);
  fp8_gemm->linear(as<uint8_t>(fp8_codes), as<float>(fp8_scales), n, as<uint8_t>(w.w), as<float>(w.scales), w.rows,
                   w.cols, y, s, accumulate);
}

void CudaGlm5Model::Impl::add_linear(const LinearDevice& w, const uint16_t* x, int n, float* y, cuda::Gemm& g,
                                     cudaStream_t s, bool x_quantised) {
  if (!w.fp8()) {
    g.linear_accumulate(x, n, as<uint16_t>(w.w), w.rows, w.cols, y, s);
    return;
  }
  fp8_gemm_product(w, x, n, y, s, x_quantised, /*accumulate=*/true);
}

void CudaGlm5Model::Impl::run_step(const StepShape& shape) {
  const io::ModelConfig& c = config;
  const int T = shape.num_tokens;
  const int64_t hidden = c.hidden_size;
  cudaStream_t s = stream.get();
  timer.mark("start", s);
  step_selects_all_written = false;
  cuda::embed_rows(as<uint16_t>(weights.embed_tokens), meta_i32(meta.token_ids), T, hidden, as<float>(x), s);
  timer.mark("embed", s);
  PendingOutput pending;  // a block output not yet added to the residual stream
  for (int l = 0; l < c.num_hidden_layers; ++l) layer_step(weights.layers[l], l, shape, pending);
  cuda::residual_rms_norm(as<float>(x), pending.sum, T, hidden, as<float>(weights.final_norm), c.rms_norm_eps, nullptr,
                          as<uint16_t>(normed_bf16), s, pending.addend, nullptr, pending.sum_bf16);
  if (shape.num_logits > 0) {
    cuda::gather_rows(as<uint16_t>(normed_bf16), hidden, meta_i32(meta.logits_tokens), shape.num_logits, 1,
                      as<uint16_t>(head_in), s);
    gemm.linear(as<uint16_t>(head_in), shape.num_logits, as<uint16_t>(weights.lm_head), c.vocab_size, hidden,
                as<float>(logits), s);
  }
  timer.mark("head", s);
}

void CudaGlm5Model::Impl::layer_step(const DecoderLayerDevice& layer, int l, const StepShape& shape,
                                     PendingOutput& pending) {
  const io::ModelConfig& c = config;
  const int T = shape.num_tokens;
  const int64_t hidden = c.hidden_size;
  cudaStream_t s = stream.get();
  // A long step's FP8 projections read the norms' E4M3 rows instead of quantising normed_bf16.
  const cuda::Fp8Rows attention_input = fp8_input_rows(layer.attention.q_a_proj, T);
  cuda::residual_rms_norm(as<float>(x), pending.sum, T, hidden, as<float>(layer.input_norm), c.rms_norm_eps, nullptr,
                          as<uint16_t>(normed_bf16), s, pending.addend, nullptr, pending.sum_bf16, attention_input);
  timer.mark("norms", s);
  const float* attention_out = attention(layer, l, shape, attention_input.codes != nullptr);
  // The router's input: fp32 rows, or for a long step the bf16 terms of them (normed_bf16 is
  // term 0); a dense MLP needs neither.
  const bool router_terms = layer.is_moe && router_path(layer.moe, T) == RouterPath::kTerms;
  const cuda::Fp8Rows mlp_input = fp8_input_rows(layer.is_moe ? layer.moe.shared.gate_up : layer.mlp.gate_up, T);
  cuda::residual_rms_norm(as<float>(x), attention_out, T, hidden, as<float>(layer.post_attention_norm),
                          c.rms_norm_eps, layer.is_moe && !router_terms ? as<float>(normed_f32) : nullptr,
                          as<uint16_t>(normed_bf16), s, nullptr, router_terms ? as<uint16_t>(pair_x) : nullptr,
                          nullptr, mlp_input);
  timer.mark("norms", s);
  if (layer.is_moe) {
    pending = moe(layer, shape, mlp_input.codes != nullptr);
  } else {
    const bool into_residual = adds_into_residual(layer.mlp.down, T);
    dense_mlp(layer.mlp, as<uint16_t>(normed_bf16), T, as<float>(into_residual ? x : block_out), gemm, s,
              into_residual, mlp_input.codes != nullptr);
    if (!into_residual) sum_over_tp(as<float>(block_out), T);
    timer.mark("dense_mlp", s);
    pending = into_residual ? PendingOutput{} : PendingOutput{as<float>(block_out), nullptr};
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
  step_selects_all_written = false;
  const DeviceBuffer& embed = m.embed_tokens.bytes() > 0 ? m.embed_tokens : weights.embed_tokens;
  cuda::embed_rows(as<uint16_t>(embed), meta_i32(meta.token_ids), T, hidden, as<float>(x), s);
  cuda::residual_rms_norm(as<float>(x), nullptr, T, hidden, as<float>(m.enorm), c.rms_norm_eps, nullptr,
                          as<uint16_t>(normed_bf16), s);
  gemm.linear(as<uint16_t>(normed_bf16), T, as<uint16_t>(m.eh_proj_embed), hidden, hidden, as<float>(x), s);
  cuda::residual_rms_norm(as<float>(h_prev), nullptr, T, hidden, as<float>(m.hnorm), c.rms_norm_eps, nullptr,
                          as<uint16_t>(normed_bf16), s);
  gemm.linear(as<uint16_t>(normed_bf16), T, as<uint16_t>(m.eh_proj_hidden), hidden, hidden, as<float>(block_out), s);
  PendingOutput pending{as<float>(block_out), nullptr};
  layer_step(m.block, c.num_hidden_layers, shape, pending);
  cuda::residual_rms_norm(as<float>(x), pending.sum, T, hidden, as<float>(m.shared_head_norm), c.rms_norm_eps, nullptr,
                          as<uint16_t>(normed_bf16), s, pending.addend, nullptr, pending.sum_bf16);
  if (shape.num_logits == 0) return;
  cuda::gather_rows(as<uint16_t>(normed_bf16), hidden, meta_i32(meta.logits_tokens), shape.num_logits, 1,
                    as<uint16_t>(head_in), s);
  const DeviceBuffer& head = m.shared_head.bytes() > 0 ? m.shared_head : weights.lm_head;
  gemm.linear(as<uint16_t>(head_in), shape.num_logits, as<uint16_t>(head), c.vocab_size, hidden, as<float>(logits), s);
}

const ForwardBatch& CudaGlm5Model::Impl::runnable(const ForwardBatch& step) const {
  if (step.num_tokens() > 0) return step;
  if (!peers.dp) fail("empty batch");
  return idle_batch;  // an idle data-parallel rank: one dummy token, so that it joins the MoE gathers
}

StepShape CudaGlm5Model::Impl::plan_step(const ForwardBatch& step, bool padded) {
  if (peers.dp && static_cast<int>(step.dp_peers.size()) != peers.dp->size())
    fail("a data-parallel step needs every rank's step (ForwardBatch::dp_peers)");
  const ForwardBatch& run = padded ? padded_for_graph(step) : runnable(step);
  batch = &run;
  StepShape shape = shape_of(run);
  if (peers.dp) {
    // Every rank's step as the peers see it: the padded one's, or the caller's (an idle rank
    // runs its dummy token, whose batch carries no peers).
    const ForwardBatch& peers_of = padded ? run : step;
    step_dp_tokens = peers_of.dp_tokens();
    shape.moe_rows = moe_gather_rows(step_dp_tokens, options.max_tokens);
    shape.dp_graph_key = dp_graph_key(peers_of.dp_peers, config.index_topk);
    shape.dp_padded = padded;
    // A padded step's launches follow from the key alone: the top-k skips the indexer only
    // where it is all of every rank's context (a top-k over fewer positions than k is all of them).
    if (padded)
      for (const DpStepShape& peer : peers_of.dp_peers)
        shape.selects_all = shape.selects_all && peer.max_context <= config.index_topk;
  }
  return shape;
}

StepShape CudaGlm5Model::Impl::prepare(const ForwardBatch& step, bool padded) {
  const StepShape shape = plan_step(step, padded);
  upload_metadata(*batch, step.num_tokens(), static_cast<int>(step.sequences.size()));
  return shape;
}

bool CudaGlm5Model::Impl::dp_step_graphable(const ForwardBatch& step, bool use_graph) const {
  if (!peers.dp || !use_graph || !collectives_capturable()) return false;
  const int n = uniform_dp_sequence_tokens(step.dp_peers);
  return n > 0 && n <= options.block_size;  // the dummies' n tokens fit their one block
}

// Every rank pads its decode (or verify) batch of n tokens a sequence to the largest rank's
// sequences with dummy ones (n tokens from position 0 in the block after the usable ones, a
// logits row each, never read back), so that its step, and so its graph, follows from the largest
// batch and the joint top-k flag alone: a few graphs serve every step, where keys of every rank's
// own sizes would take thousands of values (SGLang pads its data-parallel attention's batches the
// same way). The dummy tokens route to no expert (the metadata's routed_tokens is the rank's own
// count); only the real rows' logits and hidden states are read back (they come first).
const ForwardBatch& CudaGlm5Model::Impl::padded_for_graph(const ForwardBatch& step) {
  const int n = uniform_dp_sequence_tokens(step.dp_peers);
  GLMS_CHECK(n > 0 && n <= options.block_size, "padded_for_graph: the ranks' sequences differ in tokens");
  DpStepShape largest;
  for (const DpStepShape& peer : step.dp_peers) {
    largest.sequences = std::max(largest.sequences, peer.sequences);
    largest.max_context = std::max(largest.max_context, peer.max_context);
  }
  largest.sequences = std::max(largest.sequences, 1);
  largest.tokens = largest.logits = n * largest.sequences;
  largest.max_sequence_tokens = n;
  // Every rank's batch already the largest (the rank simulation's steps): nothing to pad, and the
  // key of every rank's shapes is as uniform (every rank decides this alike).
  if (std::all_of(step.dp_peers.begin(), step.dp_peers.end(),
                  [&](const DpStepShape& p) { return p.sequences == largest.sequences; }))
    return step;
  padded_batch = step;
  const int dummy_block = idle_batch.sequences[0].block_table[0];
  while (static_cast<int>(padded_batch.sequences.size()) < largest.sequences)
    padded_batch.add_sequence(std::vector<int32_t>(n, 0), 0, {dummy_block}, options.block_size, true);
  padded_batch.dp_peers.assign(step.dp_peers.size(), largest);
  return padded_batch;
}

std::optional<StepShape> CudaGlm5Model::Impl::graph_key(const ForwardBatch& step, const StepShape& shape,
                                                        bool use_graph) const {
  // Decode and verify steps (a few tokens a sequence) replay graphs; data-parallel ranks take a
  // graph together or not at all (dp_graph_key), every input to this decision the same on each.
  const bool graph_sized = peers.dp ? every_dp_peer_fits_a_graph(step.dp_peers) : dp_step_shape(*batch).fits_a_graph();
  const int64_t moe_tokens = peers.dp ? int64_t{shape.moe_rows} * peers.dp->size() : shape.num_tokens;
  if (!use_graph || !graph_sized || !moe_without_host_sync(moe_tokens) || !collectives_capturable())
    return std::nullopt;
  // Graphs are keyed by the step's sizes (tokens, sequences, logits rows); their grids are
  // sized for the longest context allowed, so that any step of those sizes replays.
  StepShape key = shape;
  key.max_context = options.max_context;
  key.host_sync_ok = false;
  if (graphs.count(key)) return key;
  // Unpadded data-parallel keys (each rank's own sizes, when the ranks' sequences differ in
  // tokens) take at most an eighth of the bound, so that one-off mixes leave room for the
  // padded shapes, which recur.
  const bool unpadded_dp = peers.dp && !shape.dp_padded;
  if (static_cast<int>(graphs.size()) >= options.max_decode_graphs ||
      (unpadded_dp && unpadded_dp_graphs >= options.max_decode_graphs / 8))
    return std::nullopt;
  return key;
}

void CudaGlm5Model::Impl::launch(const ForwardBatch& step, bool use_graph) {
  bool padded = dp_step_graphable(step, use_graph);
  StepShape shape = plan_step(step, padded);
  std::optional<StepShape> key = graph_key(step, shape, use_graph);
  if (padded && !key) {  // the padding only serves a graph
    padded = false;
    shape = plan_step(step, false);
  }
  upload_metadata(*batch, step.num_tokens(), static_cast<int>(step.sequences.size()));
  struct Reset {
    const ForwardBatch*& current;
    ~Reset() { current = nullptr; }
  } reset{batch};
  if (!key) {
    run_step(shape);
    return;
  }
  shape = *key;
  std::unique_ptr<cuda::Graph>& graph = graphs[shape];
  if (!graph) {
    if (peers.dp && !shape.dp_padded) ++unpadded_dp_graphs;
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

CudaGlm5Model::CudaGlm5Model(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

namespace {
// The options as this device takes them: clusters of decode splits no larger than it can hold
// (a GPU whose GPCs, or a MIG slice, hold fewer blocks of the attention kernel at once).
CudaModelOptions resolved(CudaModelOptions options) {
  if (options.max_logits <= 0) options.max_logits = options.max_sequences;
  if (options.attention_cluster_splits > 1)
    options.attention_cluster_splits =
        std::min(options.attention_cluster_splits, cuda::mla_largest_cluster_splits(options.attention_ring_stages));
  return options;
}
}  // namespace

CudaGlm5Model::CudaGlm5Model(const ModelWeights& weights, const CudaModelOptions& options, Peers peers,
                             const std::function<void(int, int, int64_t)>& upload_progress) {
  impl_ = std::make_unique<Impl>(weights.config, resolved(options), upload_weights(weights, upload_progress, options.linear_weights), peers);
  impl_->allocate();
}

std::unique_ptr<CudaGlm5Model> CudaGlm5Model::synthetic(const io::ModelConfig& config, uint64_t seed,
                                                        const CudaModelOptions& options,
                                                        ops::WeightFormat experts_format, const ModelShard& shard,
                                                        Peers peers) {
  auto impl = std::make_unique<Impl>(config, resolved(options),
                                     synthetic_weights(config, seed, experts_format, options.mtp, shard,
                                                       options.linear_weights == CudaLinearWeights::kFp8),
                                     peers);
  impl->allocate();
  return std::unique_ptr<CudaGlm5Model>(new CudaGlm5Model(std::move(impl)));
}

CudaGlm5Model::~CudaGlm5Model() = default;

int CudaGlm5Model::captured_graphs() const { return static_cast<int>(impl_->graphs.size()); }

void CudaGlm5Model::limit_blocks(int blocks) {
  Impl& m = *impl_;
  GLMS_CHECK(blocks > 0 && blocks <= m.options.num_blocks, "limit_blocks beyond the allocated cache");
  m.options.num_blocks = blocks;
  m.idle_batch = ForwardBatch();  // the dummy block stays the one after the usable ones
  m.idle_batch.add_sequence({0}, 0, {blocks}, m.options.block_size, false);
  m.idle_batch.logits_tokens.clear();
}

const io::ModelConfig& CudaGlm5Model::config() const { return impl_->config; }
const CudaModelOptions& CudaGlm5Model::options() const { return impl_->options; }
int64_t CudaGlm5Model::weight_bytes() const { return impl_->weights.bytes; }
int64_t CudaGlm5Model::cache_bytes() const {
  int64_t total = 0;
  for (const DeviceBuffer& b : impl_->latent_cache) total += static_cast<int64_t>(b.bytes());
  for (const DeviceBuffer& b : impl_->index_keys) total += static_cast<int64_t>(b.bytes());
  return total;
}

std::pair<int, int> CudaGlm5Model::linear_matrices() const {
  return {impl_->weights.linear_matrices, impl_->weights.fp8_linear_matrices};
}

int64_t CudaGlm5Model::fp8_linear_parameters() const { return impl_->weights.fp8_linear_parameters; }

CudaMemoryReport CudaGlm5Model::memory_report() const {
  CudaMemoryReport report = impl_->memory;
  report.weights = impl_->weights.bytes;
  report.workspaces = impl_->workspace_bytes;
  report.widths = impl_->rank_widths;
  report.limits = impl_->step_limits;
  report.cache = cache_bytes();
  return report;
}

std::vector<float> CudaGlm5Model::forward(const ForwardBatch& batch, bool use_graph, std::vector<float>* last_hidden) {
  impl_->launch(batch, use_graph);
  return impl_->take_outputs(batch, last_hidden);
}

StepLogits CudaGlm5Model::forward_selected(const ForwardBatch& batch, const std::vector<RowOutput>& outputs,
                                           bool use_graph, std::vector<float>* last_hidden) {
  GLMS_CHECK(outputs.size() == batch.logits_tokens.size(), "forward_selected: one output per logits row");
  impl_->launch(batch, use_graph);
  return impl_->take_selected_outputs(outputs, batch, last_hidden);
}

void CudaGlm5Model::Impl::apply_token_masks(const std::vector<RowOutput>& outputs) {
  const CudaMaskLayout layout(step_limits.max_logits, config.vocab_size);
  char* base = static_cast<char*>(mask_staging.data());
  auto* rows = reinterpret_cast<int32_t*>(base + layout.rows_at);
  auto* words = reinterpret_cast<uint32_t*>(base + layout.words_at);
  int64_t masked = 0;
  // The step's forward is on the device by now: masks made on demand (mask_source) are made
  // here, straight into the staging buffer, while it runs.
  for (size_t i = 0; i < outputs.size(); ++i) {
    const RowOutput& o = outputs[i];
    if (!o.has_mask()) continue;
    GLMS_CHECK((o.mask ? static_cast<int64_t>(o.mask->size()) : o.mask_source_words) == layout.words,
               "forward_selected: a row's token mask needs (vocab + 31) / 32 words");
    uint32_t* row_words = words + masked * layout.words;
    if (o.mask) std::copy(o.mask->begin(), o.mask->end(), row_words);
    else o.mask_source(row_words);
    rows[masked] = static_cast<int32_t>(i);
    ++masked;
  }
  if (masked == 0) return;
  cudaStream_t s = stream.get();
  cuda::copy_to_device_async(token_masks.data(), mask_staging.data(),
                             static_cast<size_t>(layout.words_at + sizeof(uint32_t) * masked * layout.words), s);
  const char* device = static_cast<const char*>(token_masks.data());
  cuda::apply_token_masks(as<float>(logits), config.vocab_size, reinterpret_cast<const int32_t*>(device + layout.rows_at),
                          reinterpret_cast<const uint32_t*>(device + layout.words_at), masked, s);
}

StepLogits CudaGlm5Model::Impl::take_selected_outputs(const std::vector<RowOutput>& outputs, const ForwardBatch& step,
                                                      std::vector<float>* hidden_out) {
  const int64_t rows = static_cast<int64_t>(outputs.size()), vocab = config.vocab_size;
  cudaStream_t s = stream.get();
  apply_token_masks(outputs);  // before anything reads the rows
  StepLogits out;
  out.vocab_size = config.vocab_size;
  out.token.resize(rows);
  out.full_row.assign(rows, -1);
  if (rows > 0) {
    cuda::argmax_rows(as<float>(logits), rows, vocab, as<int32_t>(logits_argmax), s);
    cuda::copy_to_host_async(out.token.data(), logits_argmax.data(), sizeof(int32_t) * rows, s);
  }
  // Rows drawn on the device, or, without sample_on_device, copied back to be drawn here.
  std::vector<int32_t> sample_rows;
  std::vector<cuda::RowSampling> params;
  for (int64_t i = 0; i < rows; ++i)
    if (outputs[i].kind == RowOutput::Kind::kSample) {
      const RowOutput& o = outputs[i];
      GLMS_CHECK(o.temperature > 0.0f, "forward_selected: a sampled row needs a temperature above 0");
      sample_rows.push_back(static_cast<int32_t>(i));
      params.push_back({o.temperature, o.top_k, o.top_p, o.min_p, o.canonical});
    }
  std::vector<int32_t> drawn(sample_rows.size());
  const bool draw_here = options.sample_on_device && !sample_rows.empty();
  if (draw_here) {
    cuda::copy_to_device_async(sample_rows_of.data(), sample_rows.data(), sizeof(int32_t) * sample_rows.size(), s);
    cuda::copy_to_device_async(sample_params.data(), params.data(), sizeof(cuda::RowSampling) * params.size(), s);
    cuda::sample_rows(as<float>(logits), static_cast<int64_t>(sample_rows.size()), vocab, as<int32_t>(sample_rows_of),
                      as<cuda::RowSampling>(sample_params), as<int32_t>(sampled), s, options.sample_blocks_per_row);
    cuda::copy_to_host_async(drawn.data(), sampled.data(), sizeof(int32_t) * drawn.size(), s);
  }
  int32_t full_rows = 0;
  for (int64_t i = 0; i < rows; ++i) {
    const bool wanted = outputs[i].kind == RowOutput::Kind::kLogits ||
                        (outputs[i].kind == RowOutput::Kind::kSample && !options.sample_on_device);
    if (wanted) out.full_row[i] = full_rows++;
  }
  out.full.resize(static_cast<size_t>(full_rows) * vocab);
  for (int64_t i = 0; i < rows; ++i)
    if (out.full_row[i] >= 0)
      cuda::copy_to_host_async(out.full.data() + int64_t{out.full_row[i]} * vocab, as<float>(logits) + i * vocab,
                               sizeof(float) * vocab, s);
  if (hidden_out) {
    hidden_out->resize(static_cast<size_t>(step.num_tokens()) * config.hidden_size);
    cuda::copy_to_host_async(hidden_out->data(), x.data(), hidden_out->size() * sizeof(float), s);
  }
  stream.synchronize();
  timer.collect();
  if (draw_here) {
    for (size_t r = 0; r < sample_rows.size(); ++r) out.token[sample_rows[r]] = drawn[r];
  } else {
#pragma omp parallel for schedule(dynamic) if (sample_rows.size() > 1)
    for (int64_t r = 0; r < static_cast<int64_t>(sample_rows.size()); ++r) {
      const int64_t i = sample_rows[r];
      out.token[i] = ops::sample_row(out.row(i), config.vocab_size, sampling_filter(outputs[i]), outputs[i].canonical);
    }
    // The rows came back only to be drawn from.
    for (int32_t i : sample_rows) out.full_row[i] = -1;
  }
  return out;
}

bool CudaGlm5Model::has_mtp() const {
  const Impl& m = *impl_;
  return m.options.mtp && !m.weights.mtp.empty() && m.weights.mtp[0].block.attention.has_indexer;
}

std::vector<float> CudaGlm5Model::mtp_forward(const ForwardBatch& batch, const float* h_prev, std::vector<float>* h_out) {
  impl_->run_mtp(batch, h_prev);
  return impl_->take_outputs(batch, h_out);
}

StepLogits CudaGlm5Model::mtp_forward_selected(const ForwardBatch& batch, const float* h_prev,
                                               const std::vector<RowOutput>& outputs, std::vector<float>* h_out) {
  GLMS_CHECK(outputs.size() == batch.logits_tokens.size(), "mtp_forward_selected: one output per logits row");
  impl_->run_mtp(batch, h_prev);
  return impl_->take_selected_outputs(outputs, batch, h_out);
}

void CudaGlm5Model::Impl::run_mtp(const ForwardBatch& step, const float* h_prev_host) {
  if (weights.mtp.empty()) fail("this model has no MTP layer on the device");
  if (!options.mtp) fail("the MTP layer's cache was not allocated (CudaModelOptions::mtp)");
  // Without its own indexer the layer would attend over another step's token selection.
  if (!weights.mtp[0].block.attention.has_indexer)
    fail("the MTP layer has no indexer weights: it cannot select its own top-k");
  const StepShape shape = prepare(step, false);
  struct Reset {
    const ForwardBatch*& current;
    ~Reset() { current = nullptr; }
  } reset{batch};
  const int64_t bytes = sizeof(float) * int64_t{step.num_tokens()} * config.hidden_size;
  cuda::copy_to_device_async(h_prev.data(), h_prev_host, static_cast<size_t>(bytes), stream.get());
  mtp_step(shape);
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
  const io::ModelConfig& c = impl_->config;
  for (size_t l = 0; l < impl_->latent_cache.size(); ++l) {
    DeviceBuffer& keys = impl_->index_keys[l];
    cuda::fill_cache_random(impl_->latent_cache[l].data(), keys.bytes() > 0 ? keys.data() : nullptr,
                            impl_->key_scales(static_cast<int>(l)), impl_->num_slots, c.kv_lora_rank,
                            c.qk_rope_head_dim, c.index_head_dim, impl_->cache_storage(), seed + 2 * l,
                            impl_->stream.get());
  }
  impl_->stream.synchronize();
}

}  // namespace glms::model
