#include "cli/vllm_flags.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli/peer_flag_table.h"
#include "core/error.h"

namespace glms::cli {

namespace {

constexpr std::string_view kSpeculativeConfig = "--speculative-config";

bool starts_with(const std::string& s, std::string_view prefix) { return s.compare(0, prefix.size(), prefix) == 0; }
bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// "-tp N" / "-tp=N" and the like in their long form where the subcommand takes it; other
// arguments unchanged.
std::string long_layout_flag(const std::string& arg, const TakesOption& takes) {
  static const std::pair<std::string_view, std::string_view> kShort[] = {
      {"-tp", "--tensor-parallel-size"}, {"-dp", "--data-parallel-size"}, {"-pp", "--pipeline-parallel-size"}};
  for (const auto& [short_form, long_form] : kShort)
    if ((arg == short_form || starts_with(arg, std::string(short_form) + "=")) && takes(std::string(long_form)))
      return std::string(long_form) + arg.substr(short_form.size());
  return arg;
}

// "--max_model_len=8K" -> "--max-model-len=8K": underscores become dashes in the flag's name (up
// to '=' or a '.KEY' part), never in a value or a key.
std::string dashed_name(std::string arg) {
  const size_t end = std::min({arg.find('='), arg.find('.'), arg.size()});
  std::replace(arg.begin() + 2, arg.begin() + static_cast<std::ptrdiff_t>(end), '_', '-');
  return arg;
}

std::string name_of(const std::string& arg) { return arg.substr(0, arg.find('=')); }

nlohmann::json json_or_string(const std::string& text) {
  nlohmann::json value = nlohmann::json::parse(text, nullptr, false);
  return value.is_discarded() ? nlohmann::json(text) : value;
}

const char* const kSpeculativeExample =
    "e.g. --speculative-config '{\"method\": \"mtp\", \"num_speculative_tokens\": 3}' or "
    "--speculative-config.method mtp --speculative-config.num_speculative_tokens 3";

// --speculative-config's JSON object and its dotted keys, merged as vLLM merges them.
class SpeculativeConfigArgs {
 public:
  // Takes argv[i] (and its value, advancing i) when it is one of them.
  bool take(const std::vector<std::string>& argv, size_t& i) {
    const std::string arg = dashed_name(argv[i]);
    const std::string name = name_of(arg);
    if (name == kSpeculativeConfig) {
      const std::string text = value_of(argv, i, arg, name);
      object_ = nlohmann::json::parse(text, nullptr, false);
      if (!object_.is_object())
        fail("--speculative-config '" + text + "' is not a JSON object (" + kSpeculativeExample + ")");
      return true;
    }
    if (!starts_with(name, std::string(kSpeculativeConfig) + ".")) return false;
    std::string key = name.substr(kSpeculativeConfig.size() + 1);
    std::replace(key.begin(), key.end(), '-', '_');  // the config's keys are spelt with underscores
    dotted_[key] = json_or_string(value_of(argv, i, arg, name));
    return true;
  }
  // The merged argument pair, if either form was given (a dotted key overrides the object's).
  std::vector<std::string> merged() const {
    if (object_.is_null() && dotted_.empty()) return {};
    nlohmann::json config = object_.is_null() ? nlohmann::json::object() : object_;
    config.update(dotted_);
    return {std::string(kSpeculativeConfig), config.dump()};
  }

 private:
  // The value of the flag at argv[i]: after its '=' or the next argument.
  static std::string value_of(const std::vector<std::string>& argv, size_t& i, const std::string& arg,
                              const std::string& name) {
    const size_t equals = arg.find('=');
    if (equals != std::string::npos) return arg.substr(equals + 1);
    if (i + 1 >= argv.size()) fail(name + " needs a value (" + kSpeculativeExample + ")");
    return argv[++i];
  }
  nlohmann::json object_;  // null until given
  nlohmann::json dotted_ = nlohmann::json::object();
};

// vLLM's flags with nothing to set here (cli/peer_flag_table.h).

constexpr const char* kGraphs =
    "decode steps replay CUDA graphs captured for the batch sizes glmserve runs; prefill runs without them";
constexpr const char* kChunks =
    "each step's prefill chunks fill what --max-num-batched-tokens leaves after its decodes";
constexpr const char* kOneProcess = "one process serves HTTP on its I/O threads (--io-threads)";
constexpr const char* kNoContents = "request contents are never logged";
constexpr const char* kTls =
    "glmserve serves plain HTTP: put a TLS-terminating proxy (nginx, Caddy, Envoy) in front of it";
constexpr const char* kLora = "LoRA adapters are not supported";
constexpr const char* kPlugins = "no parser plugins: GLM's tool-call and reasoning parsers are built in";
constexpr const char* kPlacement =
    "experts stay where the layout puts them (rank r of N holds experts r E/N onwards); none is copied or moved";
constexpr const char* kDataParallelRanks =
    "the data-parallel ranks are one process's threads (and one process a node under mpirun); the engine assigns "
    "requests to them by load and prefix affinity";
constexpr const char* kTextOnly = "GLM-5 reads text only: no multimodal inputs";
constexpr const char* kLogits =
    "no custom logits processors (requests take logit_bias, min_tokens and structured outputs)";

constexpr FlagWithNothingToSet kVllmFlagsWithNothingToSet[] = {
    {"--max-seq-len-to-capture", FlagValues::kOne, false, kGraphs},
    {"--cuda-graph-sizes", FlagValues::kSeveral, false, kGraphs},
    {"--max-cudagraph-capture-size", FlagValues::kOne, false, kGraphs},
    {"--max-parallel-loading-workers", FlagValues::kOne, false, "each rank maps its checkpoint shards (mmap); there is no loader pool"},
    {"--disable-fastapi-docs", FlagValues::kNone, false, "glmserve serves no /docs pages"},
    {"--root-path", FlagValues::kOne, false, "routes stay at /v1/...; a proxy that adds a path prefix must strip it"},
    {"--api-server-count", FlagValues::kOne, false, kOneProcess},
    {"--disable-frontend-multiprocessing", FlagValues::kNone, false, kOneProcess},
    {"--model-impl", FlagValues::kOne, false, "glmserve runs its own GLM-5 implementation"},
    {"--config-format", FlagValues::kOne, false, "config.json is read in Hugging Face's format"},
    {"--tokenizer-mode", FlagValues::kOne, false, "the model's tokenizer.json is read by glmserve's own tokenizer"},
    {"--tokenizer-revision", FlagValues::kOne, false, "the tokenizer is the model folder's own (--revision picks the snapshot)"},
    {"--code-revision", FlagValues::kOne, false, "glmserve runs no code from checkpoints"},
    {"--hf-token", FlagValues::kOne, false, "glmserve does not download: models come from a folder or the Hugging Face cache"},
    {"--prefix-caching-hash-algo", FlagValues::kOne, false, "the prefix cache hashes blocks of token ids with its own hash"},
    {"--max-num-partial-prefills", FlagValues::kOne, false, kChunks},
    {"--max-long-partial-prefills", FlagValues::kOne, false, kChunks},
    {"--long-prefill-token-threshold", FlagValues::kOne, false, kChunks},
    {"--structured-outputs-config", FlagValues::kOne, false, "structured outputs are glmserve's own (docs/api.md)"},
    {"--guided-decoding-backend", FlagValues::kOne, false, "structured outputs are glmserve's own (docs/api.md)"},
    {"--chat-template-content-format", FlagValues::kOne, false,
     "content parts reach the chat template as a list (openai), which GLM's template joins"},
    {"--expand-tools-even-if-tool-choice-none", FlagValues::kNone, false,
     "tools stay in the prompt with tool_choice none (--exclude-tools-when-tool-choice-none leaves them out)"},
    {"--enable-prompt-tokens-details", FlagValues::kNone, false, "usage.prompt_tokens_details.cached_tokens is always reported"},
    {"--enable-server-load-tracking", FlagValues::kNone, false,
     "GET /load always answers {\"server_load\": the requests running or waiting}"},
    {"--log-error-stack", FlagValues::kNone, false, "errors are logged with their message"},
    {"--max-log-len", FlagValues::kOne, false, kNoContents},
    {"--enable-log-outputs", FlagValues::kNone, false, kNoContents},
    {"--response-role", FlagValues::kOne, false, "responses carry the role assistant"},
    {"--num-gpu-blocks-override", FlagValues::kOne, false, "the KV cache is sized by --gpu-memory-utilization or --kv-cache-memory"},
    {"--disable-sliding-window", FlagValues::kNone, false, "GLM-5 has no sliding-window attention"},
    {"--disable-cascade-attn", FlagValues::kNone, false, "no cascade attention here; shared prefixes come from the prefix cache"},
    {"--scheduling-policy", FlagValues::kOne, false, "requests are scheduled first come, first served (fcfs)"},
    {"--runner", FlagValues::kOne, false, "glmserve generates text"},
    {"--task", FlagValues::kOne, false, "glmserve generates text"},
    {"--ssl-keyfile", FlagValues::kOne, true, kTls},
    {"--ssl-certfile", FlagValues::kOne, true, kTls},
    {"--ssl-ca-certs", FlagValues::kOne, true, kTls},
    {"--ssl-cert-reqs", FlagValues::kOne, true, kTls},
    {"--enable-lora", FlagValues::kNone, true, kLora},
    {"--lora-modules", FlagValues::kSeveral, true, kLora},
    {"--max-loras", FlagValues::kOne, true, kLora},
    {"--max-lora-rank", FlagValues::kOne, true, kLora},
    {"--kv-transfer-config", FlagValues::kOne, true, "disaggregated prefill and KV transfer are not supported"},
    {"--kv-events-config", FlagValues::kOne, true, "KV cache events are not published"},
    {"--reasoning-parser-plugin", FlagValues::kOne, true, kPlugins},
    {"--tool-parser-plugin", FlagValues::kOne, true, kPlugins},
    {"--logits-processors", FlagValues::kOne, true, kLogits},
    {"--logits-processor-pattern", FlagValues::kOne, true, kLogits},
    {"--hf-overrides", FlagValues::kOne, true, "config.json is read as stored: edit it in a copy of the model folder"},
    {"--cpu-offload-gb", FlagValues::kOne, true, "weights stay on the GPUs: split a model with -tp, or -dp with --enable-expert-parallel"},
    {"--enable-sleep-mode", FlagValues::kNone, true, "sleep mode is not supported"},
    {"--num-redundant-experts", FlagValues::kOne, false, kPlacement},
    {"--expert-placement-strategy", FlagValues::kOne, false, kPlacement},
    {"--data-parallel-hybrid-lb", FlagValues::kNone, false, kDataParallelRanks},
    {"--data-parallel-external-lb", FlagValues::kNone, false, kDataParallelRanks},
    {"--data-parallel-backend", FlagValues::kOne, false, kDataParallelRanks},
    {"--enable-dbo", FlagValues::kNone, false, "a step's batch runs as one; it is not split into overlapped micro-batches"},
    {"--logprobs-mode", FlagValues::kOne, false, "logprobs are the raw model's (raw_logprobs), before penalties and biases"},
    {"--calculate-kv-scales", FlagValues::kNone, false,
     "the FP8 cache (--kv-cache-dtype fp8) keeps a scale for each row it writes, so none is calibrated"},
    {"--tokenizer-pool-size", FlagValues::kOne, false, "requests are tokenized on the HTTP threads (--io-threads)"},
    {"--safetensors-load-strategy", FlagValues::kOne, false, "each rank maps its checkpoint shards (mmap)"},
    {"--limit-mm-per-prompt", FlagValues::kOne, false, kTextOnly},
    {"--mm-processor-kwargs", FlagValues::kOne, false, kTextOnly},
    {"--mm-encoder-tp-mode", FlagValues::kOne, false, kTextOnly},
    {"--middleware", FlagValues::kOne, true, "glmserve runs no Python middleware: put a proxy in front of it"},
    {"--otlp-traces-endpoint", FlagValues::kOne, true, "no OpenTelemetry traces; /metrics serves Prometheus metrics"},
};

// The table's flags (a note each, a refusal for a refused one), and the values that pick what
// glmserve cannot do: a priority policy, a pooling runner.
void check_vllm_flags_with_nothing_to_set(const VllmFlags& f, std::vector<std::string>& notes) {
  auto value = [&](const char* name) {
    const auto it = f.nothing_to_set.find(name);
    return it == f.nothing_to_set.end() || it->second.empty() ? std::string() : it->second.front();
  };
  const std::string policy = value("--scheduling-policy");
  if (!policy.empty() && policy != "fcfs")
    fail(shown_as_given("--scheduling-policy", f.nothing_to_set) +
         ": requests are scheduled first come, first served here (fcfs); a request's priority is not read");
  const std::string logprobs_mode = value("--logprobs-mode");
  if (!logprobs_mode.empty() && logprobs_mode != "raw_logprobs")
    fail(shown_as_given("--logprobs-mode", f.nothing_to_set) +
         ": logprobs are the raw model's log-probabilities here (raw_logprobs), before penalties and biases");
  for (const char* runner : {"--runner", "--task"})
    if (!value(runner).empty() && value(runner) != "generate" && value(runner) != "auto")
      fail(shown_as_given(runner, f.nothing_to_set) +
           ": glmserve generates text (generate); pooling, embedding and scoring are not served");
  check_flags_with_nothing_to_set(kVllmFlagsWithNothingToSet, f.nothing_to_set, notes);
}

// A JSON list of strings (--allowed-origins '["*"]'), or a refusal naming the flag.
std::vector<std::string> string_list(const std::string& flag, const std::string& text) {
  const nlohmann::json list = nlohmann::json::parse(text, nullptr, false);
  std::vector<std::string> out;
  if (list.is_array())
    for (const nlohmann::json& item : list)
      if (item.is_string()) out.push_back(item.get<std::string>());
  if (!list.is_array() || out.size() != list.size())
    fail(flag + " '" + text + "': expects a JSON list of strings, e.g. '[\"https://example.com\"]' or '[\"*\"]'");
  return out;
}

// The HTTP answers' extras: usage on every stream, sampling defaults, CORS.
void check_response_flags(const VllmFlags& f, VllmSettings& s) {
  s.force_include_usage = f.force_include_usage;
  s.exclude_tools_when_none = f.exclude_tools_when_none;
  s.tokens_as_ids = f.tokens_as_ids;
  s.request_id_headers = f.request_id_headers;
  if (!f.default_chat_template_kwargs.empty()) {
    const nlohmann::json kwargs = nlohmann::json::parse(f.default_chat_template_kwargs, nullptr, false);
    if (!kwargs.is_object())
      fail("--default-chat-template-kwargs '" + f.default_chat_template_kwargs +
           "': expects a JSON object, e.g. '{\"enable_thinking\": false}'");
    s.default_template_kwargs = kwargs.dump();
  }
  if (!f.override_generation_config.empty()) {
    const nlohmann::json overrides = nlohmann::json::parse(f.override_generation_config, nullptr, false);
    if (!overrides.is_object())
      fail("--override-generation-config '" + f.override_generation_config +
           "': expects a JSON object, e.g. '{\"temperature\": 0.6, \"top_p\": 0.95}'");
    s.generation_overrides = overrides.dump();
    s.notes.push_back("--override-generation-config: sampling defaults " + s.generation_overrides +
                      " over generation_config.json's");
  }
  if (!f.allowed_origins.empty()) s.cors_origins = string_list("--allowed-origins", f.allowed_origins);
  if (!f.allowed_methods.empty()) s.cors_methods = string_list("--allowed-methods", f.allowed_methods);
  if (!f.allowed_headers.empty()) s.cors_headers = string_list("--allowed-headers", f.allowed_headers);
  s.cors_credentials = f.allow_credentials;
  if (!s.cors_origins.empty()) {
    std::string origins;
    for (const std::string& origin : s.cors_origins) origins += (origins.empty() ? "" : ", ") + origin;
    s.notes.push_back("CORS: browsers at " + origins + " may call the API" +
                      (s.cors_credentials ? ", with credentials" : ""));
  } else if (!f.allowed_methods.empty() || !f.allowed_headers.empty() || f.allow_credentials) {
    fail("--allowed-methods, --allowed-headers and --allow-credentials go with --allowed-origins, which names the "
         "origins that may call the API from a browser (e.g. --allowed-origins '[\"https://example.com\"]')");
  }
}

}  // namespace

std::vector<std::string> normalize_vllm_arguments(const std::vector<std::string>& argv, const TakesOption& takes) {
  std::vector<std::string> out;
  SpeculativeConfigArgs speculative;
  const bool takes_speculative_config = takes(std::string(kSpeculativeConfig));
  size_t i = 0;
  for (; i < argv.size() && argv[i] != "--"; ++i) {  // after "--": the rest as given
    const std::string& arg = argv[i];
    if (i == 0 || !starts_with(arg, "--")) {
      out.push_back(i == 0 ? arg : long_layout_flag(arg, takes));
      continue;
    }
    if (takes_speculative_config && speculative.take(argv, i)) continue;
    const std::string dashed = dashed_name(arg);
    const bool respelt = dashed != arg && !takes(name_of(arg)) && takes(name_of(dashed));
    out.push_back(respelt ? dashed : arg);
  }
  const std::vector<std::string> merged = speculative.merged();
  out.insert(out.end(), merged.begin(), merged.end());
  out.insert(out.end(), argv.begin() + static_cast<std::ptrdiff_t>(i), argv.end());
  return out;
}

void add_vllm_flags(CLI::App* cmd, VllmFlags& f) {
  CLI::Option_group* g = cmd->add_option_group("vLLM's flags", "Taken as vLLM takes them (docs/operations.md)");
  g->add_option("--dtype", f.dtype, "auto or bfloat16 (glmserve computes in bf16)")->capture_default_str();
  g->add_option("--tool-call-parser", f.tool_call_parser, "glm45 / glm47 / glm4_moe / glm5: GLM's format, always on");
  g->add_option("--reasoning-parser", f.reasoning_parser, "glm45 / glm47 / glm4_moe / glm5: GLM's format, always on");
  g->add_flag("--enable-auto-tool-choice", f.auto_tool_choice, "Accepted: tool_choice auto is always on");
  g->add_flag("--enable-prefix-caching", f.enable_prefix_caching, "Accepted: the prefix cache is on by default");
  g->add_flag("--trust-remote-code", f.trust_remote_code, "Accepted, no effect (no checkpoint code is run)");
  g->add_option("--speculative-config", f.speculative_config,
                "A JSON object, or --speculative-config.KEY VALUE: method mtp (the checkpoint's MTP layer), "
                "num_speculative_tokens N (default 1), disable_by_batch_size N");
  g->add_option("--pipeline-parallel-size", f.pipeline_parallel, "1 (also -pp; split a model with -tp and -dp)")
      ->check(CLI::Range(1, 1024));
  g->add_option("--data-parallel-size-local", f.data_parallel_local,
                "Data-parallel ranks on this node: all of them (several nodes run under mpirun)")
      ->check(CLI::Range(1, 1024));
  g->add_option("--data-parallel-address", f.data_parallel_address, "Refused: several nodes run under mpirun");
  g->add_option("--data-parallel-rpc-port", f.data_parallel_rpc_port, "Refused: several nodes run under mpirun");
  g->add_option("--data-parallel-start-rank", f.data_parallel_start_rank, "0 (several nodes run under mpirun)");
  g->add_flag("--headless", f.headless, "Refused: several nodes run under mpirun");
  g->add_option("--nnodes", f.nnodes, "1 (several nodes run under mpirun)");
  g->add_option("--node-rank", f.node_rank, "0 (several nodes run under mpirun)");
  g->add_option("--distributed-executor-backend", f.distributed_executor_backend,
                "mp or uni: one process, a thread a GPU (ray: several nodes run under mpirun)");
  g->add_flag("--enable-eplb", f.enable_eplb, "Accepted: experts stay where the layout puts them");
  g->add_option("--eplb-config", f.eplb_config, "Accepted with --enable-eplb, no effect");
  g->add_option("--all2all-backend", f.all2all_backend,
                "Accepted: tokens reach their experts by all-gather and reduce-scatter over NCCL");
  g->add_flag("--disable-custom-all-reduce", f.disable_custom_all_reduce, "Accepted: collectives are NCCL's");
  g->add_flag("--enforce-eager,--disable-cuda-graph", f.enforce_eager,
              "Run decode steps kernel by kernel, without CUDA graphs");
  g->add_option("--load-format", f.load_format,
                "auto or safetensors (the checkpoint), or dummy (seeded random weights on the GPU, as --synthetic)")
      ->capture_default_str();
  g->add_option("--swap-space", f.swap_space, "Accepted, no effect: preempted sequences are recomputed");
  g->add_flag("--enable-chunked-prefill", f.enable_chunked_prefill, "Accepted: long prompts are always prefilled in chunks");
  g->add_flag("--no-enable-chunked-prefill", f.no_chunked_prefill,
              "Accepted: prompts longer than --max-num-batched-tokens are still prefilled in chunks");
  g->add_flag("--async-scheduling", f.async_scheduling, "Accepted, no effect");
  g->add_option("--compilation-config", f.compilation_config,
                "Accepted, no effect: no torch.compile, the kernels are compiled ahead of time");
  g->add_option("--tokenizer,--tokenizer-path", f.tokenizer, "The model folder or its tokenizer.json (glmserve reads the model's own)");
  g->add_option("--uvicorn-log-level", f.uvicorn_log_level, "Accepted: glmserve's HTTP log lines follow --log-level");
  g->add_flag("--disable-uvicorn-access-log", f.disable_uvicorn_access_log,
              "No access line per request (as --disable-log-requests)");
  g->add_flag("--enable-log-requests", f.enable_log_requests, "Accepted: an access line per request is the default");
  g->add_option("--max-logprobs", f.max_logprobs, "Largest logprobs / top_logprobs a request may ask (default 20)")
      ->check(CLI::Range(1, 1 << 20));
  g->add_option("--block-size", f.block_size, "Accepted, no effect: the KV cache's blocks are 16 tokens");
  g->add_flag("--enable-force-include-usage", f.force_include_usage,
              "Streams end with a usage chunk whether or not the request asks (stream_options.include_usage)");
  g->add_flag("--return-tokens-as-token-ids", f.tokens_as_ids,
              "Logprobs name tokens token_id:N unless a request's return_tokens_as_token_ids says otherwise");
  g->add_flag("--enable-request-id-headers", f.request_id_headers,
              "Every answer carries an X-Request-Id header: the request's own, or a fresh one");
  g->add_flag("--exclude-tools-when-tool-choice-none", f.exclude_tools_when_none,
              "With tool_choice none, the tools are left out of the prompt (else the template shows them)");
  g->add_option("--default-chat-template-kwargs", f.default_chat_template_kwargs,
                "A JSON object of chat template arguments under every request's chat_template_kwargs, e.g. "
                "'{\"enable_thinking\": false}'");
  g->add_option("--override-generation-config", f.override_generation_config,
                "A JSON object of sampling defaults over generation_config.json's: temperature, top_p, top_k, min_p");
  g->add_option("--allowed-origins", f.allowed_origins, "CORS: a JSON list of origins that may call the API from a browser, [\"*\"] for any (vLLM's default; "
                "none without it)");
  g->add_option("--allowed-methods", f.allowed_methods, "CORS: a JSON list of methods (default [\"*\"])");
  g->add_option("--allowed-headers", f.allowed_headers, "CORS: a JSON list of request headers (default [\"*\"])");
  g->add_flag("--allow-credentials", f.allow_credentials, "CORS: allow credentials (cookies, authorization)");
  add_flags_with_nothing_to_set(g, kVllmFlagsWithNothingToSet, f.nothing_to_set);
}

namespace {

void check_parsers(const VllmFlags& f, std::vector<std::string>& notes) {
  // GLM's tool calls and reasoning have one format, which glmserve always parses.
  auto check_parser = [&](const std::string& flag, const std::string& name) {
    if (name.empty()) return;
    static const char* const kGlmParsers[] = {"glm45", "glm47", "glm4_moe", "glm5"};
    for (const char* known : kGlmParsers)
      if (name == known) {
        notes.push_back(flag + " " + name + ": GLM's format, which glmserve always parses");
        return;
      }
    fail(flag + " '" + name + "': glmserve parses GLM's format only (glm45, glm47, glm4_moe or glm5 name it)");
  };
  check_parser("--tool-call-parser", f.tool_call_parser);
  check_parser("--reasoning-parser", f.reasoning_parser);
}

// Layouts over several nodes, pipelines and executors: what glmserve does instead, or a refusal
// that gives the command to type.
void check_layout_flags(const VllmFlags& f, const VllmTarget& target, std::vector<std::string>& notes) {
  if (f.pipeline_parallel > 1)
    fail("--pipeline-parallel-size " + std::to_string(f.pipeline_parallel) +
         ": glmserve has no pipeline parallelism; split the model over GPUs with -tp N, or -dp N "
         "--enable-expert-parallel (docs/parallelism.md; `glmserve plan` shows what each layout needs)");
  const std::string several_nodes =
      ": glmserve runs a layout over several nodes under mpirun, one process a node, e.g. `mpirun -np 2 -H "
      "node0,node1 glmserve serve MODEL --device cuda -tp 8 -dp 2 --enable-expert-parallel` (docs/parallelism.md, "
      "\"Several nodes\"); process 0 serves the API";
  if (f.headless) fail("--headless" + several_nodes);
  if (!f.data_parallel_address.empty()) fail("--data-parallel-address" + several_nodes);
  if (f.data_parallel_rpc_port != 0) fail("--data-parallel-rpc-port" + several_nodes);
  if (f.data_parallel_start_rank > 0) fail("--data-parallel-start-rank" + several_nodes);
  if (f.nnodes > 1) fail("--nnodes " + std::to_string(f.nnodes) + several_nodes);
  if (f.node_rank > 0) fail("--node-rank" + several_nodes);
  if (f.data_parallel_local > 0 && f.data_parallel_local != target.data_parallel)
    fail("--data-parallel-size-local " + std::to_string(f.data_parallel_local) + " of --data-parallel-size " +
         std::to_string(target.data_parallel) + several_nodes);
  const std::string& backend = f.distributed_executor_backend;
  if (backend == "mp" || backend == "uni")
    notes.push_back("--distributed-executor-backend " + backend + ": one process runs every local rank, a thread a GPU");
  else if (backend == "ray" || backend == "external_launcher")
    fail("--distributed-executor-backend " + backend + several_nodes);
  else if (!backend.empty())
    fail("--distributed-executor-backend '" + backend + "': expects mp or uni (one process, a thread a GPU)");
  if (f.enable_eplb || !f.eplb_config.empty())
    notes.push_back("--enable-eplb: experts stay where the layout puts them (rank r of N holds experts r E/N "
                    "onwards); nothing rebalances them");
  if (!f.all2all_backend.empty())
    notes.push_back("--all2all-backend " + f.all2all_backend +
                    ": tokens reach their experts by all-gather and reduce-scatter over NCCL (docs/parallelism.md "
                    "says why)");
  if (f.disable_custom_all_reduce)
    notes.push_back("--disable-custom-all-reduce: collectives are NCCL's; there is no custom all-reduce");
}

void check_execution_flags(const VllmFlags& f, const VllmTarget& target, VllmSettings& s) {
  if (f.dtype != "auto" && f.dtype != "bfloat16" && f.dtype != "bf16")
    fail("--dtype " + f.dtype + ": glmserve computes in bf16 with fp32 sums (auto, bfloat16); for smaller weights "
         "use --quantization fp8 or a quantised checkpoint (glmserve quantize)");
  if (f.enforce_eager) {
    s.cuda_graphs = false;
    s.notes.push_back(target.device == "cuda"
                          ? "CUDA graphs off (--enforce-eager): decode steps run kernel by kernel (slower)"
                          : "CUDA graphs off (--enforce-eager): the CPU path runs none anyway");
  }
  if (f.load_format == "dummy") {
    if (target.device != "cuda") fail("--load-format dummy makes seeded random weights on the GPU: add --device cuda");
    s.synthetic = true;
  } else if (f.load_format != "auto" && f.load_format != "safetensors") {
    fail("--load-format " + f.load_format +
         ": glmserve reads safetensors checkpoints (auto, safetensors) or makes seeded random weights on the GPU "
         "(dummy)");
  }
  if (f.swap_space >= 0)
    s.notes.push_back("--swap-space: a preempted sequence is recomputed from its tokens (the prefix cache keeps what "
                      "it can), never swapped to host memory");
  if (f.enable_chunked_prefill) s.notes.push_back("--enable-chunked-prefill: long prompts are always prefilled in chunks");
  if (f.no_chunked_prefill)
    s.notes.push_back("--no-enable-chunked-prefill: prompts longer than --max-num-batched-tokens are still prefilled "
                      "in chunks of it");
  if (f.async_scheduling) s.notes.push_back("--async-scheduling has no effect here");
  if (!f.compilation_config.empty())
    s.notes.push_back("--compilation-config has no effect: no torch.compile, the kernels are compiled ahead of time");
  if (f.block_size > 0 && f.block_size != target.block_size)
    s.notes.push_back("--block-size " + std::to_string(f.block_size) + ": the KV cache's blocks are " +
                      std::to_string(target.block_size) + " tokens here");
}

// An integer field of --speculative-config in [low, high].
int speculative_int(const nlohmann::json& config, const char* key, int low, int high) {
  const nlohmann::json& value = config[key];
  if (!value.is_number_integer() || value.get<int64_t>() < low || value.get<int64_t>() > high)
    fail(std::string("--speculative-config: ") + key + " must be a whole number from " + std::to_string(low) +
         " to " + std::to_string(high) + ", got " + value.dump());
  return value.get<int>();
}

// vLLM's speculative config as MTP drafting: method mtp (or a model-specific *_mtp name), the
// served checkpoint's own MTP layer, num_speculative_tokens draft tokens (vLLM's default for MTP:
// the checkpoint's MTP layers, one for GLM-5).
void apply_speculative_config(const std::string& text, const VllmTarget& target, VllmSettings& s) {
  const nlohmann::json config = nlohmann::json::parse(text, nullptr, false);
  if (!config.is_object()) fail("--speculative-config '" + text + "' is not a JSON object (" + kSpeculativeExample + ")");
  static const char* const kKeys[] = {"method", "num_speculative_tokens", "model", "disable_by_batch_size",
                                      "draft_tensor_parallel_size"};
  for (const auto& item : config.items())
    if (std::none_of(std::begin(kKeys), std::end(kKeys), [&](const char* k) { return item.key() == k; }))
      fail("--speculative-config: no key '" + item.key() +
           "' here (glmserve reads method, num_speculative_tokens, model, disable_by_batch_size, "
           "draft_tensor_parallel_size)");
  const nlohmann::json method = config.value("method", nlohmann::json());
  if (!method.is_string())
    fail(std::string("--speculative-config needs method mtp (") + kSpeculativeExample + ")");
  const std::string name = method.get<std::string>();
  if (name != "mtp" && !ends_with(name, "_mtp"))
    fail("--speculative-config method '" + name +
         "': glmserve drafts with the checkpoint's MTP layer only (method mtp); n-gram, EAGLE and draft-model "
         "speculation are not supported");
  if (name != "mtp") s.notes.push_back("--speculative-config method " + name + ": the checkpoint's MTP layer (mtp)");
  if (config.contains("model") && !config["model"].is_null()) {
    const nlohmann::json& model = config["model"];
    std::error_code error;
    if (!model.is_string() || !std::filesystem::equivalent(model.get<std::string>(), target.model_dir, error))
      fail("--speculative-config model " + model.dump() +
           ": glmserve drafts with the served checkpoint's own MTP layer; a separate draft model is not "
           "supported (leave model out)");
  }
  s.speculative_steps = config.contains("num_speculative_tokens")
                            ? speculative_int(config, "num_speculative_tokens", 1, 16)
                            : 1;
  if (config.contains("disable_by_batch_size")) {
    s.speculative_max_batch = speculative_int(config, "disable_by_batch_size", 1, 1 << 20);
    s.notes.push_back("--speculative-config disable_by_batch_size " + std::to_string(*s.speculative_max_batch) +
                      ": steps with more decoding sequences than that decode plainly (--speculative-max-batch)");
  }
  if (config.contains("draft_tensor_parallel_size")) {
    speculative_int(config, "draft_tensor_parallel_size", 1, 1024);
    s.notes.push_back("--speculative-config draft_tensor_parallel_size: the MTP layer runs in the model's own layout");
  }
}

// The HTTP side: the tokenizer (the model's own), uvicorn's log flags, --max-logprobs.
void check_http_flags(const VllmFlags& f, const VllmTarget& target, VllmSettings& s) {
  if (!f.tokenizer.empty()) {
    const std::filesystem::path given(f.tokenizer), model(target.model_dir);
    std::error_code error;
    const bool own = (!target.repo_id.empty() && f.tokenizer == target.repo_id) ||
                     std::filesystem::equivalent(given, model, error) ||
                     std::filesystem::equivalent(given, model / "tokenizer.json", error);
    if (!own)
      fail("--tokenizer " + f.tokenizer + ": glmserve reads the model folder's own tokenizer.json (" +
           target.model_dir + "); put the tokenizer there, or leave --tokenizer out");
  }
  if (!f.uvicorn_log_level.empty())
    s.notes.push_back("--uvicorn-log-level " + f.uvicorn_log_level + ": glmserve's HTTP log lines follow --log-level");
  if (f.disable_uvicorn_access_log) s.access_log = false;
  if (f.enable_log_requests) s.notes.push_back("--enable-log-requests: an access line per request is the default");
  s.max_logprobs = f.max_logprobs;
}

}  // namespace

VllmSettings resolve_vllm_flags(const VllmFlags& f, const VllmTarget& target) {
  VllmSettings s;
  check_parsers(f, s.notes);
  if (f.auto_tool_choice) s.notes.push_back("--enable-auto-tool-choice: tool_choice \"auto\" is always on");
  if (f.enable_prefix_caching) s.notes.push_back("--enable-prefix-caching: the prefix cache is on by default");
  if (f.trust_remote_code) s.notes.push_back("--trust-remote-code has no effect: glmserve runs no code from checkpoints");
  check_layout_flags(f, target, s.notes);
  check_execution_flags(f, target, s);
  check_http_flags(f, target, s);
  check_response_flags(f, s);
  check_vllm_flags_with_nothing_to_set(f, s.notes);
  if (!f.speculative_config.empty()) apply_speculative_config(f.speculative_config, target, s);
  return s;
}

}  // namespace glms::cli
