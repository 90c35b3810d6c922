// SGLang's launch_server flags as `glmserve serve` takes them (docs/operations.md, "Coming from
// SGLang"): its layouts (--enable-dp-attention, --ep-size), EAGLE/NEXTN speculation with the
// checkpoint's MTP layer, --chunked-prefill-size, notes for its kernel back-ends, and refusals with
// what to type instead. Its names of glmserve's own flags (--model-path, --tp-size, --dp-size,
// --context-length, --max-running-requests, --mem-fraction-static, --random-seed,
// --disable-radix-cache, --disable-cuda-graph) are aliases where those flags are declared.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace CLI { class App; }

namespace glms::cli {

struct SglangFlags {
  bool enable_dp_attention = false, enable_metrics = false;
  int ep_size = 0;  // 0: not given
  std::string speculative_algorithm, speculative_draft_model_path;
  int speculative_num_steps = 0, speculative_eagle_topk = 0, speculative_num_draft_tokens = 0;  // 0: not given
  int page_size = 0, cuda_graph_max_bs = 0;
  int chunked_prefill_size = 0;  // 0: not given; -1: SGLang's "no chunking"
  std::string attention_backend, nsa_prefill_backend, nsa_decode_backend, moe_a2a_backend, moe_runner_backend;
  std::string dist_init_addr;
  // The flags of kSglangFlagsWithNothingToSet (sglang_flags.cpp) given, with their values.
  std::map<std::string, std::vector<std::string>> nothing_to_set;  // cli::GivenFlags
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
  int max_batch_tokens = 0;        // --chunked-prefill-size N > 0: tokens a step at most
};

// Checks SGLang's flags and turns them into glmserve's: --enable-dp-attention makes --tp-size the
// whole layout's ranks (glmserve's tensor-parallel size becomes tp / dp), --ep-size of SGLang's
// expert group spreads whole experts over every rank. Throws glms::Error saying what to type
// instead.
SglangSettings resolve_sglang_flags(const SglangFlags& flags, const std::string& model_dir, int block_size,
                                    SglangLayout& layout);

}  // namespace glms::cli
