// glmserve plan: memory, rooflines, layouts and cost of serving a model on a number of GPUs,
// from its config.json alone (glm_moe_dsa, DeepSeek-style MLA or dense GQA models).
#include <CLI/CLI.hpp>
#include <iostream>
#include <memory>

#include "bench/workload.h"
#include "cli/commands.h"
#include "cli/validators.h"
#include "core/error.h"
#include "plan/roofline.h"

namespace glms::cli {

namespace {

struct PlanOptions {
  std::string model_dir, config_file;
  plan::PlanInputs inputs;
  double reserve_percent = 10;
  double gpu_memory_utilization = 0;  // > 0: the reserve is what it leaves (serve's flag)
  std::string speculative;
  int speculative_steps = 3;
  std::string workload;  // a bench preset
  bool json = false;
};

void run_plan(const PlanOptions& o) {
  const std::string path = o.model_dir.empty() ? o.config_file : o.model_dir;
  if (path.empty()) fail("give --model DIR or --config FILE");
  plan::PlanInputs inputs = o.inputs;
  inputs.reserve_fraction =
      o.gpu_memory_utilization > 0 ? 1.0 - o.gpu_memory_utilization : o.reserve_percent / 100.0;
  inputs.speculative_steps = o.speculative.empty() ? 0 : o.speculative_steps;
  inputs.kv_dtype = inputs.kv_dtype == "auto" || inputs.kv_dtype == "bf16" ? "bf16" : "fp8";
  if (!o.workload.empty()) {
    const bench::Preset w = *bench::find_preset(o.workload);
    inputs.workload = {w.name, w.input_len, w.output_len, w.prefix_hit};
  }
  const plan::ModelSpec model = plan::load_model_spec(path);
  const plan::PlanResult result = plan::make_plan(model, inputs, path);
  std::cout << (o.json ? plan::render_json(result) + "\n" : plan::render_text(result)) << std::flush;
}

// Owning the GPUs instead of renting them (plan/tco.h): --gpu-price turns it on; the rest are
// assumptions with round defaults, each repeated in the report.
void add_tco_options(CLI::App* cmd, plan::TcoInputs& t) {
  const auto money = CLI::Range(0.0, 1e9);
  cmd->add_option("--gpu-price", t.gpu_price, "USD per GPU bought: price the GPU-hour as owned (TCO) instead of rented")
      ->check(money);
  cmd->add_option("--host-price-per-gpu", t.host_price_per_gpu,
                  "TCO: USD of the server around each GPU (CPUs, memory, NICs, chassis)")
      ->check(money)
      ->capture_default_str();
  cmd->add_option("--amortization-years", t.years, "TCO: years the hardware is written off over")
      ->check(CLI::Range(0.1, 50.0))
      ->capture_default_str();
  cmd->add_option("--usd-per-kwh", t.usd_per_kwh, "TCO: electricity price")->check(money)->capture_default_str();
  cmd->add_option("--pue", t.pue, "TCO: facility power over IT power (cooling, power distribution)")
      ->check(CLI::Range(1.0, 5.0))
      ->capture_default_str();
  cmd->add_option("--host-watts-per-gpu", t.host_watts_per_gpu, "TCO: the host's draw per GPU beside the board power")
      ->check(CLI::Range(0.0, 1e5))
      ->capture_default_str();
  cmd->add_option("--power-share", t.power_share, "TCO: average draw as a share of board + host power")
      ->check(CLI::Range(0.01, 1.0))
      ->capture_default_str();
  cmd->add_option("--usd-per-kw-month", t.usd_per_kw_month, "TCO: space (colocation) per kW of IT load a month")
      ->check(money)
      ->capture_default_str();
  cmd->add_option("--maintenance-rate", t.maintenance_per_year,
                  "TCO: support and repairs a year, as a share of the hardware price (0.08 = 8%)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
}

}  // namespace

void add_plan_command(CLI::App& app) {
  auto o = std::make_shared<PlanOptions>();
  CLI::App* cmd = app.add_subcommand(
      "plan", "Capacity and cost plan: weights, KV cache, fit, decode/prefill rooflines, TP vs replicas, $/M tokens");
  auto* model = cmd->add_option("--model", o->model_dir, "Model folder holding config.json, or a Hugging Face repo id in the hub cache")
                    ->transform(local_path_or_cached_repo())
                    ->check(CLI::ExistingDirectory);
  auto* config = cmd->add_option("--config", o->config_file, "A config.json file")->check(CLI::ExistingFile);
  model->excludes(config);
  config->excludes(model);
  cmd->add_option("--gpu", o->inputs.gpu, "GPU kind")
      ->check(CLI::IsMember({"mi355x", "mi300x", "b300", "b200", "h200", "h100"}, CLI::ignore_case))
      ->required();
  cmd->add_option("--gpus", o->inputs.gpus, "Number of GPUs")->check(CLI::Range(1, 4096))->required();
  cmd->add_option("--tp", o->inputs.tp, "Tensor-parallel size of the headline layout (default: all GPUs)")
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--weights", o->inputs.weights, "Weight format")
      ->check(CLI::IsMember({"bf16", "fp8", "mxfp6", "mxfp4"}))
      ->capture_default_str();
  // serve's spellings too (vLLM's --kv-cache-dtype): auto is bf16 on CUDA; the FP8 names are one
  // layout (run_plan reduces them to the planner's bf16 / fp8).
  cmd->add_option("--kv-dtype,--kv-cache-dtype", o->inputs.kv_dtype,
                  "KV cache dtype: bf16 (serve's auto on CUDA) or fp8 (fp8_e4m3: E4M3 rows with scales)")
      ->check(CLI::IsMember({"bf16", "auto", "fp8", "fp8_e4m3", "fp8_ds_mla"}))
      ->capture_default_str();
  cmd->add_option("--context", o->inputs.context, "Tokens per sequence (prompt + output)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 32))
      ->capture_default_str();
  cmd->add_option("--concurrency", o->inputs.concurrency, "Sequences decoding at once")
      ->check(CLI::Range(1, 1 << 24))
      ->capture_default_str();
  cmd->add_option("--gpu-hour-price", o->inputs.usd_per_gpu_hour, "USD per GPU-hour (default: the catalogue's)")
      ->check(CLI::Range(0.0, 1e6));
  add_tco_options(cmd, o->inputs.tco);
  cmd->add_option("--utilization", o->inputs.utilization, "Share of the time the GPUs serve at that rate")
      ->check(CLI::Range(0.001, 1.0))
      ->capture_default_str();
  auto* reserve = cmd->add_option("--reserve", o->reserve_percent, "Percent of each GPU's memory kept for the runtime")
                      ->check(CLI::Range(0.0, 99.0))
                      ->capture_default_str();
  cmd->add_option("--gpu-memory-utilization", o->gpu_memory_utilization,
                  "Fraction of each GPU's memory glmserve serve may hold (as serve's flag; default 0.9 = --reserve 10)")
      ->check(CLI::Range(0.01, 1.0))
      ->excludes(reserve);
  // How glmserve serve would run it: what sizes its workspaces and cache (the serve section).
  cmd->add_flag("--enable-expert-parallel", o->inputs.expert_parallel,
                "The headline layout's data-parallel ranks share whole experts (serve's flag)");
  cmd->add_option("--max-num-batched-tokens", o->inputs.max_num_batched_tokens, "Tokens per step, as serve's flag")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--max-num-seqs", o->inputs.max_num_seqs, "Sequences per step, as serve's flag (default: --concurrency)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--block-size", o->inputs.block_size, "KV cache block, tokens")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  cmd->add_option("--speculative", o->speculative, "Count the MTP layer's weights and cache, as serve --speculative mtp")
      ->check(CLI::IsMember({"mtp"}));
  cmd->add_option("--speculative-steps", o->speculative_steps, "Draft tokens per step (with --speculative mtp)")
      ->check(CLI::Range(1, 16))
      ->capture_default_str();
  cmd->add_option("--measured-tokens-per-s", o->inputs.measured_tokens_per_s,
                  "Price a measured aggregate output throughput instead of the decode bound")
      ->check(CLI::Range(0.0, 1e12));
  cmd->add_option("--workload", o->workload,
                  "Also bound a bench preset's requests (agentic: 20k in, 60% cached, 1k out): output tok/s per GPU "
                  "with their prefill, requests/s and $ per 1000 requests")
      ->check(CLI::IsMember(bench::preset_names()));
  cmd->add_flag("--json", o->json, "Print JSON");
  cmd->callback([o]() { run_plan(*o); });
}

}  // namespace glms::cli
