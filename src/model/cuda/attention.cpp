// CudaGlm5Model's attention: the MLA projections, the DSA indexer's selection and the
// attention over the paged latent cache (decode runs and short chunks; long prefill chunks).
#include "model/cuda/model_impl.h"

namespace glms::model {

const float* CudaGlm5Model::Impl::attention(const DecoderLayerDevice& layer, int l, const StepShape& shape,
                                            bool normed_quantised) {
  const bool bf16_queries = project_attention_inputs(layer, l, shape, normed_quantised);
  // A short step's selection (latency-bound launches, one block a token for its top-k) runs
  // beside the absorption, which reads none of what it writes.
  const bool overlap_indexer = layer.attention.has_indexer && !shape.selects_all &&
                               shape.num_tokens <= options.overlap_indexer_tokens && !timer.enabled;
  if (overlap_indexer) {
    indexer_fork.record(stream.get());
    indexer_fork.make_wait(side_stream.get());
    select_positions(layer, l, shape, side_stream.get(), side_gemm);
    indexer_join.record(side_stream.get());
  } else if (layer.attention.has_indexer) {
    select_positions(layer, l, shape, stream.get(), gemm);
  }
  absorb_queries(layer.attention, shape.num_tokens, bf16_queries);
  if (overlap_indexer) indexer_join.make_wait(stream.get());
  attention_core(l, shape, layer.attention.heads);
  timer.mark("attention.core", stream.get());
  return attention_output(layer.attention, shape.num_tokens);
}

bool CudaGlm5Model::Impl::project_attention_inputs(const DecoderLayerDevice& layer, int l, const StepShape& shape,
                                                   bool normed_quantised) {
  const io::ModelConfig& c = config;
  const AttentionDevice& w = layer.attention;
  const int T = shape.num_tokens, H = w.heads;  // this rank's heads
  const int64_t hidden = c.hidden_size, qd = c.qk_head_dim(), rd = c.qk_rope_head_dim;
  const int64_t L = c.kv_lora_rank, q_lora = c.q_lora_rank;
  cudaStream_t s = stream.get();
  const int32_t* positions = meta_i32(meta.positions);
  const int64_t* slots = meta_slots();
  const uint16_t* normed = as<uint16_t>(normed_bf16);

  // The projections of the normed rows (q_a, kv_a and the indexer's wk and head weights), then
  // those of the normed q residual (q_b, the indexer's wq_b): one grouped launch each at decode
  // sizes. When every token's context fits index_topk the top-k is every position: the indexer's
  // query side is skipped, its keys are still cached for later steps.
  const IndexerDevice& ix = w.indexer;
  const int IH = c.index_n_heads, ID = c.index_head_dim;
  const bool score_positions = w.has_indexer && !shape.selects_all;
  // FP8 q_a / kv_a / q_b go through linear() on their own; the bf16 ones share the group launch.
  const int x_outputs = w.has_indexer ? (score_positions ? 4 : 3) : 2;
  cuda::GemvOutput from_x[4] = {{as<uint16_t>(w.q_a_proj.w), q_lora, as<float>(q_resid)},
                                {as<uint16_t>(w.kv_a_proj.w), L + rd, as<float>(kv)},
                                {as<uint16_t>(ix.wk), ID, as<float>(index_k)},
                                {as<uint16_t>(ix.weights_proj), IH, as<float>(index_w)}};
  if (w.q_a_proj.fp8() || w.kv_a_proj.fp8()) {
    linear(w.q_a_proj, normed, T, as<float>(q_resid), gemm, s, normed_quantised);
    // fp8_codes hold the same rows for kv_a: the norm's or those q_a's GEMM quantised.
    const bool quantised = w.q_a_proj.fp8() && T > cuda::kFp8GemvMaxTokens;
    linear(w.kv_a_proj, normed, T, as<float>(kv), gemm, s, quantised);
    gemm.linear_group(normed, T, hidden, from_x + 2, x_outputs - 2, s);
  } else {
    gemm.linear_group(normed, T, hidden, from_x, x_outputs, s);
  }
  // q_b's FP8 GEMM reads the q_a norm's E4M3 rows (written where it takes them).
  const cuda::Fp8Rows q_b_input = fused_projection_rows(T) ? cuda::Fp8Rows{} : fp8_input_rows(w.q_b_proj, T);
  if (fused_projection_rows(T))
    write_projection_rows(layer, l, T);
  else
    cuda::residual_rms_norm(as<float>(q_resid), nullptr, T, q_lora, as<float>(w.q_a_norm), kLatentNormEps, nullptr,
                            as<uint16_t>(q_resid_bf16), s, nullptr, nullptr, nullptr, q_b_input);
  const bool q_in_quantised = q_b_input.codes != nullptr;
  cuda::GemvOutput from_q[2] = {{as<uint16_t>(w.q_b_proj.w), H * qd, as<float>(q)},
                                {as<uint16_t>(ix.wq_b), int64_t{IH} * ID, as<float>(index_q)}};
  // Long chunks: q straight in bf16, as the absorption GEMM reads it (the fp32 rows were only
  // converted; 8192 tokens at GLM-5.2 width: 0.5 GB written and read again).
  const uint16_t* q_in = as<uint16_t>(q_resid_bf16);
  const bool bf16_queries =
      bf16_intermediates(T) && linear_to_bf16(w.q_b_proj, q_in, T, as<uint16_t>(q_bf16), gemm, s, q_in_quantised);
  if (bf16_queries || w.q_b_proj.fp8()) {
    if (!bf16_queries) linear(w.q_b_proj, q_in, T, as<float>(q), gemm, s, q_in_quantised);
    if (score_positions) gemm.linear_group(q_in, T, q_lora, from_q + 1, 1, s);
  } else {
    gemm.linear_group(q_in, T, q_lora, from_q, score_positions ? 2 : 1, s);
  }
  if (!fused_projection_rows(T))
    cuda::write_latent_cache(as<float>(kv), T, static_cast<int>(L), static_cast<int>(rd), as<float>(w.kv_a_norm),
                             kLatentNormEps, positions, slots, as<float>(inv_freq), latent_cache[l].data(),
                             cache_storage(), s);
  timer.mark("attention.projections", s);
  return bf16_queries;
}

// q_a's norm into bf16, the latent cache row and the indexer key in one launch
// (CudaModelOptions::fused_projection_rows_max_tokens): what residual_rms_norm, write_latent_cache and
// write_indexer_keys write apart.
void CudaGlm5Model::Impl::write_projection_rows(const DecoderLayerDevice& layer, int l, int T) {
  const io::ModelConfig& c = config;
  const AttentionDevice& w = layer.attention;
  cuda::ProjectionRows rows;
  rows.q = as<float>(q_resid);
  rows.q_dim = static_cast<int>(c.q_lora_rank);
  rows.q_norm_weight = as<float>(w.q_a_norm);
  rows.q_eps = kLatentNormEps;
  rows.q_bf16 = as<uint16_t>(q_resid_bf16);
  rows.kv = as<float>(kv);
  rows.latent_dim = static_cast<int>(c.kv_lora_rank);
  rows.rope_dim = static_cast<int>(c.qk_rope_head_dim);
  rows.kv_norm_weight = as<float>(w.kv_a_norm);
  rows.kv_eps = kLatentNormEps;
  rows.cache = latent_cache[l].data();
  rows.storage = cache_storage();
  if (w.has_indexer) {
    rows.keys = as<float>(index_k);
    rows.key_dim = c.index_head_dim;
    rows.key_ln_weight = as<float>(w.indexer.k_norm_weight);
    rows.key_ln_bias = as<float>(w.indexer.k_norm_bias);
    rows.key_eps = kIndexerNormEps;
    rows.key_cache = index_keys[l].data();
    rows.key_scales = key_scales(l);
  }
  rows.positions = meta_i32(meta.positions);
  rows.slot_mapping = meta_slots();
  rows.inv_freq = as<float>(inv_freq);
  cuda::write_projection_rows(rows, T, stream.get());
}

void CudaGlm5Model::Impl::select_positions(const DecoderLayerDevice& layer, int l, const StepShape& shape,
                                           cudaStream_t s, cuda::Gemm& g) {
  const io::ModelConfig& c = config;
  const IndexerDevice& ix = layer.attention.indexer;
  const int T = shape.num_tokens;
  const int32_t* positions = meta_i32(meta.positions);
  const int64_t* slots = meta_slots();
  if (!fused_projection_rows(T))  // else written with the projections' rows
    cuda::write_indexer_keys(as<float>(index_k), T, c.index_head_dim, c.qk_rope_head_dim, as<float>(ix.k_norm_weight),
                             as<float>(ix.k_norm_bias), kIndexerNormEps, positions, slots, as<float>(inv_freq),
                             index_keys[l].data(), key_scales(l), s);
  if (!shape.selects_all) score_indexer_keys(l, shape, s, g);
  // Scores are not read for tokens whose context is at most top_k: every position is selected,
  // the same in each layer (written once a step with reuse_step_selection).
  if (!(shape.selects_all && options.reuse_step_selection && step_selects_all_written)) {
    cuda::select_top_k(as<float>(scores), options.max_context, positions, T, c.index_topk, as<int32_t>(selected),
                       c.index_topk, as<int32_t>(num_selected), s, options.indexer_topk_blocks);
    step_selects_all_written = shape.selects_all;
  }
  timer.mark("attention.indexer", s);
}

// Absorb W_uk into the queries, per head, and stage them for the attention passes:
// queries[t, h] = scale * [q_nope[t, h] . W_uk[h] ([nope, L]), rope(q_rope[t, h])] in bf16.
// One pass writes the nope columns in bf16 for the product and the rotated rope columns
// staged; the product writes the latent columns in bf16 at once (prefill 8192 at GLM-5.2
// width: 1 GB of fp32 rows a layer and a staging pass over them, otherwise).
void CudaGlm5Model::Impl::absorb_queries(const AttentionDevice& w, int T, bool bf16_queries) {
  const io::ModelConfig& c = config;
  const int H = w.heads;
  const int64_t qd = c.qk_head_dim(), nope = c.qk_nope_head_dim, rd = c.qk_rope_head_dim;
  const int64_t L = c.kv_lora_rank, vd = c.v_head_dim;
  cudaStream_t s = stream.get();
  const int32_t* positions = meta_i32(meta.positions);
  const int64_t head_stride = (nope + vd) * L;  // kv_b_proj rows of one head: W_uk then W_uv
  const int64_t width = cuda_mla_padded_row(L, rd);  // of a staged query
  const auto scale = static_cast<float>(c.attention_scale());
  uint16_t* queries = as<uint16_t>(staged_queries);
  if (bf16_queries)
    cuda::mla_prepare_queries(as<uint16_t>(q_bf16), T, H, qd, nope, static_cast<int>(rd), positions,
                              as<float>(inv_freq), static_cast<int>(L), scale, queries, s);
  else
    cuda::mla_prepare_queries(as<float>(q), T, H, qd, nope, static_cast<int>(rd), positions, as<float>(inv_freq),
                              static_cast<int>(L), scale, as<uint16_t>(q_bf16), queries, s);
  gemm.batched_to_bf16(as<uint16_t>(q_bf16), T, H * qd, qd, as<uint16_t>(w.kv_b_proj), nope, L, L, head_stride, true,
                       queries, H * width, width, H, s, scale);
  timer.mark("attention.absorb", s);
}

// Un-absorb W_uv per head from the bf16 attention output, the heads written in bf16 at once
// (prefill 8192 at GLM-5.2 width moved 0.8 GB a layer through fp32 rows and their conversion
// otherwise; a decode step saves the conversion's launch), then o_proj.
const float* CudaGlm5Model::Impl::attention_output(const AttentionDevice& w, int T) {
  const io::ModelConfig& c = config;
  const int H = w.heads;
  const int64_t nope = c.qk_nope_head_dim, L = c.kv_lora_rank, vd = c.v_head_dim;
  const int64_t head_stride = (nope + vd) * L;
  cudaStream_t s = stream.get();
  // An FP8 o_proj's GEMM reads the heads as E4M3 rows, which the un-absorption writes itself.
  const cuda::Fp8Rows heads_fp8 =
      cuda::mla_unabsorb_fp8_supported(L, vd) ? fp8_input_rows(w.o_proj, T) : cuda::Fp8Rows{};
  const bool heads_quantised = heads_fp8.codes != nullptr;
  if (heads_quantised)
    cuda::mla_unabsorb_fp8(as<uint16_t>(o_bf16), T, H, as<uint16_t>(w.kv_b_proj) + nope * L, nope + vd, heads_fp8, s);
  else
    gemm.batched_to_bf16(as<uint16_t>(o_bf16), T, H * L, L, as<uint16_t>(w.kv_b_proj) + nope * L, vd, L, L,
                         head_stride, false, as<uint16_t>(heads_bf16), H * vd, vd, H, s);
  if (adds_into_residual(w.o_proj, T)) {
    add_linear(w.o_proj, as<uint16_t>(heads_bf16), T, as<float>(x), gemm, s, heads_quantised);
    timer.mark("attention.output", s);
    return nullptr;
  }
  linear(w.o_proj, as<uint16_t>(heads_bf16), T, as<float>(block_out), gemm, s, heads_quantised);
  sum_over_tp(as<float>(block_out), T);  // the heads of every tensor-parallel peer
  timer.mark("attention.output", s);
  return as<float>(block_out);
}

void CudaGlm5Model::Impl::attention_core(int l, const StepShape& shape, int heads) {
  const io::ModelConfig& c = config;
  const int T = shape.num_tokens, H = heads;
  const int64_t L = c.kv_lora_rank, rd = c.qk_rope_head_dim;
  cudaStream_t s = stream.get();
  const int32_t* block_tables = meta_i32(meta.block_tables);
  const int32_t* token_sequence = meta_i32(meta.token_sequence);
  void* cache = latent_cache[l].data();
  const cuda::CacheStorage storage = cache_storage();
  cuda::MlaAttentionArgs args;
  args.queries = as<uint16_t>(staged_queries);
  args.cache = cache;
  args.storage = storage;
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
  args.out = as<uint16_t>(o_bf16);
  args.warp_specialized = options.warp_specialized_attention;
  args.ring_stages = options.attention_ring_stages;
  args.persistent = options.persistent_attention;
  args.paired_stages = options.paired_attention;
  args.cluster_splits = options.attention_cluster_splits;
  cuda::MlaGatherWorkspace gather;
  gather.gathered = as<uint16_t>(gathered_rows);
  gather.gathered_elements = gathered_capacity;
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
          cuda::mla_attention_fused(args, max_selected_in_step, as<float>(prefill_scores), prefill_score_capacity, s,
                                    options.wgmma_attention, options.wgmma_attention_splits);
        else
          cuda::mla_attention_gathered(args, max_selected_in_step, gather, gemm, s);
      },
      [&](int index) {
        const SequenceSlice& seq = batch->sequences[index];
        if (!options.fused_prefill_attention || !fused_attention() || !fused_prefill_pays(seq, H)) {
          prefill_attention(index, l, H);
          return;
        }
        cuda::MlaAttentionArgs chunk = args;
        chunk.first_token = seq.first_token;
        chunk.launch_tokens = seq.num_tokens;
        if (storage == cuda::CacheStorage::kFp8) {
          // Each row is read by up to top_k of the chunk's tokens: widen the context once into
          // bf16 rows where position j is slot j (the identity block table, one row of it for
          // every token), rather than once per token in the pass.
          cuda::mla_gather_context(cache, storage, block_tables + int64_t{index} * max_blocks, options.block_size,
                                   seq.context_len, static_cast<int>(L), static_cast<int>(rd),
                                   as<uint16_t>(prefill_context), s);
          chunk.cache = prefill_context.data();
          chunk.storage = cuda::CacheStorage::kBf16;
          chunk.block_tables = as<int32_t>(context_table);
          chunk.max_blocks = 0;
        }
        cuda::mla_attention_fused(chunk, std::min(seq.context_len, c.index_topk), as<float>(prefill_scores),
                                  prefill_score_capacity, s, options.wgmma_attention, options.wgmma_attention_splits);
      });
}

void CudaGlm5Model::Impl::score_indexer_keys(int l, const StepShape& shape, cudaStream_t s, cuda::Gemm& g) {
  const io::ModelConfig& c = config;
  const int T = shape.num_tokens, IH = c.index_n_heads, ID = c.index_head_dim;
  const int rd = c.qk_rope_head_dim;
  const int32_t* positions = meta_i32(meta.positions);
  const int32_t* block_tables = meta_i32(meta.block_tables);
  const int32_t* token_sequence = meta_i32(meta.token_sequence);
  // The queries' rope: the decode kernel rotates them as it stages them; every other path's rows
  // are rotated here first, [first, first + count) of them.
  auto rotate_queries = [&](int first, int count) {
    cuda::rope_rows(as<float>(index_q) + int64_t{first} * IH * ID, count, IH, ID, 0, rd, positions + first,
                    as<float>(inv_freq), s);
  };
  cuda::IndexerScoreArgs args;
  args.queries = as<float>(index_q);
  args.head_weights = as<float>(index_w);
  args.key_cache = index_keys[l].data();
  args.key_scales = key_scales(l);
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
  args.threads_per_key = options.indexer_threads_per_key;
  args.decode_one_wave = options.indexer_decode_one_wave;
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
        if (options.wgmma_decode_indexer && cuda::indexer_scores_decode_wgmma_supported(IH, ID)) {
          cuda::IndexerScoreArgs unrotated = args;
          unrotated.rope_inv_freq = as<float>(inv_freq);
          unrotated.rope_dim = rd;
          cuda::indexer_scores_decode_wgmma(unrotated, s);
        } else {
          rotate_queries(first, count);
          cuda::indexer_scores(args, s);
        }
      },
      [&](int index) {
        const SequenceSlice& seq = batch->sequences[index];
        rotate_queries(seq.first_token, seq.num_tokens);
        cuda::IndexerScoreArgs chunk = args;
        chunk.first_token = seq.first_token;
        chunk.launch_tokens = seq.num_tokens;
        if (options.wgmma_indexer && cuda::indexer_scores_wgmma_supported(IH, ID))
          cuda::indexer_scores_wgmma(chunk, block_tables + int64_t{index} * max_blocks, seq.context_len,
                                     workspace, s, options.fp8_prefill_indexer);
        else
          cuda::indexer_scores_gemm(chunk, block_tables + int64_t{index} * max_blocks, seq.context_len,
                                    workspace, g, s);
      });
}

bool CudaGlm5Model::Impl::fused_prefill_pays(const SequenceSlice& seq, int heads) const {
  // The dense path scores every chunk token against (at most) the whole context; the fused pass
  // reads min(position + 1, top_k) rows per token, positions context - n .. context - 1.
  const double n = seq.num_tokens, context = seq.context_len, top_k = config.index_topk;
  const double first = context - n + 1, last = context;  // rows read by the first and last token, uncapped
  double fused_rows = 0;
  if (last <= top_k) {
    fused_rows = (first + last) * n / 2;
  } else if (first > top_k) {
    fused_rows = top_k * n;
  } else {
    fused_rows = (first + top_k) * (top_k - first + 1) / 2 + top_k * (last - top_k);
  }
  // mla_attention_fused takes the wgmma pass (without splits: for chunks of a block per SM or more).
  const bool wgmma = options.wgmma_attention &&
                     (options.wgmma_attention_splits || seq.num_tokens >= cuda::mla_wgmma_min_tokens()) &&
                     cuda::mla_attention_wgmma_supported(heads, config.kv_lora_rank, config.qk_rope_head_dim);
  return n * context > (wgmma ? kFusedPrefillWorkRatioWgmma : kFusedPrefillWorkRatio) * fused_rows;
}

void CudaGlm5Model::Impl::prefill_attention(int sequence, int l, int H) {
  const io::ModelConfig& c = config;
  const SequenceSlice& seq = batch->sequences[sequence];
  const int L = c.kv_lora_rank, rd = c.qk_rope_head_dim, row = L + rd;
  const int64_t width = cuda_mla_padded_row(L, rd);  // of a staged query
  cudaStream_t s = stream.get();
  const uint16_t* context_rows = as<uint16_t>(prefill_context);
  cuda::mla_gather_context(latent_cache[l].data(), cache_storage(),
                           meta_i32(meta.block_tables) + int64_t{sequence} * max_blocks, options.block_size,
                           seq.context_len, L, rd, as<uint16_t>(prefill_context), s);
  for (int done = 0; done < seq.num_tokens;) {
    const int first = seq.first_token + done;
    const int n = static_cast<int>(std::clamp<int64_t>(prefill_score_capacity / (int64_t{H} * seq.context_len), 1,
                                                       seq.num_tokens - done));
    const int context = batch->positions[first + n - 1] + 1;  // the chunk's causal extent
    // scores[h] = queries[first:, h, :row] . context_rows^T   [H, n, context] fp32
    gemm.batched(as<uint16_t>(staged_queries) + first * H * width, n, H * width, width, context_rows, context, row, row,
                 0, false, as<float>(prefill_scores), context, int64_t{n} * context, H, s);
    cuda::memset_async(prefill_probs.data(), 0, sizeof(uint16_t) * H * n * context, s);
    cuda::mla_sparse_softmax(as<float>(prefill_scores), n, H, context, as<int32_t>(selected) + int64_t{first} * c.index_topk,
                             c.index_topk, as<int32_t>(num_selected) + first, as<uint16_t>(prefill_probs), s);
    // o_bf16[first + i, h, :] = probs[h, i, :] . context_rows[:, :latent]
    gemm.batched_to_bf16(as<uint16_t>(prefill_probs), n, context, int64_t{n} * context, context_rows, context, L, row, 0,
                         true, as<uint16_t>(o_bf16) + int64_t{first} * H * L, int64_t{H} * L, L, H, s);
    done += n;
  }
}

}  // namespace glms::model
