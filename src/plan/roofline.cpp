#include "plan/roofline.h"

#include "plan/parallel.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "quant/kv_fp8.h"

namespace glms::plan {

int kv_dtype_bytes(const std::string& kv_dtype) {
  if (kv_dtype == "bf16") return 2;
  if (kv_dtype == "fp8") return 1;
  fail("unknown KV cache dtype '" + kv_dtype + "' (bf16, fp8)");
}

double expected_distinct_experts(int experts, int top_k, double batch) {
  if (experts <= 0 || batch <= 0) return 0;
  const double E = experts, k = top_k;
  return E * (1.0 - std::pow(1.0 - k / E, batch));
}

namespace {
// Bytes of one token's latent row and indexer key on one layer in a cache of b bytes a value.
double mla_row_bytes(const ModelSpec& m, int b) {
  return b == 1 ? double(quant::kv_fp8_row_bytes(m.kv_lora_rank, m.qk_rope_head_dim))
                : double(m.kv_lora_rank + m.qk_rope_head_dim) * b;
}
double index_key_bytes(const ModelSpec& m, int b) {
  return b == 1 ? double(m.index_head_dim) + 4.0 : double(m.index_head_dim) * b;
}
}  // namespace

double kv_bytes_per_token(const ModelSpec& m, int b) {
  switch (m.attention) {
    case AttentionKind::kGqa:
      return 2.0 * m.kv_heads * m.head_dim * m.layers * b;
    case AttentionKind::kMla:
      return mla_row_bytes(m, b) * m.layers;
    case AttentionKind::kMlaDsa:
      return mla_row_bytes(m, b) * m.layers + index_key_bytes(m, b) * m.full_indexer_layers;
  }
  return 0;
}

double attended_tokens(const ModelSpec& m, double position) {
  if (m.attention == AttentionKind::kMlaDsa && m.index_topk > 0) return std::min(position, double(m.index_topk));
  return position;
}

double mean_attended_tokens(const ModelSpec& m, double length) {
  if (length <= 0) return 0;
  const double cap = m.attention == AttentionKind::kMlaDsa && m.index_topk > 0 ? m.index_topk : length;
  if (length <= cap) return (length + 1.0) / 2.0;
  return (cap * (cap + 1.0) / 2.0 + (length - cap) * cap) / length;
}

double mean_attended_tokens_between(const ModelSpec& m, double first, double last) {
  if (last <= first) return 0;
  return (last * mean_attended_tokens(m, last) - first * mean_attended_tokens(m, first)) / (last - first);
}

double kv_bytes_read_per_step(const ModelSpec& m, double position, int b) {
  if (m.attention != AttentionKind::kMlaDsa) return kv_bytes_per_token(m, b) * position;
  return attended_tokens(m, position) * mla_row_bytes(m, b) * m.layers +
         position * index_key_bytes(m, b) * m.full_indexer_layers;
}

double attention_flops(const ModelSpec& m, double attended, double scored, bool prefill) {
  if (m.attention == AttentionKind::kGqa) return 4.0 * m.heads * m.head_dim * attended * m.layers;
  const double per_token = prefill ? 2.0 * m.heads * (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim)
                                   : 2.0 * m.heads * (2.0 * m.kv_lora_rank + m.qk_rope_head_dim);
  double flops = per_token * attended * m.layers;
  if (m.attention == AttentionKind::kMlaDsa)
    flops += 2.0 * m.index_n_heads * m.index_head_dim * scored * m.full_indexer_layers;
  return flops;
}

double lm_head_parameters(const ModelSpec& m) { return double(m.vocab) * m.hidden; }

double decode_step_weight_bytes(const ModelSpec& m, const std::string& format, double batch) {
  double bytes = static_cast<double>(m.weight_bytes(format));
  bytes -= static_cast<double>(m.group_bytes("routed_experts", format));
  if (!m.tie_word_embeddings) bytes -= static_cast<double>(m.group_bytes("embed_tokens", format));
  for (const auto& g : m.inventory.groups)
    if (g.in_mtp) bytes -= static_cast<double>(m.group_bytes(g.name, format));
  if (m.moe_layers > 0)
    bytes += m.moe_layers * expected_distinct_experts(m.n_routed_experts, m.experts_per_token, batch) *
             m.expert_bytes(format);
  return bytes;
}

double allreduce_bytes_per_token(const ModelSpec& m, int tp) {
  if (tp <= 1) return 0;
  return 2.0 * m.layers * m.hidden * 2.0 * 2.0 * (tp - 1) / tp;
}

double usd_per_million_tokens(double usd_per_hour, double tokens_per_s, double utilization) {
  const double tokens_per_hour = tokens_per_s * utilization * 3600.0;
  return tokens_per_hour > 0 ? usd_per_hour / tokens_per_hour * 1e6 : INFINITY;
}

double tokens_per_s_per_megawatt(double tokens_per_s, double watts) {
  return watts > 0 ? tokens_per_s / (watts / 1e6) : 0;
}

double mixed_output_tokens_per_s(double decode_tokens_per_s, double prefill_tokens_per_s, int input_len,
                                 int output_len, double prefix_hit) {
  if (decode_tokens_per_s <= 0 || output_len <= 0) return 0;
  const double new_tokens = input_len * (1.0 - prefix_hit);
  if (new_tokens > 0 && prefill_tokens_per_s <= 0) return 0;
  const double seconds = output_len / decode_tokens_per_s + (new_tokens > 0 ? new_tokens / prefill_tokens_per_s : 0.0);
  return output_len / seconds;
}

DecodeBound decode_bound(const ModelSpec& m, const std::string& format, int kv_bytes, double position,
                         double batch, int gpus, double bandwidth, double gemm_rate) {
  DecodeBound d;
  d.batch = batch;
  d.touched_experts = m.moe_layers > 0 ? expected_distinct_experts(m.n_routed_experts, m.experts_per_token, batch) : 0;
  d.weight_bytes = decode_step_weight_bytes(m, format, batch);
  d.kv_bytes = batch * kv_bytes_read_per_step(m, position, kv_bytes);
  d.flops = batch * (2.0 * m.active_parameters +
                     attention_flops(m, attended_tokens(m, position), position, /*prefill=*/false));
  d.bandwidth_time_s = (d.weight_bytes + d.kv_bytes) / (gpus * bandwidth);
  d.compute_time_s = d.flops / (gpus * gemm_rate);
  d.compute_bound = d.compute_time_s > d.bandwidth_time_s;
  d.step_time_s = std::max(d.bandwidth_time_s, d.compute_time_s);
  d.tokens_per_s = d.step_time_s > 0 ? batch / d.step_time_s : 0;
  d.tokens_per_s_per_sequence = d.step_time_s > 0 ? 1.0 / d.step_time_s : 0;
  return d;
}

Layout plan_layout(const ModelSpec& m, const PlanInputs& in, const GpuSpec& gpu, int tp) {
  Layout l;
  l.tp = tp;
  l.dp = in.gpus / tp;
  const double weights = static_cast<double>(m.weight_bytes(in.weights));
  const double usable = gpu.memory_bytes * (1.0 - in.reserve_fraction);
  const int b = kv_dtype_bytes(in.kv_dtype);
  l.weight_bytes_per_gpu = weights / tp;
  l.weights_fit = l.weight_bytes_per_gpu <= usable;
  l.kv_room_per_replica = std::max(0.0, tp * usable - weights);
  // GQA shards KV by heads: with more TP ranks than KV heads each head lives on tp/kv_heads
  // ranks. MLA's single latent head is split by sequence across the ranks (DP attention).
  double replication = 1;
  if (m.attention == AttentionKind::kGqa && tp > m.kv_heads) replication = std::ceil(double(tp) / m.kv_heads);
  l.kv_bytes_per_sequence = kv_bytes_per_token(m, b) * double(in.context) * replication;
  if (l.weights_fit && l.kv_bytes_per_sequence > 0)
    l.max_sequences = int64_t(l.dp) * static_cast<int64_t>(std::floor(l.kv_room_per_replica / l.kv_bytes_per_sequence));
  const Rate bw = effective_bandwidth(gpu), rate = effective_gemm_rate(gpu, in.weights);
  l.decode = decode_bound(m, in.weights, b, double(in.context), double(in.concurrency) / l.dp, tp, bw.value, rate.value);
  l.aggregate_tokens_per_s = l.decode.tokens_per_s * l.dp;
  l.allreduce_bytes_per_token = allreduce_bytes_per_token(m, tp);
  if (gpu.link_bandwidth > 0)
    l.allreduce_time_per_step_s = l.allreduce_bytes_per_token * l.decode.batch / gpu.link_bandwidth;
  return l;
}

namespace {

// The layout the plan is about, as `glmserve serve` would run it: with --enable-expert-parallel
// (a MoE model on several GPUs) data-parallel attention groups sharing whole experts, which is
// what the serve lines size; else TP x DP replicas.
Layout headline_layout(const ModelSpec& model, const PlanInputs& in, const GpuSpec& gpu, int tp) {
  if (in.expert_parallel && model.moe_layers > 0 && in.gpus > 1) return plan_expert_parallel_layout(model, in, gpu, tp);
  return plan_layout(model, in, gpu, tp);
}

WorkloadBound workload_bound(const ModelSpec& model, const PlanInputs& in, const PlanResult& p) {
  const PlanInputs::Workload& w = in.workload;
  if (w.output_len < 1 || !(w.prefix_hit >= 0 && w.prefix_hit <= 1))
    fail("a workload needs output tokens and a prefix hit in [0, 1]");
  WorkloadBound b;
  PlanInputs at_length = in;
  at_length.context = int64_t{w.input_len} + w.output_len;
  b.decode_tokens_per_s_per_gpu = headline_layout(model, at_length, p.gpu, p.inputs.tp).aggregate_tokens_per_s / in.gpus;
  const double cached = w.input_len * w.prefix_hit;
  b.prefill_flops_per_token =
      2.0 * (double(p.active_params) - lm_head_parameters(model)) +
      attention_flops(model, mean_attended_tokens_between(model, cached, w.input_len), (cached + w.input_len + 1.0) / 2.0,
                      true);
  b.prefill_tokens_per_s_per_gpu = p.gemm_rate.value / b.prefill_flops_per_token;
  b.output_tokens_per_s_per_gpu = mixed_output_tokens_per_s(b.decode_tokens_per_s_per_gpu, b.prefill_tokens_per_s_per_gpu,
                                                            w.input_len, w.output_len, w.prefix_hit);
  b.requests_per_s = b.output_tokens_per_s_per_gpu * in.gpus / w.output_len;
  const double requests_per_hour = b.requests_per_s * in.utilization * 3600.0;
  b.usd_per_thousand_requests = requests_per_hour > 0 ? p.usd_per_gpu_hour * in.gpus / requests_per_hour * 1e3 : INFINITY;
  return b;
}

}  // namespace

PlanResult make_plan(const ModelSpec& model, const PlanInputs& in, const std::string& source) {
  if (in.gpus < 1 || in.gpus > 4096) fail("--gpus must be between 1 and 4096");
  const int tp = in.tp == 0 ? in.gpus : in.tp;
  if (tp < 1 || in.gpus % tp != 0) fail("--tp must divide --gpus");
  if (in.context < 1) fail("--context must be at least 1 token");
  if (in.concurrency < 1) fail("--concurrency must be at least 1");
  if (!(in.utilization > 0 && in.utilization <= 1)) fail("--utilization must be in (0, 1]");
  if (!(in.reserve_fraction >= 0 && in.reserve_fraction < 1)) fail("the memory reserve must be in [0, 1)");
  kv_dtype_bytes(in.kv_dtype);

  PlanResult p;
  p.inputs = in;
  p.inputs.tp = tp;
  p.gpu = find_gpu(in.gpu);
  p.model = model;
  p.source = source;
  p.bandwidth = effective_bandwidth(p.gpu);
  p.gemm_rate = effective_gemm_rate(p.gpu, in.weights);  // also rejects an unknown format
  p.usable_bytes_per_gpu = p.gpu.memory_bytes * (1.0 - in.reserve_fraction);
  p.params = model.total_parameters();
  p.active_params = model.active_parameters;
  p.mtp_params = model.mtp_parameters();
  p.weight_bytes = static_cast<double>(model.weight_bytes(in.weights));
  const int b = kv_dtype_bytes(in.kv_dtype);
  p.kv_bytes_per_token = kv_bytes_per_token(model, b);
  p.kv_bytes_per_sequence = p.kv_bytes_per_token * double(in.context);

  for (int t = in.gpus; t >= 1; --t)
    if (in.gpus % t == 0) p.layouts.push_back(plan_layout(model, in, p.gpu, t));
  if (model.moe_layers > 0 && in.gpus > 1)
    for (int t = in.gpus; t >= 1; --t)
      if (in.gpus % t == 0) p.layouts.push_back(plan_expert_parallel_layout(model, in, p.gpu, t));
  p.headline = headline_layout(model, in, p.gpu, tp);
  p.serve = serve_memory(model, in, p.gpu, {tp, in.gpus / tp}, in.expert_parallel);
  // An expert-parallel group's cache is on each of its tensor-parallel GPUs (kv_bytes_per_sequence
  // is one GPU's copy there).
  p.kv_bytes_needed = p.headline.kv_bytes_per_sequence * in.concurrency *
                      (p.headline.expert_parallel ? p.headline.tp : 1);
  p.max_sequences = p.headline.max_sequences;
  p.fits = p.headline.weights_fit && p.max_sequences >= in.concurrency;
  p.decode_tokens_per_s_bound = p.headline.aggregate_tokens_per_s;
  p.decode_tokens_per_s_per_sequence_bound = p.headline.decode.tokens_per_s_per_sequence;

  const double ctx = double(in.context);
  p.prefill_flops_per_token = 2.0 * (double(p.active_params) - lm_head_parameters(model)) +
                              attention_flops(model, mean_attended_tokens(model, ctx), (ctx + 1.0) / 2.0, true);
  p.prefill_tokens_per_s_bound = in.gpus * p.gemm_rate.value / p.prefill_flops_per_token;
  p.ttft_bound_s = ctx * p.prefill_flops_per_token / (tp * p.gemm_rate.value);

  p.has_tco = in.tco.gpu_price > 0;
  if (p.has_tco) p.tco = tco_per_gpu_hour(in.tco, p.gpu.power_watts);
  p.usd_per_gpu_hour = in.usd_per_gpu_hour >= 0 ? in.usd_per_gpu_hour : p.has_tco ? p.tco.total() : p.gpu.usd_per_gpu_hour;
  p.price_basis = in.usd_per_gpu_hour >= 0 ? "given" : p.has_tco ? "owned (TCO)" : "catalogue rental";
  p.cost_tokens_per_s = in.measured_tokens_per_s > 0 ? in.measured_tokens_per_s : p.decode_tokens_per_s_bound;
  p.cost_basis = in.measured_tokens_per_s > 0 ? "measured" : "decode bound";
  p.usd_per_million_tokens = usd_per_million_tokens(p.usd_per_gpu_hour * in.gpus, p.cost_tokens_per_s, in.utilization);
  p.tokens_per_s_per_megawatt =
      tokens_per_s_per_megawatt(p.cost_tokens_per_s * in.utilization, p.gpu.power_watts * in.gpus);
  if (in.workload.input_len > 0) p.workload = workload_bound(model, in, p);
  return p;
}

}  // namespace glms::plan
