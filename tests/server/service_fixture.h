// The API service over a scripted backend, as the service tests drive it: the bundled model's
// tokenizer, a GLM-style stand-in template, and calls recorded through RecordingResponder.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fakes.h"
#include "server/api_service.h"
#include "text/tokenizer.h"

namespace glms::test {

using nlohmann::json;
using server::ApiService;
using server::ChatRequest;
using server::HttpRequest;
using server::ParserFactory;
using server::ServiceConfig;

inline text::Tokenizer& tokenizer() {
  static text::Tokenizer t = text::Tokenizer::load(GLMS_SOURCE_DIR "/models/glm5-tiny-code");
  return t;
}

// A stand-in for the model's chat template: GLM-style markers around each message.
inline std::string render(const ChatRequest& r) {
  std::string out = "[gMASK]<sop>";
  for (const json& m : *r.messages)
    out += "<|" + m["role"].get<std::string>() + "|>\n" + (m["content"].is_string() ? m["content"].get<std::string>() : "");
  if (r.add_generation_prompt) out += "<|assistant|>\n";
  if (r.template_kwargs->value("enable_thinking", false)) out += "<think>";
  return out;
}

inline std::vector<int32_t> ids(const std::string& text) { return tokenizer().encode(text, false); }

struct Fixture {
  FakeBackend backend;
  std::unique_ptr<ApiService> service;
  explicit Fixture(ServiceConfig config = {}, ParserFactory parsers = nullptr) {
    config.served_model_name = "tiny";
    service = std::make_unique<ApiService>(backend, tokenizer(), render, parsers, config);
  }
  // Scripted output: `text` encoded, then EOS.
  void say(const std::string& text) {
    backend.script = [text](const engine::RequestParams&) {
      std::vector<int32_t> t = ids(text);
      t.push_back(8170);
      return t;
    };
  }
  std::shared_ptr<RecordingResponder> call(const std::string& method, const std::string& path, const std::string& body = "",
                                           std::map<std::string, std::string> headers = {}) {
    HttpRequest req;
    req.method = method;
    req.target = path;
    req.body = body;
    req.headers = std::move(headers);
    req.client = "127.0.0.1";
    auto responder = std::make_shared<RecordingResponder>();
    service->handle(req, responder);
    EXPECT_TRUE(responder->wait()) << path << " " << body;
    return responder;
  }
  json post(const std::string& path, const json& body, int expect_status = 200) {
    auto r = call("POST", path, body.dump());
    EXPECT_EQ(r->response.status, expect_status) << r->response.body;
    EXPECT_FALSE(r->streaming);
    return json::parse(r->response.body);
  }
  // SSE events of a streamed call (the payloads of "data:" lines; "[DONE]" included).
  std::vector<std::string> stream(const std::string& path, const json& body) {
    auto r = call("POST", path, body.dump());
    EXPECT_TRUE(r->streaming) << r->response.body;
    EXPECT_EQ(r->response.content_type, "text/event-stream");
    const std::string text = r->stream_body();
    std::vector<std::string> events;
    size_t pos = 0;
    while (pos < text.size()) {
      const size_t end = text.find("\n\n", pos);
      EXPECT_NE(end, std::string::npos) << "unterminated event";
      if (end == std::string::npos) break;
      const std::string event = text.substr(pos, end - pos);
      EXPECT_EQ(event.rfind("data: ", 0), 0u) << event;
      EXPECT_EQ(event.find('\n'), std::string::npos) << event;
      events.push_back(event.substr(6));
      pos = end + 2;
    }
    return events;
  }
};

// Named SSE events in order, (event name, data), as Anthropic's and the Responses API's streams
// write them ("event: NAME\ndata: JSON\n\n").
inline std::vector<std::pair<std::string, json>> named_events_of(const std::string& stream) {
  std::vector<std::pair<std::string, json>> events;
  size_t at = 0;
  while (at < stream.size()) {
    const size_t end = stream.find("\n\n", at);
    const std::string event = stream.substr(at, end - at);
    at = end + 2;
    const size_t newline = event.find('\n');
    EXPECT_EQ(event.rfind("event: ", 0), 0u) << event;
    EXPECT_EQ(event.compare(newline + 1, 6, "data: "), 0) << event;
    events.emplace_back(event.substr(7, newline - 7), json::parse(event.substr(newline + 7)));
  }
  return events;
}

// A chat completion (chatcmpl-abc) with reasoning, text and one tool call, 8 of its 12 prompt
// tokens cached: what the adapters of other APIs turn into theirs.
inline json chat_completion_with_a_call() {
  return {
      {"id", "chatcmpl-abc"},
      {"created", 1700000000},
      {"model", "glm-5"},
      {"choices", json::array({{{"index", 0},
                                {"message", {{"role", "assistant"},
                                             {"content", "Here."},
                                             {"reasoning_content", "Think."},
                                             {"tool_calls", json::array({{{"id", "call_1"}, {"type", "function"},
                                                                          {"function", {{"name", "ls"},
                                                                                        {"arguments", R"({"path":"/"})"}}}}})}}},
                                {"finish_reason", "tool_calls"},
                                {"stop_reason", nullptr}}})},
      {"usage", {{"prompt_tokens", 12}, {"completion_tokens", 5}, {"prompt_tokens_details", {{"cached_tokens", 8}}}}}};
}

inline json chat(const std::string& content) { return {{"messages", {{{"role", "user"}, {"content", content}}}}}; }

inline void expect_error_shape(const std::string& body, int status) {
  const json j = json::parse(body);
  ASSERT_TRUE(j.contains("error")) << body;
  EXPECT_TRUE(j["error"]["message"].is_string());
  EXPECT_TRUE(j["error"]["type"].is_string());
  EXPECT_EQ(j["error"]["code"], status);
}


}  // namespace glms::test
