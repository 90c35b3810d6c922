#include "server/anthropic_messages.h"

#include <fmt/format.h>

#include <algorithm>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <tuple>

#include "server/api_error.h"
#include "server/chat_adapter.h"

namespace glms::server {

using nlohmann::json;
using namespace adapter;

namespace {

// visit(block, its path, its type) for each block of a content array.
template <typename Visit>
void for_each_block(const json& content, const std::string& at, Visit visit) {
  for_each_object(content, at, [&](const json& block, const std::string& block_at) {
    visit(block, block_at, string_field(block, "type", block_at));
  });
}

// A tool_result's content (a string, or blocks) as the tool message's text.
std::string tool_result_text(const json& block, const std::string& at) {
  if (!block.contains("content") || block["content"].is_null()) return "";
  const json& content = block["content"];
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) bad_request(at + "content must be a string or an array of blocks", at + "content");
  std::string text;
  for_each_block(content, at + "content.", [&](const json& part, const std::string& part_at, const std::string& type) {
    append_part(text, type == "text" ? text_of(part, part_at) : placeholder_of(type), "\n");
  });
  return text;
}

// A user turn: its tool_result blocks as tool messages, then its text as a user message.
void add_user_turn(const json& content, const std::string& at, json& messages) {
  if (content.is_string()) {
    messages.push_back({{"role", "user"}, {"content", content}});
    return;
  }
  std::string text;
  for_each_block(content, at, [&](const json& block, const std::string& block_at, const std::string& type) {
    if (type == "text") {
      append_part(text, text_of(block, block_at), "\n\n");
    } else if (type == "tool_result") {
      const std::string id = string_field(block, "tool_use_id", block_at);
      if (id.empty()) bad_request(block_at + "tool_use_id: Field required", block_at + "tool_use_id");
      std::string result = tool_result_text(block, block_at);
      if (bool_field(block, "is_error", block_at)) result = "Error: " + result;
      messages.push_back({{"role", "tool"}, {"tool_call_id", id}, {"content", result}});
    } else {
      append_part(text, placeholder_of(type), "\n\n");  // image, document, ...
    }
  });
  if (!text.empty()) messages.push_back({{"role", "user"}, {"content", text}});
}

// An assistant turn: text as content, thinking as reasoning_content, tool_use blocks as tool calls.
void add_assistant_turn(const json& content, const std::string& at, json& messages) {
  json message = {{"role", "assistant"}};
  if (content.is_string()) {
    message["content"] = content;
    messages.push_back(std::move(message));
    return;
  }
  std::string text, reasoning;
  json calls = json::array();
  for_each_block(content, at, [&](const json& block, const std::string& block_at, const std::string& type) {
    if (type == "text") {
      append_part(text, text_of(block, block_at), "\n\n");
    } else if (type == "thinking") {
      reasoning += string_field(block, "thinking", block_at);  // its signature is ours, and ignored
    } else if (type == "tool_use") {
      const std::string id = string_field(block, "id", block_at), name = string_field(block, "name", block_at);
      if (id.empty() || name.empty()) bad_request(block_at + "id and name are required", block_at + (id.empty() ? "id" : "name"));
      const json input = block.contains("input") ? block["input"] : json::object();
      calls.push_back({{"id", id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", dump(input)}}}});
    }  // redacted_thinking and server-side blocks: opaque to this model, left out
  });
  message["content"] = text;
  if (!reasoning.empty()) message["reasoning_content"] = reasoning;
  if (!calls.empty()) message["tool_calls"] = std::move(calls);
  messages.push_back(std::move(message));
}

// The system prompt: `system` (a string or text blocks) and any system turns among the messages.
// Claude Code's per-request billing header block is left out: it would change every prompt's
// first tokens, so that the prefix cache never hits.
std::string system_text(const json& system, const std::string& at) {
  if (system.is_string()) return system.get<std::string>();
  if (!system.is_array()) bad_request(at + " must be a string or an array of text blocks", at);
  std::string text;
  for (size_t i = 0; i < system.size(); ++i) {
    const std::string part = text_of(system[i], at + "." + std::to_string(i) + ".");
    if (part.rfind("x-anthropic-billing-header", 0) != 0) append_part(text, part, "\n\n");
  }
  return text;
}

json chat_messages(const json& doc) {
  const json& turns = required(doc, "messages", "");
  if (!turns.is_array() || turns.empty()) bad_request("messages must be a non-empty array", "messages");
  std::string system = doc.contains("system") ? system_text(doc["system"], "system") : "";
  json messages = json::array();
  for_each_object(turns, "messages.", [&](const json& turn, const std::string& at) {
    const std::string role = string_field(turn, "role", at);
    const json& content = required(turn, "content", at);
    if (!content.is_string() && !content.is_array())
      bad_request(at + "content must be a string or an array of blocks", at + "content");
    if (role == "system") append_part(system, system_text(content, at + "content"), "\n\n");
    else if (role == "user" || role == "ctx" || role == "msg") add_user_turn(content, at + "content.", messages);
    else if (role == "assistant") add_assistant_turn(content, at + "content.", messages);
    else bad_request(at + "role must be 'user' or 'assistant'", at + "role");
  });
  if (!system.empty()) messages.insert(messages.begin(), json{{"role", "system"}, {"content", system}});
  return messages;
}

json chat_tools(const json& tools) {
  if (!tools.is_array()) bad_request("tools must be an array", "tools");
  json out = json::array();
  for_each_object(tools, "tools.", [&](const json& tool, const std::string& at) {
    const std::string type = string_field(tool, "type", at);
    if (!type.empty() && type != "custom")
      bad_request(at + "type: server tools such as '" + type + "' are not supported", at + "type");
    const std::string name = string_field(tool, "name", at);
    if (name.empty()) bad_request(at + "name: Field required", at + "name");
    json function = {{"name", name}, {"parameters", tool.value("input_schema", json::object())}};
    if (tool.contains("description")) function["description"] = tool["description"];
    out.push_back({{"type", "function"}, {"function", std::move(function)}});
  });
  return out;
}

// tool_choice {"type": auto | any | tool | none, "name", "disable_parallel_tool_use"}.
void set_tool_choice(const json& choice, json& chat) {
  if (!choice.is_object()) bad_request("tool_choice must be an object", "tool_choice");
  const std::string type = string_field(choice, "type", "tool_choice.");
  if (type == "auto" || type == "none") {
    chat["tool_choice"] = type;
  } else if (type == "any") {
    chat["tool_choice"] = "required";
  } else if (type == "tool") {
    const std::string name = string_field(choice, "name", "tool_choice.");
    if (name.empty()) bad_request("tool_choice.name: Field required", "tool_choice.name");
    chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", name}}}};
  } else {
    bad_request("tool_choice.type must be auto, any, tool or none", "tool_choice.type");
  }
  if (bool_field(choice, "disable_parallel_tool_use", "tool_choice.")) chat["parallel_tool_calls"] = false;
}

// The sampling fields that keep their names, and thinking as the template's enable_thinking.
void copy_sampling(const json& doc, bool count_only, json& chat) {
  if (!count_only) {
    const json& max_tokens = required(doc, "max_tokens", "");
    if (!max_tokens.is_number_integer()) bad_request("max_tokens must be an integer", "max_tokens");
    chat["max_tokens"] = max_tokens;
  }
  for (const char* key : {"temperature", "top_p", "top_k"})
    if (doc.contains(key)) chat[key] = doc[key];
  if (doc.contains("stop_sequences")) chat["stop"] = doc["stop_sequences"];
  if (doc.contains("thinking")) {
    const json& thinking = doc["thinking"];
    if (!thinking.is_object()) bad_request("thinking must be an object", "thinking");
    const std::string type = string_field(thinking, "type", "thinking.");
    if (type != "enabled" && type != "adaptive" && type != "disabled")
      bad_request("thinking.type must be 'enabled', 'adaptive' or 'disabled'", "thinking.type");
    chat["chat_template_kwargs"] = {{"enable_thinking", type != "disabled"}};
  }
  if (!count_only && bool_field(doc, "stream", "")) {
    chat["stream"] = true;
    // Usage on every chunk: message_start carries the prompt's tokens.
    chat["stream_options"] = {{"include_usage", true}, {"continuous_usage_stats", true}};
  }
}

// ---- The answer: a chat completion as a message ----

std::string message_id(const std::string& chat_id) {
  const size_t dash = chat_id.find('-');
  return "msg_" + (dash == std::string::npos ? chat_id : chat_id.substr(dash + 1));
}

// A finish_reason (and the stop string that ended it, if any) as stop_reason and stop_sequence.
std::pair<json, json> stop_of(const json& finish_reason, const json& stop_reason) {
  if (finish_reason == "length") return {"max_tokens", nullptr};
  if (finish_reason == "tool_calls") return {"tool_use", nullptr};
  if (stop_reason.is_string()) return {"stop_sequence", stop_reason};
  return {"end_turn", nullptr};
}

// Anthropic's usage: input_tokens the prompt's tokens the prefix cache did not hold, those it
// held as cache_read_input_tokens (clients add the two).
json usage_of(const json& usage) {
  const int prompt = usage.value("prompt_tokens", 0);
  const json details = usage.value("prompt_tokens_details", json::object());
  const int cached = details.is_object() ? details.value("cached_tokens", 0) : 0;
  return {{"input_tokens", prompt - cached},
          {"cache_creation_input_tokens", 0},
          {"cache_read_input_tokens", cached},
          {"output_tokens", usage.value("completion_tokens", 0)}};
}

// A thinking block's signature: Anthropic's clients keep only signed thinking. Nothing checks it
// here (a later turn's thinking is read as text).
std::string thinking_signature() {
  static std::mutex mutex;
  static std::mt19937_64 random{std::random_device{}()};
  std::lock_guard lock(mutex);
  return fmt::format("{:016x}{:016x}", random(), random());
}

json tool_input(const std::string& arguments) {
  json input = json::parse(arguments, nullptr, false);
  return input.is_object() ? input : json::object();
}

const char* error_type(int status) {
  switch (status) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 405: return "invalid_request_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "overloaded_error";
    default: return "api_error";
  }
}

}  // namespace

std::string chat_request_of_message(std::string_view body, bool count_only) {
  const json doc = parse_body(body);
  // Fields that ask for what only Anthropic's servers run; others this model has no use for
  // (metadata, service_tier, output_config, context_management, ...) are ignored, as vLLM does.
  for (const char* server_side : {"mcp_servers", "container"})
    if (doc.contains(server_side)) bad_request(std::string(server_side) + ": not supported here", server_side);
  json chat = {{"messages", chat_messages(doc)}};
  if (doc.contains("model")) chat["model"] = doc["model"];
  copy_sampling(doc, count_only, chat);
  if (doc.contains("tools")) {
    chat["tools"] = chat_tools(doc["tools"]);
    if (chat["tools"].empty()) chat.erase("tools");
  }
  if (doc.contains("tool_choice")) set_tool_choice(doc["tool_choice"], chat);
  return dump(chat);
}

std::string message_of_chat_completion(const std::string& chat_completion) {
  const json chat = json::parse(chat_completion);
  const json& choice = chat["choices"].at(0);
  const json& message = choice["message"];
  json content = json::array();
  if (message.value("reasoning_content", json()).is_string())
    content.push_back({{"type", "thinking"}, {"thinking", message["reasoning_content"]}, {"signature", thinking_signature()}});
  if (message.value("content", json()).is_string() && !message["content"].get<std::string>().empty())
    content.push_back({{"type", "text"}, {"text", message["content"]}});
  if (message.contains("tool_calls") && message["tool_calls"].is_array())
    for (const json& call : message["tool_calls"])
      content.push_back({{"type", "tool_use"},
                         {"id", call["id"]},
                         {"name", call["function"]["name"]},
                         {"input", tool_input(call["function"].value("arguments", "{}"))}});
  const auto [stop_reason, stop_sequence] = stop_of(choice["finish_reason"], choice.value("stop_reason", json()));
  return dump({{"id", message_id(chat.value("id", ""))},
               {"type", "message"},
               {"role", "assistant"},
               {"model", chat["model"]},
               {"content", std::move(content)},
               {"stop_reason", stop_reason},
               {"stop_sequence", stop_sequence},
               {"usage", usage_of(chat.value("usage", json::object()))}});
}

std::string anthropic_error_body(int status, const std::string& message) {
  return dump({{"type", "error"}, {"error", {{"type", error_type(status)}, {"message", message}}}});
}

namespace {

// The chat pipeline's stream turned into Anthropic's events: content blocks opened and closed as
// the deltas change kind (thinking, text, a tool call each), the message's stop and usage last.
class AnthropicStream {
 public:
  // Anthropic's events for one OpenAI SSE event's payload ("[DONE]" ends the message).
  std::string translate(const std::string& payload) {
    std::string out;
    if (failed_) return out;  // an error event ends the stream for its readers
    if (payload == "[DONE]") return finish();
    const json chunk = json::parse(payload, nullptr, false);
    if (!chunk.is_object()) return out;
    if (chunk.contains("error")) {
      failed_ = true;
      const json& error = chunk["error"];
      return event("error", json::parse(anthropic_error_body(error.value("code", 500), error.value("message", ""))));
    }
    if (chunk.contains("usage") && chunk["usage"].is_object()) usage_ = usage_of(chunk["usage"]);
    id_ = message_id(chunk.value("id", ""));
    model_ = chunk.value("model", "");
    // The first chunk (the assistant's role) has no usage yet: the message starts with the next.
    if (!chunk.contains("usage")) return out;
    out += start();
    if (!chunk.contains("choices") || chunk["choices"].empty()) return out;
    const json& choice = chunk["choices"][0];
    const json delta = choice.value("delta", json::object());
    if (delta.value("reasoning_content", json()).is_string())
      out += block_delta("thinking", {{"type", "thinking_delta"}, {"thinking", delta["reasoning_content"]}});
    if (delta.value("content", json()).is_string() && !delta["content"].get<std::string>().empty())
      out += block_delta("text", {{"type", "text_delta"}, {"text", delta["content"]}});
    if (delta.contains("tool_calls") && delta["tool_calls"].is_array())
      for (const json& call : delta["tool_calls"]) out += tool_call(call);
    if (!choice.value("finish_reason", json()).is_null())
      std::tie(stop_reason_, stop_sequence_) = stop_of(choice["finish_reason"], choice.value("stop_reason", json()));
    return out;
  }

 private:
  std::string start() {
    if (started_) return "";
    started_ = true;
    json usage = usage_;
    usage["output_tokens"] = 0;
    return event("message_start", {{"type", "message_start"},
                                   {"message", {{"id", id_},
                                                {"type", "message"},
                                                {"role", "assistant"},
                                                {"model", model_},
                                                {"content", json::array()},
                                                {"stop_reason", nullptr},
                                                {"stop_sequence", nullptr},
                                                {"usage", usage}}}});
  }
  static std::string event(const std::string& type, const json& data) {
    return "event: " + type + "\ndata: " + dump(data) + "\n\n";
  }
  std::string close_block() {
    if (open_.empty()) return "";
    std::string out;
    if (open_ == "thinking")
      out = event("content_block_delta", {{"type", "content_block_delta"},
                                          {"index", index_},
                                          {"delta", {{"type", "signature_delta"}, {"signature", thinking_signature()}}}});
    open_.clear();
    return out + event("content_block_stop", {{"type", "content_block_stop"}, {"index", index_++}});
  }
  std::string open_block(const std::string& kind, const json& block) {
    std::string out = close_block();
    open_ = kind;
    return out + event("content_block_start", {{"type", "content_block_start"}, {"index", index_}, {"content_block", block}});
  }
  // A thinking or text delta, into a block of its kind.
  std::string block_delta(const std::string& kind, const json& delta) {
    std::string out;
    if (open_ != kind)
      out += open_block(kind, kind == "thinking" ? json{{"type", "thinking"}, {"thinking", ""}, {"signature", ""}}
                                                 : json{{"type", "text"}, {"text", ""}});
    return out + event("content_block_delta", {{"type", "content_block_delta"}, {"index", index_}, {"delta", delta}});
  }
  // A tool call's delta: one with an id starts a tool_use block; its arguments are input JSON.
  std::string tool_call(const json& call) {
    std::string out;
    const json function = call.value("function", json::object());
    if (call.contains("id") && call["id"].is_string())
      out += open_block("tool_use", {{"type", "tool_use"}, {"id", call["id"]}, {"name", function.value("name", "")},
                                     {"input", json::object()}});
    if (open_ == "tool_use" && function.value("arguments", json()).is_string())
      out += event("content_block_delta", {{"type", "content_block_delta"},
                                           {"index", index_},
                                           {"delta", {{"type", "input_json_delta"}, {"partial_json", function["arguments"]}}}});
    return out;
  }
  std::string finish() {
    std::string out = start() + close_block();
    out += event("message_delta", {{"type", "message_delta"},
                                   {"delta", {{"stop_reason", stop_reason_}, {"stop_sequence", stop_sequence_}}},
                                   {"usage", usage_}});
    return out + event("message_stop", {{"type", "message_stop"}});
  }

  bool started_ = false, failed_ = false;
  std::string id_, model_;
  std::string open_;  // the open block's kind: thinking, text, tool_use, or none
  int index_ = 0;     // the open (or next) block's index
  json usage_ = usage_of(json::object());
  json stop_reason_ = "end_turn", stop_sequence_ = nullptr;
};

class AnthropicResponder : public ChatAdapterResponder {
 public:
  using ChatAdapterResponder::ChatAdapterResponder;

 protected:
  void rewrite(HttpResponse& response) override {
    response.body = response.status == 200 ? message_of_chat_completion(response.body)
                                           : anthropic_error_body(response.status, error_message_of(response.body));
  }
  std::string translate(const std::string& payload) override { return stream_.translate(payload); }

 private:
  AnthropicStream stream_;
};

}  // namespace

std::shared_ptr<Responder> anthropic_responder(std::shared_ptr<Responder> inner) {
  return std::make_shared<AnthropicResponder>(std::move(inner));
}

}  // namespace glms::server
