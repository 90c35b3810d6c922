// glmserve bench-step's options and its run (bench_step_run.cpp), apart from the command line
// that fills them (cmd_bench_step.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cli/bench_step_rank.h"
#include "model/cuda/model.h"  // CudaModelOptions' defaults (declarations only)

namespace glms::cli {

struct BenchStepOptions {
  std::string model_dir, config_file, json_out;
  bool synthetic = false;
  int num_layers = -1;
  std::vector<int> batches = {1, 8, 32, 64, 128};
  std::vector<int> contexts = {2048, 16384};
  std::vector<int> prefills = {2048, 8192};
  int prefill_context = 0;              // cached positions before each prefill (a prefix-cache hit's)
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
  std::string project_workload = "agentic";  // a bench preset the simulated rank's rates project to
  double gpu_memory_utilization = 0.9; // what the cache may fill (sequences beyond it share blocks)
  int token_mask_host_us = 0;          // > 0: masked rows' masks made on demand after this host work
};

// Builds the model the options describe and times every decode and prefill point, printing each
// and writing the JSON record (--json, or stdout). Fails without a GPU.
void run_bench_step(const BenchStepOptions& o);

}  // namespace glms::cli
