// vLLM's serve flags as glmserve takes them (docs/operations.md, "Coming from vLLM"): the argument
// forms vLLM's parser reads (-tp/-dp/-pp, underscores in names, --speculative-config.KEY VALUE),
// flags that pick what glmserve always does (a start-up note each), flags that map onto
// glmserve's own settings, and flags that cannot apply here, refused with what to type instead.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace CLI { class App; }

namespace glms::cli {

// Whether the command line's subcommand takes the flag `name` ("--max-model-len").
using TakesOption = std::function<bool(const std::string& name)>;

// The command line as vLLM's parser reads it, in glmserve's spelling, for flags the subcommand
// takes (so that no argument value is touched): "-tp N", "-dp N" and "-pp N" become the long
// flags; "--max_model_len" becomes "--max-model-len"; every "--speculative-config.KEY VALUE" (or
// KEY=VALUE) is merged with a --speculative-config JSON object, if one is given, into one
// --speculative-config JSON argument before any "--" (each value read as JSON where it parses,
// else as a string), as vLLM merges them. Throws glms::Error for a dotted key without a value or
// a --speculative-config that is not a JSON object.
std::vector<std::string> normalize_vllm_arguments(const std::vector<std::string>& argv, const TakesOption& takes);

struct VllmFlags {
  std::string tool_call_parser, reasoning_parser, dtype = "auto";
  bool auto_tool_choice = false, enable_prefix_caching = false, trust_remote_code = false;
  std::string speculative_config;  // a JSON object: method, num_speculative_tokens, ...
  // Layouts and launchers.
  int pipeline_parallel = 1;
  int data_parallel_local = 0;  // 0: not given
  std::string data_parallel_address, distributed_executor_backend, all2all_backend, eplb_config;
  int data_parallel_rpc_port = 0, data_parallel_start_rank = -1, nnodes = 1, node_rank = 0;
  bool headless = false, enable_eplb = false, disable_custom_all_reduce = false;
  // Execution and memory.
  bool enforce_eager = false, enable_chunked_prefill = false, no_chunked_prefill = false, async_scheduling = false;
  std::string compilation_config;
  std::string load_format = "auto";
  double swap_space = -1.0;  // GiB; < 0: not given
  int block_size = 0;        // 0: not given
  // The HTTP side.
  std::string tokenizer, uvicorn_log_level;
  bool disable_uvicorn_access_log = false, enable_log_requests = false;
  int max_logprobs = 0;  // 0: not given
  bool force_include_usage = false, exclude_tools_when_none = false;
  bool tokens_as_ids = false, request_id_headers = false;
  std::string override_generation_config;  // a JSON object of sampling defaults
  std::string default_chat_template_kwargs;  // a JSON object
  std::string allowed_origins, allowed_methods, allowed_headers;  // JSON lists of strings
  bool allow_credentials = false;
  // The flags of kVllmFlagsWithNothingToSet (vllm_flags.cpp) given, with their values.
  std::map<std::string, std::vector<std::string>> nothing_to_set;  // cli::GivenFlags
};

void add_vllm_flags(CLI::App* cmd, VllmFlags& flags);

// What the flags go with.
struct VllmTarget {
  std::string device;      // cpu or cuda
  std::string model_dir;   // the served checkpoint folder
  std::string repo_id;     // the Hugging Face repo id it was found by, if any
  int data_parallel = 1;   // --data-parallel-size
  int block_size = 16;     // the engine's cache blocks
};

// What vLLM's flags set here.
struct VllmSettings {
  std::vector<std::string> notes;            // a start-up line for each flag that changes nothing here
  int speculative_steps = 0;                 // --speculative-config: MTP draft tokens a step (0: not asked)
  std::optional<int> speculative_max_batch;  // its disable_by_batch_size
  bool synthetic = false;                    // --load-format dummy: random weights
  bool cuda_graphs = true;                   // false: --enforce-eager
  bool access_log = true;                    // false: --disable-uvicorn-access-log
  int max_logprobs = 0;                      // --max-logprobs (0: not given)
  bool force_include_usage = false;          // --enable-force-include-usage: usage on every stream
  bool exclude_tools_when_none = false;      // --exclude-tools-when-tool-choice-none
  bool tokens_as_ids = false;                // --return-tokens-as-token-ids: the requests' default
  bool request_id_headers = false;           // --enable-request-id-headers: X-Request-Id on every answer
  std::string generation_overrides;          // --override-generation-config: a JSON object ("" when not given)
  std::string default_template_kwargs;       // --default-chat-template-kwargs: a JSON object ("" when not given)
  // CORS (--allowed-origins, --allowed-methods, --allowed-headers, --allow-credentials). No origin
  // unless given (vLLM allows every one): a page on any site could otherwise use a local server.
  std::vector<std::string> cors_origins, cors_methods = {"*"}, cors_headers = {"*"};
  bool cors_credentials = false;
};

// Checks vLLM's flags against what they go with; throws glms::Error saying what to type instead.
VllmSettings resolve_vllm_flags(const VllmFlags& flags, const VllmTarget& target);

}  // namespace glms::cli
