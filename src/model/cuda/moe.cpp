// CudaGlm5Model's MoE block: routing (fp32 scores, sigmoid + correction bias, group-limited
// top-k), the shared expert (on a second stream at small batches), this rank's routed experts
// and the weighted combine. On one rank the combine adds straight into the residual stream. A
// shard (model/shard.h) routes its own tokens, gathers every data-parallel rank's routing and
// bf16 rows, runs its experts over all of them, reduce-scatters the sums back, adds its
// shared-expert slice and all-reduces over its tensor-parallel peers; routing stays per token in
// fp32, so a sharded step chooses the experts one rank would (up to the order of the scores' fp32
// sums, which the GEMM's shape and path set).
#include "model/cuda/model_impl.h"

namespace glms::model {

void CudaGlm5Model::Impl::moe_shared_expert(const MoeDevice& m, int T, bool on_side_stream, bool into_residual,
                                            bool x_quantised) {
  GLMS_CHECK(!(on_side_stream && x_quantised), "the shared expert reads FP8 rows on the main stream only");
  if (!on_side_stream) {
    dense_mlp(m.shared, as<uint16_t>(normed_bf16), T, as<float>(into_residual ? x : shared_out), gemm, stream.get(),
              into_residual, x_quantised);
    timer.mark("moe.shared", stream.get());
    return;
  }
  shared_fork.record(stream.get());
  shared_fork.make_wait(side_stream.get());
  dense_mlp(m.shared, as<uint16_t>(normed_bf16), T, as<float>(shared_out), side_gemm, side_stream.get());
  shared_join.record(side_stream.get());
}

static_assert(cuda::kRouterProductPlanes == kCudaRouterPlanes, "router_logits holds router_product's planes");

CudaGlm5Model::Impl::RouterPath CudaGlm5Model::Impl::router_path(const MoeDevice& m, int T) const {
  if (m.router_bf16.data() == nullptr) return RouterPath::kFp32;
  const int64_t E = config.n_routed_experts;
  // Steps of options.router_terms_min_tokens or more score it on the bf16 tensor cores (model.h
  // says why). Terms 1 and 2 borrow pair_x, which the experts fill only after routing (term 0 is
  // normed_bf16).
  const bool terms_fit = sizeof(uint16_t) * 2 * T * config.hidden_size <= pair_x.bytes();
  if (T >= options.router_terms_min_tokens && terms_fit) return RouterPath::kTerms;
  // Shorter steps from options.router_product_min_tokens on score it in router_product's planes.
  const bool planes_fit = sizeof(float) * cuda::kRouterProductPlanes * T * E <= router_logits.bytes();
  if (T >= options.router_product_min_tokens && cuda::router_product_fits(E, config.hidden_size) && planes_fit)
    return RouterPath::kProduct;
  // Steps below that, within the small-batch GEMV's tokens, read the bf16 weights in fp32
  // products: half the bytes of the fp32 copy's.
  if (T <= std::min(options.small_batch_gemv_tokens, cuda::kGemvMaxTokens) &&
      cuda::gemv_f32_bf16_fits(as<float>(normed_f32), T, config.hidden_size, as<uint16_t>(m.router_bf16),
                               config.hidden_size))
    return RouterPath::kGemv;
  return RouterPath::kFp32;
}

void CudaGlm5Model::Impl::moe_route(const MoeDevice& m, int T, int rows) {
  const io::ModelConfig& c = config;
  cudaStream_t s = stream.get();
  int logit_planes = 1;
  switch (router_path(m, T)) {
    case RouterPath::kTerms:
      gemm.linear_f32_terms(as<uint16_t>(normed_bf16), as<uint16_t>(pair_x), T, as<uint16_t>(m.router_bf16),
                            c.n_routed_experts, c.hidden_size, as<float>(router_logits), s);
      break;
    case RouterPath::kProduct:
      cuda::router_product(as<float>(normed_f32), T, as<uint16_t>(m.router_bf16), c.n_routed_experts, c.hidden_size,
                           as<float>(router_logits), s);
      logit_planes = cuda::kRouterProductPlanes;
      break;
    case RouterPath::kGemv:
      cuda::gemv_f32_bf16(as<float>(normed_f32), T, c.hidden_size, as<uint16_t>(m.router_bf16), c.n_routed_experts,
                          c.hidden_size, as<float>(router_logits), c.n_routed_experts, s);
      break;
    case RouterPath::kFp32:
      gemm.linear_f32(as<float>(normed_f32), T, as<float>(m.router), c.n_routed_experts, c.hidden_size,
                      as<float>(router_logits), s);
      break;
  }
  cuda::MoeRouting routing;
  routing.num_experts = c.n_routed_experts;
  routing.top_k = c.num_experts_per_tok;
  routing.n_group = c.n_group;
  routing.topk_group = c.topk_group;
  routing.norm_topk_prob = c.norm_topk_prob;
  routing.routed_scaling_factor = c.routed_scaling_factor;
  routing.logit_planes = logit_planes;
  cuda::moe_route(as<float>(router_logits), as<float>(m.correction_bias), T, routing, as<int32_t>(expert_ids),
                  as<float>(expert_weights), s, rows, peers.dp ? meta_i32(meta.routed_tokens) : nullptr);
}

// The W8A8 expert GEMMs' E4M3 rows and scales, in buffers that path leaves unused: the tokens'
// in pair_x ([P, hidden] bf16), act's in pair_gate_up ([P, 2 inter] fp32).
std::optional<cuda::MoeFp8Staging> CudaGlm5Model::Impl::fp8_expert_staging(int64_t tokens, int64_t pairs,
                                                                            int64_t inter) {
  const int64_t hidden = config.hidden_size;
  const int64_t nt = cuda::fp8_padded_tokens(tokens), np = cuda::fp8_padded_tokens(pairs);
  const int64_t token_codes = (nt * hidden + 15) / 16 * 16, act_codes = (np * inter + 15) / 16 * 16;
  if (static_cast<size_t>(token_codes) + sizeof(float) * nt * hidden / 128 > pair_x.bytes() ||
      static_cast<size_t>(act_codes) + sizeof(float) * np * inter / 128 > pair_gate_up.bytes())
    return std::nullopt;
  cuda::MoeFp8Staging staging;
  staging.token_codes = as<uint8_t>(pair_x);
  staging.token_scales = reinterpret_cast<float*>(as<uint8_t>(pair_x) + token_codes);
  staging.act_codes = as<uint8_t>(pair_gate_up);
  staging.act_scales = reinterpret_cast<float*>(as<uint8_t>(pair_gate_up) + act_codes);
  staging.persistent.unit_counters = expert_unit_counters.as<int>();
  return staging;
}

bool CudaGlm5Model::Impl::stage_fp8_expert_tokens(const MoeDevice& m, int T) {
  if (m.experts_format != ops::WeightFormat::Fp8Block || !options.wgmma_fp8_experts) return false;
  const std::optional<cuda::MoeFp8Staging> staging = fp8_expert_staging(T, 0, m.expert_inter);
  if (!staging) return false;
  const int64_t rows = cuda::fp8_padded_tokens(T), hidden = config.hidden_size;
  cudaStream_t s = stream.get();
  cuda::copy_device_async(staging->token_codes, fp8_codes.data(), static_cast<size_t>(rows * hidden), s);
  cuda::copy_device_async(staging->token_scales, fp8_scales.data(), sizeof(float) * rows * hidden / 128, s);
  return true;
}

// Per-expert GEMMs over the grouped rows (the paths above cover none of this step's shape): the
// group offsets come back to the host first. Returns false where the pairs outnumber the pair
// buffers.
bool CudaGlm5Model::Impl::moe_experts_per_expert_gemms(const MoeDevice& m, const uint16_t* x, const cuda::MoePlan& plan,
                                                       const cuda::ExpertWeights& experts) {
  const int K = config.num_experts_per_tok, E = m.num_experts;
  const int64_t hidden = config.hidden_size, inter = m.expert_inter;
  cudaStream_t s = stream.get();
  // Quantised experts are widened to bf16 one at a time (same stream: the next widening waits
  // for this expert's GEMMs).
  cuda::copy_to_host_async(offsets_host.data(), plan.offsets, sizeof(int32_t) * (E + 1), s);
  stream.synchronize();
  const auto* offsets = static_cast<const int32_t*>(offsets_host.data());
  const int64_t local_pairs = offsets[E];
  if (local_pairs > pair_capacity) return false;
  cuda::gather_rows(x, hidden, plan.sorted_pairs, local_pairs, K, as<uint16_t>(pair_x), s);
  if (options.grouped_expert_gemm && m.experts_format == ops::WeightFormat::Plain) {
    // All active experts' gate/up in one grouped GEMM, SwiGLU over every grouped row at once
    // (each expert's rows are contiguous), then all downs.
    std::vector<cuda::GroupedProduct> gate_up, down;
    for (int e = 0; e < E; ++e) {
      const int count = offsets[e + 1] - offsets[e];
      if (count == 0) continue;
      gate_up.push_back({as<uint16_t>(pair_x) + int64_t{offsets[e]} * hidden, count,
                         as<uint16_t>(m.experts_gate_up) + int64_t{e} * 2 * inter * hidden,
                         as<float>(pair_gate_up) + int64_t{offsets[e]} * 2 * inter});
      down.push_back({as<uint16_t>(pair_act) + int64_t{offsets[e]} * inter, count,
                      as<uint16_t>(m.experts_down) + int64_t{e} * hidden * inter,
                      as<float>(expert_out) + int64_t{offsets[e]} * hidden});
    }
    if (!gate_up.empty()) {
      gemm.linear_grouped(gate_up.data(), static_cast<int>(gate_up.size()), 2 * inter, hidden, s);
      cuda::silu_mul_to_bf16(as<float>(pair_gate_up), local_pairs, inter, as<uint16_t>(pair_act), s);
      gemm.linear_grouped(down.data(), static_cast<int>(down.size()), hidden, inter, s);
    }
  } else {
    for (int e = 0; e < E; ++e) {
      const int count = offsets[e + 1] - offsets[e];
      if (count == 0) continue;
      const uint16_t* gate_up = as<uint16_t>(m.experts_gate_up) + int64_t{e} * 2 * inter * hidden;
      const uint16_t* down = as<uint16_t>(m.experts_down) + int64_t{e} * hidden * inter;
      if (m.experts_format != ops::WeightFormat::Plain) {
        cuda::dequantize_experts(experts, e, 1, hidden, inter, as<uint16_t>(expert_gate_up_bf16),
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
  return true;
}

cuda::ExpertWeights CudaGlm5Model::Impl::routed_experts(const MoeDevice& m) {
  cuda::ExpertWeights experts;
  experts.format = m.experts_format;
  experts.gate_up = m.experts_gate_up.data();
  experts.gate_up_scales = m.experts_gate_up_scales.data();
  experts.down = m.experts_down.data();
  experts.down_scales = m.experts_down_scales.data();
  experts.mxfp4_tiled = m.experts_mxfp4_tiled;
  return experts;
}

bool CudaGlm5Model::Impl::moe_without_host_sync(int64_t moe_tokens) const {
  const int64_t pairs = moe_tokens * config.num_experts_per_tok;
  for (const DecoderLayerDevice& layer : weights.layers) {
    if (!layer.is_moe) continue;
    const int64_t per_expert = small_moe_pairs_per_expert(routed_experts(layer.moe), config.hidden_size,
                                                          layer.moe.expert_inter);
    if (pairs > per_expert * config.n_routed_experts || pairs > pair_capacity) return false;
  }
  return true;
}

int64_t CudaGlm5Model::Impl::local_pair_count(const cuda::MoePlan& plan, int num_experts) {
  cuda::copy_to_host_async(offsets_host.data(), plan.offsets + num_experts, sizeof(int32_t), stream.get());
  stream.synchronize();
  return *static_cast<const int32_t*>(offsets_host.data());
}

bool CudaGlm5Model::Impl::moe_experts(const MoeDevice& m, const uint16_t* x, const int32_t* ids, const float* weights,
                                      int rows, int routed_rows, const StepShape& shape, cuda::ExpertSums out,
                                      bool accumulate, const float* shared, const cuda::Event* shared_ready,
                                      bool tokens_staged) {
  const int K = config.num_experts_per_tok, E = m.num_experts;
  const int64_t hidden = config.hidden_size, inter = m.expert_inter, P = int64_t{rows} * K;
  cudaStream_t s = stream.get();
  cuda::MoePlan plan;
  plan.counts = as<int32_t>(plan_counts);
  plan.offsets = as<int32_t>(plan_offsets);
  plan.active_experts = as<int32_t>(plan_active);
  plan.num_active = as<int32_t>(plan_num_active);
  plan.sorted_pairs = as<int32_t>(sorted_pairs);
  plan.pair_slot = as<int32_t>(pair_slot);
  GLMS_CHECK(P <= plan_capacity, "MoE pairs beyond the plan's buffers");
  cuda::moe_plan(ids, P, E, plan, s, m.first_expert);
  timer.mark("moe.routing", s);

  const cuda::ExpertWeights experts = routed_experts(m);
  ExpertStep step;
  step.pairs = P;
  // This rank's grouped pairs at most (the grouped kernels' bound): P where the pair buffers hold
  // them all; a larger gathered step (a prefill over data-parallel ranks) counts its own on the host.
  step.local_pairs = P <= pair_capacity || !shape.host_sync_ok ? P : local_pair_count(plan, E);
  // Counted over the model's experts (each rank's share of pairs is about its share of experts).
  step.pairs_per_expert = (int64_t{routed_rows} * K + config.n_routed_experts - 1) / config.n_routed_experts;
  step.host_sync_ok = shape.host_sync_ok;
  std::optional<cuda::MoeFp8Staging> fp8_staging;
  if (m.experts_format == ops::WeightFormat::Fp8Block) fp8_staging = fp8_expert_staging(rows, step.local_pairs, inter);
  // The staged rows are the step's T tokens, which the W8A8 GEMMs count as bound / top_k.
  if (fp8_staging) fp8_staging->tokens_quantised = tokens_staged && step.local_pairs == P;
  step.fp8_staged = fp8_staging.has_value();
  step.widening_fits = sizeof(uint16_t) * E * 2 * inter * hidden <= pair_gate_up.bytes();  // moe_experts_widened's
  const int64_t bound = step.local_pairs;
  auto* const act = as<uint16_t>(pair_act);
  const ExpertPath path = choose_expert_path(options, config.n_routed_experts, experts, hidden, inter, pair_capacity, step);
  // The grouped GEMMs write their sums in bf16 where the options ask (expert_out holds either);
  // the other paths in fp32.
  const bool grouped = path == ExpertPath::kWidened || path == ExpertPath::kRegisterWidened ||
                       path == ExpertPath::kSpecialized || path == ExpertPath::kGrouped || path == ExpertPath::kW8a8;
  const cuda::ExpertSums sums = options.bf16_expert_sums && grouped ? cuda::ExpertSums(as<uint16_t>(expert_out))
                                                                    : cuda::ExpertSums(as<float>(expert_out));
  switch (path) {
    case ExpertPath::kStreamed: {
      const int64_t per_expert = step.pairs_per_expert;
      const int chunk = static_cast<int>(std::max<int64_t>(1, per_expert * options.stream_experts_chunk_factor));
      const auto stream_shape = options.stream_experts_shape >= 0
                                    ? static_cast<cuda::MoeStreamShape>(options.stream_experts_shape)
                                : per_expert <= 8 ? cuda::MoeStreamShape::kFrags2Stages6
                                                  : cuda::MoeStreamShape::kWgmmaPairsStages3Warps8;
      // Staged rows in pair_x ([bound, hidden] 2-byte values; inter <= hidden fits too).
      GLMS_CHECK(inter <= hidden, "streamed experts stage their rows in pair_x");
      cuda::moe_experts_stream(x, hidden, inter, experts, plan, E, K, bound, chunk,
                               static_cast<int>(std::min<int64_t>(E, bound)),
                               {as<uint32_t>(pair_x), as<float>(pair_scale)}, act, sums.f32, s, stream_shape);
      break;
    }
    case ExpertPath::kWidened:
      cuda::moe_experts_widened(x, hidden, inter, experts, plan, E, K, bound, as<uint16_t>(pair_gate_up), act, sums,
                                s, specialized_tiles(options.paired_widened_experts),
                                {expert_unit_counters.as<int>()});
      break;
    case ExpertPath::kRegisterWidened:
      cuda::moe_experts_wgmma_rs(x, hidden, inter, experts, plan, E, K, bound, as<uint32_t>(pair_x), act, sums, s);
      break;
    case ExpertPath::kSpecialized:
      cuda::moe_experts_specialized(
          x, hidden, inter, experts, plan, E, K, bound, act, sums, s,
          specialized_tiles(options.paired_bf16_experts, m.experts_format != ops::WeightFormat::Plain),
          {expert_unit_counters.as<int>()});
      break;
    case ExpertPath::kGrouped:
      cuda::moe_experts_wgmma(x, hidden, inter, experts, plan, E, K, bound, act, sums, s,
                              options.wgmma_experts_tile_rows);
      break;
    case ExpertPath::kW8a8:
      cuda::moe_experts_wgmma_fp8(x, hidden, inter, experts, plan, E, K, bound, *fp8_staging, act, sums, s,
                                  fp8_expert_gemm());
      break;
    case ExpertPath::kSmall: {
      // The expert kernels size their chunks by the pairs an expert gets on average: this rank's
      // share of the real tokens' pairs, as that many tokens over its experts would give.
      const int chunk_tokens = static_cast<int>(std::max<int64_t>(
          1, (int64_t{routed_rows} * E + config.n_routed_experts - 1) / config.n_routed_experts));
      GLMS_CHECK(P <= pair_capacity, "MoE pairs beyond the pair buffers");
      cuda::moe_experts_small(x, hidden, inter, experts, plan, E, K, chunk_tokens,
                              static_cast<int>(std::min<int64_t>(E, P)), act, sums.f32, s);
      break;
    }
    case ExpertPath::kPerExpertGemms:
      if (!moe_experts_per_expert_gemms(m, x, plan, experts)) return false;
      break;
  }
  timer.mark("moe.experts", s);
  if (shared_ready) shared_ready->make_wait(s);
  cuda::moe_combine(out, accumulate, shared, sums, plan.pair_slot, ids, weights, rows, K, hidden, s);
  timer.mark("moe.combine", s);
  return true;
}

void CudaGlm5Model::Impl::sum_over_tp(float* block_output, int T) {
  if (peers.tp)
    peers.tp->all_reduce_sum(block_output, static_cast<size_t>(T) * config.hidden_size, comm::Element::F32,
                             stream.get());
}

CudaGlm5Model::Impl::PendingOutput CudaGlm5Model::Impl::moe(const DecoderLayerDevice& layer, const StepShape& shape,
                                                             bool normed_quantised) {
  const io::ModelConfig& c = config;
  const MoeDevice& m = layer.moe;
  const int T = shape.num_tokens, K = c.num_experts_per_tok;
  const int64_t hidden = c.hidden_size;
  cudaStream_t s = stream.get();
  // (FP8 GEMMs run on the main stream only: their activation buffer and cuBLASLt handle are one.)
  const bool overlap_shared = T <= options.overlap_shared_expert_tokens && !timer.enabled &&
                              (T <= cuda::kFp8GemvMaxTokens || (!m.shared.gate_up.fp8() && !m.shared.down.fp8()));
  const cuda::Event* shared_ready = overlap_shared ? &shared_join : nullptr;  // the side stream's join
  // The whole model's shared expert of a long step may add itself into the residual stream.
  const bool shared_into_residual = !overlap_shared && !peers.dp && adds_into_residual(m.shared.down, T);
  if (overlap_shared) moe_shared_expert(m, T, true);
  // A data-parallel step routes this rank's own tokens and pads its rows to every rank's count
  // (an idle rank's dummy token routes nowhere).
  const bool gathered = peers.dp != nullptr;
  GLMS_CHECK(!gathered || (shape.moe_rows >= T && shape.moe_rows <= options.max_tokens), "MoE gather rows out of range");
  moe_route(m, T, gathered ? shape.moe_rows : T);
  // The norm's E4M3 rows serve this rank's own rows' routed experts too (the router has read the
  // terms that shared their staging); a data-parallel step's experts take every rank's rows.
  const bool tokens_staged = normed_quantised && !gathered && stage_fp8_expert_tokens(m, T);
  if (!overlap_shared) {
    timer.mark("moe.routing", s);
    moe_shared_expert(m, T, false, shared_into_residual, normed_quantised);
  }

  if (!peers.tp && !peers.dp) {  // the whole model: combine into the residual stream
    moe_experts(m, as<uint16_t>(normed_bf16), as<int32_t>(expert_ids), as<float>(expert_weights), T, T, shape,
                as<float>(x), true, shared_into_residual ? nullptr : as<float>(shared_out), shared_ready,
                tokens_staged);
    return {};
  }
  if (!peers.dp) {
    moe_experts(m, as<uint16_t>(normed_bf16), as<int32_t>(expert_ids), as<float>(expert_weights), T, T, shape,
                as<float>(block_out), false, as<float>(shared_out), shared_ready, tokens_staged);
    sum_over_tp(as<float>(block_out), T);
    return {as<float>(block_out), nullptr};
  }

  // Every data-parallel rank's moe_rows rows: its tokens, then padding that routes nowhere.
  comm::Communicator& dp = *peers.dp;
  const int rows = shape.moe_rows, ranks = dp.size();
  dp.begin_group();  // one launch for the three
  dp.all_gather(expert_ids.data(), gathered_ids.data(), static_cast<size_t>(rows) * K, comm::Element::I32, s);
  dp.all_gather(expert_weights.data(), gathered_weights.data(), static_cast<size_t>(rows) * K, comm::Element::F32, s);
  dp.all_gather(normed_bf16.data(), gathered_x.data(), static_cast<size_t>(rows) * hidden, comm::Element::BF16, s);
  dp.end_group();
  timer.mark("moe.gather", s);
  // All ranks' rows at once, so that each active expert's weights are read once for the whole
  // step; where a large step's pairs on this rank outnumber the pair buffers, a source rank's
  // rows at a time. The partial rows, [total, hidden] in routed_all: fp32, or bf16 in its first
  // half, the reduce-scatter's bf16 rows of this rank coming into the second.
  const int total = rows * ranks;
  const bool bf16_partials = options.bf16_moe_reduce_scatter;
  auto partial_rows = [&](int64_t first_row) {
    return bf16_partials ? cuda::ExpertSums(as<uint16_t>(routed_all) + first_row * hidden)
                         : cuda::ExpertSums(as<float>(routed_all) + first_row * hidden);
  };
  int routed_total = 0;
  for (int32_t n : step_dp_tokens) routed_total += n;
  if (!moe_experts(m, as<uint16_t>(gathered_x), as<int32_t>(gathered_ids), as<float>(gathered_weights), total,
                   routed_total, shape, partial_rows(0), false, nullptr, nullptr)) {
    for (int r = 0; r < ranks; ++r)
      GLMS_CHECK(moe_experts(m, as<uint16_t>(gathered_x) + int64_t{r} * rows * hidden,
                             as<int32_t>(gathered_ids) + int64_t{r} * rows * K,
                             as<float>(gathered_weights) + int64_t{r} * rows * K, rows, step_dp_tokens[r], shape,
                             partial_rows(int64_t{r} * rows), false, nullptr, nullptr),
                 "a rank's MoE rows beyond the pair buffers");
  }
  const size_t local_values = static_cast<size_t>(rows) * hidden;
  uint16_t* summed_bf16 = nullptr;
  if (bf16_partials) {
    GLMS_CHECK(sizeof(uint16_t) * (int64_t{total} + rows) * hidden <= routed_all.bytes(),
               "bf16 MoE partial rows beyond routed_all");
    summed_bf16 = as<uint16_t>(routed_all) + int64_t{total} * hidden;
    dp.reduce_scatter_sum(routed_all.data(), summed_bf16, local_values, comm::Element::BF16, s);
  } else {
    dp.reduce_scatter_sum(routed_all.data(), routed_local.data(), local_values, comm::Element::F32, s);
  }
  if (shared_ready) shared_ready->make_wait(s);
  if (!peers.tp) {  // the next norm adds both (one launch fewer), widening bf16 sums as it reads them
    timer.mark("moe.scatter", s);
    if (summed_bf16) return {nullptr, as<float>(shared_out), summed_bf16};
    return {as<float>(routed_local), as<float>(shared_out)};
  }
  if (summed_bf16) cuda::widen_bf16(summed_bf16, static_cast<int64_t>(local_values), as<float>(routed_local), s);
  cuda::add_f32(as<float>(routed_local), as<float>(shared_out), as<float>(block_out), int64_t{T} * hidden, s);
  sum_over_tp(as<float>(block_out), T);
  timer.mark("moe.scatter", s);
  return {as<float>(block_out), nullptr};
}

}  // namespace glms::model
