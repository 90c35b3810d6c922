// glmserve bench-step: times single forward steps of the CUDA model, decode at several batch
// sizes and context lengths and prefill at several prompt lengths, beside the device's measured
// copy bandwidth, bf16 GEMM rate and block-scaled FP8 GEMM rate, and states each step's
// bytes-moved and FLOP bounds.
// With --synthetic it needs no checkpoint: seeded random weights of a config at full width.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/bench_step_rank.h"
#include "cli/bench_step_rates.h"
#include "cli/commands.h"
#include "cli/validators.h"
#include "core/error.h"
#include "io/model_config.h"
#include "kv/latent_cache.h"
#include "model/batch.h"
#include "model/cuda/model.h"  // CudaModelOptions' defaults (declarations only)
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

namespace {

struct BenchStepOptions {
  std::string model_dir, config_file, json_out;
  bool synthetic = false;
  int num_layers = -1;
  std::vector<int> batches = {1, 8, 32, 64, 128};
  std::vector<int> contexts = {2048, 16384};
  std::vector<int> prefills = {2048, 8192};
  int steps = 20;
  bool graphs = true;
  bool profile_step = false;
  bool profile_prefill = false;
  uint64_t seed = 1;
  std::string expert_format = "bf16";  // routed experts: bf16, mxfp4 or fp8
  std::string quantization;            // "fp8": the linear layers in block FP8
  std::string kv_cache_dtype = "auto";  // the cache's rows: auto (bf16) or fp8 (serve's flag)
  model::CudaModelOptions kernels;      // the kernel flags; run_bench_step sets the sizes
  int speculative_steps = 0;           // > 0: also time K-draft verification and MTP draft steps
  int project_layers = 0;              // depth the speculation break-even is projected to (0: the config's)
  RankSimulation simulation;           // --simulate-rank R --world N --layout L
  double gpu_memory_utilization = 0.9; // what the cache may fill (sequences beyond it share blocks)
  int token_mask_host_us = 0;          // > 0: masked rows' masks made on demand after this host work
};

#ifdef GLMS_HAVE_CUDA

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
  // The rank's experts read in expert_format instead of bf16.
  return plan::rank_decode_weight_bytes(spec, "bf16", sim.rank_shape(), batch) +
         rank_touched_experts(spec, sim, batch) * (spec.expert_bytes(expert_format) - spec.expert_bytes("bf16")) +
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

// What MTP speculation with K drafts costs at this batch and context: a verify step (1 + K tokens
// per sequence, every row's logits, eager) and one MTP draft step (one token per sequence,
// greedy: argmax ids back). A
// speculative step runs K MTP calls (the entries, then K - 1 chain steps; the entries call has
// 1 + accepted tokens per sequence, counted here as one) and one verify, and yields the
// acceptance length a in tokens, so it pays when a > (verify + K x draft) / decode. With fewer
// layers than the checkpoint has, the draft step weighs more than it would at full depth, so the
// break-even is also projected to `full_layers`: the per-layer part of decode and verify (all
// but embedding and lm_head, `fixed_s`) scales with depth, the MTP draft step does not.
template <typename TableOf>
nlohmann::json speculation_costs(model::CudaGlm5Model& model, const io::ModelConfig& config, int K, int batch,
                                 int context, int steps, double decode_s, double fixed_s, int full_layers,
                                 TableOf table_of, int block_size) {
  auto median_of = [&](auto&& run) {
    run();
    std::vector<double> times;
    for (int i = 0; i < std::max(steps / 2, 3); ++i) {
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
    verify.add_sequence(tokens, context - 1, table_of(s), block_size, true);
  }
  const double verify_s = median_of([&] {
    model.forward_on_device(verify);
    model.synchronize();
  });
  model::ForwardBatch chain;
  for (int s = 0; s < batch; ++s)
    chain.add_sequence({(s * 104729) % config.vocab_size}, context - 1, table_of(s), block_size, false);
  std::vector<float> h_prev(static_cast<size_t>(batch) * config.hidden_size);
  for (size_t i = 0; i < h_prev.size(); ++i) h_prev[i] = static_cast<float>((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
  // As the engine drafts for greedy requests (argmax ids back), and with every row's logits on
  // the host, as sampled requests need.
  const std::vector<model::RowOutput> argmax_only(batch);
  const double draft_s = median_of([&] { model.mtp_forward_selected(chain, h_prev.data(), argmax_only, nullptr); });
  const double draft_full_s = median_of([&] { model.mtp_forward(chain, h_prev.data(), nullptr); });
  const double step_s = verify_s + K * draft_s;
  nlohmann::json speedups = nlohmann::json::object();
  for (double a : {1.5, 2.0, 2.5, 3.0, 3.5}) speedups[fmt::format("{:.1f}", a)] = a * decode_s / step_s;
  const double depth = static_cast<double>(full_layers) / config.num_hidden_layers;
  const double full_decode_s = fixed_s + (decode_s - fixed_s) * depth;
  const double full_step_s = fixed_s + (verify_s - fixed_s) * depth + K * draft_s;
  std::cerr << fmt::format("    K={}: verify {:.3f} ms, MTP draft step {:.3f} ms ({:.3f} with its logits on the host); "
                           "pays above acceptance length {:.2f} (x{:.2f} at 3.5); at {} layers above {:.2f}\n",
                           K, verify_s * 1e3, draft_s * 1e3, draft_full_s * 1e3, step_s / decode_s,
                           3.5 * decode_s / step_s, full_layers, full_step_s / full_decode_s);
  return {{"steps", K},
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
}

void run_bench_step(const BenchStepOptions& o) {
  namespace cuda = ops::cuda;
  if (cuda::device_count() == 0) fail("no CUDA device is visible: bench-step needs a GPU");
  if (!o.synthetic) fail("bench-step runs on --synthetic weights (give --config FILE or --model DIR for the shapes)");
  const std::string path = !o.config_file.empty() ? o.config_file : o.model_dir + "/config.json";
  if (o.num_layers == 0) fail("--num-layers must be at least 1");
  io::ModelConfig config = io::load_model_config(path);
  const int full_layers = o.project_layers > 0 ? o.project_layers : config.num_hidden_layers;
  config.keep_first_layers(o.num_layers);
  const RankSimulation& sim = o.simulation;
  if (sim.enabled()) {
    if (sim.rank < 0 || sim.rank >= sim.parallel_layout().world_size())
      fail("--simulate-rank must be in [0, " + std::to_string(sim.parallel_layout().world_size()) + ")");
    runtime::check_layout(config, sim.parallel_layout());
    if (o.speculative_steps > 0) fail("--speculative-steps is not simulated across ranks yet");
  }
  const int max_batch = *std::max_element(o.batches.begin(), o.batches.end());
  const int max_context = *std::max_element(o.contexts.begin(), o.contexts.end()) + o.steps + o.speculative_steps + 8;
  const int max_prefill = o.prefills.empty() ? 0 : *std::max_element(o.prefills.begin(), o.prefills.end());

  std::cerr << "measuring copy bandwidth and the bf16 and FP8 GEMM rates...\n";
  const double bandwidth = measure_copy_bandwidth(size_t{4} << 30);
  const double gemm_rate = measure_gemm_rate(8192);
  const Fp8GemmRate fp8_rate = measure_fp8_gemm_rate(8192);
  std::cerr << fmt::format("  copy {:.0f} GB/s, bf16 GEMM {:.0f} TFLOP/s", bandwidth / 1e9, gemm_rate / 1e12);
  if (fp8_rate.error.empty())
    std::cerr << fmt::format(", block-scaled FP8 GEMM {:.0f} TFLOP/s ({:.0f} with the activations' quantisation)\n",
                             fp8_rate.gemm / 1e12, fp8_rate.with_quantize / 1e12);
  else
    std::cerr << "; block-scaled FP8 GEMM unavailable: " << fp8_rate.error << "\n";

  model::CudaModelOptions options = o.kernels;
  options.block_size = 64;
  options.max_tokens = std::max(max_prefill, max_batch);
  options.max_sequences = max_batch;
  options.max_context = std::max(max_context, max_prefill + 8);
  options.max_logits = max_batch;
  const int blocks_per_sequence = (options.max_context + options.block_size - 1) / options.block_size;
  options.num_blocks = 0;  // as many as fit, up to max_batch sequences of max_context
  options.gpu_memory_utilization = o.gpu_memory_utilization;
  if (o.quantization == "fp8") options.linear_weights = model::CudaLinearWeights::kFp8;
  options.cache_dtype = kv::parse_cache_dtype(o.kv_cache_dtype);
  if (o.speculative_steps > 0) {  // a verify step runs 1 + K tokens per sequence, all with logits
    options.mtp = true;
    options.max_tokens = std::max(options.max_tokens, max_batch * (1 + o.speculative_steps));
    options.max_logits = max_batch * (1 + o.speculative_steps);
  }
  std::cerr << fmt::format("making {} layers of {} at full width with seeded random weights...\n",
                           config.num_hidden_layers, path);
  const auto start = Clock::now();
  const ops::WeightFormat experts_format = o.expert_format == "mxfp4" ? ops::WeightFormat::Mxfp4
                                           : o.expert_format == "fp8" ? ops::WeightFormat::Fp8Block
                                                                      : ops::WeightFormat::Plain;
  const SimulatedPeers peers = make_simulated_peers(sim, config, options.max_tokens);
  const model::ModelShard shard = sim.enabled() ? sim.parallel_layout().shard(sim.rank) : model::ModelShard{};
  if (sim.enabled())
    std::cerr << fmt::format("simulating rank {} of {} ({}): {}\n", sim.rank, sim.parallel_layout().world_size(),
                             sim.parallel_layout().describe(), shard.describe());
  auto model = model::CudaGlm5Model::synthetic(config, o.seed, options, experts_format, shard, peers.peers());
  model->fill_cache_random(o.seed + 100);
  // Sequences beyond what the cache holds share the blocks of earlier ones (same bytes read).
  const int cached_sequences = std::max(1, model->options().num_blocks / blocks_per_sequence);
  std::cerr << fmt::format("  {:.1f} GB of weights, {:.1f} GB of cache ({} sequences of {} positions), in {:.1f} s\n",
                           model->weight_bytes() / 1e9, model->cache_bytes() / 1e9, cached_sequences,
                           options.max_context, seconds_since(start));
  const model::CudaMemoryReport memory = model->memory_report();
  const nlohmann::json memory_json = {{"device_total_bytes", memory.device_total}, {"budget_bytes", memory.budget},
                                      {"weight_bytes", memory.weights},       {"workspace_bytes", memory.workspaces},
                                      {"runtime_bytes", memory.runtime()},    {"kv_cache_bytes", memory.cache},
                                      {"kv_cache_blocks", model->options().num_blocks}};
  if (memory.budget > 0)
    std::cerr << fmt::format("  GPU memory budget {:.2f} GiB = weights {:.2f} + workspaces {:.2f} + runtime {:.2f} + "
                             "margin {:.2f} + KV cache {:.2f} GiB ({} blocks of {})\n",
                             memory.budget / 1073741824.0, memory.weights / 1073741824.0,
                             memory.workspaces / 1073741824.0, memory.runtime() / 1073741824.0,
                             model::kCudaMemoryMarginBytes / 1073741824.0, memory.cache / 1073741824.0,
                             model->options().num_blocks, options.block_size);
  const plan::ModelSpec spec = plan::model_spec_of(config);
  const double link_bandwidth = plan::find_gpu("h200").link_bandwidth;

  auto table_of = [&](int sequence) {
    std::vector<int32_t> table(blocks_per_sequence);
    for (int b = 0; b < blocks_per_sequence; ++b) table[b] = (sequence % cached_sequences) * blocks_per_sequence + b;
    return table;
  };

  nlohmann::json decode = nlohmann::json::array(), prefill = nlohmann::json::array();
  for (int context : o.contexts) {
    for (int batch : o.batches) {
      auto step_batch = [&](int step) {
        model::ForwardBatch b;
        for (int s = 0; s < batch; ++s)
          b.add_sequence({(s * 7919 + step * 31) % config.vocab_size}, context - 1 + step, table_of(s),
                         options.block_size, false);
        b.dp_tokens = sim.dp_tokens(batch);
        return b;
      };
      for (int step = 0; step < 3; ++step) model->forward_on_device(step_batch(step), o.graphs);
      model->synchronize();
      if (o.profile_step && decode.empty()) {  // one eager step of the first point, for ncu
        ops::cuda::profiler_range(true);
        model->forward_on_device(step_batch(0));
        model->synchronize();
        ops::cuda::profiler_range(false);
      }
      std::vector<double> times;
      for (int step = 0; step < o.steps; ++step) {
        const auto b = step_batch(step);
        const auto t0 = Clock::now();
        model->forward_on_device(b, o.graphs);
        model->synchronize();
        times.push_back(seconds_since(t0));
      }
      std::sort(times.begin(), times.end());
      const double median = times[times.size() / 2];
      // The same steps with their outputs on the host: every sequence's logits row (vocab fp32),
      // as sampled requests need, and each row's argmax only, as the engine takes greedy ones.
      auto median_of = [&](auto run_step) {
        std::vector<double> step_times;
        for (int step = 0; step < std::max(3, o.steps / 2); ++step) {
          const auto b = step_batch(step);
          const auto t0 = Clock::now();
          run_step(b);
          step_times.push_back(seconds_since(t0));
        }
        std::sort(step_times.begin(), step_times.end());
        return step_times[step_times.size() / 2];
      };
      const double host_median = median_of([&](const model::ForwardBatch& b) { model->forward(b, o.graphs); });
      const std::vector<model::RowOutput> argmax_only(batch);
      const double argmax_median =
          median_of([&](const model::ForwardBatch& b) { model->forward_selected(b, argmax_only, o.graphs); });
      // Sampled rows (temperature 0.8, top_p 0.95), drawn as --sample-on-device says.
      std::vector<model::RowOutput> sampled(batch);
      for (int s = 0; s < batch; ++s) {
        sampled[s].kind = model::RowOutput::Kind::kSample;
        sampled[s].temperature = 0.8f;
        sampled[s].top_p = 0.95f;
        sampled[s].canonical = (s + 0.5) / batch;
      }
      const double sampled_median =
          median_of([&](const model::ForwardBatch& b) { model->forward_selected(b, sampled, o.graphs); });
      // Greedy rows under a structured-output token mask each (random bits, about half the
      // vocabulary allowed), applied on the device as the engine sends them.
      auto mask = std::make_shared<std::vector<uint32_t>>((config.vocab_size + 31) / 32);
      for (size_t w = 0; w < mask->size(); ++w) (*mask)[w] = static_cast<uint32_t>((w + 1) * 2654435761u) | 1u;
      if (config.vocab_size % 32) mask->back() &= (uint32_t{1} << (config.vocab_size % 32)) - 1;  // none past vocab
      // With --token-mask-host-us, each row's mask is made on demand after that much host work
      // (a new grammar state's walk of the vocabulary), which the runner does while the step's
      // forward runs: what the engine's structured outputs cost a step beyond the device's part.
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
      const double masked_median =
          median_of([&](const model::ForwardBatch& b) { model->forward_selected(b, masked, o.graphs); });
      const nlohmann::json phases = phase_breakdown(*model, [&](int step) { model->forward_on_device(step_batch(step)); });
      // FP8 linear layers read one byte a value instead of two.
      const std::string kv_dtype = plan_kv_dtype(o.kv_cache_dtype);
      const double bytes = (sim.enabled() ? rank_decode_bytes(spec, sim, o.expert_format, kv_dtype, batch, context)
                                          : decode_bytes(spec, o.expert_format, kv_dtype, batch, context)) -
                           static_cast<double>(model->fp8_linear_parameters());
      const double bound = bytes / bandwidth;
      // The routed experts' share of that bound: a simulated rank's own experts.
      const double experts_bound = (sim.enabled() ? rank_touched_experts(spec, sim, batch) * spec.expert_bytes(o.expert_format)
                                                  : expert_bytes(spec, o.expert_format, batch)) /
                                   bandwidth;
      decode.push_back({{"batch", batch},
                        {"context", context},
                        {"step_ms", median * 1e3},
                        {"min_step_ms", times.front() * 1e3},
                        {"tokens_per_s", batch / median},
                        {"bytes_moved", bytes},
                        {"bound_ms", bound * 1e3},
                        {"ratio_to_bound", median / bound},
                        {"experts_bound_ms", experts_bound * 1e3},
                        {"step_with_host_logits_ms", host_median * 1e3},
                        {"step_with_argmax_ms", argmax_median * 1e3},
                        {"step_with_sampling_ms", sampled_median * 1e3},
                        {"step_with_token_masks_ms", masked_median * 1e3},
                        {"token_mask_host_us", o.token_mask_host_us},
                        {"eager_phases_ms", phases}});
      std::cerr << fmt::format("  decode batch {:>3} context {:>5}: {:8.3f} ms/step  {:9.1f} tok/s  bound {:7.3f} ms  x{:.2f}"
                               "  (logits to the host: {:.3f} ms, argmax only: {:.3f} ms, sampled: {:.3f} ms)\n",
                               batch, context, median * 1e3, batch / median, bound * 1e3, median / bound,
                               host_median * 1e3, argmax_median * 1e3, sampled_median * 1e3);
      std::cerr << fmt::format("    every row under a token mask (on the device{}): {:.3f} ms, {:+.3f} ms against argmax only\n",
                               o.token_mask_host_us > 0 ? fmt::format(", each made after {} us on the host", o.token_mask_host_us) : "",
                               masked_median * 1e3, (masked_median - argmax_median) * 1e3);
      if (sim.enabled()) {
        decode.back()["cache_shared_by_sequences"] = batch > cached_sequences;
        decode.back()["projection"] = project_step(spec, sim, argmax_median, batch, link_bandwidth);
        const nlohmann::json& p = decode.back()["projection"];
        std::cerr << fmt::format("    with the collectives ({} calls, {:.2f} MB a rank, {:.3f} ms): {:.3f} ms/step, "
                                 "{:.0f} output tok/s per GPU, {:.0f} for the node{}\n",
                                 p["collective_calls"].get<int>(), p["collective_bytes_sent"].get<double>() / 1e6,
                                 p["collectives_ms"].get<double>(), p["projected_step_ms"].get<double>(),
                                 p["projected_tokens_per_s_per_gpu"].get<double>(),
                                 p["projected_node_tokens_per_s"].get<double>(),
                                 batch > cached_sequences ? " (sequences share cache blocks)" : "");
      }
      if (o.speculative_steps > 0)
        decode.back()["speculative"] =
            speculation_costs(*model, config, o.speculative_steps, batch, context, o.steps, median,
                              (phases.value("embed", 0.0) + phases.value("head", 0.0)) / 1e3, full_layers, table_of,
                              options.block_size);
    }
  }
  for (int tokens : o.prefills) {
    std::vector<int32_t> prompt(tokens);
    for (int i = 0; i < tokens; ++i) prompt[i] = (i * 104729 + 7) % config.vocab_size;
    model::ForwardBatch b;
    b.add_sequence(prompt, 0, table_of(0), options.block_size, false);
    b.dp_tokens = sim.dp_tokens(tokens);
    model->forward_on_device(b);
    model->synchronize();
    if (o.profile_prefill && prefill.empty()) {  // one prefill of the first length, for ncu
      ops::cuda::profiler_range(true);
      model->forward_on_device(b);
      model->synchronize();
      ops::cuda::profiler_range(false);
    }
    std::vector<double> times;
    for (int rep = 0; rep < 3; ++rep) {
      const auto t0 = Clock::now();
      model->forward_on_device(b);
      model->synchronize();
      times.push_back(seconds_since(t0));
    }
    const double best = *std::min_element(times.begin(), times.end());
    const double flops = prefill_linear_flops(spec, tokens);
    const nlohmann::json phases = phase_breakdown(*model, [&](int) { model->forward_on_device(b); });
    // The linear layers' own rate: their FLOPs over the eager time of the phases made of them.
    double linear_ms = 0;
    for (const char* name : kLinearPhases) linear_ms += phases.value(name, 0.0);
    const double linear_rate = linear_ms > 0 ? flops / (linear_ms / 1e3) : 0.0;
    prefill.push_back({{"tokens", tokens},
                       {"seconds", best},
                       {"tokens_per_s", tokens / best},
                       {"linear_flops", flops},
                       {"linear_flops_per_s", flops / best},
                       {"fraction_of_gemm_rate", flops / best / gemm_rate},
                       {"linear_phases_ms", linear_ms},
                       {"linear_phases_fraction_of_gemm_rate", linear_rate / gemm_rate},
                       {"phases_ms", phases}});
    std::cerr << fmt::format("  prefill {:>5} tokens: {:8.1f} ms  {:9.0f} tok/s  linear FLOPs at {:.1f} TFLOP/s = {:.2f} of "
                             "GEMM rate over the whole step, {:.2f} over the linear phases ({:.1f} ms)\n",
                             tokens, best * 1e3, tokens / best, flops / best / 1e12, flops / best / gemm_rate,
                             linear_rate / gemm_rate, linear_ms);
    if (sim.enabled()) {
      prefill.back()["projection"] = project_step(spec, sim, best, tokens, link_bandwidth);
      std::cerr << fmt::format("    with the collectives: {:.1f} ms\n",
                               prefill.back()["projection"]["projected_step_ms"].get<double>());
    }
  }
  nlohmann::json out = {{"benchmark", "cuda-step"},
                        {"config", path},
                        {"num_layers", config.num_hidden_layers},
                        {"weights", "bf16 synthetic"},
                        {"expert_format", o.expert_format},
                        {"small_batch_gemv_tokens", o.kernels.small_batch_gemv_tokens},
                        {"skinny_gemm_tokens", o.kernels.skinny_gemm_tokens},
                        {"skinny_group_tokens", o.kernels.skinny_group_tokens},
                        {"fused_attention_min_tokens", o.kernels.fused_attention_min_tokens},
                        {"fused_prefill_attention", o.kernels.fused_prefill_attention},
                        {"wgmma_attention", o.kernels.wgmma_attention},
                        {"wgmma_attention_splits", o.kernels.wgmma_attention_splits},
                        {"warp_specialized_attention", o.kernels.warp_specialized_attention},
                        {"wgmma_indexer", o.kernels.wgmma_indexer},
                        {"wgmma_experts_min_pairs", o.kernels.wgmma_experts_min_pairs},
                        {"wgmma_bf16_experts_min_pairs", o.kernels.wgmma_bf16_experts_min_pairs},
                        {"wgmma_fp8_experts_min_pairs", o.kernels.wgmma_fp8_experts_min_pairs},
                        {"wgmma_experts_tile_rows", o.kernels.wgmma_experts_tile_rows},
                        {"wgmma_bf16_experts_max_pairs", o.kernels.wgmma_bf16_experts_max_pairs},
                        {"specialized_bf16_experts_min_pairs", o.kernels.specialized_bf16_experts_min_pairs},
                        {"specialized_mxfp4_experts_min_pairs", o.kernels.specialized_mxfp4_experts_min_pairs},
                        {"wgmma_rs_mxfp4_experts_min_pairs", o.kernels.wgmma_rs_mxfp4_experts_min_pairs},
                        {"paired_bf16_experts", o.kernels.paired_bf16_experts},
                        {"bf16_expert_sums", o.kernels.bf16_expert_sums},
                        {"bf16_queries_min_tokens", o.kernels.bf16_queries_min_tokens},
                        {"wgmma_fp8_experts", o.kernels.wgmma_fp8_experts},
                        {"specialized_fp8_experts", o.kernels.specialized_fp8_experts},
                        {"fp8_prefill_indexer", o.kernels.fp8_prefill_indexer},
                        {"stream_experts_min_pairs", o.kernels.stream_experts_min_pairs},
                        {"stream_experts_max_pairs", o.kernels.stream_experts_max_pairs},
                        {"stream_experts_shape", o.kernels.stream_experts_shape},
                        {"stream_experts_chunk_factor", o.kernels.stream_experts_chunk_factor},
                        {"grouped_expert_gemm", o.kernels.grouped_expert_gemm},
                        {"sample_on_device", o.kernels.sample_on_device},
                        {"sample_blocks_per_row", o.kernels.sample_blocks_per_row},
                        {"indexer_threads_per_key", o.kernels.indexer_threads_per_key},
                        {"wgmma_decode_indexer", o.kernels.wgmma_decode_indexer},
                        {"indexer_topk_blocks", o.kernels.indexer_topk_blocks},
                        {"overlap_shared_expert_tokens", o.kernels.overlap_shared_expert_tokens},
                        {"speculative_steps", o.speculative_steps},
                        {"graphs", o.graphs},
                        {"weight_bytes", model->weight_bytes()},
                        {"quantization", o.quantization.empty() ? std::string("none") : o.quantization},
                        {"kv_cache_dtype", kv::cache_dtype_name(kv::parse_cache_dtype(o.kv_cache_dtype))},
                        {"fp8_linear_matrices", model->linear_matrices().second},
                        {"gpu_memory", memory_json},
                        {"copy_bandwidth_bytes_per_s", bandwidth},
                        {"bf16_gemm_flops_per_s", gemm_rate},
                        {"fp8_block_gemm_flops_per_s", fp8_rate.error.empty() ? nlohmann::json(fp8_rate.gemm) : nullptr},
                        {"fp8_block_gemm_with_quantize_flops_per_s",
                         fp8_rate.error.empty() ? nlohmann::json(fp8_rate.with_quantize) : nullptr},
                        {"fp8_block_gemm_error", fp8_rate.error},
                        {"decode", decode},
                        {"prefill", prefill}};
  out["cached_sequences"] = cached_sequences;
  if (sim.enabled())
    out["simulated_rank"] = {{"rank", sim.rank},
                             {"world", sim.parallel_layout().world_size()},
                             {"layout", sim.flags.world_size() > 1 ? "flags" : sim.layout},
                             {"describe", sim.parallel_layout().describe()},
                             {"shard", shard.describe()},
                             {"link_bandwidth_bytes_per_s", link_bandwidth},
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

}  // namespace

void add_bench_step_command(CLI::App& app) {
  auto o = std::make_shared<BenchStepOptions>();
  CLI::App* cmd = app.add_subcommand(
      "bench-step", "Time CUDA forward steps (decode by batch and context, prefill by length) against the hardware limits");
  auto* model = cmd->add_option("--model", o->model_dir, "Model folder (its config.json gives the shapes)")
                    ->check(CLI::ExistingDirectory);
  auto* config = cmd->add_option("--config", o->config_file, "A config.json file")->check(CLI::ExistingFile);
  model->excludes(config);
  cmd->add_flag("--synthetic", o->synthetic, "Seeded random weights made on the GPU (no checkpoint)");
  cmd->add_option("--num-layers", o->num_layers, "Keep the first N decoder layers")->check(CLI::Range(1, 1000));
  cmd->add_option("--batch", o->batches, "Decode batch sizes")->delimiter(',')->check(CLI::Range(1, 4096))->capture_default_str();
  cmd->add_option("--context", o->contexts, "Decode context lengths")->delimiter(',')->check(CLI::Range(1, 1 << 20))->capture_default_str();
  cmd->add_option("--prefill", o->prefills, "Prefill prompt lengths")->delimiter(',')->check(CLI::Range(1, 1 << 20))->capture_default_str();
  cmd->add_option("--steps", o->steps, "Timed decode steps per point")->check(CLI::Range(1, 100000))->capture_default_str();
  cmd->add_option("--graphs", o->graphs, "Replay decode steps as CUDA graphs (true/false)")->capture_default_str();
  cmd->add_flag("--profile-step", o->profile_step,
                "Run one eager decode step of the first point between cudaProfilerStart and cudaProfilerStop "
                "(for ncu --profile-from-start off)");
  cmd->add_flag("--profile-prefill", o->profile_prefill,
                "Run one prefill of the first --prefill length between cudaProfilerStart and cudaProfilerStop "
                "(for ncu --profile-from-start off)");
  cmd->add_option("--seed", o->seed, "Weight seed")->capture_default_str();
  cmd->add_option("--speculative-steps", o->speculative_steps,
                  "Also time MTP speculation with K drafts (synthetic MTP layer): verify and draft steps, break-even "
                  "acceptance length")
      ->check(CLI::Range(0, 16))
      ->capture_default_str();
  cmd->add_option("--project-layers", o->project_layers,
                  "Depth the speculation break-even is projected to (default: the config's num_hidden_layers)")
      ->check(CLI::Range(1, 1000));
  cmd->add_option("--gemv-tokens", o->kernels.small_batch_gemv_tokens,
                  "Linear layers of at most N tokens through glmserve's GEMV instead of cuBLAS (0: never, at most 4)")
      ->check(CLI::Range(0, 4))
      ->capture_default_str();
  cmd->add_option("--skinny-gemm-tokens", o->kernels.skinny_gemm_tokens,
                  "Linear layers of more tokens than the GEMV takes, up to N, through glmserve's tensor-core "
                  "skinny GEMM instead of cuBLAS (0: never, at most 128)")
      ->check(CLI::Range(0, 128))
      ->capture_default_str();
  cmd->add_option("--skinny-group-tokens", o->kernels.skinny_group_tokens,
                  "The attention's groups of projections over the same input, up to N tokens, through the skinny "
                  "GEMM (0: never, at most 128)")
      ->check(CLI::Range(0, 128))
      ->capture_default_str();
  cmd->add_option("--fused-attention-min-tokens", o->kernels.fused_attention_min_tokens,
                  "Decode batches of at least N tokens attend in one fused pass, smaller ones through gathered-row "
                  "GEMMs (0: always fused)")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--fused-prefill-attention", o->kernels.fused_prefill_attention,
                  "Long prefill chunks whose context is long against the top-k attend in the fused pass over each "
                  "token's top-k rows (true/false; false: always dense scores over the causal extent)")
      ->capture_default_str();
  cmd->add_option("--wgmma-attention", o->kernels.wgmma_attention,
                  "Fused attention passes with a block per token on Hopper's warpgroup tensor cores (true/false; "
                  "false: the mma.sync kernel)")
      ->capture_default_str();
  cmd->add_option("--wgmma-attention-splits", o->kernels.wgmma_attention_splits,
                  "The wgmma pass also for decode batches of fewer tokens than SMs, each token's rows split over "
                  "blocks (true/false; false: those take the mma.sync kernel)")
      ->capture_default_str();
  cmd->add_option("--warp-specialized-attention", o->kernels.warp_specialized_attention,
                  "The wgmma pass over bf16 rows without splits in the warp-specialised kernel: a producer warpgroup "
                  "gathers rows into two stages while two consumers score 32 rows each (true/false)")
      ->capture_default_str();
  cmd->add_option("--wgmma-decode-indexer", o->kernels.wgmma_decode_indexer,
                  "Decode tokens' indexer scores on the warpgroup tensor cores (true/false; false: fp32 FMAs, a "
                  "key a thread)")
      ->capture_default_str();
  cmd->add_option("--wgmma-indexer", o->kernels.wgmma_indexer,
                  "Long prefill chunks' indexer scores on the warpgroup tensor cores, fused with the sum over heads "
                  "(true/false; false: a TF32 GEMM through per-head products in memory)")
      ->capture_default_str();
  cmd->add_option("--fp8-prefill-indexer", o->kernels.fp8_prefill_indexer,
                  "Those indexer scores with E4M3 queries and keys on the FP8 tensor cores (true/false; DeepSeek-V3.2's "
                  "FP8 indexer)")
      ->capture_default_str();
  cmd->add_option("--wgmma-experts-min-pairs", o->kernels.wgmma_experts_min_pairs,
                  "Routed experts (tiled MXFP4 or bf16) run as grouped GEMMs on the warpgroup tensor cores from this "
                  "many pairs per expert on average (0: never)")
      ->check(non_negative_number())
      ->capture_default_str();
  cmd->add_option("--wgmma-bf16-experts-min-pairs", o->kernels.wgmma_bf16_experts_min_pairs,
                  "bf16 routed experts take those GEMMs from this many pairs per expert instead (0: as "
                  "--wgmma-experts-min-pairs)")
      ->check(non_negative_number())
      ->capture_default_str();
  cmd->add_option("--wgmma-fp8-experts-min-pairs", o->kernels.wgmma_fp8_experts_min_pairs,
                  "Block-FP8 routed experts take the W8A8 grouped GEMMs from this many pairs per expert (0: as "
                  "--wgmma-experts-min-pairs)")
      ->check(non_negative_number())
      ->capture_default_str();
  cmd->add_option("--wgmma-bf16-experts-max-pairs", o->kernels.wgmma_bf16_experts_max_pairs,
                  "bf16 routed experts take those GEMMs only below this many pairs per expert (0: no bound; above, "
                  "cuBLAS's grouped GEMM)")
      ->check(non_negative_number())
      ->capture_default_str();
  cmd->add_option("--specialized-bf16-experts-min-pairs", o->kernels.specialized_bf16_experts_min_pairs,
                  "bf16 routed experts from this many pairs per expert take the warp-specialised grouped GEMMs (0: "
                  "never)")
      ->check(non_negative_number())
      ->capture_default_str();
  cmd->add_option("--specialized-mxfp4-experts-min-pairs", o->kernels.specialized_mxfp4_experts_min_pairs,
                  "Tiled MXFP4 routed experts from this many pairs per expert take the warp-specialised grouped GEMMs, "
                  "widened by their producer (0: never)")
      ->check(non_negative_number())
      ->capture_default_str();
  cmd->add_option("--wgmma-rs-mxfp4-experts-min-pairs", o->kernels.wgmma_rs_mxfp4_experts_min_pairs,
                  "Tiled MXFP4 routed experts from this many pairs per expert take the grouped GEMMs that widen the "
                  "codes into wgmma's A registers (0: never)")
      ->check(non_negative_number())
      ->capture_default_str();
  cmd->add_option("--paired-bf16-experts", o->kernels.paired_bf16_experts,
                  "Those GEMMs take an expert's row tiles two by two in thread block clusters that load each weight "
                  "line once for both (TMA multicast; true/false)")
      ->capture_default_str();
  cmd->add_option("--bf16-expert-sums", o->kernels.bf16_expert_sums,
                  "The grouped expert GEMMs of prefills write their down sums in bf16 for the combine (true/false; "
                  "false: fp32)")
      ->capture_default_str();
  cmd->add_option("--bf16-queries-min-tokens", o->kernels.bf16_queries_min_tokens,
                  "Steps of at least this many tokens with bf16 q_b weights write the queries in bf16 straight from "
                  "the GEMM (0: never)")
      ->check(non_negative_number())
      ->capture_default_str();
  cmd->add_option("--wgmma-fp8-experts", o->kernels.wgmma_fp8_experts,
                  "Block-FP8 routed experts take W8A8 grouped GEMMs on the FP8 tensor cores from those pairs per "
                  "expert (true/false; false: mma.sync kernels, then each expert widened to bf16 for cuBLAS)")
      ->capture_default_str();
  cmd->add_option("--specialized-fp8-experts", o->kernels.specialized_fp8_experts,
                  "Those GEMMs warp-specialised: a producer warpgroup copies while two consumer warpgroups multiply "
                  "(true/false)")
      ->capture_default_str();
  cmd->add_option("--wgmma-experts-tile-rows", o->kernels.wgmma_experts_tile_rows,
                  "Grouped rows a block of those GEMMs: 64, 128, or 0 (128 from 80 pairs per expert)")
      ->check(CLI::IsMember({0, 64, 128}))
      ->capture_default_str();
  cmd->add_option("--stream-experts-min-pairs", o->kernels.stream_experts_min_pairs,
                  "MXFP4 routed experts of steps with from this many pairs per expert on average run on the streamed "
                  "decode kernels")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
  cmd->add_option("--stream-experts-max-pairs", o->kernels.stream_experts_max_pairs,
                  "... up to this many pairs per expert on average (0: never)")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
  cmd->add_option("--stream-experts-shape", o->kernels.stream_experts_shape,
                  "Their shape: mma.sync 0 (1 row fragment a warp, 8 steps in flight, 4 warps a block), 1 (2, 6, 4), "
                  "2 (1, 6, 8); wgmma 3 (6 steps, 8 warps), 4 (3 slots of 2 steps, 8 warps); or -1 (1 up to 8 pairs "
                  "per expert, 4 above)")
      ->check(CLI::IsMember({-1, 0, 1, 2, 3, 4}))
      ->capture_default_str();
  cmd->add_option("--stream-experts-chunk-factor", o->kernels.stream_experts_chunk_factor,
                  "Their token chunk: this many times the average pairs per expert (8, 16 or 32 tokens)")
      ->check(CLI::Range(1, 8))
      ->capture_default_str();
  cmd->add_option("--grouped-expert-gemm", o->kernels.grouped_expert_gemm,
                  "bf16 experts of large batches through one cuBLAS grouped GEMM per projection (true/false)")
      ->capture_default_str();
  cmd->add_option("--sample-on-device", o->kernels.sample_on_device,
                  "Sampled rows drawn on the GPU (true/false) instead of copied back and drawn on the host")
      ->capture_default_str();
  cmd->add_option("--sample-blocks-per-row", o->kernels.sample_blocks_per_row,
                  "Blocks (a thread block cluster) that draw each sampled row on the GPU: 1, 2, 4 or 8")
      ->check(CLI::IsMember({1, 2, 4, 8}))
      ->capture_default_str();
  cmd->add_option("--indexer-threads-per-key", o->kernels.indexer_threads_per_key,
                  "Lanes that score each cached key in the DSA indexer: 1 or 4")
      ->check(CLI::IsMember({1, 4}))
      ->capture_default_str();
  cmd->add_option("--indexer-topk-blocks", o->kernels.indexer_topk_blocks,
                  "Blocks (a thread block cluster) that select each token's top-k positions: 1, 2, 4 or 8")
      ->check(CLI::IsMember({1, 2, 4, 8}))
      ->capture_default_str();
  cmd->add_option("--overlap-shared-expert-tokens", o->kernels.overlap_shared_expert_tokens,
                  "Steps of at most this many tokens run the MoE shared expert on a second stream beside the routing "
                  "(0: never; untimed steps only)")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  cmd->add_option("-q,--quantization", o->quantization,
                  "fp8: the linear layers in block FP8 (serve's flag); none: bf16 (the default)")
      ->check(CLI::IsMember({"none", "fp8"}));
  cmd->add_option("--kv-cache-dtype", o->kv_cache_dtype,
                  "The cache's rows: auto (bf16) or fp8 / fp8_e4m3 (E4M3 with a scale per 128 values, serve's flag)")
      ->check(CLI::IsMember({"auto", "fp8", "fp8_e4m3", "fp8_ds_mla"}))
      ->capture_default_str();
  cmd->add_option("--expert-format", o->expert_format, "Routed experts' storage: bf16, mxfp4 (W4A16) or fp8 (block E4M3)")
      ->check(CLI::IsMember({"bf16", "mxfp4", "fp8"}))
      ->capture_default_str();
  cmd->add_option("--simulate-rank", o->simulation.rank,
                  "Run exactly what this rank of --world does (its experts, heads and batch), collectives as "
                  "device copies plus their time at the link bandwidth")
      ->check(CLI::Range(0, 4095));
  cmd->add_option("--world", o->simulation.world, "Ranks of the simulated layout")->check(CLI::Range(1, 4096));
  cmd->add_option("--tensor-parallel-size", o->simulation.flags.tensor_parallel,
                  "The simulated layout in vLLM's terms (also -tp N; overrides --world/--layout)")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--data-parallel-size", o->simulation.flags.data_parallel, "The simulated layout's DP size (also -dp N)")
      ->check(CLI::Range(1, 1024));
  cmd->add_flag("--enable-expert-parallel", o->simulation.flags.expert_parallel,
                "The simulated layout spreads whole experts over its ranks");
  cmd->add_option("--layout", o->simulation.layout,
                  "Simulated layout: dp-ep (DP attention, EP MoE), tp (experts split by width) or tp-ep")
      ->check(CLI::IsMember({"dp-ep", "tp", "tp-ep"}))
      ->capture_default_str();
  cmd->add_option("--gpu-memory-utilization", o->gpu_memory_utilization,
                  "Fraction of the GPU the weights, workspaces and cache may fill (more sequences share cache blocks)")
      ->check(CLI::Range(0.05, 1.0))
      ->capture_default_str();
  cmd->add_option("--token-mask-host-us", o->token_mask_host_us,
                  "The token-masked rows' masks are made on demand after this many microseconds of host work "
                  "each (as a structured output's new grammar state costs), overlapping the step's forward")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
  cmd->add_option("--json", o->json_out, "Write the results as JSON to this file");
  cmd->callback([o] {
    if (o->model_dir.empty() && o->config_file.empty()) fail("give --config FILE or --model DIR");
    run_bench_step(*o);
  });
}

}  // namespace glms::cli
