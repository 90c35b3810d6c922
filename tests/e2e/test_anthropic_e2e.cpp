// Anthropic's Messages API against `glmserve serve` on the bundled model, as Claude Code and the
// anthropic SDK send it: a message and its stream say the same text, a forced tool call comes
// back as a tool_use block whose result the next turn takes, count_tokens counts what the
// message's usage counts, and keys come as x-api-key.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "e2e_client.h"

using namespace glms::e2e;
using nlohmann::json;

namespace {

const std::string kBinary = GLMS_BINARY_DIR "/glmserve";
const std::string kModel = GLMS_SOURCE_DIR "/models/glm5-tiny-code";
const std::map<std::string, std::string> kKey = {{"x-api-key", "sk-test"}, {"anthropic-version", "2023-06-01"}};

// The text of a message stream's text_delta events, and its event names in order.
std::pair<std::string, std::vector<std::string>> stream_text(const std::string& body) {
  std::string text;
  std::vector<std::string> names;
  size_t at = 0;
  while ((at = body.find("event: ", at)) != std::string::npos) {
    const size_t newline = body.find('\n', at);
    names.push_back(body.substr(at + 7, newline - at - 7));
    const size_t end = body.find("\n\n", newline);
    const json data = json::parse(body.substr(newline + 7, end - newline - 7));
    if (data["type"] == "content_block_delta" && data["delta"]["type"] == "text_delta")
      text += data["delta"]["text"].get<std::string>();
    at = end;
  }
  return {text, names};
}

}  // namespace

class AnthropicE2E : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new ServerProcess(kBinary, {"serve", kModel, "--port", "0", "--kv-cache-memory", "64M",
                                          "--served-model-name", "glm-5", "--api-key", "sk-test"});
  }
  static void TearDownTestSuite() {
    EXPECT_EQ(server_->stop(SIGTERM, 60.0), 0);
    delete server_;
  }
  static Response post(const std::string& path, const json& body,
                       const std::map<std::string, std::string>& headers = kKey) {
    return http(server_->port(), "POST", path, body.dump(), headers);
  }
  static ServerProcess* server_;
};

ServerProcess* AnthropicE2E::server_ = nullptr;

TEST_F(AnthropicE2E, AMessageAndItsStreamSayTheSame) {
  json request = {{"model", "glm-5"},
                  {"max_tokens", 16},
                  {"temperature", 0},
                  {"system", "You write Python."},
                  {"messages", json::array({{{"role", "user"}, {"content", "def fibonacci(n):"}}})}};
  const Response whole = post("/v1/messages", request);
  ASSERT_EQ(whole.status, 200) << whole.body;
  const json message = json::parse(whole.body);
  EXPECT_EQ(message["type"], "message");
  EXPECT_EQ(message["role"], "assistant");
  EXPECT_EQ(message["model"], "glm-5");
  EXPECT_EQ(message["stop_reason"], "max_tokens");
  EXPECT_EQ(message["usage"]["output_tokens"], 16);
  std::string text;
  for (const json& block : message["content"])
    if (block["type"] == "text") text += block["text"].get<std::string>();
  EXPECT_FALSE(text.empty());

  request["stream"] = true;
  const Response streamed = post("/v1/messages", request);
  ASSERT_EQ(streamed.status, 200) << streamed.body;
  EXPECT_EQ(streamed.headers.at("content-type").rfind("text/event-stream", 0), 0u);
  const auto [stream_text_seen, names] = stream_text(streamed.body);
  EXPECT_EQ(stream_text_seen, text);
  ASSERT_GE(names.size(), 4u);
  EXPECT_EQ(names.front(), "message_start");
  EXPECT_EQ(names[names.size() - 2], "message_delta");
  EXPECT_EQ(names.back(), "message_stop");

  // count_tokens counts what the message's usage counted (uncached and cached input together).
  request.erase("stream");
  request.erase("max_tokens");
  const Response counted = post("/v1/messages/count_tokens", request);
  ASSERT_EQ(counted.status, 200) << counted.body;
  const json& usage = message["usage"];
  EXPECT_EQ(json::parse(counted.body)["input_tokens"],
            usage["input_tokens"].get<int>() + usage["cache_read_input_tokens"].get<int>());
}

TEST_F(AnthropicE2E, AForcedToolCallIsAToolUseBlockAndItsResultTheNextTurn) {
  const json tools = json::array({{{"name", "read_file"},
                                   {"description", "Read a file"},
                                   {"input_schema", {{"type", "object"},
                                                     {"properties", {{"path", {{"type", "string"}, {"maxLength", 12}}}}},
                                                     {"required", json::array({"path"})}}}}});
  json request = {{"model", "glm-5"},
                  {"max_tokens", 120},
                  {"thinking", {{"type", "disabled"}}},
                  {"tools", tools},
                  {"tool_choice", {{"type", "tool"}, {"name", "read_file"}}},
                  {"messages", json::array({{{"role", "user"}, {"content", "Show me setup.py"}}})}};
  const Response called = post("/v1/messages", request);
  ASSERT_EQ(called.status, 200) << called.body;
  const json message = json::parse(called.body);
  EXPECT_EQ(message["stop_reason"], "tool_use") << message.dump();
  json tool_use;
  for (const json& block : message["content"])
    if (block["type"] == "tool_use") tool_use = block;
  ASSERT_FALSE(tool_use.is_null()) << message.dump();
  EXPECT_EQ(tool_use["name"], "read_file");
  ASSERT_TRUE(tool_use["input"].is_object());
  EXPECT_TRUE(tool_use["input"]["path"].is_string()) << tool_use.dump();

  // Streamed, each call is a tool_use block whose input_json_delta events make its input.
  json streamed_request = request;
  streamed_request["stream"] = true;
  const Response streamed = post("/v1/messages", streamed_request);
  ASSERT_EQ(streamed.status, 200) << streamed.body;
  std::vector<std::string> inputs;  // a tool_use block's input JSON each
  for (size_t at = 0; (at = streamed.body.find("data: ", at)) != std::string::npos;) {
    const size_t end = streamed.body.find("\n\n", at);
    const json data = json::parse(streamed.body.substr(at + 6, end - at - 6));
    if (data["type"] == "content_block_start" && data["content_block"]["type"] == "tool_use") {
      EXPECT_EQ(data["content_block"]["name"], "read_file");
      inputs.emplace_back();
    }
    if (data["type"] == "content_block_delta" && data["delta"]["type"] == "input_json_delta") {
      ASSERT_FALSE(inputs.empty()) << streamed.body;
      inputs.back() += data["delta"]["partial_json"].get<std::string>();
    }
    at = end;
  }
  ASSERT_FALSE(inputs.empty()) << streamed.body;
  for (const std::string& input : inputs) EXPECT_TRUE(json::parse(input)["path"].is_string()) << input;

  // The next turn: the assistant's blocks as they came, the tool's result as a user block.
  request["messages"].push_back({{"role", "assistant"}, {"content", message["content"]}});
  request["messages"].push_back(
      {{"role", "user"},
       {"content", json::array({{{"type", "tool_result"}, {"tool_use_id", tool_use["id"]}, {"content", "print(1)"}}})}});
  request["tool_choice"] = {{"type", "auto"}};
  const Response next = post("/v1/messages", request);
  EXPECT_EQ(next.status, 200) << next.body;
}

TEST_F(AnthropicE2E, KeysAndErrorsAreAnthropics) {
  const json request = {{"model", "glm-5"}, {"max_tokens", 4}, {"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}};
  const Response no_key = post("/v1/messages", request, {});
  EXPECT_EQ(no_key.status, 401);
  EXPECT_EQ(json::parse(no_key.body)["error"]["type"], "authentication_error") << no_key.body;
  const Response bearer = post("/v1/messages", request, {{"authorization", "Bearer sk-test"}});
  EXPECT_EQ(bearer.status, 200) << bearer.body;
  json no_max = request;
  no_max.erase("max_tokens");
  const Response missing = post("/v1/messages", no_max);
  EXPECT_EQ(missing.status, 400);
  EXPECT_EQ(json::parse(missing.body),
            (json{{"type", "error"}, {"error", {{"type", "invalid_request_error"}, {"message", "max_tokens: Field required"}}}}));
  json unknown = request;
  unknown["model"] = "claude-sonnet-4-5";
  EXPECT_EQ(json::parse(post("/v1/messages", unknown).body)["error"]["type"], "not_found_error");
}
