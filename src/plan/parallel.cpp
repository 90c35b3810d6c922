#include "plan/parallel.h"

#include <algorithm>
#include <cmath>

#include "model/cuda_memory.h"
#include "plan/roofline.h"

namespace glms::plan {

namespace {

// The part of the "attention" group a tensor-parallel rank splits (q_b, kv_b, o_proj), by
// parameters; q_a and kv_a are whole on every rank.
double split_attention_fraction(const ModelSpec& m) {
  const double whole = static_cast<double>(m.group_bytes("attention", "bf16")) / 2.0;
  if (whole <= 0) return 1.0;
  const double replicated = double(m.layers) * m.hidden * (double(m.q_lora_rank) + m.kv_lora_rank + m.qk_rope_head_dim);
  return std::max(0.0, (whole - replicated) / whole);
}

// Bytes of the non-expert groups one rank holds (MTP excluded).
double rank_shared_bytes(const ModelSpec& m, const std::string& format, const RankShape& r) {
  const double split = split_attention_fraction(m);
  double bytes = 0;
  for (const auto& g : m.inventory.groups) {
    if (g.in_mtp || g.name == "routed_experts") continue;
    double b = static_cast<double>(m.group_bytes(g.name, format));
    if (g.name == "attention") b = b * (1.0 - split) + b * split / r.tp;
    else if (g.name == "dense_mlp" || g.name == "shared_experts") b /= r.tp;
    bytes += b;
  }
  return bytes;
}

}  // namespace

double rank_weight_bytes(const ModelSpec& m, const std::string& format, const RankShape& r) {
  return rank_shared_bytes(m, format, r) + static_cast<double>(m.group_bytes("routed_experts", format)) / r.world();
}

double rank_device_weight_bytes(const ModelSpec& m, const std::string& experts_format, const RankShape& r) {
  // The router in fp32 and again in bf16 (for prefill's tensor-core scores): 4 more bytes a value.
  const double router_copies = 2.0 * static_cast<double>(m.group_bytes("router", "bf16"));
  return rank_shared_bytes(m, "bf16", r) + router_copies +
         static_cast<double>(m.group_bytes("routed_experts", experts_format)) / r.world();
}

double rank_decode_weight_bytes(const ModelSpec& m, const std::string& format, const RankShape& r,
                                double tokens_per_rank) {
  double bytes = rank_shared_bytes(m, format, r);
  if (!m.tie_word_embeddings) bytes -= static_cast<double>(m.group_bytes("embed_tokens", format));  // rows only
  if (m.moe_layers > 0)
    bytes += m.moe_layers *
             expected_distinct_experts(m.n_routed_experts, m.experts_per_token, tokens_per_rank * r.dp) *
             m.expert_bytes(format) / r.world();
  return bytes;
}

double rank_decode_device_weight_bytes(const ModelSpec& m, const std::string& experts_format, const RankShape& r,
                                       double tokens_per_rank) {
  double bytes = rank_decode_weight_bytes(m, "bf16", r, tokens_per_rank);
  if (m.moe_layers > 0)  // the touched experts in their own format instead of bf16
    bytes += m.moe_layers *
             expected_distinct_experts(m.n_routed_experts, m.experts_per_token, tokens_per_rank * r.dp) *
             (m.expert_bytes(experts_format) - m.expert_bytes("bf16")) / r.world();
  return bytes;
}

namespace {

// The MTP layer as one rank holds it: bf16 but its routed experts, which are in
// `experts_format` and spread over the world like a decoder layer's.
double rank_mtp_bytes(const ModelSpec& m, const std::string& experts_format, const RankShape& r) {
  const double whole = static_cast<double>(m.group_bytes("mtp", "bf16"));
  if (whole <= 0) return 0;
  const double experts_bf16 = double(m.n_routed_experts) * m.expert_bytes("bf16");
  return whole - experts_bf16 + double(m.n_routed_experts) * m.expert_bytes(experts_format) / r.world();
}

}  // namespace

ServeMemory serve_memory(const ModelSpec& m, const PlanInputs& in, const GpuSpec& gpu, const RankShape& r,
                         bool expert_parallel) {
  ServeMemory s;
  s.tp = r.tp;
  s.dp = r.dp;
  s.expert_parallel = expert_parallel;
  s.budget = gpu.memory_bytes * (1.0 - in.reserve_fraction);
  if (!m.glm) return s;
  s.known = true;
  const io::ModelConfig& c = *m.glm;
  const bool mtp = in.speculative_steps > 0 && c.num_nextn_predict_layers > 0;
  s.weights = rank_device_weight_bytes(m, in.weights, r) + (mtp ? rank_mtp_bytes(m, in.weights, r) : 0.0);
  model::ModelShard shard;
  shard.tp_size = r.tp;
  shard.dp_size = r.dp;
  shard.expert_parallel = expert_parallel;
  const model::CudaRankWidths widths =
      model::cuda_rank_widths(c, shard, in.weights != "bf16", mtp, false, in.weights == "mxfp4");
  model::CudaStepLimits limits;
  limits.max_tokens = in.max_num_batched_tokens;
  limits.max_sequences = in.max_num_seqs > 0 ? in.max_num_seqs : in.concurrency;
  limits.max_logits = std::min(in.max_num_batched_tokens, limits.max_sequences * (1 + in.speculative_steps));
  limits.max_context = static_cast<int>(std::min<int64_t>(in.context, c.max_position_embeddings));
  limits.block_size = in.block_size;
  limits.mtp = mtp;
  s.workspaces = static_cast<double>(model::cuda_workspace_bytes(c, widths, limits));
  s.runtime = static_cast<double>(model::kCudaRuntimeBytes);
  s.margin = static_cast<double>(model::kCudaMemoryMarginBytes);
  const int64_t per_token = model::cuda_cache_bytes_per_token(
      c, in.kv_dtype == "fp8" ? kv::CacheDtype::kFp8E4m3 : kv::CacheDtype::kAuto, mtp, widths.mtp_indexer);
  const double free_bytes = s.budget - s.weights - s.workspaces - s.runtime - s.margin;
  s.cache_blocks = free_bytes > 0 ? model::cuda_cache_blocks_that_fit(static_cast<int64_t>(free_bytes), per_token,
                                                                      in.block_size)
                                  : 0;
  s.cache_tokens = s.cache_blocks * in.block_size;
  s.cache = double(s.cache_tokens + in.block_size) * double(per_token);  // with the idle rank's block
  s.fits = s.cache_tokens >= limits.max_context;
  return s;
}

double StepCollectives::time_s(double link_bandwidth, double latency_s) const {
  return count * latency_s + (link_bandwidth > 0 ? bytes_sent / link_bandwidth : 0.0);
}

StepCollectives step_collectives(const ModelSpec& m, const RankShape& r, double tokens_per_rank) {
  return step_collectives(m, r, tokens_per_rank, model::kDefaultBf16MoeReduceScatter);
}

StepCollectives step_collectives(const ModelSpec& m, const RankShape& r, double tokens_per_rank, bool bf16_moe_sums) {
  StepCollectives c;
  if (r.tp > 1) {
    const double message = tokens_per_rank * m.hidden * 4.0;  // fp32 block outputs
    c.bytes_sent += 2.0 * m.layers * 2.0 * (r.tp - 1) / r.tp * message;
    c.count += 2 * m.layers;
  }
  if (r.dp > 1 && m.moe_layers > 0) {
    const double gather = tokens_per_rank * (m.hidden * 2.0 + m.experts_per_token * 8.0);
    const double scatter = tokens_per_rank * m.hidden * (bf16_moe_sums ? 2.0 : 4.0);
    c.bytes_sent += m.moe_layers * (r.dp - 1) * (gather + scatter);
    c.count += 2 * m.moe_layers;  // the three gathers go out as one group call
  }
  return c;
}

StepCollectives moe_layer_collectives(const ModelSpec& m, const RankShape& r, double tokens_per_rank) {
  return moe_layer_collectives(m, r, tokens_per_rank, model::kDefaultBf16MoeReduceScatter);
}

StepCollectives moe_layer_collectives(const ModelSpec& m, const RankShape& r, double tokens_per_rank,
                                      bool bf16_moe_sums) {
  ModelSpec layer = m;
  layer.layers = 1;
  layer.moe_layers = m.moe_layers > 0 ? 1 : 0;
  return step_collectives(layer, r, tokens_per_rank, bf16_moe_sums);
}

Layout plan_expert_parallel_layout(const ModelSpec& m, const PlanInputs& in, const GpuSpec& gpu, int tp) {
  Layout l;
  l.tp = tp;
  l.dp = in.gpus / tp;
  l.expert_parallel = true;
  const RankShape r{l.tp, l.dp};
  const double usable = gpu.memory_bytes * (1.0 - in.reserve_fraction);
  const int b = kv_dtype_bytes(in.kv_dtype);
  l.weight_bytes_per_gpu = rank_device_weight_bytes(m, in.weights, r);
  l.weights_fit = l.weight_bytes_per_gpu <= usable;
  // Each GPU of an attention group holds the group's whole latent cache: for glm_moe_dsa what
  // glmserve serve would leave it after its workspaces, else the reserve's room.
  const ServeMemory serve = serve_memory(m, in, gpu, r, true);
  l.kv_room_per_replica = serve.known ? serve.cache : std::max(0.0, usable - l.weight_bytes_per_gpu);
  l.kv_bytes_per_sequence = kv_bytes_per_token(m, b) * double(in.context);
  if (l.weights_fit && l.kv_bytes_per_sequence > 0)
    l.max_sequences = int64_t(l.dp) * static_cast<int64_t>(std::floor(l.kv_room_per_replica / l.kv_bytes_per_sequence));
  const Rate bw = effective_bandwidth(gpu), rate = effective_gemm_rate(gpu, in.weights);
  // One step on one GPU: its share of the weights the node's batch touches, its group's cache
  // reads, its share of the FLOPs.
  const double per_group = double(in.concurrency) / l.dp;
  DecodeBound& d = l.decode;
  d.batch = per_group;
  d.touched_experts =
      m.moe_layers > 0 ? expected_distinct_experts(m.n_routed_experts, m.experts_per_token, double(in.concurrency)) : 0;
  d.weight_bytes = rank_decode_device_weight_bytes(m, in.weights, r, per_group);
  d.kv_bytes = per_group * kv_bytes_read_per_step(m, double(in.context), b);
  d.flops = per_group * (2.0 * m.active_parameters +
                         attention_flops(m, attended_tokens(m, double(in.context)), double(in.context), false)) /
            tp;
  d.bandwidth_time_s = (d.weight_bytes + d.kv_bytes) / bw.value;
  d.compute_time_s = d.flops / rate.value;
  d.compute_bound = d.compute_time_s > d.bandwidth_time_s;
  const StepCollectives c = step_collectives(m, r, per_group);
  l.allreduce_bytes_per_token = per_group > 0 ? c.bytes_sent / per_group : 0;
  l.allreduce_time_per_step_s = c.time_s(gpu.link_bandwidth, kCollectiveLatencySeconds);
  d.step_time_s = std::max(d.bandwidth_time_s, d.compute_time_s) + l.allreduce_time_per_step_s;
  d.tokens_per_s = d.step_time_s > 0 ? per_group / d.step_time_s : 0;
  d.tokens_per_s_per_sequence = d.step_time_s > 0 ? 1.0 / d.step_time_s : 0;
  l.aggregate_tokens_per_s = d.tokens_per_s * l.dp;
  return l;
}

}  // namespace glms::plan
