// glmserve serve: the OpenAI-compatible HTTP server over the engine (see docs/operations.md).
// Prints "glmserve: listening on http://HOST:PORT" and then "glmserve: ready"; on SIGINT or
// SIGTERM it stops accepting, drains the requests in flight and exits 0.
#include <CLI/CLI.hpp>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/model_source.h"
#include "core/error.h"
#include "engine/engine.h"
#include "model/glm5.h"
#include "server/api_error.h"
#include "server/api_service.h"
#include "server/backend.h"
#include "server/http_server.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace glms::cli {

namespace {

struct ServeArgs {
  ModelSourceArgs source;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::vector<std::string> api_keys;
  std::string jwt_secret;
  int max_num_seqs = 0;
  int max_batch_tokens = 0;
  int64_t kv_cache_memory = 0;
  double gpu_memory_utilization = engine::EngineConfig{}.gpu_memory_utilization;
  int max_model_len = 0;
  std::string preset;
  std::string served_model_name;
  int max_waiting = 0;
  std::string rate_limit;
  double request_timeout = 0.0;
  size_t max_body_bytes = 8u << 20;
  int io_threads = 2;
  std::string speculative;
  int speculative_steps = 3;
  int speculative_max_batch = engine::EngineConfig{}.speculative_max_batch;
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

// Sampling defaults from generation_config.json, as vLLM applies them.
void read_generation_defaults(const std::filesystem::path& dir, server::ServiceConfig& config) {
  std::ifstream in(dir / "generation_config.json");
  if (!in) return;
  const nlohmann::json g = nlohmann::json::parse(in, nullptr, false);
  if (!g.is_object()) return;
  if (g.contains("temperature") && g["temperature"].is_number()) config.default_temperature = g["temperature"];
  if (g.contains("top_p") && g["top_p"].is_number()) config.default_top_p = g["top_p"];
  if (g.contains("top_k") && g["top_k"].is_number_integer()) config.default_top_k = g["top_k"];
  if (g.contains("min_p") && g["min_p"].is_number()) config.default_min_p = g["min_p"];
}

// continue_final_message, as transformers does it: the rendered prompt ends right after the
// final (assistant) message's text, so the model continues that message instead of a new turn.
std::string cut_after_final_message(const std::string& prompt, const nlohmann::json& messages) {
  const nlohmann::json& content = messages.back()["content"];
  std::string text;
  if (content.is_string()) {
    text = content.get<std::string>();
  } else if (content.is_array()) {
    for (const auto& part : content)
      if (part.contains("text") && part["text"].is_string()) text = part["text"].get<std::string>();
  }
  const size_t at = text.empty() ? std::string::npos : prompt.rfind(text);
  if (at == std::string::npos)
    server::bad_request("continue_final_message: the final message's text does not appear in the rendered prompt",
                        "messages");
  return prompt.substr(0, at + text.size());
}

void run_serve(const ServeArgs& args) {
  // Every thread started from here on inherits the blocked signals; this thread waits for them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  if (args.source.model_dir.empty()) fail("serve needs --model DIR (its tokenizer and chat template)");
  const std::filesystem::path dir(args.source.model_dir);
  text::Tokenizer tokenizer = text::Tokenizer::load(dir);
  server::ChatRenderer renderer;
  try {
    auto tmpl = std::make_shared<const ChatTemplate>(ChatTemplate::load(args.source.model_dir));
    renderer = [tmpl](const server::ChatRequest& r) {
      const std::string tools = r.tools && !r.tools->is_null() ? r.tools->dump() : std::string();
      std::string prompt = tmpl->render(r.messages->dump(), tools, r.add_generation_prompt, r.template_kwargs->dump());
      if (r.continue_final_message) prompt = cut_after_final_message(prompt, *r.messages);
      return prompt;
    };
  } catch (const Error& e) {
    std::fprintf(stderr, "glmserve: warning: no chat template (%s); /v1/chat/completions answers 400\n", e.what());
  }

  engine::EngineConfig engine_config;
  apply_preset(args.preset, engine_config);
  if (args.max_num_seqs > 0) engine_config.max_num_seqs = args.max_num_seqs;
  if (args.max_batch_tokens > 0) engine_config.max_batch_tokens = args.max_batch_tokens;
  if (args.kv_cache_memory > 0) engine_config.kv_cache_bytes = args.kv_cache_memory;
  engine_config.gpu_memory_utilization = args.gpu_memory_utilization;
  if (args.max_model_len > 0) engine_config.max_model_len = args.max_model_len;
  if (args.max_waiting > 0) engine_config.max_waiting = args.max_waiting;
  if (!args.speculative.empty()) {
    engine_config.speculative_steps = args.speculative_steps;
    engine_config.speculative_max_batch = args.speculative_max_batch;
  }

  ModelSourceArgs source = args.source;
  source.load_mtp = engine_config.speculative_steps > 0;
  LoadedModel model = load_model(source);
  if (engine_config.max_model_len > model.config().max_position_embeddings)
    fail("--max-model-len " + std::to_string(engine_config.max_model_len) + " exceeds the model's " +
         std::to_string(model.config().max_position_embeddings) + " positions");
  const int64_t model_cache_bytes_per_token = model.executor->cache_bytes_per_token();
  const std::string device = model.executor->device();
  runtime::Executor& executor = *model.executor;
  engine::Engine engine(std::move(model.executor), engine_config);
  const std::vector<runtime::Executor::RankMemory> memory = executor.memory();
  std::unique_ptr<server::Backend> backend = server::make_engine_backend(engine);

  server::ServiceConfig config;
  config.served_model_name = args.served_model_name.empty() ? dir.filename().string() : args.served_model_name;
  if (config.served_model_name.empty()) config.served_model_name = dir.parent_path().filename().string();
  config.api_keys = args.api_keys;
  config.jwt_secret = args.jwt_secret;
  config.request_timeout_seconds = args.request_timeout;
  config.max_body_bytes = args.max_body_bytes;
  parse_rate_limit(args.rate_limit, config);
  read_generation_defaults(dir, config);
  server::ApiService service(*backend, tokenizer, renderer, server::glm_parser_factory(), config);

  server::HttpServerOptions http;
  http.host = args.host;
  http.port = static_cast<uint16_t>(args.port);
  http.max_body_bytes = args.max_body_bytes;
  http.threads = args.io_threads;
  server::HttpServer server(service, http);
  server.start();
  std::printf("glmserve: model %s (served as '%s'), max_model_len %d, max_num_seqs %d, max_batch_tokens %d\n",
              args.source.model_dir.c_str(), config.served_model_name.c_str(), engine.config().max_model_len,
              engine.config().max_num_seqs, engine.config().max_batch_tokens);
  const int64_t cache_bytes = int64_t{engine.blocks_per_rank()} * engine.config().block_size *
                              model_cache_bytes_per_token;
  std::printf("glmserve: layout %s on %s; KV cache %d blocks of %d tokens per data-parallel rank (%d tokens, %.2f GiB)\n",
              engine.layout().describe().c_str(), device.c_str(), engine.blocks_per_rank(), engine.config().block_size,
              engine.blocks_per_rank() * engine.config().block_size, static_cast<double>(cache_bytes) / (1 << 30));
  for (size_t r = 0; r < memory.size(); ++r)
    if (memory[r].weight_bytes > 0)
      std::printf("glmserve: rank %zu: weights %.2f GiB, KV cache %.2f GiB on its device\n", r,
                  static_cast<double>(memory[r].weight_bytes) / (1 << 30),
                  static_cast<double>(memory[r].cache_bytes) / (1 << 30));
  if (engine.config().speculative_steps > 0)
    std::printf("glmserve: speculative decoding with the MTP layer, %d draft tokens per step%s\n",
                engine.config().speculative_steps,
                engine.config().speculative_max_batch > 0
                    ? (", up to " + std::to_string(engine.config().speculative_max_batch) + " decoding sequences").c_str()
                    : "");
  std::printf("glmserve: pid %d%s\n", static_cast<int>(getpid()),
              model.processes ? (", process 0 of " + std::to_string(model.processes->size()) + " (mpirun): SIGTERM here stops them all").c_str() : "");
  std::printf("glmserve: listening on http://%s:%u\n", args.host.c_str(), static_cast<unsigned>(server.port()));
  std::printf("glmserve: ready\n");
  std::fflush(stdout);

  int received = 0;
  sigwait(&signals, &received);
  std::printf("glmserve: %s received: draining\n", received == SIGINT ? "SIGINT" : "SIGTERM");
  std::fflush(stdout);
  service.stop_accepting();
  server.stop_accepting();
  backend->drain();
  server.wait_idle(10.0);
  server.stop();
  std::printf("glmserve: stopped\n");
  std::fflush(stdout);
}

}  // namespace

void add_serve_command(CLI::App& app) {
  auto args = std::make_shared<ServeArgs>();
  CLI::App* cmd = app.add_subcommand("serve", "Serve the OpenAI-compatible HTTP API (chat, completions, metrics)");
  add_model_source_options(cmd, args->source);
  cmd->add_option("--host", args->host, "Address to bind (default loopback)");
  cmd->add_option("--port", args->port, "Port (0 = any free port)")->check(CLI::Range(0, 65535));
  cmd->add_option("--api-key", args->api_keys, "Accepted Bearer key (repeatable)")->take_all();
  cmd->add_option("--jwt-secret", args->jwt_secret, "Accept HS256 JWTs signed with this secret");
  cmd->add_option("--max-num-seqs", args->max_num_seqs, "Sequences per step at most")->check(CLI::PositiveNumber);
  cmd->add_option("--max-batch-tokens", args->max_batch_tokens, "Tokens per step at most")->check(CLI::PositiveNumber);
  cmd->add_option("--kv-cache-memory", args->kv_cache_memory, "Bytes for the latent KV cache")->check(CLI::PositiveNumber);
  cmd->add_option("--gpu-memory-utilization", args->gpu_memory_utilization,
                  "Fraction of each GPU's memory for weights, workspaces and the KV cache (without --kv-cache-memory)")
      ->check(CLI::Range(0.05, 1.0))
      ->capture_default_str();
  cmd->add_option("--max-model-len", args->max_model_len, "Prompt + output tokens per request")->check(CLI::PositiveNumber);
  cmd->add_option("--preset", args->preset, "high_throughput | low_latency | memory_constrained")
      ->check(CLI::IsMember({"high_throughput", "low_latency", "memory_constrained"}));
  cmd->add_option("--served-model-name", args->served_model_name, "Model id in the API (default: folder name)");
  cmd->add_option("--max-waiting", args->max_waiting, "Queued requests beyond which 429 is returned")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--rate-limit", args->rate_limit, "Per-client token bucket: RPS or RPS:BURST");
  cmd->add_option("--request-timeout", args->request_timeout, "Seconds before a request ends with 'timeout'")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--max-body-bytes", args->max_body_bytes, "Largest request body (413 above)");
  cmd->add_option("--io-threads", args->io_threads, "HTTP I/O threads")->check(CLI::Range(1, 64));
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
  cmd->callback([args]() { run_serve(*args); });
}

}  // namespace glms::cli
