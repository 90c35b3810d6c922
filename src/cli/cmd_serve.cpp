// glmserve serve: the OpenAI-compatible HTTP server over the engine (see docs/operations.md).
// Prints "glmserve: listening on http://HOST:PORT" and then "glmserve: ready"; on SIGINT or
// SIGTERM it stops accepting, drains the requests in flight and exits 0.
#include <CLI/CLI.hpp>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fmt/format.h>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <mutex>
#include <optional>
#include <thread>

#include "cli/commands.h"
#include "cli/validators.h"
#include "cli/model_source.h"
#include "cli/sglang_flags.h"
#include "cli/vllm_flags.h"
#include "core/error.h"
#include "core/readable_number.h"
#include "log/log.h"
#include "engine/engine.h"
#include "model/glm5.h"
#include "server/api_error.h"
#include "server/api_service.h"
#include "server/backend.h"
#include "server/http_server.h"
#include "server/stats_log.h"
#ifdef GLMS_HAVE_CUDA
#include "ops/cuda/cuda_ops.h"
#endif
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace glms::cli {

namespace {

struct ServeArgs {
  ModelSourceArgs source;
  std::string positional_model;  // vLLM's `serve MODEL`
  std::string host = "127.0.0.1";
  int port = 8000;
  std::vector<std::string> api_keys;
  std::string api_key_file;
  std::string jwt_secret;
  int max_num_seqs = 0;
  int max_batch_tokens = 0;
  std::string kv_cache_memory;  // bytes, readable ("2G")
  std::string kv_cache_dtype = "auto";
  double gpu_memory_utilization = engine::EngineConfig{}.gpu_memory_utilization;
  std::string max_model_len;    // tokens, readable ("8k", "32K")
  std::string preset;
  std::vector<std::string> served_model_names;
  // vLLM's and SGLang's flags that map onto glmserve's settings or change nothing here (a note each).
  VllmFlags vllm;
  SglangFlags sglang;
  bool no_prefix_caching = false, disable_log_requests = false, vllm_metric_names = false, disable_log_stats = false,
       no_web_ui = false;
  std::string log_level = "info", log_format = "text";
  double log_stats_interval = 10.0;
  double shutdown_timeout = 60.0;
  int max_connections = server::HttpServerOptions{}.max_connections;
  double header_timeout = server::HttpServerOptions{}.header_timeout_seconds;  // seconds the drain may take before running requests end with an error
  std::string chat_template, generation_config = "auto";
  std::optional<uint64_t> seed;
  int max_waiting = 0;
  std::string rate_limit;
  double request_timeout = 0.0;
  size_t max_body_bytes = 8u << 20;
  int io_threads = 2;
  std::string speculative;
  int speculative_steps = 3;
  bool speculative_steps_given = false;
  int max_logprobs = 0;  // vLLM's --max-logprobs (0: the server's default)
  int speculative_max_batch = engine::EngineConfig{}.speculative_max_batch;
  VllmSettings vllm_settings;  // what vLLM's flags set (resolve_peer_flags)
  int responses_store = 0;     // Responses API answers kept (0: none)
};

// Preset values; explicit flags override them (documented in docs/operations.md).
void apply_preset(const std::string& preset, engine::EngineConfig& c) {
  if (preset.empty()) return;
  if (preset == "high_throughput") {
    c.max_num_seqs = 256;
    c.max_batch_tokens = 8192;
    c.max_waiting = 4096;
  } else if (preset == "low_latency") {
    c.max_num_seqs = 16;
    c.max_batch_tokens = 1024;
    c.max_waiting = 256;
  } else if (preset == "memory_constrained") {
    c.max_num_seqs = 8;
    c.max_batch_tokens = 512;
    c.max_waiting = 256;
    c.kv_cache_bytes = int64_t{256} << 20;
  } else {
    fail("--preset must be high_throughput, low_latency or memory_constrained, got '" + preset + "'");
  }
}

void parse_rate_limit(const std::string& spec, server::ServiceConfig& config) {
  if (spec.empty()) return;
  try {
    const size_t colon = spec.find(':');
    size_t used = 0;
    config.rate_limit_rps = std::stod(spec.substr(0, colon), &used);
    if (used != (colon == std::string::npos ? spec.size() : colon)) throw std::invalid_argument(spec);
    if (colon != std::string::npos) {
      config.rate_limit_burst = std::stod(spec.substr(colon + 1), &used);
      if (used != spec.size() - colon - 1) throw std::invalid_argument(spec);
    }
  } catch (const std::exception&) {
    fail("--rate-limit expects RPS or RPS:BURST (e.g. 5 or 5:20), got '" + spec + "'");
  }
  if (config.rate_limit_rps <= 0) fail("--rate-limit must be positive");
}

// Sampling defaults from a generation config object (generation_config.json's fields are read
// where they have the right type, as vLLM does; --override-generation-config's must all be known).
void apply_generation_defaults(const nlohmann::json& g, server::ServiceConfig& config, bool strict) {
  for (const auto& [key, value] : g.items()) {
    const bool number = value.is_number(), integer = value.is_number_integer();
    if (key == "temperature" && number) config.default_temperature = value;
    else if (key == "top_p" && number) config.default_top_p = value;
    else if (key == "top_k" && integer) config.default_top_k = value;
    else if (key == "min_p" && number) config.default_min_p = value;
    else if (strict) {
      const bool known = key == "temperature" || key == "top_p" || key == "top_k" || key == "min_p";
      fail("--override-generation-config: '" + key + "' " +
           (known ? "must be a number (top_k a whole one)" : "is not a sampling default here") +
           " (glmserve takes temperature, top_p, top_k and min_p)");
    }
  }
}

void read_generation_defaults(const std::filesystem::path& dir, server::ServiceConfig& config) {
  std::ifstream in(dir / "generation_config.json");
  if (!in) return;
  const nlohmann::json g = nlohmann::json::parse(in, nullptr, false);
  if (g.is_object()) apply_generation_defaults(g, config, false);
}

// continue_final_message, as transformers does it: the rendered prompt ends right after the
// final (assistant) message's text, so the model continues that message instead of a new turn.
std::string cut_after_final_message(const std::string& prompt, const nlohmann::json& messages) {
  const nlohmann::json& content = messages.back()["content"];
  std::string text;
  if (content.is_string()) {
    text = content.get<std::string>();
  } else if (content.is_array()) {
    for (const auto& part : content)  // the template concatenates the parts
      if (part.contains("text") && part["text"].is_string()) text += part["text"].get<std::string>();
  }
  const size_t at = text.empty() ? std::string::npos : prompt.rfind(text);
  if (at == std::string::npos)
    server::bad_request("continue_final_message: the final message's text does not appear in the rendered prompt",
                        "messages");
  return prompt.substr(0, at + text.size());
}

// Requests' own chat templates (vLLM's request field), compiled once each: the last few kept.
class RequestTemplates {
 public:
  explicit RequestTemplates(std::string model_dir) : model_dir_(std::move(model_dir)) {}
  std::shared_ptr<const ChatTemplate> get(const std::string& source) {
    std::lock_guard lock(mutex_);
    for (const auto& [text, compiled] : recent_)
      if (text == source) return compiled;
    std::shared_ptr<const ChatTemplate> compiled;
    try {
      compiled = std::make_shared<const ChatTemplate>(ChatTemplate::load(model_dir_, source));
    } catch (const Error& e) {
      server::bad_request(std::string("chat_template does not compile: ") + e.what(), "chat_template");
    }
    if (recent_.size() == kKept) recent_.erase(recent_.begin());
    recent_.emplace_back(source, compiled);
    return compiled;
  }

 private:
  static constexpr size_t kKept = 8;
  std::string model_dir_;
  std::mutex mutex_;
  std::vector<std::pair<std::string, std::shared_ptr<const ChatTemplate>>> recent_;
};

// Drafting asked by --speculative mtp, vLLM's --speculative-config or SGLang's
// --speculative-algorithm: one of them, with the draft count given once.
void apply_speculation(ServeArgs& args, const VllmSettings& vllm, const SglangSettings& sglang) {
  const int asked = (vllm.speculative_steps > 0) + (sglang.speculative_steps > 0) + !args.speculative.empty();
  if (asked > 1)
    fail("speculative decoding is asked twice: give one of --speculative mtp, --speculative-config or "
         "--speculative-algorithm");
  if (vllm.speculative_steps == 0 && sglang.speculative_steps == 0) return;
  if (args.speculative_steps_given)
    fail("--speculative-steps goes with --speculative mtp; give the draft count in --speculative-config "
         "(num_speculative_tokens) or --speculative-num-steps");
  args.speculative = "mtp";
  args.speculative_steps = std::max(vllm.speculative_steps, sglang.speculative_steps);
  if (vllm.speculative_max_batch) args.speculative_max_batch = *vllm.speculative_max_batch;
}

// The model folder (vLLM's positional form too), the device, and vLLM's and SGLang's flags,
// checked and applied to the serve settings. Returns the notes to print.
std::vector<std::string> resolve_peer_flags(ServeArgs& args) {
  if (!args.positional_model.empty()) {
    if (!args.source.model_dir.empty() && args.source.model_dir != args.positional_model)
      fail("the model is given twice: '" + args.positional_model + "' and --model '" + args.source.model_dir + "'");
    args.source.model_dir = args.positional_model;
  }
  resolve_model_folder(args.source);
  const std::string device_note = resolve_device(args.source);
  const int block_size = engine::EngineConfig{}.block_size;
  runtime::ParallelLayout& layout = args.source.layout;
  SglangLayout sglang_layout{layout.tensor_parallel, layout.data_parallel, layout.expert_parallel};
  const SglangSettings sglang = resolve_sglang_flags(args.sglang, args.source.model_dir, block_size, sglang_layout);
  layout.tensor_parallel = sglang_layout.tensor_parallel;
  layout.expert_parallel = sglang_layout.expert_parallel;
  if (sglang.max_batch_tokens > 0) {
    if (args.max_batch_tokens > 0 && args.max_batch_tokens != sglang.max_batch_tokens)
      fail("--chunked-prefill-size and --max-num-batched-tokens disagree: give one of them");
    args.max_batch_tokens = sglang.max_batch_tokens;
  }
  const VllmTarget target{args.source.device, args.source.model_dir, args.source.repo_id, layout.data_parallel,
                          block_size};
  const VllmSettings vllm = cli::resolve_vllm_flags(args.vllm, target);
  if (vllm.synthetic) args.source.synthetic = true;
  args.source.cuda_graphs = vllm.cuda_graphs;
  if (!vllm.access_log) args.disable_log_requests = true;
  if (vllm.max_logprobs > 0) args.max_logprobs = vllm.max_logprobs;
  args.vllm_settings = vllm;
  apply_speculation(args, vllm, sglang);
  std::vector<std::string> notes = sglang.notes;
  notes.insert(notes.end(), vllm.notes.begin(), vllm.notes.end());
  if (!device_note.empty()) notes.push_back(device_note);
  // vLLM keeps Responses API answers where this is set (its store grows without bound; here the newest 1024).
  const char* vllm_store = std::getenv("VLLM_ENABLE_RESPONSES_API_STORE");
  if (vllm_store && (std::string(vllm_store) == "1" || std::string(vllm_store) == "true") && args.responses_store == 0) {
    args.responses_store = 1024;
    notes.push_back("VLLM_ENABLE_RESPONSES_API_STORE: the newest 1024 Responses API answers are kept "
                    "(--responses-store N sets the count)");
  }
  // vLLM binds every address by default; glmserve the loopback only, which a container's published
  // port cannot reach.
  const bool in_container = std::filesystem::exists("/.dockerenv") || std::filesystem::exists("/run/.containerenv") ||
                            std::getenv("KUBERNETES_SERVICE_HOST") != nullptr;
  if (in_container && (args.host == "127.0.0.1" || args.host == "localhost"))
    notes.push_back("listening on " + args.host + " only, inside a container: --host 0.0.0.0 makes the port "
                    "reachable from outside it (vLLM's default; then set --api-key)");
  return notes;
}

// The API keys: --api-key, the lines of --api-key-file, and GLMSERVE_API_KEY or VLLM_API_KEY.
std::vector<std::string> api_keys_of(const ServeArgs& args) {
  std::vector<std::string> keys = args.api_keys;
  if (!args.api_key_file.empty()) {
    std::ifstream in(args.api_key_file);
    if (!in) fail("--api-key-file " + args.api_key_file + ": cannot read it");
    for (std::string line; std::getline(in, line);) {
      while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
      if (!line.empty() && line[0] != '#') keys.push_back(line);
    }
    if (keys.size() == args.api_keys.size()) fail("--api-key-file " + args.api_key_file + " holds no key");
  }
  for (const char* name : {"GLMSERVE_API_KEY", "VLLM_API_KEY"})
    if (const char* value = std::getenv(name); value && *value) keys.emplace_back(value);
  return keys;
}

// --chat-template: a file, or the template text itself (as vLLM takes it).
std::string chat_template_source(const std::string& arg) {
  if (arg.empty()) return "";
  if (std::filesystem::is_regular_file(arg)) {
    std::ifstream in(arg);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  if (arg.find("{%") == std::string::npos && arg.find("{{") == std::string::npos)
    fail("--chat-template '" + arg + "' is neither a file nor a Jinja template");
  return arg;
}

// The chat renderer: the model's template (or --chat-template), a request's own template when it
// brings one; none (a warning, chat answers 400) when the model has no template.
server::ChatRenderer make_renderer(const ServeArgs& args) {
  try {
    auto tmpl = std::make_shared<const ChatTemplate>(
        ChatTemplate::load(args.source.model_dir, chat_template_source(args.chat_template)));
    auto request_templates = std::make_shared<RequestTemplates>(args.source.model_dir);
    return [tmpl, request_templates](const server::ChatRequest& r) {
      const std::string tools = r.tools && !r.tools->is_null() ? r.tools->dump() : std::string();
      const std::shared_ptr<const ChatTemplate> chosen =
          r.chat_template.empty() ? tmpl : request_templates->get(r.chat_template);
      std::string prompt =
          chosen->render(r.messages->dump(), tools, r.add_generation_prompt, r.template_kwargs->dump());
      if (r.continue_final_message) prompt = cut_after_final_message(prompt, *r.messages);
      return prompt;
    };
  } catch (const Error& e) {
    log::warning(std::string("glmserve: no chat template (") + e.what() + "); /v1/chat/completions answers 400");
    return {};
  }
}

engine::EngineConfig engine_config_of(const ServeArgs& args) {
  engine::EngineConfig c;
  apply_preset(args.preset, c);
  if (args.max_num_seqs > 0) c.max_num_seqs = args.max_num_seqs;
  // On the CPU a 2048-token prefill chunk takes over a second on the bundled model, and a
  // cancelled request stops only when its step ends: 512-token steps stop it within about 0.3 s
  // and prefill as fast (measured: 3991 tokens in 2.47 s against 2.57 s).
  if (args.preset.empty() && args.source.device == "cpu") c.max_batch_tokens = 512;
  if (args.max_batch_tokens > 0) c.max_batch_tokens = args.max_batch_tokens;
  if (!args.kv_cache_memory.empty()) {
    c.kv_cache_bytes = parse_readable_count(args.kv_cache_memory, "--kv-cache-memory");
    if (c.kv_cache_bytes <= 0) fail("--kv-cache-memory must be positive");
  }
  c.gpu_memory_utilization = args.gpu_memory_utilization;
  c.kv_cache_dtype = kv::parse_cache_dtype(args.kv_cache_dtype);
  if (!args.max_model_len.empty()) {
    const int64_t len = parse_readable_count(args.max_model_len, "--max-model-len");
    if (len <= 0 || len > (int64_t{1} << 30)) fail("--max-model-len must be between 1 and 2^30 tokens");
    c.max_model_len = static_cast<int>(len);
  }
  if (args.no_prefix_caching) c.enable_prefix_cache = false;
  if (args.max_waiting > 0) c.max_waiting = args.max_waiting;
  if (!args.speculative.empty()) {
    c.speculative_steps = args.speculative_steps;
    c.speculative_max_batch = args.speculative_max_batch;
  }
  return c;
}

server::ServiceConfig service_config_of(const ServeArgs& args, const std::filesystem::path& dir) {
  server::ServiceConfig config;
  if (args.served_model_names.empty() && !args.source.repo_id.empty()) {
    config.served_model_name = args.source.repo_id;  // as vLLM serves a repo id
  } else if (args.served_model_names.empty()) {
    config.served_model_name = dir.filename().string();
    if (config.served_model_name.empty()) config.served_model_name = dir.parent_path().filename().string();
    // vLLM serves a model under the argument as given: clients written for it send that.
    if (args.source.model_dir != config.served_model_name) config.model_aliases.push_back(args.source.model_dir);
  } else {
    config.served_model_name = args.served_model_names.front();
    config.model_aliases.assign(args.served_model_names.begin() + 1, args.served_model_names.end());
  }
  config.model_path = args.source.repo_id.empty() ? args.source.model_dir : args.source.repo_id;
  config.responses_store_capacity = static_cast<size_t>(args.responses_store);
  config.api_keys = api_keys_of(args);
  config.seed = args.seed;
  config.vllm_metric_names = args.vllm_metric_names;
  config.log_requests = !args.disable_log_requests;
  config.web_ui = !args.no_web_ui;
  config.jwt_secret = args.jwt_secret;
  config.request_timeout_seconds = args.request_timeout;
  config.max_body_bytes = args.max_body_bytes;
  if (args.max_logprobs > 0) config.parse_limits.max_top_logprobs = args.max_logprobs;
  parse_rate_limit(args.rate_limit, config);
  if (args.generation_config == "auto") {
    read_generation_defaults(dir, config);
  } else if (args.generation_config != "vllm") {
    if (!std::filesystem::is_regular_file(std::filesystem::path(args.generation_config) / "generation_config.json"))
      fail("--generation-config " + args.generation_config +
           ": no generation_config.json there (auto: the model's, vllm: none, or a folder holding one)");
    read_generation_defaults(args.generation_config, config);
  }
  const VllmSettings& vllm = args.vllm_settings;
  if (!vllm.generation_overrides.empty())
    apply_generation_defaults(nlohmann::json::parse(vllm.generation_overrides), config, true);
  config.force_include_usage = vllm.force_include_usage;
  config.exclude_tools_when_none = vllm.exclude_tools_when_none;
  config.tokens_as_ids = vllm.tokens_as_ids;
  if (!vllm.default_template_kwargs.empty())
    config.default_template_kwargs = nlohmann::json::parse(vllm.default_template_kwargs).dump();
  config.request_id_headers = vllm.request_id_headers;
  config.cors = {vllm.cors_origins, vllm.cors_methods, vllm.cors_headers, vllm.cors_credentials};
  return config;
}

// The start-up lines (logged after the port is bound, shown at the top of the web UI): what runs
// where, and the cache.
std::vector<std::string> banner_lines(const ServeArgs& args, const std::vector<std::string>& notes,
                                      const server::ServiceConfig& config, const engine::Engine& engine,
                                      const std::string& device, int64_t cache_bytes_per_token,
                                      const std::vector<runtime::Executor::RankMemory>& memory, const LoadedModel& model) {
  std::vector<std::string> lines;
  for (const std::string& note : notes) lines.push_back("note: " + note);
  std::string names = "'" + config.served_model_name + "'";
  for (const std::string& alias : config.model_aliases) names += ", '" + alias + "'";
  const engine::EngineConfig& c = engine.config();
  const std::string checkpoint = args.source.repo_id.empty()
                                     ? args.source.model_dir
                                     : args.source.repo_id + " at " + args.source.model_dir;
  lines.push_back(fmt::format("model {} (served as {}), max_model_len {}, max_num_seqs {}, max_batch_tokens {}",
                              checkpoint, names, c.max_model_len, c.max_num_seqs, c.max_batch_tokens));
  const int64_t tokens = int64_t{engine.blocks_per_rank()} * c.block_size;
  lines.push_back(fmt::format(
      "layout {} on {}; KV cache {} blocks of {} tokens per data-parallel rank ({} tokens, {:.2f} GiB){}",
      engine.layout().describe(), device, engine.blocks_per_rank(), c.block_size, tokens,
      static_cast<double>(tokens * cache_bytes_per_token) / (1 << 30),
      c.kv_cache_dtype == kv::CacheDtype::kAuto ? std::string()
      : device == "cpu" ? fmt::format(", rows rounded as {} (held in fp32 on the CPU)", kv::cache_dtype_name(c.kv_cache_dtype))
                        : fmt::format(", rows stored as {}", kv::cache_dtype_name(c.kv_cache_dtype))));
  for (size_t r = 0; r < memory.size(); ++r)
    if (memory[r].weight_bytes > 0)
      lines.push_back(fmt::format("rank {}: weights {:.2f} GiB, KV cache {:.2f} GiB on its device", r,
                                  static_cast<double>(memory[r].weight_bytes) / (1 << 30),
                                  static_cast<double>(memory[r].cache_bytes) / (1 << 30)));
  if (c.speculative_steps > 0)
    lines.push_back(fmt::format("speculative decoding with the MTP layer, {} draft token{} per step{}",
                                c.speculative_steps, c.speculative_steps == 1 ? "" : "s",
                                c.speculative_max_batch > 0
                                    ? ", up to " + std::to_string(c.speculative_max_batch) + " decoding sequences"
                                    : ""));
  lines.push_back("API: POST /v1/chat/completions, /v1/completions, /v1/responses, /v1/messages (Anthropic's); "
                  "GET /v1/models, /health, /metrics" +
                  std::string(config.web_ui ? ", / (web UI)" : "") + " (docs/api.md)");
  lines.push_back(fmt::format("pid {}{}", static_cast<int>(getpid()),
                              model.processes ? ", process 0 of " + std::to_string(model.processes->size()) +
                                                    " (mpirun): SIGTERM here stops them all"
                                              : ""));
  return lines;
}

// /metrics' GPU memory: GPUs 0 .. ranks - 1 (the ones this process's ranks run on), read from the
// driver at each scrape (none on the CPU). Only those: a query makes the device's context, which
// on a GPU the layout does not use would take memory another job may own.
std::function<std::vector<server::DeviceMemory>()> gpu_memory_probe(const std::string& device, int ranks) {
#ifdef GLMS_HAVE_CUDA
  if (device != "cuda") return {};
  return [ranks] {
    std::vector<server::DeviceMemory> gpus;
    try {
      for (int d = 0; d < std::min(ranks, ops::cuda::device_count()); ++d) {
        ops::cuda::set_device(d);  // the calling HTTP thread's current device; it runs no other CUDA work
        const auto [free_bytes, total_bytes] = ops::cuda::memory_info();
        gpus.push_back({d, static_cast<int64_t>(total_bytes - free_bytes), static_cast<int64_t>(total_bytes)});
      }
    } catch (const std::exception&) {
      return std::vector<server::DeviceMemory>{};  // a driver that does not answer: the page goes without them
    }
    return gpus;
  };
#else
  (void)device;
  (void)ranks;
  return {};
#endif
}

void run_serve(ServeArgs args) {
  // Every thread started from here on inherits the blocked signals; this thread waits for them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  // The log: stdout, as vLLM's; the start-up lines and each request's and the engine's lines.
  log::configure(log::parse_level(args.log_level), log::parse_format(args.log_format), &std::cout);
  const std::vector<std::string> notes = resolve_peer_flags(args);
  if (args.source.model_dir.empty()) fail("serve needs a model folder: glmserve serve DIR (or --model DIR)");
  const std::filesystem::path dir(args.source.model_dir);
  text::Tokenizer tokenizer = text::Tokenizer::load(dir);
  const server::ChatRenderer renderer = make_renderer(args);
  const engine::EngineConfig engine_config = engine_config_of(args);
  // Before the weights load (minutes for a large model): a bad key file, rate limit or sampling
  // default is refused at once.
  server::ServiceConfig config = service_config_of(args, dir);

  ModelSourceArgs source = args.source;
  source.load_mtp = engine_config.speculative_steps > 0;
  LoadedModel model = load_model(source);
  if (engine_config.max_model_len > model.config().max_position_embeddings)
    fail("--max-model-len " + std::to_string(engine_config.max_model_len) + " exceeds the model's " +
         std::to_string(model.config().max_position_embeddings) + " positions");
  const int64_t cache_bytes_per_token =
      model.executor->cache_bytes_per_token(engine_config.kv_cache_dtype, engine_config.speculative_steps > 0);
  const std::string device = model.executor->device();
  runtime::Executor& executor = *model.executor;
  engine::Engine engine(std::move(model.executor), engine_config);
  const std::vector<runtime::Executor::RankMemory> memory = executor.memory();
  std::vector<server::RankMemory> rank_memory;
  for (const runtime::Executor::RankMemory& m : memory) rank_memory.push_back({m.weight_bytes, m.cache_bytes});
  std::unique_ptr<server::Backend> backend =
      server::make_engine_backend(engine, std::move(rank_memory), gpu_memory_probe(device, engine.layout().world_size()));
  config.banner = banner_lines(args, notes, config, engine, device, cache_bytes_per_token, memory, model);
  server::ApiService service(*backend, tokenizer, renderer, server::glm_parser_factory(), config);

  server::HttpServerOptions http;
  http.host = args.host;
  http.port = static_cast<uint16_t>(args.port);
  http.max_body_bytes = args.max_body_bytes;
  http.threads = args.io_threads;
  http.max_connections = args.max_connections;
  http.header_timeout_seconds = args.header_timeout;
  server::HttpServer server(service, http);
  server.start();
  for (const std::string& line : config.banner) log::info("glmserve: " + line);
  // The start-up contract: scripts wait for these two lines (in either log format).
  log::info(fmt::format("glmserve: listening on http://{}:{}", args.host, static_cast<unsigned>(server.port())));
  log::info("glmserve: ready");
  std::unique_ptr<server::StatsLogger> stats_logger;
  if (!args.disable_log_stats) stats_logger = std::make_unique<server::StatsLogger>(*backend, args.log_stats_interval);

  int received = 0;
  sigwait(&signals, &received);
  log::info(fmt::format("glmserve: {} received: draining (up to {:g} s; a second signal exits at once)",
                        received == SIGINT ? "SIGINT" : "SIGTERM", args.shutdown_timeout));
  // A second SIGINT or SIGTERM during the drain ends the process now (exit status 128 + signal).
  std::thread([signals] {
    int again = 0;
    sigwait(&signals, &again);
    log::warning(fmt::format("glmserve: second {}: exiting without draining", again == SIGINT ? "SIGINT" : "SIGTERM"));
    std::_Exit(128 + again);
  }).detach();
  service.stop_accepting();
  server.stop_accepting();
  backend->drain(args.shutdown_timeout);
  server.wait_idle(10.0);
  stats_logger.reset();
  server.stop();
  log::info("glmserve: stopped");
}

// The HTTP server's options: address, authentication, limits, logging, shutdown and /metrics.
void add_server_options(CLI::App* cmd, ServeArgs* args) {
  cmd->add_option("--host", args->host, "Address to bind")->capture_default_str();
  cmd->add_option("--port", args->port, "Port (0 = any free port)")->check(CLI::Range(0, 65535))->capture_default_str();
  cmd->add_option("--api-key", args->api_keys,
                  "Accepted Bearer key (repeatable; also GLMSERVE_API_KEY or VLLM_API_KEY in the environment)")
      ->take_all();
  cmd->add_option("--api-key-file", args->api_key_file, "A file of accepted keys, one a line");
  cmd->add_option("--jwt-secret", args->jwt_secret, "Accept HS256 JWTs signed with this secret");
  cmd->add_option("--max-waiting", args->max_waiting, "Queued requests beyond which 429 is returned")
      ->check(positive_number());
  cmd->add_option("--rate-limit", args->rate_limit, "Per-client token bucket: RPS or RPS:BURST");
  cmd->add_option("--request-timeout", args->request_timeout, "Seconds before a request ends with 'timeout'")
      ->check(non_negative_number());
  cmd->add_option("--max-body-bytes", args->max_body_bytes, "Largest request body (413 above)");
  cmd->add_option("--io-threads", args->io_threads, "HTTP I/O threads")->check(CLI::Range(1, 64));
  cmd->add_option("--max-connections", args->max_connections,
                  "Open connections at most; one more gets a 503 and is closed")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--header-timeout", args->header_timeout,
                  "Seconds from a request's first byte to the end of its headers (slow clients are cut off)")
      ->check(CLI::Range(0.1, 3600.0))
      ->capture_default_str();
  cmd->add_option("--log-level", args->log_level, "trace, debug, info, warning, error or off")->capture_default_str();
  cmd->add_option("--log-format", args->log_format, "text, or json (one object a line: time, level, msg)")
      ->capture_default_str();
  cmd->add_flag("--disable-log-requests", args->disable_log_requests,
                "No access line per request (status, latency, tokens; request contents are never logged)");
  cmd->add_flag("--disable-log-stats", args->disable_log_stats, "No periodic engine stats line");
  cmd->add_flag("--no-web-ui", args->no_web_ui, "Do not serve the dashboard and chat playground at / and /dashboard");
  cmd->add_option("--shutdown-timeout", args->shutdown_timeout,
                  "Seconds SIGINT/SIGTERM lets running requests finish; then they end with an error event (0: no "
                  "limit; a second signal exits at once)")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  cmd->add_option("--log-stats-interval", args->log_stats_interval, "Seconds between engine stats lines")
      ->check(CLI::Range(0.1, 3600.0))
      ->capture_default_str();
  cmd->add_flag("--vllm-metric-names", args->vllm_metric_names,
                "/metrics also under vLLM's names (vllm:...), for existing dashboards");
}

}  // namespace

void add_serve_command(CLI::App& app) {
  auto args = std::make_shared<ServeArgs>();
  CLI::App* cmd = app.add_subcommand("serve", "Serve the OpenAI-compatible HTTP API (chat, completions, metrics)");
  add_model_source_options(cmd, args->source);
  // (Named apart from --model: CLI11 2.4 refuses a positional that shares a long option's name.)
  cmd->add_option("MODEL", args->positional_model, "Model folder, as vLLM's `serve MODEL` (or --model)");
  cmd->add_option("--max-num-seqs,--max-running-requests", args->max_num_seqs, "Sequences per step at most (default 64; presets change it)")
      ->check(positive_number());
  cmd->add_option("--max-num-batched-tokens,--max-batch-tokens", args->max_batch_tokens,
                  "Tokens per step at most (default 2048 on GPUs, 512 on the CPU; presets change it)")
      ->check(positive_number());
  cmd->add_option("--kv-cache-memory,--kv-cache-memory-bytes", args->kv_cache_memory,
                  "Bytes for each data-parallel rank's KV cache, e.g. 2G or 512MiB (default: on a GPU what "
                  "--gpu-memory-utilization leaves, on the CPU max_num_seqs x max_model_len up to 2 GiB)");
  cmd->add_option("--kv-cache-dtype", args->kv_cache_dtype,
                  "auto (the runner's precision: bf16 on GPUs) or fp8 / fp8_e4m3 (E4M3 latent rows and indexer keys "
                  "with a scale per 128 values, DeepSeek-V3.2's layout: 656 bytes a token and layer instead of 1152 "
                  "on a GPU; the CPU rounds its fp32 rows the same way)")
      ->capture_default_str();
  cmd->add_option("--gpu-memory-utilization,--mem-fraction-static", args->gpu_memory_utilization,
                  "Fraction of each GPU's memory for weights, workspaces and the KV cache (without --kv-cache-memory)")
      ->check(CLI::Range(0.05, 1.0))
      ->capture_default_str();
  cmd->add_option("--max-model-len,--context-length", args->max_model_len,
                  "Prompt + output tokens per request, e.g. 32768, 32K or 32k (= 32000) (default: the model's)");
  cmd->add_option("--preset", args->preset, "high_throughput | low_latency | memory_constrained")
      ->check(CLI::IsMember({"high_throughput", "low_latency", "memory_constrained"}));
  cmd->add_option("--responses-store", args->responses_store,
                  "Keep the newest N Responses API answers for previous_response_id and GET /v1/responses/{id} "
                  "(0: none, as vLLM's default; VLLM_ENABLE_RESPONSES_API_STORE=1 keeps 1024)")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--served-model-name", args->served_model_names,
                  "Model ids in the API, the first in responses (default: the folder's name, and the model argument "
                  "as given, as vLLM names it)")
      ->take_all();
  cmd->add_option("--speculative", args->speculative,
                  "Speculative decoding with the checkpoint's MTP layer (greedy output unchanged, sampled output "
                  "equally distributed)")
      ->check(CLI::IsMember({"mtp"}));
  cmd->add_option("--speculative-steps", args->speculative_steps, "Draft tokens per decode step (with --speculative mtp)")
      ->check(CLI::Range(1, 16))
      ->capture_default_str();
  cmd->add_option("--speculative-max-batch", args->speculative_max_batch,
                  "Steps with more decoding sequences than this decode plainly (0: no limit)")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  // vLLM's flags (docs/operations.md, "Coming from vLLM").
  cmd->add_option("--chat-template", args->chat_template, "A Jinja chat template file (or text) instead of the model's");
  cmd->add_option("--generation-config", args->generation_config,
                  "Sampling defaults: auto (the model's generation_config.json), vllm (none) or a folder")
      ->capture_default_str();
  cmd->add_option("--seed,--random-seed", args->seed, "Seeds the draws of requests that give no seed (reproducible runs)");
  cmd->add_flag("--no-enable-prefix-caching,--disable-radix-cache", args->no_prefix_caching, "Turn the prefix cache off");
  add_vllm_flags(cmd, args->vllm);
  add_sglang_flags(cmd, args->sglang);
  add_server_options(cmd, args.get());
  cmd->callback([args, cmd]() {
    args->speculative_steps_given = cmd->count("--speculative-steps") > 0;
    run_serve(*args);
  });
}

}  // namespace glms::cli
