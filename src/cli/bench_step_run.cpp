// glmserve bench-step's run: builds the model its options describe (seeded random weights at full
// width, or one rank of a layout), times decode steps by batch and context and prefills by length
// beside the device's measured copy bandwidth, bf16 GEMM rate and block-scaled FP8 GEMM rate, and
// states each step's bytes-moved and FLOP bounds.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "bench/workload.h"
#include "cli/bench_step.h"
#include "cli/bench_step_rank.h"
#include "cli/bench_step_rates.h"
#include "cli/commands.h"
#include "core/error.h"
#include "io/model_config.h"
#include "kv/latent_cache.h"
#include "model/batch.h"
#include "model/cuda_support.h"
#include "model/weights.h"
#include "plan/hardware.h"
#include "plan/model_spec.h"
#include "plan/parallel.h"
#include "plan/roofline.h"

#ifdef GLMS_HAVE_CUDA
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/linear_fp8.h"
#endif

namespace glms::cli {

#ifdef GLMS_HAVE_CUDA

namespace {

// Bytes a decode step of `batch` tokens at `context` must move at the least, as `glmserve plan`
// counts them: every weight it uses once (routed experts: the expected number of distinct
// experts `batch` uniform top-k picks touch), and each token's cache reads (selected bf16
// latent rows on every layer, bf16 indexer keys on full layers).
// Routed-expert bytes a decode step reads: every touched expert once, in `expert_format`.
double expert_bytes(const plan::ModelSpec& spec, const std::string& expert_format, int batch) {
  return spec.moe_layers * plan::expected_distinct_experts(spec.n_routed_experts, spec.experts_per_token, batch) *
         spec.expert_bytes(expert_format);
}

// The planner's name of a --kv-cache-dtype: "bf16" (auto on CUDA) or "fp8".
std::string plan_kv_dtype(const std::string& kv_cache_dtype) {
  return kv::parse_cache_dtype(kv_cache_dtype) == kv::CacheDtype::kFp8E4m3 ? "fp8" : "bf16";
}

// Bytes a decode step moves: bf16 weights, the routed experts in their format, the cache rows
// read in the cache's storage.
double decode_bytes(const plan::ModelSpec& spec, const std::string& expert_format, const std::string& kv_dtype,
                    int batch, int context) {
  return plan::decode_step_weight_bytes(spec, "bf16", batch) - expert_bytes(spec, "bf16", batch) +
         expert_bytes(spec, expert_format, batch) +
         batch * plan::kv_bytes_read_per_step(spec, context, plan::kv_dtype_bytes(kv_dtype));
}

// The rank's share of the experts (all MoE layers) that the step's batch * dp tokens touch.
double rank_touched_experts(const plan::ModelSpec& spec, const RankSimulation& sim, int batch) {
  const plan::RankShape r = sim.rank_shape();
  return spec.moe_layers *
         plan::expected_distinct_experts(spec.n_routed_experts, spec.experts_per_token, double(batch) * r.dp) /
         r.world();
}

// decode_bytes for one simulated rank: its share of the weights and of the experts the whole step's
// tokens touch (plan/parallel.h), with bf16 everywhere but the routed experts, and its own
// sequences' cache reads (tensor-parallel peers each read the whole latent rows).
double rank_decode_bytes(const plan::ModelSpec& spec, const RankSimulation& sim, const std::string& expert_format,
                         const std::string& kv_dtype, int batch, int context) {
  return plan::rank_decode_device_weight_bytes(spec, expert_format, sim.rank_shape(), batch) +
         batch * plan::kv_bytes_read_per_step(spec, context, plan::kv_dtype_bytes(kv_dtype));
}

// The phases (CudaGlm5Model's phase timer) that are linear layers: projections, absorption,
// output projection, MLPs, the router, the experts and the head.
constexpr const char* kLinearPhases[] = {"attention.projections", "attention.absorb", "attention.output", "dense_mlp",
                                         "moe.routing", "moe.experts", "moe.shared", "head"};

// FLOPs of the linear layers for `tokens` prefill tokens (lm_head for one logits row).
double prefill_linear_flops(const plan::ModelSpec& spec, int tokens) {
  const double head = plan::lm_head_parameters(spec);
  return 2.0 * (tokens * (static_cast<double>(spec.active_parameters) - head) + head);
}

// Device milliseconds per phase of one eager step (the mean of three), printed and returned.
template <typename RunStep>
nlohmann::json phase_breakdown(model::CudaGlm5Model& model, RunStep run_step) {
  constexpr int kSteps = 3;
  model.synchronize();
  model.set_phase_timing(true);
  for (int step = 0; step < kSteps; ++step) {
    run_step(step);
    model.synchronize();
  }
  model.set_phase_timing(false);
  nlohmann::json out = nlohmann::json::object();
  std::string line = "    eager phases:";
  double total = 0;
  for (const auto& [name, ms] : model.take_phase_times()) {
    out[name] = ms / kSteps;
    total += ms / kSteps;
    line += fmt::format(" {} {:.3f}", name, ms / kSteps);
  }
  std::cerr << line << fmt::format(" (sum {:.3f} ms)\n", total);
  return out;
}

// What every point of a run shares: the options, the model at its shapes, and the inputs of the
// bounds (the device's measured rates, the planner's view of the model).
struct StepBench {
  const BenchStepOptions& o;
  std::string path;  // the config read
  io::ModelConfig config;
  int full_layers = 0;  // the depth speculation's break-even is projected to
  model::CudaModelOptions options;
  int blocks_per_sequence = 0;
  int cached_sequences = 1;  // sequences the cache holds; later ones share their blocks
  double bandwidth = 0, gemm_rate = 0, link_bandwidth = 0;
  Fp8GemmRate fp8_rate;
  plan::ModelSpec spec;
  SimulatedPeers peers;  // outlives the model, which holds their communicators
  model::ModelShard shard;
  std::unique_ptr<model::CudaGlm5Model> model;
  nlohmann::json memory;  // the start-up budget, as the record gives it

  explicit StepBench(const BenchStepOptions& options_in) : o(options_in) {}

  // Sequence s's block table: the cached sequence s stands for, its blocks in order.
  std::vector<int32_t> table_of(int sequence) const {
    std::vector<int32_t> table(blocks_per_sequence);
    for (int b = 0; b < blocks_per_sequence; ++b) table[b] = (sequence % cached_sequences) * blocks_per_sequence + b;
    return table;
  }
};

// What MTP speculation with K drafts costs at this batch and context: a verify step (1 + K
// tokens per sequence, every row's logits, a graph as decode's with --graphs) and one MTP draft
// step (one token per sequence, greedy: argmax ids back). A speculative step runs K MTP calls
// (the entries, then K - 1 chain steps; the entries call has 1 + accepted tokens per sequence,
// counted here as one) and one verify, and yields the acceptance length a in tokens, so it pays
// when a > (verify + K x draft) / decode. With fewer layers than the checkpoint has, the draft step weighs more than it would at
// full depth, so the break-even is also projected to `full_layers`: the per-layer part of decode
// and verify (all but embedding and lm_head, `fixed_s`) scales with depth, the MTP draft step does
// not. A simulated rank's steps carry every data-parallel rank's tokens, and its projection adds
// the collectives: the whole model's to a verify step, one MoE layer's to a draft step.
nlohmann::json speculation_costs(StepBench& b, int batch, int context, double decode_s, double fixed_s) {
  model::CudaGlm5Model& model = *b.model;
  const io::ModelConfig& config = b.config;
  const RankSimulation& sim = b.o.simulation;
  const int K = b.o.speculative_steps, full_layers = b.full_layers, block_size = b.options.block_size;
  auto median_of = [&](auto&& run) {
    run();
    std::vector<double> times;
    for (int i = 0; i < std::max(b.o.steps / 2, 3); ++i) {
      const auto t0 = Clock::now();
      run();
      times.push_back(seconds_since(t0));
    }
    std::sort(times.begin(), times.end());
    return times[times.size() / 2];
  };
  model::ForwardBatch verify;
  for (int s = 0; s < batch; ++s) {
    std::vector<int32_t> tokens(K + 1);
    for (int k = 0; k <= K; ++k) tokens[k] = (s * 7919 + k * 131) % config.vocab_size;
    verify.add_sequence(tokens, context - 1, b.table_of(s), block_size, true);
  }
  sim.set_dp_peers(verify);
  const double verify_s = median_of([&] {
    model.forward_on_device(verify, b.o.graphs);
    model.synchronize();
  });
  model::ForwardBatch chain;
  for (int s = 0; s < batch; ++s)
    chain.add_sequence({(s * 104729) % config.vocab_size}, context - 1, b.table_of(s), block_size, false);
  sim.set_dp_peers(chain);
  std::vector<float> h_prev(static_cast<size_t>(batch) * config.hidden_size);
  for (size_t i = 0; i < h_prev.size(); ++i) h_prev[i] = static_cast<float>((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
  // As the engine drafts for greedy requests (argmax ids back), and with every row's logits on
  // the host, as sampled requests need.
  const std::vector<model::RowOutput> argmax_only(batch);
  const double draft_s = median_of([&] { model.mtp_forward_selected(chain, h_prev.data(), argmax_only, nullptr); });
  const double draft_full_s = median_of([&] { model.mtp_forward(chain, h_prev.data(), nullptr); });
  const double step_s = verify_s + K * draft_s;
  nlohmann::json speedups = nlohmann::json::object();
  for (const double a : kProjectedAcceptanceLengths) speedups[fmt::format("{:.1f}", a)] = a * decode_s / step_s;
  const double depth = static_cast<double>(full_layers) / config.num_hidden_layers;
  const double full_decode_s = fixed_s + (decode_s - fixed_s) * depth;
  const double full_step_s = fixed_s + (verify_s - fixed_s) * depth + K * draft_s;
  std::cerr << fmt::format("    K={}: verify {:.3f} ms, MTP draft step {:.3f} ms ({:.3f} with its logits on the host); "
                           "pays above acceptance length {:.2f} (x{:.2f} at 3.5); at {} layers above {:.2f}\n",
                           K, verify_s * 1e3, draft_s * 1e3, draft_full_s * 1e3, step_s / decode_s,
                           3.5 * decode_s / step_s, full_layers, full_step_s / full_decode_s);
  nlohmann::json out = {{"steps", K},
                        {"verify_ms", verify_s * 1e3},
                        {"draft_step_ms", draft_s * 1e3},
                        {"draft_step_with_host_logits_ms", draft_full_s * 1e3},
                        {"break_even_acceptance_length", step_s / decode_s},
                        {"speedup_at_acceptance_length", speedups},
                        {"full_depth_projection",
                         {{"layers", full_layers},
                          {"decode_ms", full_decode_s * 1e3},
                          {"speculative_step_ms", full_step_s * 1e3},
                          {"break_even_acceptance_length", full_step_s / full_decode_s}}}};
  if (sim.enabled()) out["projection"] = project_speculation(b.spec, sim, verify_s, draft_s, batch, K, b.link_bandwidth,
                                                           b.o.kernels.bf16_moe_reduce_scatter);
  return out;
}

// The device's rates, printed.
void measure_rates(StepBench& b) {
  std::cerr << "measuring copy bandwidth and the bf16 and FP8 GEMM rates...\n";
  b.bandwidth = measure_copy_bandwidth(size_t{4} << 30);
  b.gemm_rate = measure_gemm_rate(8192);
  b.fp8_rate = measure_fp8_gemm_rate(8192);
  std::cerr << fmt::format("  copy {:.0f} GB/s, bf16 GEMM {:.0f} TFLOP/s", b.bandwidth / 1e9, b.gemm_rate / 1e12);
  if (b.fp8_rate.error.empty())
    std::cerr << fmt::format(", block-scaled FP8 GEMM {:.0f} TFLOP/s ({:.0f} with the activations' quantisation)\n",
                             b.fp8_rate.gemm / 1e12, b.fp8_rate.with_quantize / 1e12);
  else
    std::cerr << "; block-scaled FP8 GEMM unavailable: " << b.fp8_rate.error << "\n";
}

// The model's options: the kernel flags given, sized for the largest point.
model::CudaModelOptions model_options(const BenchStepOptions& o, int max_batch, int max_context, int max_prefill) {
  model::CudaModelOptions options = o.kernels;
  options.block_size = 64;
  options.max_tokens = std::max(max_prefill, max_batch);
  options.max_sequences = max_batch;
  options.max_context = std::max(max_context, o.prefill_context + max_prefill + 8);
  options.max_logits = max_batch;
  options.num_blocks = 0;  // as many as fit, up to max_batch sequences of max_context
  options.gpu_memory_utilization = o.gpu_memory_utilization;
  if (o.quantization == "fp8") options.linear_weights = model::CudaLinearWeights::kFp8;
  options.cache_dtype = kv::parse_cache_dtype(o.kv_cache_dtype);
  if (o.speculative_steps > 0) {  // a verify step runs 1 + K tokens per sequence, all with logits
    options.mtp = true;
    options.max_tokens = std::max(options.max_tokens, max_batch * (1 + o.speculative_steps));
    options.max_logits = max_batch * (1 + o.speculative_steps);
  }
  return options;
}

// The run's checks, the rates, and the model with its cache filled, the start-up figures printed.
void set_up(StepBench& b) {
  const BenchStepOptions& o = b.o;
  if (ops::cuda::device_count() == 0) fail("no CUDA device is visible: bench-step needs a GPU");
  const ops::cuda::GpuModel gpu = ops::cuda::gpu_model(ops::cuda::current_device());
  const std::string unsupported = model::cuda_gpu_unsupported(gpu.name, gpu.major, gpu.minor);
  if (!unsupported.empty()) fail("bench-step: " + unsupported);
  if (!o.synthetic) fail("bench-step runs on --synthetic weights (give --config FILE or --model DIR for the shapes)");
  b.path = !o.config_file.empty() ? o.config_file : o.model_dir + "/config.json";
  if (o.num_layers == 0) fail("--num-layers must be at least 1");
  b.config = io::load_model_config(b.path);
  b.full_layers = o.project_layers > 0 ? o.project_layers : b.config.num_hidden_layers;
  b.config.keep_first_layers(o.num_layers);
  const RankSimulation& sim = o.simulation;
  if (sim.enabled()) {
    if (sim.rank < 0 || sim.rank >= sim.parallel_layout().world_size())
      fail("--simulate-rank must be in [0, " + std::to_string(sim.parallel_layout().world_size()) + ")");
    runtime::check_layout(b.config, sim.parallel_layout());
  }
  const int max_batch = *std::max_element(o.batches.begin(), o.batches.end());
  const int max_context = *std::max_element(o.contexts.begin(), o.contexts.end()) + o.steps + o.speculative_steps + 8;
  const int max_prefill = o.prefills.empty() ? 0 : *std::max_element(o.prefills.begin(), o.prefills.end());
  measure_rates(b);

  b.options = model_options(o, max_batch, max_context, max_prefill);
  const model::CudaModelOptions& options = b.options;
  b.blocks_per_sequence = (options.max_context + options.block_size - 1) / options.block_size;
  std::cerr << fmt::format("making {} layers of {} at full width with seeded random weights...\n",
                           b.config.num_hidden_layers, b.path);
  const auto start = Clock::now();
  const ops::WeightFormat experts_format = o.expert_format == "mxfp4" ? ops::WeightFormat::Mxfp4
                                           : o.expert_format == "fp8" ? ops::WeightFormat::Fp8Block
                                                                      : ops::WeightFormat::Plain;
  b.peers = make_simulated_peers(sim, b.config, options.max_tokens);
  b.shard = sim.enabled() ? sim.parallel_layout().shard(sim.rank) : model::ModelShard{};
  if (sim.enabled())
    std::cerr << fmt::format("simulating rank {} of {} ({}): {}\n", sim.rank, sim.parallel_layout().world_size(),
                             sim.parallel_layout().describe(), b.shard.describe());
  b.model = model::CudaGlm5Model::synthetic(b.config, o.seed, options, experts_format, b.shard, b.peers.peers());
  b.model->fill_cache_random(o.seed + 100);
  // Sequences beyond what the cache holds share the blocks of earlier ones (same bytes read).
  b.cached_sequences = std::max(1, b.model->options().num_blocks / b.blocks_per_sequence);
  std::cerr << fmt::format("  {:.1f} GB of weights, {:.1f} GB of cache ({} sequences of {} positions), in {:.1f} s\n",
                           b.model->weight_bytes() / 1e9, b.model->cache_bytes() / 1e9, b.cached_sequences,
                           options.max_context, seconds_since(start));
  const model::CudaMemoryReport memory = b.model->memory_report();
  b.memory = {{"device_total_bytes", memory.device_total}, {"budget_bytes", memory.budget},
              {"weight_bytes", memory.weights},       {"workspace_bytes", memory.workspaces},
              {"runtime_bytes", memory.runtime()},    {"kv_cache_bytes", memory.cache},
              {"kv_cache_blocks", b.model->options().num_blocks}};
  if (memory.budget > 0)
    std::cerr << fmt::format("  GPU memory budget {:.2f} GiB = weights {:.2f} + workspaces {:.2f} + runtime {:.2f} + "
                             "margin {:.2f} + KV cache {:.2f} GiB ({} blocks of {})\n",
                             memory.budget / 1073741824.0, memory.weights / 1073741824.0,
                             memory.workspaces / 1073741824.0, memory.runtime() / 1073741824.0,
                             model::kCudaMemoryMarginBytes / 1073741824.0, memory.cache / 1073741824.0,
                             b.model->options().num_blocks, options.block_size);
  b.spec = plan::model_spec_of(b.config);
  b.link_bandwidth = plan::find_gpu("h200").link_bandwidth;
}

// Greedy rows under a structured-output token mask each (random bits, about half the vocabulary
// allowed), applied on the device as the engine sends them. With --token-mask-host-us, each
// row's mask is made on demand after that much host work (a new grammar state's walk of the
// vocabulary), which the runner does while the step's forward runs: what the engine's structured
// outputs cost a step beyond the device's part.
std::vector<model::RowOutput> masked_rows(const BenchStepOptions& o, const io::ModelConfig& config, int batch) {
  auto mask = std::make_shared<std::vector<uint32_t>>((config.vocab_size + 31) / 32);
  for (size_t w = 0; w < mask->size(); ++w) (*mask)[w] = static_cast<uint32_t>((w + 1) * 2654435761u) | 1u;
  if (config.vocab_size % 32) mask->back() &= (uint32_t{1} << (config.vocab_size % 32)) - 1;  // none past vocab
  std::vector<model::RowOutput> masked(batch);
  for (auto& row : masked) {
    if (o.token_mask_host_us <= 0) {
      row.mask = mask;
      continue;
    }
    row.mask_source_words = static_cast<int32_t>(mask->size());
    row.mask_source = [mask, work = std::chrono::microseconds(o.token_mask_host_us)](uint32_t* words) {
      const auto until = Clock::now() + work;
      while (Clock::now() < until) {
      }
      std::copy(mask->begin(), mask->end(), words);
    };
  }
  return masked;
}

// Decode step `step` of `batch` sequences at `context`: one token each, the tokens varying by
// sequence and step, the sequences' cache blocks those of table_of.
model::ForwardBatch decode_batch(const StepBench& b, int batch, int context, int step) {
  model::ForwardBatch fb;
  for (int s = 0; s < batch; ++s)
    fb.add_sequence({(s * 7919 + step * 31) % b.config.vocab_size}, context - 1 + step, b.table_of(s),
                    b.options.block_size, false);
  b.o.simulation.set_dp_peers(fb);
  return fb;
}

// A decode point's step times in seconds: graphed steps on the device (median and fastest of
// o.steps), then medians with the outputs the engine takes: every logits row on the host, each
// row's argmax, sampled rows, rows under token masks.
struct DecodeTimes {
  double median = 0, fastest = 0, host_logits = 0, argmax = 0, sampled = 0, masked = 0;
};

// `profile`: one eager step first between the profiler's marks (ncu).
DecodeTimes time_decode(StepBench& b, int context, int batch, bool profile) {
  const BenchStepOptions& o = b.o;
  model::CudaGlm5Model& model = *b.model;
  for (int step = 0; step < 3; ++step) model.forward_on_device(decode_batch(b, batch, context, step), o.graphs);
  model.synchronize();
  if (profile) {
    ops::cuda::profiler_range(true);
    model.forward_on_device(decode_batch(b, batch, context, 0));
    model.synchronize();
    ops::cuda::profiler_range(false);
  }
  std::vector<double> times;
  for (int step = 0; step < o.steps; ++step) {
    const auto fb = decode_batch(b, batch, context, step);
    const auto t0 = Clock::now();
    model.forward_on_device(fb, o.graphs);
    model.synchronize();
    times.push_back(seconds_since(t0));
  }
  std::sort(times.begin(), times.end());
  DecodeTimes t;
  t.median = times[times.size() / 2];
  t.fastest = times.front();
  auto median_of = [&](auto run_step) {
    std::vector<double> step_times;
    for (int step = 0; step < std::max(3, o.steps / 2); ++step) {
      const auto fb = decode_batch(b, batch, context, step);
      const auto t0 = Clock::now();
      run_step(fb);
      step_times.push_back(seconds_since(t0));
    }
    std::sort(step_times.begin(), step_times.end());
    return step_times[step_times.size() / 2];
  };
  t.host_logits = median_of([&](const model::ForwardBatch& fb) { model.forward(fb, o.graphs); });
  const std::vector<model::RowOutput> argmax_only(batch);
  t.argmax = median_of([&](const model::ForwardBatch& fb) { model.forward_selected(fb, argmax_only, o.graphs); });
  // Sampled rows (temperature 0.8, top_p 0.95), drawn as --sample-on-device says.
  std::vector<model::RowOutput> sampled(batch);
  for (int s = 0; s < batch; ++s) {
    sampled[s].kind = model::RowOutput::Kind::kSample;
    sampled[s].temperature = 0.8f;
    sampled[s].top_p = 0.95f;
    sampled[s].canonical = (s + 0.5) / batch;
  }
  t.sampled = median_of([&](const model::ForwardBatch& fb) { model.forward_selected(fb, sampled, o.graphs); });
  const std::vector<model::RowOutput> masked = masked_rows(o, b.config, batch);
  t.masked = median_of([&](const model::ForwardBatch& fb) { model.forward_selected(fb, masked, o.graphs); });
  return t;
}

// One decode point: its times, eager phases and bound, printed and as the record gives them.
nlohmann::json decode_point(StepBench& b, int context, int batch, bool profile) {
  const BenchStepOptions& o = b.o;
  const RankSimulation& sim = o.simulation;
  model::CudaGlm5Model& model = *b.model;
  const DecodeTimes t = time_decode(b, context, batch, profile);
  const nlohmann::json phases =
      phase_breakdown(model, [&](int step) { model.forward_on_device(decode_batch(b, batch, context, step)); });
  // FP8 linear layers read one byte a value instead of two.
  const std::string kv_dtype = plan_kv_dtype(o.kv_cache_dtype);
  const double bytes = (sim.enabled() ? rank_decode_bytes(b.spec, sim, o.expert_format, kv_dtype, batch, context)
                                      : decode_bytes(b.spec, o.expert_format, kv_dtype, batch, context)) -
                       static_cast<double>(model.fp8_linear_parameters());
  const double bound = bytes / b.bandwidth;
  // The routed experts' share of that bound: a simulated rank's own experts.
  const double experts_bound =
      (sim.enabled() ? rank_touched_experts(b.spec, sim, batch) * b.spec.expert_bytes(o.expert_format)
                     : expert_bytes(b.spec, o.expert_format, batch)) /
      b.bandwidth;
  nlohmann::json point = {{"batch", batch},
                          {"context", context},
                          {"step_ms", t.median * 1e3},
                          {"min_step_ms", t.fastest * 1e3},
                          {"tokens_per_s", batch / t.median},
                          {"bytes_moved", bytes},
                          {"bound_ms", bound * 1e3},
                          {"ratio_to_bound", t.median / bound},
                          {"experts_bound_ms", experts_bound * 1e3},
                          {"step_with_host_logits_ms", t.host_logits * 1e3},
                          {"step_with_argmax_ms", t.argmax * 1e3},
                          {"step_with_sampling_ms", t.sampled * 1e3},
                          {"step_with_token_masks_ms", t.masked * 1e3},
                          {"token_mask_host_us", o.token_mask_host_us},
                          {"eager_phases_ms", phases}};
  std::cerr << fmt::format("  decode batch {:>3} context {:>5}: {:8.3f} ms/step  {:9.1f} tok/s  bound {:7.3f} ms  x{:.2f}"
                           "  (logits to the host: {:.3f} ms, argmax only: {:.3f} ms, sampled: {:.3f} ms)\n",
                           batch, context, t.median * 1e3, batch / t.median, bound * 1e3, t.median / bound,
                           t.host_logits * 1e3, t.argmax * 1e3, t.sampled * 1e3);
  std::cerr << fmt::format("    every row under a token mask (on the device{}): {:.3f} ms, {:+.3f} ms against argmax only\n",
                           o.token_mask_host_us > 0 ? fmt::format(", each made after {} us on the host", o.token_mask_host_us) : "",
                           t.masked * 1e3, (t.masked - t.argmax) * 1e3);
  if (sim.enabled()) {
    point["cache_shared_by_sequences"] = batch > b.cached_sequences;
    point["projection"] =
        project_step(b.spec, sim, t.argmax, batch, b.link_bandwidth, b.o.kernels.bf16_moe_reduce_scatter);
    const nlohmann::json& p = point["projection"];
    std::cerr << fmt::format("    with the collectives ({} calls, {:.2f} MB a rank, {:.3f} ms): {:.3f} ms/step, "
                             "{:.0f} output tok/s per GPU, {:.0f} for the node{}\n",
                             p["collective_calls"].get<int>(), p["collective_bytes_sent"].get<double>() / 1e6,
                             p["collectives_ms"].get<double>(), p["projected_step_ms"].get<double>(),
                             p["projected_tokens_per_s_per_gpu"].get<double>(),
                             p["projected_node_tokens_per_s"].get<double>(),
                             batch > b.cached_sequences ? " (sequences share cache blocks)" : "");
  }
  if (o.speculative_steps > 0)
    point["speculative"] =
        speculation_costs(b, batch, context, t.median, (phases.value("embed", 0.0) + phases.value("head", 0.0)) / 1e3);
  return point;
}

// One prefill of `tokens` (a sequence from position --prefill-context, the positions before it as
// the cache holds them): the best of three, then the eager phases and the linear layers' rate.
// `profile`: one more between the profiler's marks first (ncu).
nlohmann::json prefill_point(StepBench& b, int tokens, bool profile) {
  const RankSimulation& sim = b.o.simulation;
  model::CudaGlm5Model& model = *b.model;
  std::vector<int32_t> prompt(tokens);
  for (int i = 0; i < tokens; ++i) prompt[i] = (i * 104729 + 7) % b.config.vocab_size;
  model::ForwardBatch fb;
  fb.add_sequence(prompt, b.o.prefill_context, b.table_of(0), b.options.block_size, false);
  sim.set_dp_peers(fb);
  model.forward_on_device(fb);
  model.synchronize();
  if (profile) {
    ops::cuda::profiler_range(true);
    model.forward_on_device(fb);
    model.synchronize();
    ops::cuda::profiler_range(false);
  }
  std::vector<double> times;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = Clock::now();
    model.forward_on_device(fb);
    model.synchronize();
    times.push_back(seconds_since(t0));
  }
  const double best = *std::min_element(times.begin(), times.end());
  const double flops = prefill_linear_flops(b.spec, tokens);
  const nlohmann::json phases = phase_breakdown(model, [&](int) { model.forward_on_device(fb); });
  // The linear layers' own rate: their FLOPs over the eager time of the phases made of them.
  double linear_ms = 0;
  for (const char* name : kLinearPhases) linear_ms += phases.value(name, 0.0);
  const double linear_rate = linear_ms > 0 ? flops / (linear_ms / 1e3) : 0.0;
  nlohmann::json point = {{"tokens", tokens},
                          {"context_before", b.o.prefill_context},
                          {"seconds", best},
                          {"tokens_per_s", tokens / best},
                          {"linear_flops", flops},
                          {"linear_flops_per_s", flops / best},
                          {"fraction_of_gemm_rate", flops / best / b.gemm_rate},
                          {"linear_phases_ms", linear_ms},
                          {"linear_phases_fraction_of_gemm_rate", linear_rate / b.gemm_rate},
                          {"phases_ms", phases}};
  const std::string after = b.o.prefill_context > 0 ? fmt::format(" after {} cached", b.o.prefill_context) : "";
  std::cerr << fmt::format("  prefill {:>5} tokens{}: {:8.1f} ms  {:9.0f} tok/s  linear FLOPs at {:.1f} TFLOP/s = {:.2f} of "
                           "GEMM rate over the whole step, {:.2f} over the linear phases ({:.1f} ms)\n",
                           tokens, after, best * 1e3, tokens / best, flops / best / 1e12, flops / best / b.gemm_rate,
                           linear_rate / b.gemm_rate, linear_ms);
  if (sim.enabled()) {
    point["projection"] =
        project_step(b.spec, sim, best, tokens, b.link_bandwidth, b.o.kernels.bf16_moe_reduce_scatter);
    std::cerr << fmt::format("    with the collectives: {:.1f} ms\n", point["projection"]["projected_step_ms"].get<double>());
  }
  return point;
}

// The kernel-path options of a run, as its record names them.
nlohmann::json kernel_options_json(const model::CudaModelOptions& k) {
  return {{"small_batch_gemv_tokens", k.small_batch_gemv_tokens},
          {"skinny_gemm_tokens", k.skinny_gemm_tokens},
          {"skinny_group_tokens", k.skinny_group_tokens},
          {"fused_attention_min_tokens", k.fused_attention_min_tokens},
          {"fused_prefill_attention", k.fused_prefill_attention},
          {"wgmma_attention", k.wgmma_attention},
          {"wgmma_attention_splits", k.wgmma_attention_splits},
          {"warp_specialized_attention", k.warp_specialized_attention},
          {"attention_ring_stages", k.attention_ring_stages},
          {"persistent_attention", k.persistent_attention},
          {"paired_attention", k.paired_attention},
          {"fused_projection_rows_max_tokens", k.fused_projection_rows_max_tokens},
          {"reuse_step_selection", k.reuse_step_selection},
          {"attention_cluster_splits", k.attention_cluster_splits},
          {"wgmma_indexer", k.wgmma_indexer},
          {"wgmma_experts_min_pairs", k.wgmma_experts_min_pairs},
          {"wgmma_bf16_experts_min_pairs", k.wgmma_bf16_experts_min_pairs},
          {"wgmma_fp8_experts_min_pairs", k.wgmma_fp8_experts_min_pairs},
          {"wgmma_experts_tile_rows", k.wgmma_experts_tile_rows},
          {"wgmma_bf16_experts_max_pairs", k.wgmma_bf16_experts_max_pairs},
          {"specialized_bf16_experts_min_pairs", k.specialized_bf16_experts_min_pairs},
          {"specialized_mxfp4_experts_min_pairs", k.specialized_mxfp4_experts_min_pairs},
          {"wgmma_rs_mxfp4_experts_min_pairs", k.wgmma_rs_mxfp4_experts_min_pairs},
          {"widened_experts_min_pairs", k.widened_experts_min_pairs},
          {"paired_bf16_experts", k.paired_bf16_experts},
          {"paired_widened_experts", k.paired_widened_experts},
          {"bf16_expert_sums", k.bf16_expert_sums},
          {"bf16_moe_reduce_scatter", k.bf16_moe_reduce_scatter},
          {"bf16_intermediates_min_tokens", k.bf16_intermediates_min_tokens},
          {"fp8_bf16_intermediates", k.fp8_bf16_intermediates},
          {"accumulate_residual_min_tokens", k.accumulate_residual_min_tokens},
          {"wgmma_fp8_experts", k.wgmma_fp8_experts},
          {"specialized_fp8_experts", k.specialized_fp8_experts},
          {"wide_fp8_experts", k.wide_fp8_experts},
          {"paired_fp8_experts", k.paired_fp8_experts},
          {"persistent_bf16_experts", k.persistent_bf16_experts},
          {"persistent_mxfp4_experts", k.persistent_mxfp4_experts},
          {"persistent_fp8_experts", k.persistent_fp8_experts},
          {"fp8_prefill_indexer", k.fp8_prefill_indexer},
          {"stream_experts_min_pairs", k.stream_experts_min_pairs},
          {"stream_experts_max_pairs", k.stream_experts_max_pairs},
          {"stream_experts_shape", k.stream_experts_shape},
          {"stream_experts_chunk_factor", k.stream_experts_chunk_factor},
          {"grouped_expert_gemm", k.grouped_expert_gemm},
          {"sample_on_device", k.sample_on_device},
          {"sample_blocks_per_row", k.sample_blocks_per_row},
          {"indexer_threads_per_key", k.indexer_threads_per_key},
          {"wgmma_decode_indexer", k.wgmma_decode_indexer},
          {"indexer_decode_one_wave", k.indexer_decode_one_wave},
          {"indexer_topk_blocks", k.indexer_topk_blocks},
          {"overlap_shared_expert_tokens", k.overlap_shared_expert_tokens},
          {"overlap_indexer_tokens", k.overlap_indexer_tokens},
          {"router_terms_min_tokens", k.router_terms_min_tokens},
          {"router_product_min_tokens", k.router_product_min_tokens}};
}

// A simulated rank's decode points and its last prefill (each per GPU, with the collectives)
// projected to --project-workload's requests: plan::mixed_output_tokens_per_s, beside the
// write-up's node.
nlohmann::json project_workload(const BenchStepOptions& o, const nlohmann::json& decode, const nlohmann::json& prefill,
                                int layers, int full_layers, int64_t cache_tokens) {
  const bench::Preset w = *bench::find_preset(o.project_workload);
  const double prefill_rate = prefill["projection"]["projected_tokens_per_s_per_gpu"].get<double>();
  const int world = o.simulation.parallel_layout().world_size();
  // Sequences of the workload's length this run's cache holds on a rank (serve, whose
  // workspaces are sized for fewer tokens a step, holds somewhat more: glmserve plan's serve lines).
  const int64_t holds = cache_tokens / (int64_t{w.input_len} + w.output_len);
  nlohmann::json points = nlohmann::json::array();
  std::cerr << fmt::format("projected to the {} workload ({} in, {:.0f}% cached, {} out), prefilling at {:.0f} tok/s a GPU "
                           "({} tokens after {} cached), decode and prefill in turn, at {} layers{}; a rank's cache holds "
                           "{} such sequences:\n",
                           w.name, w.input_len, w.prefix_hit * 100, w.output_len, prefill_rate,
                           prefill["tokens"].get<int>(), prefill["context_before"].get<int>(), layers,
                           layers < full_layers ? fmt::format(" (the model has {}: not its node's figure)", full_layers)
                                                : std::string(),
                           holds);
  for (const nlohmann::json& d : decode) {
    const double decode_rate = d["projection"]["projected_tokens_per_s_per_gpu"].get<double>();
    const double rate = plan::mixed_output_tokens_per_s(decode_rate, prefill_rate, w.input_len, w.output_len, w.prefix_hit);
    nlohmann::json point = {{"batch", d["batch"]},
                            {"context", d["context"]},
                            {"decode_tokens_per_s_per_gpu", decode_rate},
                            {"output_tokens_per_s_per_gpu", rate},
                            {"node_requests_per_s", rate * world / w.output_len},
                            {"ratio_to_writeup_per_gpu", rate / kWriteupOutputTokensPerSPerGpu},
                            {"fits_at_workload_length", d["batch"].get<int>() <= holds}};
    std::cerr << fmt::format("  decode batch {:>3} context {:>5}: {:6.0f} output tok/s per GPU ({:.2f}x the write-up's "
                             "{:.0f}), {:.2f} requests/s for {} GPUs{}\n",
                             d["batch"].get<int>(), d["context"].get<int>(), rate, rate / kWriteupOutputTokensPerSPerGpu,
                             kWriteupOutputTokensPerSPerGpu, rate * world / w.output_len, world,
                             d["batch"].get<int>() <= holds ? "" : " (more sequences than a rank holds at this length)");
    if (d.contains("speculative") && d["speculative"].contains("projection")) {
      // The write-up's figure is with MTP: the same with speculative steps at each acceptance length.
      nlohmann::json with_mtp = nlohmann::json::object();
      std::string line = "    with MTP speculation, output tok/s per GPU at acceptance length";
      for (const auto& [a, speculative_rate] :
           d["speculative"]["projection"]["output_tokens_per_s_per_gpu_at_acceptance_length"].items()) {
        const double mixed = plan::mixed_output_tokens_per_s(speculative_rate.get<double>(), prefill_rate, w.input_len,
                                                             w.output_len, w.prefix_hit);
        with_mtp[a] = mixed;
        line += fmt::format(" {}: {:.0f}", a, mixed);
      }
      point["output_tokens_per_s_per_gpu_with_mtp_at_acceptance_length"] = with_mtp;
      std::cerr << line << "\n";
    }
    points.push_back(point);
  }
  return {{"workload", w.name},
          {"layers", layers},
          {"model_layers", full_layers},
          {"input_len", w.input_len},
          {"output_len", w.output_len},
          {"prefix_hit", w.prefix_hit},
          {"prefill_tokens", prefill["tokens"]},
          {"prefill_context_before", prefill["context_before"]},
          {"prefill_tokens_per_s_per_gpu", prefill_rate},
          {"sequences_a_rank_holds", holds},
          {"writeup_output_tokens_per_s_per_gpu", kWriteupOutputTokensPerSPerGpu},
          {"points", points}};
}

}  // namespace

void run_bench_step(const BenchStepOptions& o) {
  StepBench b(o);
  set_up(b);
  nlohmann::json decode = nlohmann::json::array(), prefill = nlohmann::json::array();
  for (int context : o.contexts)
    for (int batch : o.batches) decode.push_back(decode_point(b, context, batch, o.profile_step && decode.empty()));
  for (int tokens : o.prefills) prefill.push_back(prefill_point(b, tokens, o.profile_prefill && prefill.empty()));
  const RankSimulation& sim = o.simulation;
  nlohmann::json out = kernel_options_json(o.kernels);
  // What ran: the device may hold smaller clusters than asked (CudaGlm5Model caps them).
  out["attention_cluster_splits"] = b.model->options().attention_cluster_splits;
  if (sim.enabled() && !prefill.empty()) out["workload_projection"] = project_workload(o, decode, prefill.back(), b.config.num_hidden_layers, b.full_layers,
                                       int64_t{b.model->options().num_blocks} * b.options.block_size);
  out.update({{"benchmark", "cuda-step"},
              {"config", b.path},
              {"num_layers", b.config.num_hidden_layers},
              {"weights", "bf16 synthetic"},
              {"expert_format", o.expert_format},
              {"speculative_steps", o.speculative_steps},
              {"graphs", o.graphs},
              {"weight_bytes", b.model->weight_bytes()},
              {"quantization", o.quantization.empty() ? std::string("none") : o.quantization},
              {"kv_cache_dtype", kv::cache_dtype_name(kv::parse_cache_dtype(o.kv_cache_dtype))},
              {"fp8_linear_matrices", b.model->linear_matrices().second},
              {"gpu_memory", b.memory},
              {"copy_bandwidth_bytes_per_s", b.bandwidth},
              {"bf16_gemm_flops_per_s", b.gemm_rate},
              {"fp8_block_gemm_flops_per_s", b.fp8_rate.error.empty() ? nlohmann::json(b.fp8_rate.gemm) : nullptr},
              {"fp8_block_gemm_with_quantize_flops_per_s",
               b.fp8_rate.error.empty() ? nlohmann::json(b.fp8_rate.with_quantize) : nullptr},
              {"fp8_block_gemm_error", b.fp8_rate.error},
              {"decode", decode},
              {"prefill", prefill},
              {"cached_sequences", b.cached_sequences}});
  if (sim.enabled())
    out["simulated_rank"] = {{"rank", sim.rank},
                             {"world", sim.parallel_layout().world_size()},
                             {"layout", sim.flags.world_size() > 1 ? "flags" : sim.layout},
                             {"describe", sim.parallel_layout().describe()},
                             {"shard", b.shard.describe()},
                             {"link_bandwidth_bytes_per_s", b.link_bandwidth},
                             {"collective_latency_s", plan::kCollectiveLatencySeconds}};
  if (!o.json_out.empty()) {
    std::ofstream file(o.json_out);
    file << out.dump(2) << "\n";
    if (!file) fail("cannot write " + o.json_out);
  } else {
    std::cout << out.dump(2) << "\n";
  }
}

#else

void run_bench_step(const BenchStepOptions&) {
  fail("this glmserve was built without CUDA (configure with -DGLMS_CUDA=ON where nvcc is installed)");
}

#endif

}  // namespace glms::cli
