// End-to-end: `glmserve serve --model models/glm5-tiny-code` on a loopback port, driven over real
// HTTP. One server for the suite (started in SetUpTestSuite); SIGTERM draining has its own.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "../server/prom_validator.h"
#include "../structured/schema_check.h"
#include "../structured/schema_generator.h"
#include "e2e_client.h"

using namespace glms::e2e;
using nlohmann::json;

namespace {

const std::string kBinary = GLMS_BINARY_DIR "/glmserve";
const std::string kModel = GLMS_SOURCE_DIR "/models/glm5-tiny-code";

std::vector<std::string> server_args(std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"serve", "--model", kModel, "--port", "0", "--served-model-name", "tiny",
                                   "--max-model-len", "512", "--max-num-seqs", "64"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

double metric(const std::string& text, const std::string& name) {
  std::vector<glms::test::PromSample> samples;
  if (!glms::test::validate_prometheus(text, &samples).empty()) return -1;
  for (const auto& s : samples)
    if (s.name == name) return s.value;
  return -1;
}

}  // namespace

class E2E : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_ = new ServerProcess(kBinary, server_args()); }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  static int port() { return server_->port(); }
  static json post(const std::string& path, const json& body, int expect = 200) {
    const Response r = http(port(), "POST", path, body.dump());
    EXPECT_EQ(r.status, expect) << r.body;
    return r.status == 0 ? json() : json::parse(r.body, nullptr, false);
  }
  // Concatenated text of a streamed chat/completion (content or text), plus the final chunk.
  static std::string stream_text(const std::string& path, json body, json* usage = nullptr, std::string* finish = nullptr) {
    body["stream"] = true;
    body["stream_options"] = {{"include_usage", true}};
    const Response r = http(port(), "POST", path, body.dump());
    EXPECT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.headers.at("content-type"), "text/event-stream");
    const auto events = sse_payloads(r.body);
    EXPECT_FALSE(events.empty());
    if (events.empty()) return "";
    EXPECT_EQ(events.back(), "[DONE]");
    std::string text;
    for (const std::string& e : events) {
      if (e == "[DONE]") continue;
      const json chunk = json::parse(e);
      if (chunk["choices"].empty()) {
        if (usage) *usage = chunk["usage"];
        continue;
      }
      const json& c = chunk["choices"][0];
      if (c.contains("delta") && c["delta"].contains("content")) text += c["delta"]["content"].get<std::string>();
      if (c.contains("text")) text += c["text"].get<std::string>();
      if (finish && !c["finish_reason"].is_null()) *finish = c["finish_reason"];
    }
    return text;
  }
  static ServerProcess* server_;
};

ServerProcess* E2E::server_ = nullptr;

TEST_F(E2E, HealthModelsVersionMetrics) {
  EXPECT_EQ(http(port(), "GET", "/health").status, 200);
  const json models = json::parse(http(port(), "GET", "/v1/models").body);
  EXPECT_EQ(models["data"][0]["id"], "tiny");
  EXPECT_EQ(models["data"][0]["max_model_len"], 512);
  EXPECT_EQ(json::parse(http(port(), "GET", "/version").body)["version"], "0.1.0");
  const Response m = http(port(), "GET", "/metrics");
  EXPECT_EQ(glms::test::validate_prometheus(m.body), "") << m.body;
}

TEST_F(E2E, StreamingEqualsNonStreaming) {
  const json chat = {{"messages", {{{"role", "user"}, {"content", "def fibonacci(n):"}}}},
                     {"temperature", 0}, {"max_tokens", 12}};
  const json full = post("/v1/chat/completions", chat);
  json usage;
  std::string finish;
  EXPECT_EQ(stream_text("/v1/chat/completions", chat, &usage, &finish),
            full["choices"][0]["message"]["content"].get<std::string>());
  EXPECT_EQ(finish, full["choices"][0]["finish_reason"].get<std::string>());
  EXPECT_EQ(usage["completion_tokens"], full["usage"]["completion_tokens"]);
  EXPECT_EQ(usage["prompt_tokens"], full["usage"]["prompt_tokens"]);

  const json completion = {{"prompt", "import os\nimport sys\n"}, {"temperature", 0}, {"max_tokens", 12}};
  const json cfull = post("/v1/completions", completion);
  EXPECT_EQ(cfull["usage"]["completion_tokens"], 12);
  EXPECT_EQ(cfull["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(stream_text("/v1/completions", completion), cfull["choices"][0]["text"].get<std::string>());
}

TEST_F(E2E, ConcurrentGreedyMatchesSequential) {
  const std::vector<std::string> prompts = {"def main():\n", "class Stack:\n", "import numpy as np\n",
                                            "for i in range(10):\n"};
  auto body = [&](size_t i) {
    return json{{"prompt", prompts[i % prompts.size()]}, {"temperature", 0}, {"max_tokens", 6}, {"ignore_eos", true}};
  };
  std::vector<std::string> expected;
  for (size_t i = 0; i < prompts.size(); ++i) expected.push_back(post("/v1/completions", body(i))["choices"][0]["text"]);
  constexpr int kClients = 64;
  std::vector<std::string> got(kClients);
  std::vector<int> status(kClients);
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i)
    threads.emplace_back([&, i] {
      const Response r = http(port(), "POST", "/v1/completions", body(i).dump());
      status[i] = r.status;
      if (r.status == 200) got[i] = json::parse(r.body)["choices"][0]["text"];
    });
  for (auto& t : threads) t.join();
  for (int i = 0; i < kClients; ++i) {
    EXPECT_EQ(status[i], 200) << i;
    EXPECT_EQ(got[i], expected[i % prompts.size()]) << "client " << i;
  }
}

TEST_F(E2E, SharedPrefixIsCached) {
  std::string prefix = "# A long shared system prompt for the prefix cache test.\n";
  for (int i = 0; i < 12; ++i) prefix += "def helper_" + std::to_string(i) + "(x):\n    return x * " + std::to_string(i) + "\n";
  const json first = post("/v1/completions", {{"prompt", prefix + "print(1)"}, {"max_tokens", 2}, {"temperature", 0}});
  const json second = post("/v1/completions", {{"prompt", prefix + "print(2)"}, {"max_tokens", 2}, {"temperature", 0}});
  EXPECT_GT(second["usage"]["prompt_tokens"].get<int>(), 64);
  EXPECT_GT(second["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 0) << second.dump();
  EXPECT_GT(metric(http(port(), "GET", "/metrics").body, "glmserve:prefix_cache_hits_total"), 0);
}

TEST_F(E2E, DisconnectMidStreamFreesBlocks) {
  const json body = {{"prompt", "while True:\n"}, {"max_tokens", 400}, {"ignore_eos", true}, {"stream", true}};
  const int fd = connect_to(port());
  ASSERT_GE(fd, 0);
  send_all(fd, request_text("POST", "/v1/completions", body.dump(), {}));
  std::string seen;
  char buf[4096];
  while (seen.find("data: ", seen.find("data: ") + 1) == std::string::npos) {
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    seen.append(buf, static_cast<size_t>(n));
  }
  EXPECT_NE(seen.find("200 OK"), std::string::npos) << seen;
  close(fd);
  // The engine must see the cancel: nothing running and the KV pool back to idle, well before
  // 400 tokens could have been generated.
  double running = -1, usage = -1;
  for (int i = 0; i < 200; ++i) {
    const std::string m = http(port(), "GET", "/metrics").body;
    running = metric(m, "glmserve:num_requests_running");
    usage = metric(m, "glmserve:kv_cache_usage_perc");
    if (running == 0 && usage == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  EXPECT_EQ(running, 0);
  EXPECT_EQ(usage, 0);
  const std::string m = http(port(), "GET", "/metrics").body;
  EXPECT_NE(m.find("finished_reason=\"abort\"} "), std::string::npos);
  EXPECT_EQ(m.find("finished_reason=\"abort\"} 0\n"), std::string::npos) << "no abort was counted";
}

TEST_F(E2E, BadInputsGetTheirStatusAndServerStaysUp) {
  const std::string chat_ok = R"({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})";
  std::string deep = "{\"prompt\": \"x\", \"a\": ";
  for (int i = 0; i < 100; ++i) deep += "[";
  for (int i = 0; i < 100; ++i) deep += "]";
  deep += "}";
  const std::vector<std::tuple<std::string, std::string, int>> cases = {
      {"/v1/chat/completions", "{not json", 400},
      {"/v1/chat/completions", "[]", 400},
      {"/v1/chat/completions", R"({"messages": "hi"})", 400},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "hi"}], "temperature": "x"})", 400},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "hi"}], "n": 0})", 400},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "hi"}], "model": "nope"})", 404},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 100000})", 400},
      {"/v1/completions", "{\"prompt\": \"\xff\xfe\"}", 400},
      {"/v1/completions", deep, 400},
      {"/v1/completions", R"({"prompt": [1, 2, 999999]})", 400},
      {"/v1/completions", R"({"prompt": ""})", 400},
      {"/v1/completions", std::string("{\"prompt\": \"") + std::string(9 << 20, 'a') + "\"}", 413},
      {"/v1/unknown", "{}", 404},
  };
  for (const auto& [path, body, status] : cases) {
    const Response r = http(port(), "POST", path, body);
    EXPECT_EQ(r.status, status) << path << " " << body.substr(0, 80) << " -> " << r.body;
    const json err = json::parse(r.body, nullptr, false);
    ASSERT_TRUE(err.is_object() && err.contains("error")) << r.body;
    EXPECT_TRUE(err["error"]["message"].is_string());
    EXPECT_EQ(err["error"]["code"], status);
  }
  // Garbage on the wire.
  const int fd = connect_to(port());
  send_all(fd, "NOT HTTP AT ALL\r\n\r\n");
  char buf[256];
  (void)!recv(fd, buf, sizeof buf, 0);
  close(fd);
  EXPECT_EQ(http(port(), "GET", "/health").status, 200);
  EXPECT_EQ(http(port(), "POST", "/v1/chat/completions", chat_ok).status, 200);
}

// A prompt that cannot fit by its length alone is refused before tokenizing (8 MB of one letter
// would take seconds of BPE), saying the bound it broke; the server answers the next request.
TEST_F(E2E, AHugePromptIsRefusedByItsLength) {
  const json r = post("/v1/completions", {{"prompt", std::string(8000000, 'a')}, {"max_tokens", 4}}, 400);
  const std::string message = r["error"]["message"];
  EXPECT_NE(message.find("8000000 bytes has at least"), std::string::npos) << message;
  EXPECT_EQ(r["error"]["param"], "prompt");
  post("/v1/completions", {{"prompt", "def f():"}, {"max_tokens", 2}});
}

// Structured outputs, the choice form, on the bundled model: greedy and sampled, streamed and
// not, chat and completions, every answer is one of the choices and ends with "stop".
TEST_F(E2E, ChoiceOutputsAreOneOfTheChoices) {
  const std::vector<std::string> choices = {"positive", "negative", "neutral", "not sure"};
  for (int i = 0; i < 12; ++i) {
    json body = {{"prompt", "# sentiment of 'def f(): pass':"}, {"max_tokens", 20}, {"seed", i}};
    body["temperature"] = i % 3 == 0 ? 0.0 : 1.0;
    if (i % 2 == 0) body["structured_outputs"] = {{"choice", choices}};
    else body["guided_choice"] = choices;
    std::string text, finish;
    if (i % 4 < 2) {
      const json r = post("/v1/completions", body);
      text = r["choices"][0]["text"];
      finish = r["choices"][0]["finish_reason"];
    } else {
      text = stream_text("/v1/completions", body, nullptr, &finish);
    }
    EXPECT_NE(std::find(choices.begin(), choices.end(), text), choices.end()) << i << ": '" << text << "'";
    EXPECT_EQ(finish, "stop") << i;
  }
  const json chat = post("/v1/chat/completions",
                         {{"messages", {{{"role", "user"}, {"content", "Is water wet?"}}}},
                          {"chat_template_kwargs", {{"enable_thinking", false}}},
                          {"structured_outputs", {{"choice", {"yes", "no"}}}},
                          {"max_tokens", 10}});
  const std::string answer = chat["choices"][0]["message"]["content"];
  EXPECT_TRUE(answer == "yes" || answer == "no") << chat.dump();
}

// The regex form on the bundled model: greedy and sampled outputs match the expression (a
// date, a small JSON object), and an expression outside the syntax is a 400 naming it.
TEST_F(E2E, RegexOutputsMatchTheExpression) {
  const std::vector<std::string> patterns = {R"(20[0-9]{2}-(0[1-9]|1[0-2])-[0-3][0-9])",
                                             R"(\{"n": [0-9]{1,3}, "ok": (true|false)\})"};
  for (const std::string& pattern : patterns)
    for (int i = 0; i < 4; ++i) {
      json body = {{"prompt", "# today:"}, {"max_tokens", 40}, {"seed", i}, {"temperature", i == 0 ? 0.0 : 1.0}};
      body["structured_outputs"] = {{"regex", pattern}};
      const json r = post("/v1/completions", body);
      const std::string text = r["choices"][0]["text"];
      EXPECT_TRUE(std::regex_match(text, std::regex(pattern))) << pattern << ": '" << text << "'";
      EXPECT_EQ(r["choices"][0]["finish_reason"], "stop") << pattern << ": '" << text << "'";
    }
  const json bad = post("/v1/completions", {{"prompt", "x"}, {"guided_regex", "(ab"}}, 400);
  EXPECT_EQ(bad["error"]["param"], "structured_outputs.regex");
}

// The json_object form (OpenAI's response_format) on the bundled model: every answer, greedy
// or sampled, parses as one JSON object.
TEST_F(E2E, JsonObjectOutputsParse) {
  int closed = 0;
  for (int i = 0; i < 6; ++i) {
    json body = {{"prompt", "config = "}, {"max_tokens", 120}, {"seed", i}, {"temperature", i == 0 ? 0.0 : 0.8}};
    if (i % 2 == 0) body["response_format"] = {{"type", "json_object"}};
    else body["structured_outputs"] = {{"json_object", true}};
    const json r = post("/v1/completions", body);
    const std::string text = r["choices"][0]["text"];
    if (r["choices"][0]["finish_reason"] == "length") continue;  // cut by max_tokens: not yet closed
    ++closed;
    const json parsed = json::parse(text, nullptr, false);
    EXPECT_TRUE(parsed.is_object()) << i << ": '" << text << "'";
  }
  EXPECT_GT(closed, 0) << "every answer was cut by max_tokens";
  const json chat = post("/v1/chat/completions",
                         {{"messages", {{{"role", "user"}, {"content", "Give a JSON object."}}}},
                          {"chat_template_kwargs", {{"enable_thinking", false}}},
                          {"response_format", {{"type", "json_object"}}},
                          {"max_tokens", 120}});
  if (chat["choices"][0]["finish_reason"] == "stop") {
    const std::string content = chat["choices"][0]["message"]["content"];
    EXPECT_TRUE(json::parse(content, nullptr, false).is_object()) << chat.dump();
  }
}

// JSON schema outputs on the bundled model: for 100 generated schemas (response_format
// json_schema, structured_outputs.json and guided_json in turn; greedy and sampled), every
// answer parses and satisfies its schema (schema_check.h, independent of the grammar).
TEST_F(E2E, HundredJsonSchemasEveryAnswerParsesAndValidates) {
  glms::testing::SchemaGenerator gen(23);
  std::vector<nlohmann::ordered_json> schemas;
  for (int i = 0; i < 100; ++i) schemas.push_back(i % 2 ? gen.object_schema(1) : gen.schema(1));
  std::vector<std::string> failures(schemas.size());
  std::atomic<size_t> next{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < 8; ++c)
    clients.emplace_back([&] {
      for (size_t i; (i = next++) < schemas.size();) {
        json body = {{"prompt", "data = "}, {"max_tokens", 500}, {"seed", i}, {"temperature", i % 3 ? 0.8 : 0.0}};
        const json schema = json::parse(schemas[i].dump());
        if (i % 3 == 0) body["response_format"] = {{"type", "json_schema"}, {"json_schema", {{"name", "s"}, {"schema", schema}}}};
        else if (i % 3 == 1) body["structured_outputs"] = {{"json", schema}};
        else body["guided_json"] = schemas[i].dump();
        const Response r = http(port(), "POST", "/v1/completions", body.dump());
        const json out = json::parse(r.body, nullptr, false);
        if (r.status != 200) {
          failures[i] = "status " + std::to_string(r.status) + ": " + r.body;
          continue;
        }
        const std::string text = out["choices"][0]["text"];
        const auto parsed = nlohmann::ordered_json::parse(text, nullptr, false);
        if (out["choices"][0]["finish_reason"] != "stop") failures[i] = "finish_reason " + out["choices"][0]["finish_reason"].dump();
        else if (parsed.is_discarded()) failures[i] = "does not parse";
        else failures[i] = glms::testing::schema_violation(parsed, schemas[i], schemas[i]);
        if (!failures[i].empty()) failures[i] += " in '" + text + "'";
      }
    });
  for (auto& t : clients) t.join();
  for (size_t i = 0; i < schemas.size(); ++i) EXPECT_EQ(failures[i], "") << schemas[i].dump();
  const json bad = post("/v1/completions", {{"prompt", "x"}, {"structured_outputs", {{"json", {{"type", "array"}, {"uniqueItems", true}}}}}}, 400);
  EXPECT_NE(bad["error"]["message"].get<std::string>().find("uniqueItems"), std::string::npos) << bad.dump();
  EXPECT_EQ(bad["error"]["param"], "structured_outputs.json");
  // The error names the field the schema came in.
  const json schema = {{"type", "number"}, {"multipleOf", 0.5}};
  const json via_format = post("/v1/chat/completions",
                               {{"messages", {{{"role", "user"}, {"content", "x"}}}},
                                {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "n"}, {"schema", schema}}}}}},
                               400);
  EXPECT_EQ(via_format["error"]["param"], "response_format.json_schema.schema") << via_format.dump();
  EXPECT_EQ(post("/v1/completions", {{"prompt", "x"}, {"guided_json", schema}}, 400)["error"]["param"], "guided_json");
}

// vLLM's structural tags on the bundled model (a code model, which writes "(" often): every "("
// of an answer, greedy or sampled, opens an integer and its ")"; the rest is free text.
TEST_F(E2E, StructuralTagsHoldEveryTriggeredStructure) {
  const json tag = {{"structures", {{{"begin", "("}, {"schema", {{"type", "integer"}}}, {"end", ")"}}}},
                    {"triggers", {"("}}};
  int structures = 0;
  for (int i = 0; i < 6; ++i) {
    json body = {{"prompt", "def area(width, height):\n    return"}, {"max_tokens", 60}, {"seed", i},
                 {"temperature", i == 0 ? 0.0 : 1.0}};
    json format = tag;
    format["type"] = "structural_tag";
    if (i % 2 == 0) body["response_format"] = format;
    else body["structured_outputs"] = {{"structural_tag", tag.dump()}};
    const json choice = post("/v1/completions", body)["choices"][0];
    const std::string text = choice["text"];
    static const std::regex structure(R"(\(\s*-?(0|[1-9][0-9]*)\s*\))");
    std::string rest = text;
    for (std::smatch m; std::regex_search(rest, m, structure); rest = m.suffix()) {
      EXPECT_EQ(m.prefix().str().find('('), std::string::npos) << "a ( that opens no integer in '" << text << "'";
      ++structures;
    }
    if (rest.find('(') != std::string::npos)  // only an answer cut inside its last structure
      EXPECT_EQ(choice["finish_reason"], "length") << "'" << text << "'";
  }
  EXPECT_GT(structures, 0) << "no answer wrote a (";
  const json bad = post("/v1/completions",
                        {{"prompt", "x"}, {"structured_outputs", {{"structural_tag", {{"structures", json::array()}, {"triggers", {"("}}}}}}},
                        400);
  EXPECT_EQ(bad["error"]["param"], "structured_outputs.structural_tag");
}

// tool_choice "required" and a named function on the bundled model: every answer, streamed or
// not, is a parsed call of an offered tool whose arguments satisfy its parameters.
TEST_F(E2E, ForcedToolChoiceAlwaysYieldsAParsedCall) {
  const json params = {{"type", "object"},
                       {"properties", {{"city", {{"type", "string"}, {"maxLength", 12}}},
                                       {"days", {{"type", "integer"}, {"minimum", 1}, {"maximum", 7}}}}},
                       {"required", {"city", "days"}}};
  const json tools = {{{"type", "function"}, {"function", {{"name", "get_weather"}, {"parameters", params}}}},
                      {{"type", "function"}, {"function", {{"name", "get_time"}, {"parameters", {{"type", "object"}, {"properties", {{"zone", {{"enum", {"UTC", "CET"}}}}}}}}}}}};
  for (int i = 0; i < 8; ++i) {
    json body = {{"messages", {{{"role", "user"}, {"content", "What is the weather in Paris?"}}}},
                 {"tools", tools}, {"max_tokens", 120}, {"seed", i}, {"temperature", i % 2 ? 0.9 : 0.0},
                 {"chat_template_kwargs", {{"enable_thinking", false}}}};
    const bool named = i % 4 >= 2;
    body["tool_choice"] = named ? json{{"type", "function"}, {"function", {{"name", "get_weather"}}}} : json("required");
    std::vector<json> calls;  // {name, arguments}
    std::string finish;
    if (i % 2 == 0) {
      const json r = post("/v1/chat/completions", body);
      finish = r["choices"][0]["finish_reason"];
      for (const json& c : r["choices"][0]["message"]["tool_calls"]) calls.push_back(c["function"]);
    } else {
      body["stream"] = true;
      const Response r = http(port(), "POST", "/v1/chat/completions", body.dump());
      ASSERT_EQ(r.status, 200) << r.body;
      for (const std::string& e : sse_payloads(r.body)) {
        if (e == "[DONE]") continue;
        const json chunk = json::parse(e);
        const json& c = chunk["choices"][0];
        if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
        if (!c["delta"].contains("tool_calls")) continue;
        for (const json& d : c["delta"]["tool_calls"]) {
          const size_t index = d["index"];
          if (calls.size() <= index) calls.resize(index + 1, json{{"name", ""}, {"arguments", ""}});
          if (d["function"].contains("name")) calls[index]["name"] = d["function"]["name"];
          if (d["function"].contains("arguments"))
            calls[index]["arguments"] = calls[index]["arguments"].get<std::string>() + d["function"]["arguments"].get<std::string>();
        }
      }
    }
    EXPECT_EQ(finish, "tool_calls") << i;
    ASSERT_FALSE(calls.empty()) << i;
    for (const json& call : calls) {
      if (named) {
        EXPECT_EQ(call["name"], "get_weather") << i;
      }
      const auto args = nlohmann::ordered_json::parse(call["arguments"].get<std::string>(), nullptr, false);
      ASSERT_FALSE(args.is_discarded()) << call.dump();
      const auto schema = call["name"] == "get_weather" ? nlohmann::ordered_json::parse(params.dump())
                                                        : nlohmann::ordered_json::parse(tools[1]["function"]["parameters"].dump());
      EXPECT_EQ(glms::testing::schema_violation(args, schema, schema), "") << call.dump();
    }
  }
}

// The grammar form (structured_outputs.grammar, guided_grammar): answers are in the language.
TEST_F(E2E, GrammarOutputsAreInTheLanguage) {
  const std::string grammar = "root ::= \"def \" name \"(\" (name (\", \" name){0,2})? \"):\"\nname ::= [a-z_]{1,8}";
  for (int i = 0; i < 4; ++i) {
    json body = {{"prompt", "# python\n"}, {"max_tokens", 80}, {"seed", i}, {"temperature", i ? 1.0 : 0.0}};
    if (i % 2) body["guided_grammar"] = grammar;
    else body["structured_outputs"] = {{"grammar", grammar}};
    const json r = post("/v1/completions", body);
    const std::string text = r["choices"][0]["text"];
    EXPECT_TRUE(std::regex_match(text, std::regex(R"(def [a-z_]{1,8}\(([a-z_]{1,8}(, [a-z_]{1,8}){0,2})?\):)"))) << text;
  }
  const json bad = post("/v1/completions", {{"prompt", "x"}, {"guided_grammar", "root ::= root \"a\""}}, 400);
  EXPECT_EQ(bad["error"]["param"], "structured_outputs.grammar");
}

// Memory pressure end to end: a server whose KV cache holds 36 blocks of 16 tokens (one
// 512-token sequence and a bit) serves 8 concurrent greedy requests of 8 blocks each by preempting and
// recomputing; every one finishes with the unpressured server's tokens, and afterwards the cache
// and the running and waiting counts are back at zero.
TEST_F(E2E, MemoryPressureFinishesEveryRequestWithTheSameGreedyOutput) {
  ServerProcess small(kBinary, server_args({"--kv-cache-memory", "1440K"}));
  const std::vector<std::string> prompts = {"def parse(text):\n", "class Queue:\n    def __init__(self):\n",
                                            "import os\nimport sys\n\n", "for i in range(10):\n",
                                            "# sort a list\n", "def add(a, b):\n    return", "try:\n    x = ",
                                            "with open(path) as f:\n"};
  auto body = [&](size_t i) {
    return json{{"prompt", prompts[i]}, {"max_tokens", 110}, {"temperature", 0}, {"ignore_eos", true}};
  };
  std::vector<std::string> expected;
  for (size_t i = 0; i < prompts.size(); ++i) expected.push_back(post("/v1/completions", body(i))["choices"][0]["text"]);
  std::vector<std::string> got(prompts.size());
  std::vector<std::thread> clients;
  for (size_t i = 0; i < prompts.size(); ++i)
    clients.emplace_back([&, i] {
      const Response r = http(small.port(), "POST", "/v1/completions", body(i).dump());
      got[i] = r.status == 200 ? json::parse(r.body)["choices"][0]["text"].get<std::string>() : "status " + std::to_string(r.status);
    });
  for (auto& t : clients) t.join();
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(got[i], expected[i]) << "request " << i;
  const std::string m = http(small.port(), "GET", "/metrics").body;
  EXPECT_GT(metric(m, "glmserve:num_preemptions_total"), 0) << "the cache was not small enough to preempt";
  EXPECT_EQ(metric(m, "glmserve:kv_cache_usage_perc"), 0);
  EXPECT_EQ(metric(m, "glmserve:num_requests_running"), 0);
  EXPECT_EQ(metric(m, "glmserve:num_requests_waiting"), 0);
}

// A step that fails in one process (test-only GLMS_TEST_FAULT_RANK=0:S fails the S-th forward
// step): the requests in it end with an error (a stream gets an error event, then [DONE]), the
// engine carries on, and the next request is served; nothing hangs.
TEST_F(E2E, AFailingStepEndsItsRequestsWithAnErrorAndTheServerCarriesOn) {
  setenv("GLMS_TEST_FAULT_RANK", "0:4", 1);
  ServerProcess faulty(kBinary, server_args());
  unsetenv("GLMS_TEST_FAULT_RANK");
  json body = {{"prompt", "def main():\n"}, {"max_tokens", 12}, {"temperature", 0}, {"ignore_eos", true}, {"stream", true}};
  const Response r = http(faulty.port(), "POST", "/v1/completions", body.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const auto events = sse_payloads(r.body);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back(), "[DONE]");
  bool error_event = false;
  for (const std::string& e : events)
    if (e != "[DONE]" && json::parse(e).contains("error")) {
      error_event = true;
      EXPECT_NE(json::parse(e)["error"]["message"].get<std::string>().find("injected fault"), std::string::npos) << e;
    }
  EXPECT_TRUE(error_event) << r.body;
  body.erase("stream");
  const Response next = http(faulty.port(), "POST", "/v1/completions", body.dump());
  EXPECT_EQ(next.status, 200) << next.body;
  EXPECT_EQ(json::parse(next.body)["choices"][0]["finish_reason"], "length") << next.body;
}

// Cancellation reaches a prefill at its next chunk: 8 streamed clients with ~3000-token prompts
// (one prefilling, the rest waiting) hang up at once; the engine is idle, every block back, in
// less than half the time one whole prompt takes to prefill (measured first, as machines differ:
// a 2-core CI machine took 1.2-4 s for it), where the 8 prefills run through would take 8 times
// that. Only the 512-token chunk in flight finishes.
TEST_F(E2E, DisconnectedPrefillsStopAtTheNextChunk) {
  ServerProcess big(kBinary, {"serve", "--model", kModel, "--port", "0", "--max-model-len", "4096"});
  std::string prompt;
  for (int i = 0; prompt.size() < 7000; ++i) prompt += "def f" + std::to_string(i) + "(x):\n    return x * " + std::to_string(i) + "\n";
  const json counted = json::parse(http(big.port(), "POST", "/tokenize", json{{"prompt", prompt}}.dump()).body);
  ASSERT_GT(counted["count"].get<int>(), 2000);
  ASSERT_LT(counted["count"].get<int>(), 4000);
  const auto prefill_start = std::chrono::steady_clock::now();
  const Response one = http(big.port(), "POST", "/v1/completions", json{{"prompt", "x" + prompt}, {"max_tokens", 1}}.dump());
  ASSERT_EQ(one.status, 200) << one.body;
  const double one_prefill = std::chrono::duration<double>(std::chrono::steady_clock::now() - prefill_start).count();
  std::vector<int> sockets;
  for (int i = 0; i < 8; ++i) {
    const std::string body = json{{"prompt", std::to_string(i) + prompt}, {"max_tokens", 50}, {"stream", true}}.dump();
    const std::string request = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                                std::to_string(body.size()) + "\r\n\r\n" + body;
    const int fd = connect_to(big.port());
    ASSERT_EQ(send(fd, request.data(), request.size(), 0), static_cast<ssize_t>(request.size()));
    sockets.push_back(fd);
  }
  auto busy = [&] {
    const std::string m = http(big.port(), "GET", "/metrics").body;
    return metric(m, "glmserve:num_requests_running") + metric(m, "glmserve:num_requests_waiting") +
           metric(m, "glmserve:kv_cache_usage_perc");
  };
  for (int i = 0; i < 100 && busy() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_GT(busy(), 0) << "the requests never started";
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // a prefill chunk is in flight
  for (int fd : sockets) close(fd);
  const auto start = std::chrono::steady_clock::now();
  while (busy() > 0 && std::chrono::steady_clock::now() - start < std::chrono::seconds(10))
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("engine idle %.2f s after 8 prefilling clients hung up (one whole prefill: %.2f s)\n", seconds,
              one_prefill);
  EXPECT_EQ(busy(), 0);
  EXPECT_LT(seconds, one_prefill / 2);
}

// Prompt logprobs on the bundled model: prompt_logprobs lists one entry per prompt token (null
// first, then the token with its rank and the top ones), echo with logprobs opens the logprobs
// object with the same numbers, and a chat request gets them too.
TEST_F(E2E, PromptLogprobsAndEchoLogprobs) {
  const std::string prompt = "def add(a, b):\n    return";
  const json tokens = json::parse(http(port(), "POST", "/tokenize", json{{"prompt", prompt}, {"add_special_tokens", false}}.dump()).body)["tokens"];
  const json r = post("/v1/completions", {{"prompt", prompt}, {"max_tokens", 3}, {"temperature", 0}, {"echo", true},
                                          {"logprobs", 2}, {"prompt_logprobs", 2}});
  const json& c = r["choices"][0];
  ASSERT_EQ(c["prompt_logprobs"].size(), tokens.size()) << r.dump();
  EXPECT_TRUE(c["prompt_logprobs"][0].is_null());
  const json& lp = c["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), tokens.size() + 3);
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  for (size_t i = 1; i < tokens.size(); ++i) {
    const json& entry = c["prompt_logprobs"][i];
    const std::string id = std::to_string(tokens[i].get<int>());
    ASSERT_TRUE(entry.contains(id)) << entry.dump();
    EXPECT_GE(entry[id]["rank"].get<int>(), 1);
    EXPECT_LE(entry.size(), 3u);  // the token and the top 2
    EXPECT_DOUBLE_EQ(entry[id]["logprob"].get<double>(), lp["token_logprobs"][i].get<double>()) << i;
    EXPECT_LE(entry[id]["logprob"].get<double>(), 0.0);
  }
  EXPECT_EQ(c["text"].get<std::string>().rfind(prompt, 0), 0u);  // echo
  const json chat = post("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 2},
                                                  {"prompt_logprobs", 0}});
  EXPECT_EQ(chat["choices"][0]["prompt_logprobs"].size(), chat["usage"]["prompt_tokens"].get<size_t>());
}

TEST_F(E2E, ToolsAreAcceptedAndRendered) {
  const json req = {{"messages", {{{"role", "user"}, {"content", "weather in Paris?"}}}},
                    {"max_tokens", 4},
                    {"tools", {{{"type", "function"},
                                {"function", {{"name", "get_weather"},
                                              {"parameters", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}}}}}}}},
                    {"tool_choice", "auto"}};
  const json with_tools = post("/v1/chat/completions", req);
  json plain = req;
  plain.erase("tools");
  plain.erase("tool_choice");
  const json without = post("/v1/chat/completions", plain);
  // The tool schema is rendered into the prompt by the chat template.
  EXPECT_GT(with_tools["usage"]["prompt_tokens"].get<int>(), without["usage"]["prompt_tokens"].get<int>() + 10);
  EXPECT_TRUE(with_tools["choices"][0]["message"]["tool_calls"].is_array());
}

// The same server under data-parallel attention with expert-parallel MoE (two CPU ranks): the
// greedy completions of concurrent clients equal the one-rank server's, the shared prefix is
// found on the rank that holds it, and a disconnected stream's blocks come back.
TEST_F(E2E, DataParallelServerMatchesOneRank) {
  ServerProcess dp(kBinary, server_args({"-dp", "2", "--enable-expert-parallel"}));
  const std::vector<std::string> prompts = {"def main():\n", "class Stack:\n", "import numpy as np\n"};
  auto body = [&](size_t i) {
    return json{{"prompt", prompts[i % prompts.size()]}, {"temperature", 0}, {"max_tokens", 8}, {"ignore_eos", true}};
  };
  std::vector<std::string> expected;
  for (size_t i = 0; i < prompts.size(); ++i) expected.push_back(post("/v1/completions", body(i))["choices"][0]["text"]);
  constexpr int kClients = 12;
  std::vector<std::string> got(kClients);
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i)
    threads.emplace_back([&, i] {
      const Response r = http(dp.port(), "POST", "/v1/completions", body(i).dump());
      if (r.status == 200) got[i] = json::parse(r.body)["choices"][0]["text"];
    });
  for (auto& t : threads) t.join();
  for (int i = 0; i < kClients; ++i) EXPECT_EQ(got[i], expected[i % prompts.size()]) << "client " << i;

  std::string prefix = "# A shared system prompt.\n";
  for (int i = 0; i < 12; ++i) prefix += "def helper_" + std::to_string(i) + "(x):\n    return x + " + std::to_string(i) + "\n";
  auto complete = [&](const std::string& prompt) {
    const Response r = http(dp.port(), "POST", "/v1/completions",
                            json{{"prompt", prompt}, {"max_tokens", 2}, {"temperature", 0}}.dump());
    EXPECT_EQ(r.status, 200) << r.body;
    return json::parse(r.body, nullptr, false);
  };
  complete(prefix + "print(1)");
  EXPECT_GT(complete(prefix + "print(2)")["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 0);

  const int fd = connect_to(dp.port());
  ASSERT_GE(fd, 0);
  send_all(fd, request_text("POST", "/v1/completions",
                            json{{"prompt", "while True:\n"}, {"max_tokens", 400}, {"ignore_eos", true}, {"stream", true}}.dump(),
                            {}));
  char buf[4096];
  ASSERT_GT(recv(fd, buf, sizeof buf, 0), 0);
  close(fd);
  double running = -1, usage = -1;
  for (int i = 0; i < 200 && !(running == 0 && usage == 0); ++i) {
    const std::string m = http(dp.port(), "GET", "/metrics").body;
    running = metric(m, "glmserve:num_requests_running");
    usage = metric(m, "glmserve:kv_cache_usage_perc");
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  EXPECT_EQ(running, 0);
  EXPECT_EQ(usage, 0);
  // Each rank's own pool is reported too (the web UI's KV chart shows the fullest).
  const std::string m = http(dp.port(), "GET", "/metrics").body;
  EXPECT_NE(m.find("glmserve:kv_cache_usage_perc_by_rank{model_name=\"tiny\",dp_rank=\"1\"} 0"), std::string::npos) << m;
  EXPECT_EQ(dp.stop(SIGTERM, 60.0), 0);
}

TEST(E2EShutdown, SigtermDrainsInFlightRequests) {
  ServerProcess server(kBinary, server_args());
  std::atomic<int> status{0};
  std::string text;
  std::thread client([&] {
    const Response r = http(server.port(), "POST", "/v1/completions",
                            json{{"prompt", "def f():\n"}, {"max_tokens", 40}, {"ignore_eos", true}}.dump());
    status = r.status;
    if (r.status == 200) text = json::parse(r.body)["usage"].dump();
  });
  // Wait until the request is running, then ask the server to stop.
  for (int i = 0; i < 200; ++i) {
    if (metric(http(server.port(), "GET", "/metrics").body, "glmserve:num_requests_running") > 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(server.stop(SIGTERM, 60.0), 0);
  client.join();
  EXPECT_EQ(status.load(), 200);
  EXPECT_NE(text.find("\"completion_tokens\":40"), std::string::npos) << text;
}

namespace {
// Starts a long streamed completion on `port` in a thread; its whole body lands in `body`.
std::thread long_stream(int port, std::string& body) {
  return std::thread([port, &body] {
    body = http(port, "POST", "/v1/completions",
                json{{"prompt", "def f():\n"}, {"max_tokens", 3000}, {"ignore_eos", true}, {"stream", true}}.dump())
               .body;
  });
}
// A server whose requests may run 3000 tokens (about 5 s on the bundled model here).
std::vector<std::string> long_server_args(std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"serve", "--model", kModel, "--port", "0", "--max-model-len", "4096"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}
void wait_until_running(int port) {
  for (int i = 0; i < 400; ++i) {
    if (metric(http(port, "GET", "/metrics").body, "glmserve:num_requests_running") > 0) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}
}  // namespace

TEST(E2EShutdown, ASecondSignalExitsAtOnce) {
  ServerProcess server(kBinary, long_server_args());
  std::string body;
  std::thread client = long_stream(server.port(), body);
  wait_until_running(server.port());
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(server.stop(SIGTERM, 0.3), -1);  // draining: the 3000-token stream keeps it up
  EXPECT_EQ(server.stop(SIGTERM, 10.0), 128 + SIGTERM);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 3.0);
  client.join();
}

TEST(E2EShutdown, TheShutdownTimeoutEndsStreamsWithAnErrorEvent) {
  ServerProcess server(kBinary, long_server_args({"--shutdown-timeout", "0.5"}));
  std::string body;
  std::thread client = long_stream(server.port(), body);
  wait_until_running(server.port());
  EXPECT_EQ(server.stop(SIGTERM, 20.0), 0);
  client.join();
  const auto events = sse_payloads(body);
  ASSERT_GE(events.size(), 2u) << body;
  EXPECT_EQ(events.back(), "[DONE]");
  bool error_event = false;
  for (const std::string& e : events)
    if (e.find("\"error\"") != std::string::npos && e.find("shut down") != std::string::npos) error_event = true;
  EXPECT_TRUE(error_event) << body.substr(body.size() > 2000 ? body.size() - 2000 : 0);
}
