// Text and JSON renderings of a plan.
#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "plan/parallel.h"
#include "plan/roofline.h"

namespace glms::plan {

namespace {

std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string format(const char* fmt, ...) {
  char buffer[512];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(buffer, sizeof(buffer), fmt, args);
  va_end(args);
  return buffer;
}

std::string bytes(double n) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB", "PB"};
  int unit = 0;
  while (std::fabs(n) >= 1000.0 && unit < 5) { n /= 1000.0; ++unit; }
  return unit == 0 ? format("%.0f B", n) : format("%.*f %s", std::fabs(n) < 10 ? 2 : 1, n, units[unit]);
}

std::string count(double n) {
  const char* units[] = {"", "K", "M", "B", "T"};
  int unit = 0;
  while (std::fabs(n) >= 1000.0 && unit < 4) { n /= 1000.0; ++unit; }
  return unit == 0 ? format("%.0f", n) : format("%.2f%s", n, units[unit]);
}

std::string rate(double flops) { return format("%.0f TFLOP/s", flops / 1e12); }

std::string per_s(double tokens) {
  return tokens >= 100 ? format("%.0f", tokens) : tokens >= 1 ? format("%.1f", tokens) : format("%.3f", tokens);
}

std::string layout_name(const Layout& l) {
  const std::string name = l.dp == 1 ? format("TP%d", l.tp) : format("TP%d x DP%d", l.tp, l.dp);
  return l.expert_parallel ? name + format(" + EP%d", l.tp * l.dp) : name;
}

// One line of the text report: a label column of 12, then the text.
void line(std::string& out, const std::string& label, const std::string& text) {
  out += format("%-12s ", label.c_str()) + text + "\n";
}

// The model, its parameters and the hardware.
void render_model(const PlanResult& p, std::string& out) {
  const ModelSpec& m = p.model;
  const PlanInputs& in = p.inputs;
  const GpuSpec& g = p.gpu;
  if (!p.source.empty()) line(out, "config", p.source);
  std::string shape = format("%s, %s, %d layers, hidden %d", m.model_type.c_str(), attention_kind_name(m.attention),
                             m.layers, m.hidden);
  if (m.moe_layers > 0)
    shape += format(", %d MoE layers (top-%d of %d experts)", m.moe_layers, m.experts_per_token, m.n_routed_experts);
  line(out, "model", shape);
  std::string params = count(double(p.params)) + " stored";
  if (p.mtp_params > 0)
    params += " (" + count(double(p.params - p.mtp_params)) + " + " + count(double(p.mtp_params)) + " MTP)";
  line(out, "parameters", params + ", " + count(double(p.active_params)) + " active per token");
  std::string hw = format("%d x %s (%s): %s, %s/s (%s)", in.gpus, g.name.c_str(), g.description.c_str(),
                          bytes(g.memory_bytes).c_str(), bytes(p.bandwidth.value).c_str(), p.bandwidth.source.c_str());
  line(out, "hardware", hw);
  line(out, "", format("dense peaks (datasheet): bf16 %s, fp8 %s, fp4 %s; %.0f W; $%.2f/GPU-hour",
                  rate(g.bf16_flops).c_str(), rate(g.fp8_flops).c_str(),
                  g.fp4_flops > 0 ? rate(g.fp4_flops).c_str() : "none", g.power_watts, p.usd_per_gpu_hour));
  if (g.measured_bandwidth > 0 || g.measured_bf16_flops > 0)
    line(out, "", format("measured: copy %s/s, bf16 GEMM %s, fp8 GEMM %s", bytes(g.measured_bandwidth).c_str(),
                    rate(g.measured_bf16_flops).c_str(), rate(g.measured_fp8_flops).c_str()));
}

// Weights, the KV cache, the memory they need and how many sequences fit.
void render_memory(const PlanResult& p, std::string& out) {
  const PlanInputs& in = p.inputs;
  const GpuSpec& g = p.gpu;
  line(out, "weights", format("%s: %s (%s per GPU at %s)", in.weights.c_str(), bytes(p.weight_bytes).c_str(),
                         bytes(p.headline.weight_bytes_per_gpu).c_str(), layout_name(p.headline).c_str()));
  line(out, "KV cache", format("%s: %s per token (%.0f B), %s per sequence of %lld tokens", in.kv_dtype.c_str(),
                          bytes(p.kv_bytes_per_token).c_str(), p.kv_bytes_per_token, bytes(p.kv_bytes_per_sequence).c_str(),
                          static_cast<long long>(in.context)));
  const double total = g.memory_bytes * in.gpus, usable = p.usable_bytes_per_gpu * in.gpus;
  // What the GPUs hold together: a copy per replica, or the replicated non-expert weights of EP.
  const double held = p.headline.weight_bytes_per_gpu * in.gpus;
  line(out, "memory", format("%s HBM, %.0f%% reserve -> %s usable; weights %s + KV %s (%d x %lld tokens)",
                        bytes(total).c_str(), in.reserve_fraction * 100, bytes(usable).c_str(), bytes(held).c_str(),
                        bytes(p.kv_bytes_needed).c_str(), in.concurrency, static_cast<long long>(in.context)));
  line(out, "fits", p.fits ? format("yes (%s left)", bytes(usable - held - p.kv_bytes_needed).c_str())
                      : !p.headline.weights_fit ? std::string("no: the weights alone exceed the usable memory")
                                                : format("no: at most %lld sequences of %lld tokens",
                                                         static_cast<long long>(p.max_sequences),
                                                         static_cast<long long>(in.context)));
  line(out, "max seqs", format("%lld concurrent sequences of %lld tokens", static_cast<long long>(p.max_sequences),
                          static_cast<long long>(in.context)));
}

// The serve command for the layout and its per-GPU memory budget, as serve would size it.
void render_serve(const PlanResult& p, std::string& out) {
  const PlanInputs& in = p.inputs;
  if (p.serve.known) {
    const ServeMemory& s = p.serve;
    auto gib = [](double b) { return b / double(int64_t{1} << 30); };
    std::string how = format("glmserve serve -tp %d -dp %d%s: --gpu-memory-utilization %.2f", s.tp, s.dp,
                             s.expert_parallel ? " --enable-expert-parallel" : "", 1.0 - in.reserve_fraction);
    how += format(" --max-num-batched-tokens %d --max-num-seqs %d --max-model-len %lld", in.max_num_batched_tokens,
                  in.max_num_seqs > 0 ? in.max_num_seqs : in.concurrency, static_cast<long long>(in.context));
    if (in.speculative_steps > 0) how += format(" --speculative mtp --speculative-steps %d", in.speculative_steps);
    if (in.kv_dtype == "fp8") how += " --kv-cache-dtype fp8";
    line(out, "serve", how);
    line(out, "", format("per GPU: budget %.2f GiB = weights %.2f + workspaces %.2f + CUDA runtime %.2f + margin %.2f + "
                    "KV cache %.2f GiB",
                    gib(s.budget), gib(s.weights), gib(s.workspaces), gib(s.runtime), gib(s.margin), gib(s.cache)));
    line(out, "", s.cache_blocks > 0
                 ? format("KV cache %lld blocks of %d = %s tokens per data-parallel rank%s",
                          static_cast<long long>(s.cache_blocks), in.block_size, count(double(s.cache_tokens)).c_str(),
                          s.fits ? "" : ": less than one --max-model-len sequence")
                 : std::string("no room for a KV cache: more GPUs, experts over them, or a smaller format"));
  }

}

// The decode and prefill rooflines of the headline layout.
void render_bounds(const PlanResult& p, std::string& out) {
  const ModelSpec& m = p.model;
  const PlanInputs& in = p.inputs;
  const DecodeBound& d = p.headline.decode;
  out += "\n";
  line(out, "decode", format("roofline at %d sequences, each at position %lld, TP%d x DP%d%s", in.concurrency,
                        static_cast<long long>(in.context), p.headline.tp, p.headline.dp,
                        p.headline.expert_parallel ? format(" + EP%d", in.gpus).c_str() : ""));
  std::string weights_read = bytes(d.weight_bytes);
  if (m.moe_layers > 0)
    weights_read += format(" (%.1f of %d experts per MoE layer)", d.touched_experts, m.n_routed_experts);
  // A replica's step runs on its TP GPUs together; an expert-parallel layout's figures are one
  // GPU's share of its group's step, and the step adds the collectives.
  const bool ep = p.headline.expert_parallel;
  const int gpus = ep ? 1 : p.headline.tp;
  line(out, "  per step", format("weights %s, KV %s, %.1f TFLOP (%s %.1f sequences)", weights_read.c_str(),
                            bytes(d.kv_bytes).c_str(), d.flops / 1e12,
                            ep ? "one GPU's share of its attention group's" : "one replica of", d.batch));
  line(out, "  memory", format("%.2f ms at %s/s (%d x %s/s, %s)", d.bandwidth_time_s * 1e3,
                          bytes(p.bandwidth.value * gpus).c_str(), gpus, bytes(p.bandwidth.value).c_str(),
                          p.bandwidth.source.c_str()));
  line(out, "  compute", format("%.2f ms at %s (%d x %s %s, %s)", d.compute_time_s * 1e3, rate(p.gemm_rate.value * gpus).c_str(),
                           gpus, p.gemm_rate.precision.c_str(), rate(p.gemm_rate.value).c_str(),
                           p.gemm_rate.source.c_str()));
  if (ep)
    line(out, "  links", format("%.2f ms a step (all-reduces, the MoE gathers and reduce-scatters at the link "
                           "bandwidth, %.0f us a call)",
                           p.headline.allreduce_time_per_step_s * 1e3, kCollectiveLatencySeconds * 1e6));
  line(out, "  bound", format("%s tok/s aggregate, %s tok/s per sequence (%s bound)", per_s(p.decode_tokens_per_s_bound).c_str(),
                         per_s(p.decode_tokens_per_s_per_sequence_bound).c_str(),
                         d.compute_bound ? "compute" : "memory-bandwidth"));
  line(out, "prefill", format("%.1f GFLOP per token (mean over a %lld-token prompt) at %s %s", p.prefill_flops_per_token / 1e9,
                         static_cast<long long>(in.context), p.gemm_rate.precision.c_str(),
                         rate(p.gemm_rate.value).c_str()));
  line(out, "  bound", format("%s tok/s on all %d GPUs; TTFT >= %.2f s for one %lld-token prompt at TP%d",
                         per_s(p.prefill_tokens_per_s_bound).c_str(), in.gpus, p.ttft_bound_s,
                         static_cast<long long>(in.context), in.tp));

}

// The layout table.
void render_layouts(const PlanResult& p, std::string& out) {
  const PlanInputs& in = p.inputs;
  const bool expert_rows = std::any_of(p.layouts.begin(), p.layouts.end(), [](const Layout& l) { return l.expert_parallel; });
  out += "\nlayouts (weights sharded by TP, a whole copy per DP replica; " +
         std::string(expert_rows ? "+ EP: DP attention groups sharing the experts over all GPUs, weights/GPU as glmserve "
                                   "holds them without the MTP layer, AR = every collective of a step; "
                                 : "") +
         format("%d sequences of %lld tokens in all; AR = all-reduce per GPU)\n", in.concurrency,
                static_cast<long long>(in.context));
  out += format("  %-17s %12s %6s %10s %12s %10s %14s %12s\n", "layout", "weights/GPU", "fits", "max seqs",
                "tok/s bound", "tok/s/seq", "AR bytes/token", "AR ms/step");
  for (const Layout& l : p.layouts) {
    out += format("  %-17s %12s %6s %10lld %12s %10s %14s %12.3f\n", layout_name(l).c_str(),
                  bytes(l.weight_bytes_per_gpu).c_str(),
                  !l.weights_fit ? "no" : l.max_sequences >= in.concurrency ? "yes" : "no KV",
                  static_cast<long long>(l.max_sequences), l.weights_fit ? per_s(l.aggregate_tokens_per_s).c_str() : "-",
                  l.weights_fit ? per_s(l.decode.tokens_per_s_per_sequence).c_str() : "-",
                  bytes(l.allreduce_bytes_per_token).c_str(), l.allreduce_time_per_step_s * 1e3);
  }
  out += "\n";
}

// Owning the GPUs: each part per GPU-hour with the assumption behind it, beside the catalogue's
// rental price.
void render_tco(const PlanResult& p, std::string& out) {
  const TcoInputs& t = p.inputs.tco;
  const TcoBreakdown& b = p.tco;
  line(out, "tco", format("$%.3f per GPU-hour owned, against $%.2f rented (the catalogue's %s price)", b.total(),
                     p.gpu.usd_per_gpu_hour, p.gpu.name.c_str()));
  line(out, "  hardware", format("$%.3f: $%.0f a GPU + $%.0f of host over %g years", b.hardware, t.gpu_price,
                            t.host_price_per_gpu, t.years));
  line(out, "  power", format("$%.3f: %.2f kW a GPU (%.0f W board + %.0f W host, at %.0f%%) at $%.3f/kWh", b.power,
                         b.it_kw, p.gpu.power_watts, t.host_watts_per_gpu, t.power_share * 100, t.usd_per_kwh));
  line(out, "  cooling", format("$%.3f: PUE %.2f", b.cooling, t.pue));
  line(out, "  space", format("$%.3f: $%.0f per kW of IT load a month", b.space, t.usd_per_kw_month));
  line(out, "  upkeep",
       format("$%.3f: maintenance, %.1f%% of the hardware a year", b.maintenance, t.maintenance_per_year * 100));
}

// Cost and power at the bound.
void render_cost(const PlanResult& p, std::string& out) {
  const PlanInputs& in = p.inputs;
  const GpuSpec& g = p.gpu;
  if (p.has_tco) render_tco(p, out);
  line(out, "cost", format("$%.2f/hour for %d GPUs (%s price) at utilisation %.2f: $%.3f per million output tokens "
                           "(%s, %s tok/s)",
                      p.usd_per_gpu_hour * in.gpus, in.gpus, p.price_basis.c_str(), in.utilization,
                      p.usd_per_million_tokens, p.cost_basis.c_str(), per_s(p.cost_tokens_per_s).c_str()));
  line(out, "power", format("%.1f kW of GPU board power: %s tok/s per MW, %s tok/s per GPU", g.power_watts * in.gpus / 1e3,
                       count(p.tokens_per_s_per_megawatt).c_str(),
                       per_s(p.cost_tokens_per_s * in.utilization / in.gpus).c_str()));
  const PlanInputs::Workload& w = in.workload;
  if (w.input_len <= 0) return;
  const WorkloadBound& b = p.workload;
  line(out, "workload", format("%s: %d in (%.0f%% cached), %d out, %s at %d sequences", w.name.c_str(), w.input_len,
                          w.prefix_hit * 100, w.output_len, layout_name(p.headline).c_str(), in.concurrency));
  line(out, "  bounds", format("decode %s tok/s per GPU at %d tokens, prefill %s tok/s per GPU (%.1f GFLOP an uncached "
                          "token), taken in turn: %s output tok/s per GPU",
                          per_s(b.decode_tokens_per_s_per_gpu).c_str(), w.input_len + w.output_len,
                          per_s(b.prefill_tokens_per_s_per_gpu).c_str(), b.prefill_flops_per_token / 1e9,
                          per_s(b.output_tokens_per_s_per_gpu).c_str()));
  line(out, "  requests", format("%.2f req/s for %d GPUs, $%.3f per 1000 requests at utilisation %.2f%s", b.requests_per_s,
                            in.gpus, b.usd_per_thousand_requests, in.utilization,
                            p.fits ? "" : format("; %d sequences do not fit (at most %lld)", in.concurrency,
                                                 static_cast<long long>(p.max_sequences)).c_str()));
}

}  // namespace

std::string render_text(const PlanResult& p) {
  std::string out;
  render_model(p, out);
  render_memory(p, out);
  render_serve(p, out);
  render_bounds(p, out);
  render_layouts(p, out);
  render_cost(p, out);
  out += "\nBounds, not predictions: real servers reach a fraction of them (docs/planning.md).\n";
  return out;
}

std::string render_json(const PlanResult& p) {
  using json = nlohmann::json;
  const ModelSpec& m = p.model;
  auto decode_json = [](const DecodeBound& d) {
    return json{{"batch_per_replica", d.batch}, {"touched_experts_per_moe_layer", d.touched_experts},
                {"weight_bytes_per_step", d.weight_bytes}, {"kv_bytes_per_step", d.kv_bytes},
                {"flops_per_step", d.flops}, {"bandwidth_time_s", d.bandwidth_time_s},
                {"compute_time_s", d.compute_time_s}, {"compute_bound", d.compute_bound},
                {"tokens_per_s_per_replica", d.tokens_per_s}, {"tokens_per_s_per_sequence", d.tokens_per_s_per_sequence}};
  };
  json out;
  out["config"] = p.source;
  out["model"] = {{"model_type", m.model_type}, {"attention", attention_kind_name(m.attention)},
                  {"layers", m.layers}, {"hidden", m.hidden}, {"moe_layers", m.moe_layers},
                  {"routed_experts", m.n_routed_experts}, {"experts_per_token", m.experts_per_token}};
  out["gpu"] = {{"name", p.gpu.name}, {"count", p.inputs.gpus}, {"memory_bytes", p.gpu.memory_bytes},
                {"bandwidth", p.bandwidth.value}, {"bandwidth_source", p.bandwidth.source},
                {"gemm_flops", p.gemm_rate.value}, {"gemm_precision", p.gemm_rate.precision},
                {"gemm_source", p.gemm_rate.source}, {"power_watts", p.gpu.power_watts},
                {"usd_per_gpu_hour", p.usd_per_gpu_hour}};
  out["inputs"] = {{"weights", p.inputs.weights}, {"kv_dtype", p.inputs.kv_dtype}, {"context", p.inputs.context},
                   {"concurrency", p.inputs.concurrency}, {"tp", p.inputs.tp}, {"utilization", p.inputs.utilization},
                   {"reserve_fraction", p.inputs.reserve_fraction}};
  out["params"] = p.params;
  out["active_params"] = p.active_params;
  out["mtp_params"] = p.mtp_params;
  out["weight_bytes"] = p.weight_bytes;
  out["weight_bytes_per_gpu"] = p.headline.weight_bytes_per_gpu;
  out["headline"] = {{"tp", p.headline.tp}, {"dp", p.headline.dp}, {"expert_parallel", p.headline.expert_parallel}};
  out["kv_bytes_per_token"] = p.kv_bytes_per_token;
  out["kv_bytes_per_sequence"] = p.kv_bytes_per_sequence;
  out["kv_bytes_needed"] = p.kv_bytes_needed;
  out["usable_bytes"] = p.usable_bytes_per_gpu * p.inputs.gpus;
  out["fits"] = p.fits;
  out["max_sequences"] = p.max_sequences;
  out["decode_tokens_per_s_bound"] = p.decode_tokens_per_s_bound;
  out["decode_tokens_per_s_per_sequence_bound"] = p.decode_tokens_per_s_per_sequence_bound;
  out["decode"] = decode_json(p.headline.decode);
  out["prefill"] = {{"flops_per_token", p.prefill_flops_per_token}, {"tokens_per_s_bound", p.prefill_tokens_per_s_bound},
                    {"ttft_bound_s", p.ttft_bound_s}};
  json layouts = json::array();
  for (const Layout& l : p.layouts)
    layouts.push_back({{"tp", l.tp}, {"dp", l.dp}, {"expert_parallel", l.expert_parallel},
                       {"weight_bytes_per_gpu", l.weight_bytes_per_gpu},
                       {"weights_fit", l.weights_fit}, {"kv_room_per_replica", l.kv_room_per_replica},
                       {"max_sequences", l.max_sequences}, {"decode_tokens_per_s_bound", l.aggregate_tokens_per_s},
                       {"allreduce_bytes_per_token", l.allreduce_bytes_per_token},
                       {"allreduce_time_per_step_s", l.allreduce_time_per_step_s}, {"decode", decode_json(l.decode)}});
  out["layouts"] = layouts;
  if (p.serve.known) {
    const ServeMemory& s = p.serve;
    out["serve_memory"] = {{"tp", s.tp},
                           {"dp", s.dp},
                           {"expert_parallel", s.expert_parallel},
                           {"budget_bytes", s.budget},
                           {"weight_bytes", s.weights},
                           {"workspace_bytes", s.workspaces},
                           {"runtime_bytes", s.runtime},
                           {"margin_bytes", s.margin},
                           {"kv_cache_bytes", s.cache},
                           {"kv_cache_blocks", s.cache_blocks},
                           {"kv_cache_tokens", s.cache_tokens},
                           {"fits", s.fits}};
  }
  out["price_basis"] = p.price_basis;
  if (p.has_tco) {
    const TcoInputs& t = p.inputs.tco;
    const TcoBreakdown& b = p.tco;
    out["tco"] = {{"usd_per_gpu_hour", b.total()}, {"hardware", b.hardware}, {"power", b.power},
                  {"cooling", b.cooling}, {"space", b.space}, {"maintenance", b.maintenance},
                  {"it_kw_per_gpu", b.it_kw},
                  {"inputs", {{"gpu_price", t.gpu_price}, {"host_price_per_gpu", t.host_price_per_gpu},
                              {"years", t.years}, {"usd_per_kwh", t.usd_per_kwh}, {"pue", t.pue},
                              {"host_watts_per_gpu", t.host_watts_per_gpu}, {"power_share", t.power_share},
                              {"usd_per_kw_month", t.usd_per_kw_month},
                              {"maintenance_per_year", t.maintenance_per_year}}}};
  }
  out["cost_basis"] = p.cost_basis;
  out["cost_tokens_per_s"] = p.cost_tokens_per_s;
  out["usd_per_million_tokens"] = p.usd_per_million_tokens;
  out["tokens_per_s_per_megawatt"] = p.tokens_per_s_per_megawatt;
  if (p.inputs.workload.input_len > 0) {
    const PlanInputs::Workload& w = p.inputs.workload;
    const WorkloadBound& b = p.workload;
    out["workload"] = {{"name", w.name},
                       {"input_len", w.input_len},
                       {"output_len", w.output_len},
                       {"prefix_hit", w.prefix_hit},
                       {"decode_tokens_per_s_per_gpu", b.decode_tokens_per_s_per_gpu},
                       {"prefill_flops_per_token", b.prefill_flops_per_token},
                       {"prefill_tokens_per_s_per_gpu", b.prefill_tokens_per_s_per_gpu},
                       {"output_tokens_per_s_per_gpu", b.output_tokens_per_s_per_gpu},
                       {"requests_per_s", b.requests_per_s},
                       {"usd_per_thousand_requests", b.usd_per_thousand_requests}};
  }
  return out.dump(2);
}

}  // namespace glms::plan
