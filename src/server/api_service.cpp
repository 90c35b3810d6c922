// Routing, limits, authentication and request setup of the OpenAI API (see api_service.h).
#include "server/api_service.h"

#include <chrono>
#include <cmath>
#include <mutex>
#include <ctime>
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"
#include "log/log.h"
#include "server/anthropic_messages.h"
#include "server/openai_responses.h"
#include "server/api_error.h"
#include "server/auth.h"
#include "server/generation.h"
#include "server/metrics.h"
#include "server/rate_limit.h"
#include "server/sglang_generate.h"
#include "structured/recognizer.h"
#include "server/web_ui.h"
#include "text/glm_parsers.h"

namespace glms::server {

using nlohmann::json;

namespace {

double monotonic_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

HttpResponse json_response(int status, const json& body) {
  HttpResponse r;
  r.status = status;
  r.body = body.dump(-1, ' ', false, json::error_handler_t::replace);
  return r;
}

HttpResponse error_response(const ApiError& e) {
  HttpResponse r;
  r.status = e.status;
  r.body = error_body(e);
  if (e.retry_after > 0) r.headers.emplace_back("Retry-After", std::to_string(static_cast<int>(std::ceil(e.retry_after))));
  if (e.status == 401) r.headers.emplace_back("WWW-Authenticate", "Bearer");
  return r;
}

// The paths served (and /v1/models/{id}): what a 404 lists and what metrics label by name.
constexpr const char* kServedPaths[] = {"/v1/chat/completions", "/v1/completions", "/v1/responses",
                                        "/v1/responses/input_tokens", "/v1/messages",
                                        "/v1/messages/count_tokens", "/v1/models", "/tokenize", "/detokenize",
                                        "/health", "/ping", "/metrics", "/version", "/", "/dashboard",
                                        "/dashboard/info", "/invocations", "/health_generate", "/get_model_info",
                                        "/load", "/reset_prefix_cache", "/flush_cache", "/generate"};

// Anthropic's Messages API answers in Anthropic's error shape.
bool is_anthropic_path(const std::string& path) { return path.rfind("/v1/messages", 0) == 0; }

std::string handler_label(const std::string& path) {
  // Served paths by name; everything else as one label (no unbounded label values).
  for (const char* served : kServedPaths)
    if (path == served) return path;
  if (path.rfind("/v1/models/", 0) == 0) return "/v1/models/{model}";
  return "other";
}

// vLLM's truncate_prompt_tokens: the prompt's last `truncate` tokens (-1: the model's length of
// them; 0: no truncation). More than the model's length is a 400, as vLLM answers. Whether it cut.
bool truncate_prompt(std::vector<int32_t>& ids, int truncate, int max_len) {
  if (truncate == 0) return false;
  if (truncate > max_len)
    bad_request("truncate_prompt_tokens (" + std::to_string(truncate) + ") is larger than the model's length (" +
                    std::to_string(max_len) + ")",
                "truncate_prompt_tokens");
  const size_t keep = static_cast<size_t>(truncate < 0 ? max_len : truncate);
  if (ids.size() <= keep) return false;
  ids.erase(ids.begin(), ids.end() - static_cast<std::ptrdiff_t>(keep));
  return true;
}

}  // namespace

std::string ApiError::type() const {
  switch (status) {
    case 400: return "BadRequestError";
    case 401: return "AuthenticationError";
    case 403: return "PermissionDeniedError";
    case 404: return "NotFoundError";
    case 405: return "MethodNotAllowedError";
    case 408: return "RequestTimeoutError";
    case 409: return "ConflictError";
    case 413: return "RequestEntityTooLargeError";
    case 415: return "UnsupportedMediaTypeError";
    case 429: return "RateLimitError";
    case 503: return "ServiceUnavailableError";
    default: return status >= 500 ? "InternalServerError" : "BadRequestError";
  }
}

std::string error_body(const ApiError& e) {
  json err = {{"message", e.message}, {"type", e.type()}, {"param", e.param.empty() ? json(nullptr) : json(e.param)},
              {"code", e.status}};
  return json{{"error", std::move(err)}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string sse_event(const std::string& payload) {
  std::string out;
  size_t start = 0;
  while (true) {
    const size_t nl = payload.find('\n', start);
    out += "data: ";
    out.append(payload, start, nl == std::string::npos ? std::string::npos : nl - start);
    out += "\n";
    if (nl == std::string::npos) break;
    start = nl + 1;
  }
  out += "\n";
  return out;
}

ApiService::ApiService(Backend& backend, text::Tokenizer tokenizer, ChatRenderer renderer,
                       ParserFactory parser_factory, ServiceConfig config)
    : backend_(backend),
      tokenizer_(std::move(tokenizer)),
      renderer_(std::move(renderer)),
      parser_factory_(std::move(parser_factory)),
      config_(std::move(config)),
      metrics_(std::make_unique<ServerMetrics>(config_.served_model_name)),
      auth_(std::make_unique<Authenticator>(config_.api_keys, config_.jwt_secret)),
      limiter_(std::make_unique<RateLimiter>(config_.rate_limit_rps, config_.rate_limit_burst)),
      cors_(config_.cors),
      responses_store_(config_.responses_store_capacity > 0
                           ? std::make_unique<ResponsesStore>(config_.responses_store_capacity)
                           : nullptr),
      started_at_(static_cast<int64_t>(std::time(nullptr))),
      seeds_(config_.seed ? *config_.seed : std::random_device{}()) {
  tokenizer_.min_tokens_for_bytes(0);  // finds the longest token now, not at the first request
  if (!config_.default_template_kwargs.empty()) {
    json kwargs = json::parse(config_.default_template_kwargs, nullptr, false);
    if (!kwargs.is_object()) throw Error("default chat template kwargs: expected a JSON object");
    default_template_kwargs_ = std::make_shared<const json>(std::move(kwargs));
  }
  std::vector<std::string> texts(static_cast<size_t>(tokenizer_.vocab_size()));
  for (size_t id = 0; id < texts.size(); ++id) {
    const int32_t one = static_cast<int32_t>(id);
    if (!tokenizer_.is_special(one)) texts[id] = tokenizer_.decode(std::vector<int32_t>{one}, false);
  }
  std::vector<int32_t> structured_markup;
  for (const std::string_view tag : structured::kMarkupTokens)
    structured_markup.push_back(tokenizer_.token_to_id(std::string(tag)));
  vocabulary_ = structured::make_vocabulary(std::move(texts), structured_markup);
  for (const char* tag : {"<think>", "</think>", "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>",
                          "<arg_value>", "</arg_value>"}) {
    const int32_t id = tokenizer_.token_to_id(tag);
    if (id >= 0) markup_ids_.push_back(id);
  }
}

ApiService::~ApiService() = default;

void ApiService::handle(HttpRequest request, std::shared_ptr<Responder> responder) {
  // vLLM's --enable-request-id-headers: the client's id, or a fresh one, on every answer (the
  // outermost wrapper, as vLLM's middleware: preflights too). A fresh id also names the answer
  // (chatcmpl-ID), where vLLM's differ.
  if (config_.request_id_headers) {
    std::string& id = request.headers["x-request-id"];
    if (id.empty()) id = random_id("");
    responder = std::make_shared<HeaderAddingResponder>(
        std::move(responder), std::vector<std::pair<std::string, std::string>>{{"X-Request-Id", id}});
  }
  // CORS before anything else but the id: a browser's preflight carries no credentials.
  if (cors_.enabled()) {
    if (CorsPolicy::is_preflight(request)) {
      HttpResponse preflight = cors_.preflight(request);
      metrics_->count_http(preflight.status, handler_label(request.path()), request.method);
      responder->reply(std::move(preflight));
      return;
    }
    responder = cors_.wrap(request.header("origin"), std::move(responder));
  }
  HttpResponse response;
  bool answered = false;
  try {
    response = handle_sync(request, responder, answered);
  } catch (const ApiException& e) {
    response = error_response(e.error);
  } catch (const Error& e) {
    response = error_response(ApiError{400, e.what(), "", 0.0});
  } catch (const std::exception& e) {
    response = error_response(ApiError{500, std::string("internal error: ") + e.what(), "", 0.0});
  } catch (...) {
    response = error_response(ApiError{500, "internal error", "", 0.0});
  }
  if (answered) return;
  const std::string path = request.path();
  metrics_->count_http(response.status, handler_label(path), request.method);
  const bool anthropic_error = is_anthropic_path(path) && response.status >= 400;
  if (anthropic_error) {
    const json body = json::parse(response.body, nullptr, false);
    response.body = anthropic_error_body(response.status, body.is_object() && body.contains("error")
                                                              ? body["error"].value("message", "")
                                                              : response.body);
  }
  // Access lines for what the client asked (not for probes and scrapes).
  if (config_.log_requests && path != "/health" && path != "/ping" && path != "/metrics" &&
      path != "/health_generate" && path != "/load") {
    std::string line = request.client + " " + request.method + " " + path + " " + std::to_string(response.status);
    if (response.status >= 400) {
      const json body = json::parse(response.body, nullptr, false);
      if (body.is_object() && body.contains("error") && body["error"].is_object())
        line += ": " + body["error"].value("message", "");
    }
    log::info(line);
  }
  responder->reply(std::move(response));
}

HttpResponse ApiService::handle_sync(const HttpRequest& request, std::shared_ptr<Responder>& responder,
                                     bool& answered) {
  const std::string path = request.path();
  if (std::optional<HttpResponse> r = open_endpoint(request, path, responder, answered)) return std::move(*r);
  if (answered) return {};
  const bool generate = path == "/v1/chat/completions" || path == "/v1/completions" || path == "/v1/responses" ||
                        path == "/v1/responses/input_tokens" || path == "/v1/messages" || path == "/generate" ||
                        path == "/v1/messages/count_tokens" || path == "/invocations";
  const std::string models_prefix = "/v1/models/", responses_prefix = "/v1/responses/";
  const bool one_model = path.rfind(models_prefix, 0) == 0 && path.size() > models_prefix.size();
  const bool one_response = path.rfind(responses_prefix, 0) == 0 && path.size() > responses_prefix.size() && !generate;
  const bool cache_reset = path == "/reset_prefix_cache" || path == "/flush_cache";
  if (path != "/v1/models" && path != "/get_model_info" && !one_model && !one_response && !generate && !cache_reset) {
    std::string served;
    for (const char* p : kServedPaths) served += (served.empty() ? "" : ", ") + std::string(p);
    throw_api(404, "Not Found: glmserve does not serve " + path + " (it serves " + served + ")");
  }

  // Everything under /v1, /invocations, /get_model_info and the cache resets is authenticated (as
  // vLLM does /v1 with --api-key).
  // Anthropic's clients send their key as x-api-key.
  std::string authorization = request.header("authorization");
  if (authorization.empty() && !request.header("x-api-key").empty()) authorization = "Bearer " + request.header("x-api-key");
  const AuthResult auth = auth_->check(authorization, static_cast<int64_t>(std::time(nullptr)));
  if (!auth.ok) throw ApiException{auth.error};

  if (one_response) return stored_response(request, path.substr(responses_prefix.size()));
  if (cache_reset) return reset_prefix_cache(request);
  if (!generate) return model_endpoint(request, path, one_model ? path.substr(models_prefix.size()) : "");
  return start_generation(request, path, auth, responder, answered);
}

std::optional<HttpResponse> ApiService::open_endpoint(const HttpRequest& request, const std::string& path,
                                                      std::shared_ptr<Responder>& responder, bool& answered) {
  const bool is_get = request.method == "GET" || request.method == "HEAD";
  if (path == "/health" || path == "/ping") {
    if (!is_get) throw_api(405, "Method Not Allowed");
    HttpResponse r;
    r.content_type = "text/plain; charset=utf-8";
    return r;
  }
  if (path == "/metrics") {
    if (!is_get) throw_api(405, "Method Not Allowed");
    HttpResponse r;
    r.content_type = "text/plain; version=0.0.4; charset=utf-8";
    BackendStats stats = backend_.stats();
    stats.device_memory = backend_.device_memory();
    r.body = metrics_->render(stats, config_.vllm_metric_names);
    return r;
  }
  if (path == "/version") {
    if (!is_get) throw_api(405, "Method Not Allowed");
    return json_response(200, {{"version", config_.version}});
  }
  // vLLM's load balancers' figure: the requests the engine holds, running or waiting.
  if (path == "/load") {
    if (!is_get) throw_api(405, "Method Not Allowed");
    const BackendStats stats = backend_.stats();
    return json_response(200, {{"server_load", stats.num_running + stats.num_waiting}});
  }
  // The web UI: a page from the binary, and what it shows at the top. Unauthenticated, as
  // /metrics is; its requests to /v1 carry the key typed into it.
  if (path == "/" || path == "/dashboard" || path == "/dashboard/info") {
    if (!config_.web_ui) throw_api(404, "Not Found: the web UI is off (serve --no-web-ui)");
    if (!is_get) throw_api(405, "Method Not Allowed");
    if (path == "/dashboard/info")
      return json_response(200, {{"model", config_.served_model_name}, {"max_model_len", backend_.max_model_len()},
                                 {"version", config_.version}, {"banner", config_.banner},
                                 {"auth", auth_->enabled()}});
    HttpResponse r;
    r.content_type = "text/html; charset=utf-8";
    r.body = std::string(dashboard_html());
    return r;
  }
  // vLLM's tokenizer endpoints, outside /v1 (which vLLM's --api-key guards alone) as there.
  if (path == "/tokenize" || path == "/detokenize") {
    if (request.method != "POST") throw_api(405, "Method Not Allowed: use POST");
    check_body_size(request);
    return path == "/tokenize" ? tokenize(request) : detokenize(request);
  }
  // SGLang's probe that a generation runs, unauthenticated as /health is.
  if (path == "/health_generate") {
    if (!is_get) throw_api(405, "Method Not Allowed");
    if (draining_.load()) throw ApiException{ApiError{503, "The server is shutting down.", "", 1.0}};
    start_health_generation(request, responder);
    metrics_->count_http(200, path, request.method);
    answered = true;
  }
  return std::nullopt;
}

HttpResponse ApiService::model_endpoint(const HttpRequest& request, const std::string& path,
                                        const std::string& model_id) const {
  if (request.method != "GET" && request.method != "HEAD") throw_api(405, "Method Not Allowed");
  auto model_card = [&](const std::string& id) {
    return json{{"id", id},
                {"object", "model"},
                {"created", started_at_},
                {"owned_by", "glmserve"},
                {"root", config_.model_path.empty() ? config_.served_model_name : config_.model_path},  // vLLM's: the path
                {"parent", nullptr},
                {"max_model_len", backend_.max_model_len()},
                // vLLM's one default permission object (old OpenAI clients read it)
                {"permission", json::array({{{"id", "modelperm-" + id},
                                             {"object", "model_permission"},
                                             {"created", started_at_},
                                             {"allow_create_engine", false},
                                             {"allow_sampling", true},
                                             {"allow_logprobs", true},
                                             {"allow_search_indices", false},
                                             {"allow_view", true},
                                             {"allow_fine_tuning", false},
                                             {"organization", "*"},
                                             {"group", nullptr},
                                             {"is_blocking", false}}})}};
  };
  if (path == "/v1/models") {
    json data = json::array({model_card(config_.served_model_name)});
    for (const std::string& alias : config_.model_aliases) data.push_back(model_card(alias));
    return json_response(200, {{"object", "list"}, {"data", data}});
  }
  if (path == "/get_model_info") {  // SGLang's
    return json_response(200, {{"model_path", config_.model_path},
                               {"tokenizer_path", config_.model_path},
                               {"is_generation", true},
                               {"served_model_name", config_.served_model_name}});
  }
  check_model(model_id);
  return json_response(200, model_card(model_id));
}

// vLLM's POST /reset_prefix_cache and SGLang's /flush_cache (GET too, as SGLang): a cold prefix
// cache for the next benchmark run, only while no request is in flight.
HttpResponse ApiService::reset_prefix_cache(const HttpRequest& request) {
  if (request.method != "POST" && (request.method != "GET" || request.path() != "/flush_cache"))
    throw_api(405, "Method Not Allowed: use POST");
  const std::optional<int> freed = backend_.reset_prefix_cache();
  if (!freed) {
    const BackendStats stats = backend_.stats();
    throw_api(409, "the prefix cache is not reset while requests are in flight (" + std::to_string(stats.num_running) +
                       " running, " + std::to_string(stats.num_waiting) + " waiting): retry when they have finished");
  }
  log::info("prefix cache reset: " + std::to_string(*freed) + " cached blocks freed");
  return json_response(200, {{"freed_blocks", *freed}});
}

HttpResponse ApiService::start_generation(const HttpRequest& request, const std::string& path, const AuthResult& auth,
                                          std::shared_ptr<Responder>& responder, bool& answered) {
  if (request.method != "POST") throw_api(405, "Method Not Allowed: use POST");
  if (limiter_->enabled()) {
    const std::string key = auth.identity.empty() ? "ip:" + request.client : auth.identity;
    const double wait = limiter_->acquire(key, monotonic_seconds());
    if (wait > 0) throw ApiException{ApiError{429, "Rate limit exceeded for this client; retry later.", "", wait}};
  }
  check_body_size(request);
  // Any Content-Type is read as JSON (curl -d sends form encoding), as the body decides.
  if (draining_.load()) throw ApiException{ApiError{503, "The server is shutting down.", "", 1.0}};

  if (path == "/v1/messages/count_tokens") return count_message_tokens(request);
  if (path == "/v1/responses/input_tokens") return count_response_input_tokens(request);
  if (path == "/v1/chat/completions") start_chat(request, responder);
  else if (path == "/v1/responses") start_response(request, responder);
  else if (path == "/invocations") start_invocation(request, responder);
  else if (path == "/v1/messages") start_message(request, responder);
  else if (path == "/generate") start_generate(request, responder);
  else start_completion(request, responder);
  metrics_->count_http(200, path, request.method);
  answered = true;
  return {};
}

void ApiService::check_body_size(const HttpRequest& request) const {
  if (request.body.size() > config_.max_body_bytes)
    throw_api(413, "Request body is too large (" + std::to_string(request.body.size()) + " bytes; limit " +
                       std::to_string(config_.max_body_bytes) + ")");
}

void ApiService::check_model(const std::string& model) const {
  if (model.empty() || model == config_.served_model_name) return;
  for (const std::string& alias : config_.model_aliases)
    if (model == alias) return;
  throw ApiException{ApiError{404, "The model `" + model + "` does not exist.", "model", 0.0}};
}

void ApiService::check_prompt_bytes(size_t bytes, const char* param) const {
  // Far past the context by its length alone: refused before tokenizing (an 8 MB body would
  // take seconds of BPE to be refused otherwise).
  const size_t at_least = tokenizer_.min_tokens_for_bytes(bytes);
  const int max_len = backend_.max_model_len();
  if (at_least >= static_cast<size_t>(max_len))
    throw ApiException{ApiError{400,
                                "This model's maximum context length is " + std::to_string(max_len) +
                                    " tokens. However, your prompt of " + std::to_string(bytes) +
                                    " bytes has at least " + std::to_string(at_least) +
                                    " tokens. Please reduce the length of the messages or completion.",
                                param, 0.0}};
}

std::string ApiService::render_prompt(const ChatRequest& request) const {
  try {
    if (default_template_kwargs_) {
      ChatRequest with_defaults = request;
      json kwargs = *default_template_kwargs_;
      if (request.template_kwargs) kwargs.update(*request.template_kwargs);
      with_defaults.template_kwargs = std::make_shared<const json>(std::move(kwargs));
      return renderer_(with_defaults);
    }
    return renderer_(request);
  } catch (const ApiException&) {
    throw;
  } catch (const std::exception& e) {
    bad_request(std::string("chat template error: ") + e.what(), "messages");
  }
}

void ApiService::start_chat(const HttpRequest& request, std::shared_ptr<Responder> responder) {
  ChatRequest chat = parse_chat_request(request.body, config_.parse_limits);
  take_request_id_header(request, chat.sampling);
  run_chat(std::move(chat), request.client, std::move(responder), "/v1/chat/completions");
}

void ApiService::run_chat(ChatRequest req, const std::string& client, std::shared_ptr<Responder> responder,
                          const char* path) {
  check_model(req.sampling.model);
  if (config_.exclude_tools_when_none && req.tool_choice == "none") req.tools.reset();
  if (config_.force_include_usage) req.sampling.include_usage = true;
  if (!req.sampling.tokens_as_ids) req.sampling.tokens_as_ids = config_.tokens_as_ids;
  log_ignored_fields(req.sampling, path);
  if (!renderer_) throw_api(400, "This model has no chat template; use /v1/completions");
  const std::string prompt = render_prompt(req);
  GenerationSpec spec;
  if (config_.log_requests) spec.access_log = client + " POST " + path;
  spec.chat = true;
  spec.chat_echo = req.echo_text;
  spec.id = req.sampling.request_id.empty() ? random_id("chatcmpl-") : "chatcmpl-" + req.sampling.request_id;
  spec.model = config_.served_model_name;
  spec.created = static_cast<int64_t>(std::time(nullptr));
  check_prompt_bytes(prompt.size(), "messages");
  spec.prompts.push_back({tokenizer_.encode(prompt, req.sampling.add_special_tokens), prompt});
  truncate_prompt(spec.prompts[0].ids, req.sampling.truncate_prompt_tokens, backend_.max_model_len());
  const auto matcher = structured_matcher(req.sampling, &req, text::prompt_opens_reasoning(prompt));
  const std::vector<std::vector<int32_t>> bad_words = bad_word_sequences(req.sampling.bad_words);
  for (int i = 0; i < req.sampling.n; ++i) {
    spec.params.push_back(base_params(req.sampling, spec.prompts[0].ids, true, i, matcher));
    spec.params.back().bad_word_ids = bad_words;
  }
  spec.sampling = std::move(req.sampling);
  spec.parser_factory = parser_factory_;
  spec.parser_options.prompt_ends_in_think = text::prompt_opens_reasoning(prompt);
  spec.parser_options.tools = req.tools && !req.tools->is_null() && req.tool_choice != "none";
  if (spec.parser_options.tools) spec.parser_options.tools_json = req.tools->dump();
  spec.chat_text_special_ids = markup_ids_;
  auto generation = std::make_shared<Generation>(std::move(spec), tokenizer_, backend_, *metrics_, responder);
  generation->start();
  std::weak_ptr<Generation> weak = generation;
  responder->on_disconnect([weak] {
    if (auto g = weak.lock()) g->abort();
  });
}

// SGLang's native /generate as a completion whose answer an SGLang responder rewrites.
void ApiService::start_generate(const HttpRequest& request, std::shared_ptr<Responder> responder) {
  GenerateRequest generate = completion_request_of_generate(request.body);
  const HttpRequest completion{request.method, request.target, request.headers,
                               std::move(generate.completion_request), request.client};
  start_completion(completion, sglang_generate_responder(std::move(responder), std::move(generate)), "/generate");
}

// Anthropic's Messages API as a chat completion whose answer an Anthropic responder rewrites.
void ApiService::start_message(const HttpRequest& request, std::shared_ptr<Responder> responder) {
  ChatRequest req = parse_chat_request(chat_request_of_message(request.body), config_.parse_limits);
  // Claude Code asks for more output than a smaller context holds and compacts on its own.
  req.sampling.max_tokens_to_context = true;
  run_chat(std::move(req), request.client, anthropic_responder(std::move(responder)), "/v1/messages");
}

namespace {

// A health probe's answer: 200 with an empty body once the generation it ran is done; its error
// otherwise.
class ProbeResponder : public ForwardingResponder {
 public:
  using ForwardingResponder::ForwardingResponder;
  void reply(HttpResponse response) override {
    if (response.status == 200) {
      response.body.clear();
      response.content_type = "text/plain; charset=utf-8";
    }
    ForwardingResponder::reply(std::move(response));
  }
};

}  // namespace

// vLLM's /invocations (SageMaker's path): a body with messages is a chat completion, one with a
// prompt a completion.
void ApiService::start_invocation(const HttpRequest& request, std::shared_ptr<Responder> responder) {
  const json body = json::parse(request.body, nullptr, false);
  if (body.is_object() && body.contains("messages")) start_chat(request, std::move(responder));
  else if (body.is_object() && body.contains("prompt")) start_completion(request, std::move(responder), "/invocations");
  else bad_request("/invocations takes a chat completion request (messages) or a completion request (prompt)");
}

// SGLang's /health_generate: one greedy token of a fixed prompt through the engine.
void ApiService::start_health_generation(const HttpRequest& request, std::shared_ptr<Responder> responder) {
  HttpRequest probe = request;
  probe.body = json{{"prompt", "ping"}, {"max_tokens", 1}, {"temperature", 0}}.dump();
  start_completion(probe, std::make_shared<ProbeResponder>(std::move(responder)), nullptr);
}

// OpenAI's Responses API as a chat completion whose answer a Responses responder rewrites.
void ApiService::start_response(const HttpRequest& request, std::shared_ptr<Responder> responder) {
  ResponsesRequest translated = chat_request_of_response_request(request.body, responses_store_.get());
  ChatRequest chat = parse_chat_request(translated.chat_request, config_.parse_limits);
  chat.sampling.request_id.clear();  // a Response's ids are its own (resp_..., from the chat's random id)
  chat.sampling.ignored_fields.clear();  // the translation's chat body, not the client's
  run_chat(std::move(chat), request.client,
           responses_responder(std::move(responder), std::move(translated), responses_store_.get()), "/v1/responses");
}

HttpResponse ApiService::stored_response(const HttpRequest& request, const std::string& id) {
  if (!responses_store_)
    throw_api(404, "Not Found: glmserve stores no responses unless serve has --responses-store N (as vLLM without its "
                   "response store), so there is none to get or delete; send the whole conversation as input");
  if (id.find('/') != std::string::npos)
    throw_api(404, "Not Found: a stored response is read (GET) or deleted (DELETE) at /v1/responses/{id}; "
                   "cancelling and listing input items are not served");
  if (request.method == "GET") {
    const std::optional<ResponsesStore::Entry> entry = responses_store_->get(id);
    if (!entry) throw_api(404, "Response with id '" + id + "' not found (the store keeps the newest responses)");
    HttpResponse response;
    response.body = entry->response;
    return response;
  }
  if (request.method == "DELETE") {
    if (!responses_store_->erase(id)) throw_api(404, "Response with id '" + id + "' not found");
    return json_response(200, {{"id", id}, {"object", "response"}, {"deleted", true}});
  }
  throw_api(405, "Method Not Allowed: GET or DELETE");
}

// The tokens of a conversation through the chat template (Anthropic's and the Responses API's counts).
size_t ApiService::prompt_tokens_of(const ChatRequest& request) const {
  check_model(request.sampling.model);
  if (!renderer_) throw_api(400, "This model has no chat template");
  const std::string prompt = render_prompt(request);
  check_prompt_bytes(prompt.size(), "messages");
  return tokenizer_.encode(prompt, false).size();
}

HttpResponse ApiService::count_message_tokens(const HttpRequest& request) const {
  const ChatRequest req = parse_chat_request(chat_request_of_message(request.body, true), config_.parse_limits);
  return json_response(200, {{"input_tokens", prompt_tokens_of(req)}});
}

HttpResponse ApiService::count_response_input_tokens(const HttpRequest& request) const {
  const ResponsesRequest translated = chat_request_of_response_request(request.body, responses_store_.get());
  const ChatRequest req = parse_chat_request(translated.chat_request, config_.parse_limits);
  return json_response(200, {{"object", "response.input_tokens"}, {"input_tokens", prompt_tokens_of(req)}});
}

void ApiService::start_completion(const HttpRequest& request, std::shared_ptr<Responder> responder,
                                  const char* logged_path) {
  CompletionRequest req = parse_completion_request(request.body, config_.parse_limits);
  take_request_id_header(request, req.sampling);
  check_model(req.sampling.model);
  if (config_.force_include_usage) req.sampling.include_usage = true;
  if (!req.sampling.tokens_as_ids) req.sampling.tokens_as_ids = config_.tokens_as_ids;
  if (logged_path) log_ignored_fields(req.sampling, logged_path);
  GenerationSpec spec;
  if (config_.log_requests && logged_path) spec.access_log = request.client + " POST " + logged_path;
  spec.chat = false;
  spec.id = req.sampling.request_id.empty() ? random_id("cmpl-") : "cmpl-" + req.sampling.request_id;
  spec.model = config_.served_model_name;
  spec.created = static_cast<int64_t>(std::time(nullptr));
  spec.echo = req.echo;
  const int vocab = backend_.vocab_size();
  const auto matcher = structured_matcher(req.sampling, nullptr, false);
  const std::vector<std::vector<int32_t>> bad_words = bad_word_sequences(req.sampling.bad_words);
  for (const Prompt& prompt : req.prompts) {
    GenerationSpec::PromptInput input;
    if (const auto* text = std::get_if<std::string>(&prompt)) {
      check_prompt_bytes(text->size(), "prompt");
      input.ids = tokenizer_.encode(*text, req.sampling.add_special_tokens);
      input.text = *text;
      if (input.ids.empty()) bad_request("prompt encodes to no tokens", "prompt");
    } else {
      input.ids = std::get<std::vector<int32_t>>(prompt);
      for (int32_t id : input.ids)
        if (id >= vocab)
          bad_request("prompt: token id " + std::to_string(id) + " is outside the vocabulary (size " +
                          std::to_string(vocab) + ")",
                      "prompt");
      if (req.echo) input.text = tokenizer_.decode(input.ids, req.sampling.skip_special_tokens);
    }
    if (truncate_prompt(input.ids, req.sampling.truncate_prompt_tokens, backend_.max_model_len()) && req.echo)
      input.text = tokenizer_.decode(input.ids, req.sampling.skip_special_tokens);  // echo what the model read
    for (int i = 0; i < req.sampling.n; ++i) {
      spec.params.push_back(base_params(req.sampling, input.ids, false, i, matcher));
      spec.params.back().bad_word_ids = bad_words;
      // echo with logprobs: the prompt's tokens get their logprobs as the generated ones do.
      if (req.echo && req.sampling.logprobs >= 0)
        spec.params.back().prompt_logprobs = std::max(spec.params.back().prompt_logprobs, req.sampling.logprobs);
    }
    spec.prompts.push_back(std::move(input));
  }
  spec.sampling = std::move(req.sampling);
  auto generation = std::make_shared<Generation>(std::move(spec), tokenizer_, backend_, *metrics_, responder);
  generation->start();
  std::weak_ptr<Generation> weak = generation;
  responder->on_disconnect([weak] {
    if (auto g = weak.lock()) g->abort();
  });
}

}  // namespace glms::server
