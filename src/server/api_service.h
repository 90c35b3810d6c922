// The OpenAI-compatible API, independent of the transport: routes a parsed HTTP request to
// /v1/chat/completions, /v1/completions, /v1/responses, /v1/messages, /v1/models, /health,
// /metrics, /version, applies CORS, authentication, rate limits and request limits, and answers
// through a Responder.
//
// Contract: handle() never throws and answers every request exactly once (a reply, or a stream
// that ends); every error body is error_body(ApiError). handle() may be called from several
// threads at once.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "server/backend.h"
#include "server/cors.h"
#include "server/responses_store.h"
#include "server/http_types.h"
#include "server/openai_request.h"
#include "server/text_stream.h"
#include "text/tokenizer.h"

namespace glms::structured {
class GrammarMatcher;
struct TokenVocabulary;
}  // namespace glms::structured

namespace glms::server {

class ServerMetrics;
class Authenticator;
class RateLimiter;
struct AuthResult;

struct ServiceConfig {
  std::string served_model_name = "glm5";   // the id responses carry
  std::vector<std::string> model_aliases;   // more ids requests may name (serve --served-model-name A B)
  std::optional<uint64_t> seed;             // seeds the draws of requests without a seed (serve --seed)
  bool vllm_metric_names = false;           // /metrics also under vLLM's prefix (serve --vllm-metric-names)
  bool log_requests = false;                // an access line per request (serve; --disable-log-requests: none)
  std::string version = "0.1.0";
  size_t max_body_bytes = 8u << 20;
  ParseLimits parse_limits;
  std::vector<std::string> api_keys;
  std::string jwt_secret;
  double rate_limit_rps = 0.0;  // per client key; 0 = off
  double rate_limit_burst = 0.0;
  double request_timeout_seconds = 0.0;  // 0 = none
  // Sampling defaults when the request omits them (from generation_config.json, as vLLM does).
  float default_temperature = 1.0f;
  float default_top_p = 1.0f;
  int default_top_k = 0;
  float default_min_p = 0.0f;
  int default_completion_max_tokens = 16;  // /v1/completions without max_tokens (vLLM: 16)
  bool force_include_usage = false;  // streams end with usage whatever stream_options say (vLLM's flag)
  bool exclude_tools_when_none = false;  // tool_choice "none" leaves the tools out of the prompt (vLLM's flag)
  bool request_id_headers = false;   // every answer carries X-Request-Id (vLLM's --enable-request-id-headers)
  bool tokens_as_ids = false;        // logprobs name tokens token_id:N by default (vLLM's --return-tokens-as-token-ids)
  // A JSON object under every request's chat_template_kwargs (vLLM's --default-chat-template-kwargs;
  // empty: none); the request's own keys win
  std::string default_template_kwargs;
  CorsConfig cors;                   // browsers' cross-origin requests (off unless origins are given)
  std::string model_path;            // the checkpoint's folder or repo id (SGLang's /get_model_info)
  size_t responses_store_capacity = 0;  // Responses kept for previous_response_id (0: none, as vLLM's default)
  bool web_ui = true;                // the dashboard and playground at / and /dashboard (serve --no-web-ui: off)
  std::vector<std::string> banner;   // serve's start-up lines (layout, devices, KV cache), shown by the web UI
};

// Renders a chat request into the prompt text (the model's chat template). Throws
// ApiException or glms::Error (-> 400) when the template rejects the conversation.
using ChatRenderer = std::function<std::string(const ChatRequest&)>;

class ApiService {
 public:
  ApiService(Backend& backend, text::Tokenizer tokenizer, ChatRenderer renderer, ParserFactory parser_factory,
             ServiceConfig config);
  ~ApiService();

  // By value: with --enable-request-id-headers a request without X-Request-Id gets a fresh one,
  // which then names its answer as a client's would.
  void handle(HttpRequest request, std::shared_ptr<Responder> responder);

  // New generation requests get 503 from now on (SIGTERM); the others still work.
  void stop_accepting() { draining_.store(true); }
  ServerMetrics& metrics() { return *metrics_; }
  const ServiceConfig& config() const { return config_; }

 private:
  HttpResponse handle_sync(const HttpRequest& request, std::shared_ptr<Responder>& responder, bool& answered);
  // The endpoints open without a key (probes, metrics, the web UI, tokenize): their response, or
  // nothing when `path` is not one of them or when it was answered through `responder` (`answered`).
  std::optional<HttpResponse> open_endpoint(const HttpRequest& request, const std::string& path,
                                            std::shared_ptr<Responder>& responder, bool& answered);
  // GET /v1/models, /v1/models/{model_id} and SGLang's /get_model_info.
  HttpResponse model_endpoint(const HttpRequest& request, const std::string& path, const std::string& model_id) const;
  // POST of a generation or a token count: rate limit, body size, then the request's own handler.
  HttpResponse start_generation(const HttpRequest& request, const std::string& path, const AuthResult& auth,
                                std::shared_ptr<Responder>& responder, bool& answered);
  void check_body_size(const HttpRequest& request) const;  // 413 past serve --max-body-bytes
  void start_chat(const HttpRequest& request, std::shared_ptr<Responder> responder);
  // A parsed chat request's generation, answered through `responder`; `path` names it in the log.
  void run_chat(ChatRequest req, const std::string& client, std::shared_ptr<Responder> responder, const char* path);
  void start_generate(const HttpRequest& request, std::shared_ptr<Responder> responder);
  void start_message(const HttpRequest& request, std::shared_ptr<Responder> responder);
  void start_response(const HttpRequest& request, std::shared_ptr<Responder> responder);
  // GET or DELETE /v1/responses/{id}: a stored response.
  HttpResponse stored_response(const HttpRequest& request, const std::string& id);
  HttpResponse count_message_tokens(const HttpRequest& request) const;
  HttpResponse count_response_input_tokens(const HttpRequest& request) const;
  size_t prompt_tokens_of(const ChatRequest& request) const;
  // `logged_path`: the path its access line names (nullptr: no access line, for probes).
  void start_completion(const HttpRequest& request, std::shared_ptr<Responder> responder,
                        const char* logged_path = "/v1/completions");
  void start_health_generation(const HttpRequest& request, std::shared_ptr<Responder> responder);
  void start_invocation(const HttpRequest& request, std::shared_ptr<Responder> responder);
  void check_model(const std::string& model) const;
  // The chat template over `request`; its failures are 400s naming messages.
  std::string render_prompt(const ChatRequest& request) const;
  // vLLM's /tokenize (a prompt, or chat messages through the template) and /detokenize.
  HttpResponse tokenize(const HttpRequest& request) const;
  HttpResponse detokenize(const HttpRequest& request) const;
  uint64_t next_seed() const;  // a request's seed when it gives none
  HttpResponse reset_prefix_cache(const HttpRequest& request);
  static void take_request_id_header(const HttpRequest& request, SamplingFields& sampling);
  static void log_ignored_fields(const SamplingFields& sampling, const char* path);
  // bad_words as the token sequences that are never generated (engine::RequestParams::bad_word_ids)
  std::vector<std::vector<int32_t>> bad_word_sequences(const std::vector<std::string>& words) const;
  // 400 when a prompt of `bytes` cannot fit the context whatever its tokens (before tokenizing).
  void check_prompt_bytes(size_t bytes, const char* param) const;
  // `matcher` (may be null): the request's structured output; each choice gets its own constraint.
  // The bad words (bad_word_sequences, once a request) are the caller's to set.
  engine::RequestParams base_params(const SamplingFields& s, const std::vector<int32_t>& ids, bool chat, int index,
                                    const std::shared_ptr<structured::GrammarMatcher>& matcher) const;
  // The matcher of a request's structured output or forced tool call (null: none): its grammar
  // compiled once per distinct form, its DFA and masks shared by the requests using it (16 forms
  // kept). Throws ApiException 400 naming what is wrong.
  std::shared_ptr<structured::GrammarMatcher> structured_matcher(const SamplingFields& s, const ChatRequest* chat,
                                                                 bool opens_reasoning) const;

  Backend& backend_;
  text::Tokenizer tokenizer_;
  ChatRenderer renderer_;
  ParserFactory parser_factory_;
  ServiceConfig config_;
  std::unique_ptr<ServerMetrics> metrics_;
  std::unique_ptr<Authenticator> auth_;
  std::unique_ptr<RateLimiter> limiter_;
  CorsPolicy cors_;
  std::shared_ptr<const nlohmann::json> default_template_kwargs_;  // ServiceConfig's, parsed (null: none)
  std::unique_ptr<ResponsesStore> responses_store_;  // null: the Responses API stores nothing
  std::vector<int32_t> markup_ids_;  // GLM markup special tokens kept in chat text
  // Each token's text and their trie: what structured outputs match tokens against.
  std::shared_ptr<const structured::TokenVocabulary> vocabulary_;
  mutable std::mutex grammar_mutex_;
  mutable std::unordered_map<std::string, std::shared_ptr<structured::GrammarMatcher>> matchers_;
  std::atomic<bool> draining_{false};
  int64_t started_at_ = 0;
  mutable std::mutex seed_mutex_;
  mutable std::mt19937_64 seeds_;
};

}  // namespace glms::server
