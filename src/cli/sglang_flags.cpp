#include "cli/sglang_flags.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <filesystem>

#include "cli/peer_flag_table.h"
#include "core/error.h"

namespace glms::cli {

namespace {

constexpr const char* kOwnScheduler = "glmserve runs its own scheduler and kernels";
constexpr const char* kSglangGraphs = "each decode batch shape's CUDA graph is captured on its first step";

// SGLang's flags with nothing to set here (cli/peer_flag_table.h).
constexpr FlagWithNothingToSet kSglangFlagsWithNothingToSet[] = {
    {"--watchdog-timeout", FlagValues::kOne, false, "no watchdog: a failing step ends its requests with an error and serving goes on"},
    {"--schedule-conservativeness", FlagValues::kOne, false, "new sequences are admitted while the KV cache has free blocks"},
    {"--schedule-policy", FlagValues::kOne, false, "requests are scheduled first come, first served; shared prefixes come from the "
                                       "prefix cache"},
    {"--max-prefill-tokens", FlagValues::kOne, false,
     "each step's prefill chunks fill what --max-num-batched-tokens (--chunked-prefill-size) leaves after its decodes"},
    {"--max-total-tokens", FlagValues::kOne, false, "the KV cache is sized by --mem-fraction-static or --kv-cache-memory"},
    {"--cuda-graph-bs", FlagValues::kSeveral, false, kSglangGraphs},
    {"--enable-torch-compile", FlagValues::kNone, false, "no torch.compile: the kernels are compiled ahead of time"},
    {"--disable-overlap-schedule", FlagValues::kNone, false, kOwnScheduler},
    {"--enable-two-batch-overlap", FlagValues::kNone, false, kOwnScheduler},
    {"--enable-mixed-chunk", FlagValues::kNone, false, "decodes and prefill chunks always share a step"},
    {"--num-continuous-decode-steps", FlagValues::kOne, false, kOwnScheduler},
    {"--sampling-backend", FlagValues::kOne, false, kOwnScheduler},
    {"--grammar-backend", FlagValues::kOne, false, "structured outputs are glmserve's own (docs/api.md)"},
    {"--triton-attention-num-kv-splits", FlagValues::kOne, false, kOwnScheduler},
    {"--stream-interval", FlagValues::kOne, false, "a stream sends each step's tokens as they are made"},
    {"--skip-server-warmup", FlagValues::kNone, false, "glmserve sends itself no warm-up request"},
    {"--log-requests", FlagValues::kNone, false, "an access line per request is the default (request contents are never logged)"},
    {"--log-requests-level", FlagValues::kOne, false, "request contents are never logged"},
    {"--log-level-http", FlagValues::kOne, false, "HTTP log lines follow --log-level"},
    {"--decode-log-interval", FlagValues::kOne, false, "the engine's stats line comes every --log-stats-interval seconds"},
    {"--enable-cache-report", FlagValues::kNone, false, "usage.prompt_tokens_details.cached_tokens is always reported"},
    {"--show-time-cost", FlagValues::kNone, false, "/metrics has each phase's time (glmserve:request_prefill_time_seconds, ...)"},
    {"--model-loader-extra-config", FlagValues::kOne, false, "each rank maps its checkpoint shards (mmap)"},
    {"--file-storage-path", FlagValues::kOne, false, "glmserve stores no files"},
    {"--enable-hierarchical-cache", FlagValues::kNone, false, "the prefix cache lives in GPU memory; there is no host-memory tier"},
    {"--nccl-port", FlagValues::kOne, false, "NCCL's unique id is passed inside the process, or by MPI across nodes"},
    {"--enable-p2p-check", FlagValues::kNone, false, "NCCL checks the GPUs' peer access itself"},
    {"--disable-chunked-prefix-cache", FlagValues::kNone, false, kOwnScheduler},
    {"--enable-deterministic-inference", FlagValues::kNone, true,
     "glmserve's kernels are not batch-invariant: a request's output can change with the batch it runs in"},
    {"--json-model-override-args", FlagValues::kOne, true, "config.json is read as stored: edit it in a copy of the model folder"},
    {"--tool-server", FlagValues::kOne, true, "no built-in tool servers: the client runs the tools it declares"},
    {"--enable-lora", FlagValues::kNone, true, "LoRA adapters are not supported"},
    {"--lora-paths", FlagValues::kSeveral, true, "LoRA adapters are not supported"},
    {"--disaggregation-mode", FlagValues::kOne, true, "prefill/decode disaggregation is not supported"},
};

}  // namespace

void add_sglang_flags(CLI::App* cmd, SglangFlags& f) {
  CLI::Option_group* g = cmd->add_option_group(
      "SGLang's flags",
      "Taken as SGLang takes them, beside its names of the flags above (--model-path, --tp-size, --dp-size, "
      "--context-length, --max-running-requests, --mem-fraction-static, --random-seed, --disable-radix-cache, "
      "--disable-cuda-graph; docs/operations.md)");
  g->add_flag("--enable-dp-attention", f.enable_dp_attention,
              "--tp-size counts every rank; attention in --dp-size groups (glmserve's -tp becomes tp / dp)");
  g->add_option("--ep-size,--ep", f.ep_size,
                "SGLang's expert group (every rank with --enable-dp-attention, else --tp-size): whole experts "
                "spread over every rank")
      ->check(CLI::Range(1, 1024));
  g->add_option("--chunked-prefill-size", f.chunked_prefill_size,
                "Tokens a step at most (as --max-num-batched-tokens; -1 keeps glmserve's chunks)");
  g->add_option("--speculative-algorithm", f.speculative_algorithm,
                "EAGLE or NEXTN: drafts from the checkpoint's MTP layer (as --speculative mtp)");
  g->add_option("--speculative-num-steps", f.speculative_num_steps,
                "Draft tokens a step (default: --speculative-num-draft-tokens - 1, else 3)")
      ->check(CLI::Range(1, 16));
  g->add_option("--speculative-eagle-topk", f.speculative_eagle_topk, "1 (a chain of drafts, no tree)")
      ->check(CLI::Range(1, 64));
  g->add_option("--speculative-num-draft-tokens", f.speculative_num_draft_tokens,
                "--speculative-num-steps + 1 (the tokens a step verifies)")
      ->check(CLI::Range(1, 64));
  g->add_option("--speculative-draft-model-path", f.speculative_draft_model_path,
                "The served folder only (its MTP layer drafts)");
  g->add_option("--page-size", f.page_size, "Accepted, no effect: the KV cache's blocks are 16 tokens");
  g->add_option("--attention-backend", f.attention_backend, "Accepted, no effect: glmserve's own kernels");
  g->add_option("--nsa-prefill-backend", f.nsa_prefill_backend, "Accepted, no effect: glmserve's own kernels");
  g->add_option("--nsa-decode-backend", f.nsa_decode_backend, "Accepted, no effect: glmserve's own kernels");
  g->add_option("--moe-a2a-backend", f.moe_a2a_backend,
                "Accepted: tokens reach their experts by all-gather and reduce-scatter over NCCL");
  g->add_option("--moe-runner-backend", f.moe_runner_backend, "Accepted, no effect: glmserve's own kernels");
  g->add_option("--cuda-graph-max-bs", f.cuda_graph_max_bs,
                "Accepted, no effect: each decode batch shape's graph is captured on its first step");
  g->add_flag("--enable-metrics", f.enable_metrics, "Accepted: /metrics is always served");
  g->add_option("--dist-init-addr", f.dist_init_addr, "Refused: several nodes run under mpirun");
  add_flags_with_nothing_to_set(g, kSglangFlagsWithNothingToSet, f.nothing_to_set);
}

namespace {

// --enable-dp-attention and --ep-size: SGLang counts every rank in --tp-size when attention is
// data-parallel, and spreads experts over --ep-size ranks: all of them with DP attention, a
// replica's --tp-size without it (glmserve then spreads them over every replica's ranks too).
void resolve_layout(const SglangFlags& f, SglangLayout& layout, std::vector<std::string>& notes) {
  const int tp = layout.tensor_parallel, dp = layout.data_parallel;
  if (f.enable_dp_attention) {
    if (tp % dp != 0)
      fail("--enable-dp-attention: --tp-size " + std::to_string(tp) + " (every rank, as SGLang counts them) "
           "is not a multiple of --dp-size " + std::to_string(dp));
    layout.tensor_parallel = tp / dp;
    if (dp > 1)
      notes.push_back("--tp-size " + std::to_string(tp) + " --dp-size " + std::to_string(dp) +
                      " --enable-dp-attention: " + std::to_string(tp) + " ranks, attention in " +
                      std::to_string(dp) + " data-parallel groups of " + std::to_string(layout.tensor_parallel) +
                      " (glmserve's -tp " + std::to_string(layout.tensor_parallel) + " -dp " + std::to_string(dp) + ")");
  }
  if (f.ep_size == 0) return;
  const int ranks = layout.tensor_parallel * layout.data_parallel;
  const int group = f.enable_dp_attention ? ranks : tp;  // SGLang's expert group
  if (f.ep_size == 1) {
    if (layout.expert_parallel) fail("--ep-size 1 and --enable-expert-parallel disagree: give one of them");
    return;
  }
  if (f.ep_size != group)
    fail("--ep-size " + std::to_string(f.ep_size) + ": glmserve spreads whole experts over every rank, so it takes "
         "--ep-size " + std::to_string(group) + (f.enable_dp_attention ? " (every rank)" : " (--tp-size)") +
         " or 1 (each expert split by width)");
  layout.expert_parallel = ranks > 1;
  if (group != ranks)
    notes.push_back("--ep-size " + std::to_string(f.ep_size) + " in " + std::to_string(dp) +
                    " data-parallel groups: whole experts spread over all " + std::to_string(ranks) +
                    " ranks instead of copied into each group");
}

// --speculative-algorithm EAGLE / NEXTN: SGLang's MTP drafting for GLM and DeepSeek, a chain of
// --speculative-num-steps drafts (topk 1), each step verifying steps + 1 tokens.
int resolve_speculation(const SglangFlags& f, const std::string& model_dir) {
  std::string algorithm = f.speculative_algorithm;
  std::transform(algorithm.begin(), algorithm.end(), algorithm.begin(), [](unsigned char c) { return std::toupper(c); });
  if (algorithm.empty()) {
    if (f.speculative_num_steps || f.speculative_eagle_topk || f.speculative_num_draft_tokens)
      fail("--speculative-num-steps, --speculative-eagle-topk and --speculative-num-draft-tokens go with "
           "--speculative-algorithm EAGLE (or NEXTN)");
    return 0;
  }
  if (algorithm != "EAGLE" && algorithm != "NEXTN")
    fail("--speculative-algorithm " + f.speculative_algorithm +
         ": glmserve drafts with the checkpoint's MTP layer only (EAGLE or NEXTN, as SGLang names it for GLM); "
         "EAGLE3, standalone draft models and n-grams are not supported");
  const int steps = f.speculative_num_steps > 0          ? f.speculative_num_steps
                    : f.speculative_num_draft_tokens > 1 ? f.speculative_num_draft_tokens - 1
                                                         : 3;
  if (f.speculative_eagle_topk > 1)
    fail("--speculative-eagle-topk " + std::to_string(f.speculative_eagle_topk) +
         ": glmserve drafts a chain of tokens, not a tree (--speculative-eagle-topk 1)");
  if (f.speculative_num_draft_tokens > 0 && f.speculative_num_draft_tokens != steps + 1)
    fail("--speculative-num-draft-tokens " + std::to_string(f.speculative_num_draft_tokens) +
         ": a chain of " + std::to_string(steps) + " drafts verifies " + std::to_string(steps + 1) +
         " tokens a step (--speculative-num-draft-tokens " + std::to_string(steps + 1) + ")");
  std::error_code error;
  if (!f.speculative_draft_model_path.empty() &&
      !std::filesystem::equivalent(f.speculative_draft_model_path, model_dir, error))
    fail("--speculative-draft-model-path " + f.speculative_draft_model_path +
         ": glmserve drafts with the served checkpoint's own MTP layer; a separate draft model is not supported");
  return steps;
}

}  // namespace

SglangSettings resolve_sglang_flags(const SglangFlags& f, const std::string& model_dir, int block_size,
                                    SglangLayout& layout) {
  SglangSettings s;
  if (!f.dist_init_addr.empty())
    fail("--dist-init-addr: glmserve runs a layout over several nodes under mpirun, one process a node, e.g. "
         "`mpirun -np 2 -H node0,node1 glmserve serve MODEL -tp 8 -dp 2 --enable-expert-parallel` "
         "(docs/parallelism.md, \"Several nodes\")");
  resolve_layout(f, layout, s.notes);
  s.speculative_steps = resolve_speculation(f, model_dir);
  if (f.chunked_prefill_size > 0) s.max_batch_tokens = f.chunked_prefill_size;
  else if (f.chunked_prefill_size == -1)
    s.notes.push_back("--chunked-prefill-size -1: a prompt is still prefilled in steps of --max-num-batched-tokens, "
                      "which bounds the step's workspaces");
  else if (f.chunked_prefill_size != 0)
    fail("--chunked-prefill-size " + std::to_string(f.chunked_prefill_size) + ": expects tokens a step, or -1");
  if (f.page_size > 0 && f.page_size != block_size)
    s.notes.push_back("--page-size " + std::to_string(f.page_size) + ": the KV cache's blocks are " +
                      std::to_string(block_size) + " tokens here");
  for (const auto& [flag, value] : {std::pair{"--attention-backend", &f.attention_backend},
                                    {"--nsa-prefill-backend", &f.nsa_prefill_backend},
                                    {"--nsa-decode-backend", &f.nsa_decode_backend},
                                    {"--moe-runner-backend", &f.moe_runner_backend}})
    if (!value->empty()) s.notes.push_back(std::string(flag) + " " + *value + ": glmserve runs its own kernels");
  if (!f.moe_a2a_backend.empty())
    s.notes.push_back("--moe-a2a-backend " + f.moe_a2a_backend +
                      ": tokens reach their experts by all-gather and reduce-scatter over NCCL");
  if (f.cuda_graph_max_bs > 0)
    s.notes.push_back("--cuda-graph-max-bs: each decode batch shape's graph is captured on its first step");
  if (f.enable_metrics) s.notes.push_back("--enable-metrics: /metrics is always served");
  check_flags_with_nothing_to_set(kSglangFlagsWithNothingToSet, f.nothing_to_set, s.notes);
  return s;
}

}  // namespace glms::cli
