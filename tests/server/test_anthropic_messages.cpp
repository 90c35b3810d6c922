// Anthropic's Messages API over the chat pipeline (server/anthropic_messages.h): a Messages request
// becomes the chat completion request that means the same, a chat completion becomes the message,
// and a chat completion stream becomes Anthropic's events, block by block.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "fakes.h"
#include "service_fixture.h"
#include "server/anthropic_messages.h"
#include "server/api_error.h"

using namespace glms;
using nlohmann::json;

namespace {

json chat_of(const json& message, bool count_only = false) {
  return json::parse(server::chat_request_of_message(message.dump(), count_only));
}

// The ApiException message converting `message` throws ("" when none).
std::string refusal(const json& message) {
  try {
    server::chat_request_of_message(message.dump());
  } catch (const server::ApiException& e) {
    return e.error.message;
  }
  return "";
}

// Anthropic's stream events in order: (event name, data).
std::vector<std::pair<std::string, json>> events_of(const std::string& stream) {
  return glms::test::named_events_of(stream);
}

}  // namespace

TEST(AnthropicMessages, AConversationBecomesItsChatCompletionRequest) {
  const json message = {
      {"model", "glm-5"},
      {"max_tokens", 64},
      {"system", json::array({{{"type", "text"}, {"text", "Be brief."}, {"cache_control", {{"type", "ephemeral"}}}}})},
      {"messages",
       json::array({{{"role", "user"}, {"content", "What is in /tmp?"}},
                    {{"role", "assistant"},
                     {"content", json::array({{{"type", "thinking"}, {"thinking", "List it."}, {"signature", "s"}},
                                              {{"type", "text"}, {"text", "Listing."}},
                                              {{"type", "tool_use"}, {"id", "toolu_1"}, {"name", "ls"},
                                               {"input", {{"path", "/tmp"}}}}})}},
                    {{"role", "user"},
                     {"content", json::array({{{"type", "tool_result"}, {"tool_use_id", "toolu_1"},
                                               {"content", json::array({{{"type", "text"}, {"text", "a.txt"}}})}},
                                              {{"type", "text"}, {"text", "And now?"}}})}}})},
      {"tools", json::array({{{"name", "ls"}, {"description", "List a folder"},
                              {"input_schema", {{"type", "object"}, {"properties", {{"path", {{"type", "string"}}}}}}}}})},
      {"tool_choice", {{"type", "any"}, {"disable_parallel_tool_use", true}}},
      {"thinking", {{"type", "enabled"}, {"budget_tokens", 1024}}},
      {"stop_sequences", json::array({"END"})},
      {"temperature", 0.5},
      {"stream", true},
      {"metadata", {{"user_id", "u"}}}};
  const json chat = chat_of(message);
  const json expected_messages = json::array(
      {{{"role", "system"}, {"content", "Be brief."}},
       {{"role", "user"}, {"content", "What is in /tmp?"}},
       {{"role", "assistant"},
        {"content", "Listing."},
        {"reasoning_content", "List it."},
        {"tool_calls", json::array({{{"id", "toolu_1"}, {"type", "function"},
                                     {"function", {{"name", "ls"}, {"arguments", R"({"path":"/tmp"})"}}}}})}},
       {{"role", "tool"}, {"tool_call_id", "toolu_1"}, {"content", "a.txt"}},
       {{"role", "user"}, {"content", "And now?"}}});
  EXPECT_EQ(chat["messages"], expected_messages) << chat.dump(2);
  EXPECT_EQ(chat["model"], "glm-5");
  EXPECT_EQ(chat["max_tokens"], 64);
  EXPECT_EQ(chat["tools"][0]["function"]["name"], "ls");
  EXPECT_EQ(chat["tools"][0]["function"]["parameters"]["properties"]["path"]["type"], "string");
  EXPECT_EQ(chat["tool_choice"], "required");
  EXPECT_EQ(chat["parallel_tool_calls"], false);
  EXPECT_EQ(chat["chat_template_kwargs"], (json{{"enable_thinking", true}}));
  EXPECT_EQ(chat["stop"], json::array({"END"}));
  EXPECT_EQ(chat["temperature"], 0.5);
  EXPECT_EQ(chat["stream_options"]["include_usage"], true);
  // A named tool, and count_tokens' request without max_tokens.
  json named = message;
  named["tool_choice"] = {{"type", "tool"}, {"name", "ls"}};
  named.erase("stream");
  EXPECT_EQ(chat_of(named)["tool_choice"]["function"]["name"], "ls");
  named.erase("max_tokens");
  EXPECT_FALSE(chat_of(named, true).contains("max_tokens"));
}

// What Claude Code sends beyond the basics: in-array system turns and its per-request billing
// header (left out, so that prompts keep a common prefix), images (a placeholder for a text-only
// model), adaptive thinking, fields this model has no use for (ignored, as vLLM does).
TEST(AnthropicMessages, ClaudeCodesExtrasAreTakenOrLeftOut) {
  const json message = {
      {"model", "m"},
      {"max_tokens", 8},
      {"system", json::array({{{"type", "text"}, {"text", "x-anthropic-billing-header: cc_version=2; cch=1f2e"}},
                              {{"type", "text"}, {"text", "You are a coding agent."}}})},
      {"messages", json::array({{{"role", "system"}, {"content", "Mind the tests."}},
                                {{"role", "user"},
                                 {"content", json::array({{{"type", "text"}, {"text", "<system-reminder>r</system-reminder>"}},
                                                          {{"type", "image"}, {"source", json::object()}},
                                                          {{"type", "text"}, {"text", "Fix it."}}})}}})},
      {"thinking", {{"type", "adaptive"}}},
      {"output_config", {{"effort", "high"}}},
      {"context_management", {{"edits", json::array()}}},
      {"metadata", {{"user_id", "u"}}}};
  const json chat = chat_of(message);
  EXPECT_EQ(chat["messages"],
            json::array({{{"role", "system"}, {"content", "You are a coding agent.\n\nMind the tests."}},
                         {{"role", "user"},
                          {"content", "<system-reminder>r</system-reminder>\n\n[image omitted: the model reads text "
                                      "only]\n\nFix it."}}}))
      << chat.dump(2);
  EXPECT_EQ(chat["chat_template_kwargs"], (json{{"enable_thinking", true}}));
  EXPECT_FALSE(chat.contains("output_config"));
}

TEST(AnthropicMessages, WhatCannotBeAnsweredIsRefusedNamingIt) {
  const json base = {{"model", "m"}, {"max_tokens", 8}, {"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}};
  auto with = [&](const char* key, const json& value) {
    json m = base;
    m[key] = value;
    return refusal(m);
  };
  json no_max = base;
  no_max.erase("max_tokens");
  EXPECT_EQ(refusal(no_max), "max_tokens: Field required");
  EXPECT_NE(with("messages", json::array({{{"role", "tool"}, {"content", "x"}}})).find("role must be 'user' or"),
            std::string::npos);
  EXPECT_NE(with("messages", json::array()).find("non-empty array"), std::string::npos);
  EXPECT_NE(with("messages", json::array({{{"role", "user"}, {"content", json::array({{{"type", 5}}})}}}))
                .find("type must be a string"),
            std::string::npos);
  EXPECT_NE(with("tools", json::array({{{"type", "web_search_20250305"}, {"name", "web_search"}}}))
                .find("server tools"),
            std::string::npos);
  EXPECT_NE(with("tool_choice", {{"type", "sometimes"}}).find("tool_choice.type"), std::string::npos);
  EXPECT_NE(with("tool_choice", {{"type", "tool"}}).find("tool_choice.name: Field required"), std::string::npos);
  EXPECT_NE(with("thinking", {{"type", "maybe"}}).find("thinking.type"), std::string::npos);
  EXPECT_NE(with("stream", "yes").find("stream must be a boolean"), std::string::npos);
  EXPECT_NE(with("mcp_servers", json::array()).find("mcp_servers: not supported"), std::string::npos);
  EXPECT_EQ(with("top_logprobs", 3), "");  // ignored
  EXPECT_EQ(refusal(base), "");
}

TEST(AnthropicMessages, AChatCompletionBecomesAMessage) {
  const json completion = glms::test::chat_completion_with_a_call();
  const json message = json::parse(server::message_of_chat_completion(completion.dump()));
  ASSERT_EQ(message["content"][0]["signature"].get<std::string>().size(), 32u);  // clients keep signed thinking only
  const json expected = {
      {"id", "msg_abc"},
      {"type", "message"},
      {"role", "assistant"},
      {"model", "glm-5"},
      {"content", json::array({{{"type", "thinking"}, {"thinking", "Think."}, {"signature", message["content"][0]["signature"]}},
                               {{"type", "text"}, {"text", "Here."}},
                               {{"type", "tool_use"}, {"id", "call_1"}, {"name", "ls"}, {"input", {{"path", "/"}}}}})},
      {"stop_reason", "tool_use"},
      {"stop_sequence", nullptr},
      {"usage", {{"input_tokens", 4}, {"cache_creation_input_tokens", 0}, {"cache_read_input_tokens", 8}, {"output_tokens", 5}}}};
  EXPECT_EQ(message, expected) << message.dump(2);
  // A stop string ends it as stop_sequence; the token limit as max_tokens.
  json stopped = completion;
  stopped["choices"][0]["finish_reason"] = "stop";
  stopped["choices"][0]["stop_reason"] = "END";
  const json stop_message = json::parse(server::message_of_chat_completion(stopped.dump()));
  EXPECT_EQ(stop_message["stop_reason"], "stop_sequence");
  EXPECT_EQ(stop_message["stop_sequence"], "END");
  stopped["choices"][0]["finish_reason"] = "length";
  EXPECT_EQ(json::parse(server::message_of_chat_completion(stopped.dump()))["stop_reason"], "max_tokens");
}

TEST(AnthropicMessages, AStreamBecomesBlocksOfThinkingTextAndToolUse) {
  auto recording = std::make_shared<glms::test::RecordingResponder>();
  const auto responder = server::anthropic_responder(recording);
  responder->begin_stream({});
  auto chunk = [](const json& delta, const json& finish, int completion_tokens) {
    return json{{"id", "chatcmpl-xyz"},
                {"model", "glm-5"},
                {"choices", json::array({{{"index", 0}, {"delta", delta}, {"finish_reason", finish}}})},
                {"usage", {{"prompt_tokens", 20}, {"completion_tokens", completion_tokens}}}};
  };
  responder->write(server::sse_event(chunk({{"role", "assistant"}, {"content", ""}}, nullptr, 0).dump()));
  responder->write(server::sse_event(chunk({{"reasoning_content", "Hm"}}, nullptr, 1).dump()) +
                   server::sse_event(chunk({{"reasoning_content", "m."}}, nullptr, 2).dump()));
  responder->write(server::sse_event(chunk({{"content", "Sure"}}, nullptr, 3).dump()));
  const json call = {{"index", 0}, {"id", "call_9"}, {"type", "function"},
                     {"function", {{"name", "ls"}, {"arguments", R"({"path":"/"})"}}}};
  responder->write(server::sse_event(chunk({{"tool_calls", json::array({call})}}, "tool_calls", 9).dump()));
  responder->write(server::sse_done());
  responder->end_stream();
  const auto events = events_of(recording->stream_body());
  std::vector<std::string> names;
  for (const auto& [name, data] : events) {
    names.push_back(name);
    EXPECT_EQ(data["type"], name);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"message_start", "content_block_start", "content_block_delta",
                                             "content_block_delta", "content_block_delta", "content_block_stop",
                                             "content_block_start", "content_block_delta", "content_block_stop",
                                             "content_block_start", "content_block_delta", "content_block_stop",
                                             "message_delta", "message_stop"}));
  EXPECT_EQ(events[0].second["message"]["id"], "msg_xyz");
  EXPECT_EQ(events[0].second["message"]["usage"]["input_tokens"], 20);  // from the role chunk, before any token
  EXPECT_EQ(events[1].second["content_block"]["type"], "thinking");
  EXPECT_EQ(events[3].second["delta"], (json{{"type", "thinking_delta"}, {"thinking", "m."}}));
  EXPECT_EQ(events[4].second["delta"]["type"], "signature_delta");  // a thinking block ends signed
  EXPECT_EQ(events[6].second["index"], 1);
  EXPECT_EQ(events[7].second["delta"], (json{{"type", "text_delta"}, {"text", "Sure"}}));
  EXPECT_EQ(events[9].second["content_block"],
            (json{{"type", "tool_use"}, {"id", "call_9"}, {"name", "ls"}, {"input", json::object()}}));
  EXPECT_EQ(events[10].second["delta"], (json{{"type", "input_json_delta"}, {"partial_json", R"({"path":"/"})"}}));
  EXPECT_EQ(events[11].second["index"], 2);
  EXPECT_EQ(events[12].second["delta"]["stop_reason"], "tool_use");
  EXPECT_EQ(events[12].second["usage"]["output_tokens"], 9);
}

TEST(AnthropicMessages, ErrorsTakeAnthropicsShape) {
  auto recording = std::make_shared<glms::test::RecordingResponder>();
  server::HttpResponse error;
  error.status = 400;
  error.body = server::error_body({400, "max_tokens is too large", "max_tokens", 0.0});
  server::anthropic_responder(recording)->reply(error);
  EXPECT_EQ(json::parse(recording->response.body),
            (json{{"type", "error"}, {"error", {{"type", "invalid_request_error"}, {"message", "max_tokens is too large"}}}}));
  // Mid-stream, an error event.
  auto streaming = std::make_shared<glms::test::RecordingResponder>();
  const auto responder = server::anthropic_responder(streaming);
  responder->begin_stream({});
  responder->write(server::sse_event(server::error_body({503, "the engine stopped", "", 0.0})));
  responder->write(server::sse_done());  // nothing after the error event
  const auto events = events_of(streaming->stream_body());
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].first, "error");
  EXPECT_EQ(events[0].second["error"]["type"], "overloaded_error");
}

// Claude Code asks for more output than a smaller context holds: /v1/messages cuts max_tokens to
// what the context leaves (the chat path keeps refusing it), and the message says max_tokens.
TEST(AnthropicMessages, MaxTokensPastTheContextIsCutToIt) {
  glms::test::Fixture f;  // max_model_len 256
  f.backend.last_is_eos = false;
  f.backend.script = [](const engine::RequestParams& p) { return std::vector<int32_t>(p.max_tokens, 65); };
  const json request = {{"model", "tiny"}, {"max_tokens", 32000}, {"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}};
  const json message = f.post("/v1/messages", request);
  ASSERT_EQ(f.backend.submitted.size(), 1u);
  const int prompt = static_cast<int>(f.backend.submitted[0].prompt_ids.size());
  EXPECT_EQ(f.backend.submitted[0].max_tokens, 256 - prompt);
  EXPECT_EQ(message["stop_reason"], "max_tokens");
  EXPECT_EQ(message["usage"]["output_tokens"], 256 - prompt);
  const json chat = {{"model", "tiny"}, {"max_tokens", 32000}, {"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}};
  f.post("/v1/chat/completions", chat, 400);
}
