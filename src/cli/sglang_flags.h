// SGLang's launch_server flags as `glmserve serve` takes them (docs/operations.md, "Coming from
// SGLang"): its names for glmserve's settings (--model-path, --tp-size, --context-length, ...),
// its layouts (--enable-dp-attention, --ep-size), EAGLE/NEXTN speculation with the checkpoint's
// MTP layer, notes for its kernel back-ends, and refusals with what to type instead.
#pragma once

#include <string>
#include <vector>

namespace CLI { class App; }

namespace glms::cli {

// serve's command line with SGLang's names of glmserve's flags in glmserve's spelling
// (--model-path -> --model, --tp-size/--tp -> --tensor-parallel-size, --dp-size/--dp ->
// --data-parallel-size, --context-length -> --max-model-len, --chunked-prefill-size ->
// --max-num-batched-tokens, --max-running-requests -> --max-num-seqs, --mem-fraction-static ->
// --gpu-memory-utilization, --random-seed -> --seed, --disable-radix-cache ->
// --no-enable-prefix-caching, --disable-cuda-graph -> --enforce-eager). Other subcommands'
// arguments are returned as given.
std::vector<std::string> normalize_sglang_arguments(const std::vector<std::string>& argv);

struct SglangFlags {
  bool enable_dp_attention = false, enable_metrics = false;
  int ep_size = 0;  // 0: not given
  std::string speculative_algorithm, speculative_draft_model_path;
  int speculative_num_steps = 0, speculative_eagle_topk = 0, speculative_num_draft_tokens = 0;  // 0: not given
  int page_size = 0, cuda_graph_max_bs = 0;
  std::string attention_backend, nsa_prefill_backend, nsa_decode_backend, moe_a2a_backend, moe_runner_backend;
  std::string dist_init_addr;
};

void add_sglang_flags(CLI::App* cmd, SglangFlags& flags);

// The parallel layout SGLang's flags describe, in glmserve's terms (in: as parsed; out: resolved).
struct SglangLayout {
  int tensor_parallel = 1, data_parallel = 1;
  bool expert_parallel = false;
};

struct SglangSettings {
  std::vector<std::string> notes;  // a start-up line for each flag read differently or changing nothing
  int speculative_steps = 0;       // --speculative-algorithm EAGLE/NEXTN: MTP draft tokens a step
};

// Checks SGLang's flags and turns them into glmserve's: --enable-dp-attention makes --tp-size the
// whole layout's ranks (glmserve's tensor-parallel size becomes tp / dp), --ep-size of every rank
// spreads the experts. Throws glms::Error saying what to type instead.
SglangSettings resolve_sglang_flags(const SglangFlags& flags, const std::string& model_dir, int block_size,
                                    SglangLayout& layout);

}  // namespace glms::cli
