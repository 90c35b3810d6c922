// vLLM's tokenizer endpoints on ApiService (api_service.h):
//   POST /tokenize   {"prompt": "..."} or {"messages": [...], "add_generation_prompt", "tools", ...},
//                    "add_special_tokens" (default true for a prompt, false for messages, as vLLM),
//                    "return_token_strs" -> {"count", "max_model_len", "tokens", "token_strs"}
//   POST /detokenize {"tokens": [ids]} -> {"prompt": "..."}
// Both take an optional "model" (checked like the generation endpoints' one).
#include <nlohmann/json.hpp>

#include "server/api_error.h"
#include "server/api_service.h"

namespace glms::server {

using nlohmann::json;

namespace {

json parse_body(const HttpRequest& request, const ParseLimits& limits) {
  check_body_text(request.body, limits.max_json_depth);
  json body = json::parse(request.body, nullptr, false);
  if (!body.is_object()) bad_request("the request body must be a JSON object");
  return body;
}

bool flag(const json& body, const char* name, bool fallback) {
  if (!body.contains(name) || body[name].is_null()) return fallback;
  if (!body[name].is_boolean()) bad_request(std::string(name) + " must be a boolean", name);
  return body[name].get<bool>();
}

HttpResponse json_reply(const json& body) {
  HttpResponse r;
  r.body = body.dump(-1, ' ', false, json::error_handler_t::replace);
  return r;
}

}  // namespace

HttpResponse ApiService::tokenize(const HttpRequest& request) const {
  const json body = parse_body(request, config_.parse_limits);
  if (body.contains("model") && !body["model"].is_null()) {
    if (!body["model"].is_string()) bad_request("model must be a string", "model");
    check_model(body["model"].get<std::string>());
  }
  const bool has_prompt = body.contains("prompt"), has_messages = body.contains("messages");
  if (has_prompt == has_messages) bad_request("give either \"prompt\" (a string) or \"messages\" (a chat)");
  std::vector<int32_t> ids;
  if (has_prompt) {
    if (!body["prompt"].is_string()) bad_request("prompt must be a string", "prompt");
    ids = tokenizer_.encode(body["prompt"].get<std::string>(), flag(body, "add_special_tokens", true));
  } else {
    if (!renderer_) throw_api(400, "This model has no chat template; tokenize a \"prompt\" instead");
    const std::string prompt = render_prompt(parse_chat_request(request.body, config_.parse_limits));
    ids = tokenizer_.encode(prompt, flag(body, "add_special_tokens", false));
  }
  json out = {{"count", ids.size()}, {"max_model_len", backend_.max_model_len()}, {"tokens", ids}};
  if (flag(body, "return_token_strs", false)) {
    json strs = json::array();
    for (int32_t id : ids) strs.push_back(tokenizer_.decode(std::vector<int32_t>{id}, false));
    out["token_strs"] = std::move(strs);
  } else {
    out["token_strs"] = nullptr;
  }
  return json_reply(out);
}

HttpResponse ApiService::detokenize(const HttpRequest& request) const {
  const json body = parse_body(request, config_.parse_limits);
  if (body.contains("model") && !body["model"].is_null()) {
    if (!body["model"].is_string()) bad_request("model must be a string", "model");
    check_model(body["model"].get<std::string>());
  }
  if (!body.contains("tokens") || !body["tokens"].is_array()) bad_request("tokens must be an array of token ids", "tokens");
  std::vector<int32_t> ids;
  for (const json& t : body["tokens"]) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= backend_.vocab_size())
      bad_request("tokens: " + t.dump() + " is not a token id of this vocabulary (0 to " +
                      std::to_string(backend_.vocab_size() - 1) + ")",
                  "tokens");
    ids.push_back(t.get<int32_t>());
  }
  return json_reply({{"prompt", tokenizer_.decode(ids, false)}});
}

}  // namespace glms::server
