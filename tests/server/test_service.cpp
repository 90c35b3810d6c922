// The API service over a scripted backend: routing, response shapes, SSE framing, stop strings,
// n, logprobs, limits and errors, disconnects.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "fakes.h"
#include "prom_validator.h"
#include "service_fixture.h"
#include "server/api_service.h"
#include "server/auth.h"
#include "text/tokenizer.h"

using namespace glms;
using namespace glms::server;
using glms::test::FakeBackend;
using glms::test::RecordingResponder;
using glms::test::Fixture;
using glms::test::chat;
using glms::test::expect_error_shape;
using glms::test::ids;
using glms::test::tokenizer;
using nlohmann::json;


TEST(Service, Routes) {
  Fixture f;
  auto health = f.call("GET", "/health");
  EXPECT_EQ(health->response.status, 200);
  EXPECT_EQ(health->response.body, "");
  EXPECT_EQ(json::parse(f.call("GET", "/version")->response.body)["version"], "0.1.0");
  const json models = json::parse(f.call("GET", "/v1/models")->response.body);
  EXPECT_EQ(models["object"], "list");
  EXPECT_EQ(models["data"][0]["id"], "tiny");
  EXPECT_EQ(models["data"][0]["max_model_len"], 256);
  EXPECT_EQ(models["data"][0]["permission"][0]["object"], "model_permission");
  EXPECT_EQ(models["data"][0]["permission"][0]["allow_sampling"], true);
  auto metrics = f.call("GET", "/metrics");
  EXPECT_EQ(glms::test::validate_prometheus(metrics->response.body), "");
  EXPECT_NE(metrics->response.content_type.find("text/plain"), std::string::npos);
  auto missing = f.call("GET", "/v1/nothing");
  EXPECT_EQ(missing->response.status, 404);
  expect_error_shape(missing->response.body, 404);
  EXPECT_EQ(f.call("GET", "/v1/chat/completions")->response.status, 405);
  EXPECT_EQ(f.call("POST", "/health")->response.status, 405);
}

TEST(Service, ChatCompletion) {
  Fixture f;
  f.say("def add(a, b):\n    return a + b");
  const json r = f.post("/v1/chat/completions", chat("write add"));
  EXPECT_EQ(r["object"], "chat.completion");
  EXPECT_EQ(r["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(r["model"], "tiny");
  EXPECT_GT(r["created"].get<int64_t>(), 1600000000);
  const json& c = r["choices"][0];
  EXPECT_EQ(c["index"], 0);
  EXPECT_EQ(c["message"]["role"], "assistant");
  EXPECT_EQ(c["message"]["content"], "def add(a, b):\n    return a + b");
  EXPECT_TRUE(c["message"]["reasoning_content"].is_null());
  EXPECT_EQ(c["message"]["tool_calls"], json::array());
  EXPECT_EQ(c["finish_reason"], "stop");
  EXPECT_TRUE(c["logprobs"].is_null());
  const int prompt = static_cast<int>(ids("[gMASK]<sop><|user|>\nwrite add<|assistant|>\n").size());
  const int completion = static_cast<int>(ids("def add(a, b):\n    return a + b").size()) + 1;
  EXPECT_EQ(r["usage"]["prompt_tokens"], prompt);
  EXPECT_EQ(r["usage"]["completion_tokens"], completion);
  EXPECT_EQ(r["usage"]["total_tokens"], prompt + completion);
  EXPECT_EQ(r["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  // Defaults reach the engine: chat max_tokens = model length - prompt.
  EXPECT_EQ(f.backend.submitted[0].max_tokens, 256 - prompt);
}

TEST(Service, StreamingEqualsNonStreaming) {
  Fixture f;
  f.say("for i in range(10):\n    print(i)  # \xc3\xa9t\xc3\xa9");
  f.backend.cached_tokens = 4;
  const json full = f.post("/v1/chat/completions", chat("loop"));
  json req = chat("loop");
  req["stream"] = true;
  req["stream_options"] = {{"include_usage", true}};
  const auto events = f.stream("/v1/chat/completions", req);
  ASSERT_GE(events.size(), 4u);
  EXPECT_EQ(events.back(), "[DONE]");
  const json first = json::parse(events[0]);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  std::string content;
  std::string finish;
  for (size_t i = 0; i + 2 < events.size(); ++i) {
    const json chunk = json::parse(events[i]);
    EXPECT_EQ(chunk["id"], first["id"]);
    const json& choice = chunk["choices"][0];
    if (choice["delta"].contains("content")) content += choice["delta"]["content"].get<std::string>();
    if (!choice["finish_reason"].is_null()) finish = choice["finish_reason"];
  }
  EXPECT_EQ(content, full["choices"][0]["message"]["content"].get<std::string>());
  EXPECT_EQ(finish, "stop");
  const json usage = json::parse(events[events.size() - 2]);
  EXPECT_EQ(usage["choices"], json::array());
  EXPECT_EQ(usage["usage"], full["usage"]);
  EXPECT_EQ(usage["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
}

TEST(Service, StopStringsTruncateAndCancel) {
  Fixture f;
  f.say("x = 1\nSTOP here and more text that should never be sent");
  f.backend.delay = std::chrono::milliseconds(2);
  json req = chat("s");
  req["stop"] = {"STOP", "never"};
  const json r = f.post("/v1/chat/completions", req);
  EXPECT_EQ(r["choices"][0]["message"]["content"], "x = 1\n");
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(r["choices"][0]["stop_reason"], "STOP");
  EXPECT_EQ(f.backend.cancelled_ids().size(), 1u);
  // Streaming gives the same text; the stop string is never sent, even in part.
  req["stream"] = true;
  const auto events = f.stream("/v1/chat/completions", req);
  std::string content;
  for (const std::string& e : events)
    if (e != "[DONE]") {
      const json d = json::parse(e)["choices"][0]["delta"];
      if (d.contains("content")) content += d["content"].get<std::string>();
    }
  EXPECT_EQ(content, "x = 1\n");
  req["include_stop_str_in_output"] = true;
  req["stream"] = false;
  EXPECT_EQ(f.post("/v1/chat/completions", req)["choices"][0]["message"]["content"], "x = 1\nSTOP");
}

// vLLM's min_tokens: the text of the first min_tokens tokens is not searched for stop strings;
// one that ends in a later token's text counts, even where it begins earlier.
TEST(Service, StopStringsWaitForMinTokens) {
  Fixture f;
  const std::string text = "ab STOP cd STOP ef";
  f.say(text);
  const std::vector<int32_t> t = ids(text);
  size_t through_first = 1;  // tokens whose text holds the first "STOP" whole
  while (tokenizer().decode(std::span(t).first(through_first)).find("STOP") == std::string::npos) ++through_first;
  ASSERT_LT(through_first, t.size());
  json req;
  req["model"] = "tiny";
  req["prompt"] = "p";
  req["stop"] = "STOP";
  req["max_tokens"] = 64;
  auto content = [&](size_t min_tokens) {
    req["min_tokens"] = min_tokens;
    return f.post("/v1/completions", req)["choices"][0]["text"].get<std::string>();
  };
  EXPECT_EQ(content(0), "ab ");
  EXPECT_EQ(content(through_first - 1), "ab ");  // the first STOP ends in a searched token
  EXPECT_EQ(content(through_first), "ab STOP cd ");
  EXPECT_EQ(content(t.size()), text);  // never searched: the whole text, then EOS
}

TEST(Service, LengthAndStopTokenIds) {
  Fixture f;
  f.say("a b c d e f g h");
  json req = chat("x");
  req["max_tokens"] = 3;
  const json r = f.post("/v1/chat/completions", req);
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(r["usage"]["completion_tokens"], 3);
  EXPECT_EQ(f.backend.submitted.back().max_tokens, 3);
  req["stop_token_ids"] = {5, 6};
  req["ignore_eos"] = true;
  req["temperature"] = 0;
  req["top_k"] = -1;
  req["seed"] = 7;
  f.post("/v1/chat/completions", req);
  const engine::RequestParams& p = f.backend.submitted.back();
  EXPECT_EQ(p.stop_token_ids, (std::vector<int32_t>{5, 6}));
  EXPECT_TRUE(p.ignore_eos);
  EXPECT_EQ(p.sampling.temperature, 0.0f);
  EXPECT_EQ(p.sampling.top_k, 0);
  EXPECT_EQ(p.sampling.seed, 7u);
}

TEST(Service, NChoicesWithSeeds) {
  Fixture f;
  f.say("same");
  json req = chat("x");
  req["n"] = 3;
  req["seed"] = 100;
  req["temperature"] = 0.8;
  const json r = f.post("/v1/chat/completions", req);
  ASSERT_EQ(r["choices"].size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(r["choices"][i]["index"], i);
    EXPECT_EQ(r["choices"][i]["message"]["content"], "same");
    EXPECT_EQ(f.backend.submitted[i].sampling.seed, 100u + i);
  }
  EXPECT_EQ(r["usage"]["completion_tokens"], 3 * (static_cast<int>(ids("same").size()) + 1));
  EXPECT_EQ(r["usage"]["prompt_tokens"], static_cast<int>(f.backend.submitted[0].prompt_ids.size()));
  req["stream"] = true;
  std::set<int> indices;
  for (const std::string& e : f.stream("/v1/chat/completions", req))
    if (e != "[DONE]") indices.insert(json::parse(e)["choices"][0]["index"].get<int>());
  EXPECT_EQ(indices, (std::set<int>{0, 1, 2}));
}

TEST(Service, Completions) {
  Fixture f;
  f.say(" world");
  const json r = f.post("/v1/completions", {{"prompt", "hello"}, {"echo", true}});
  EXPECT_EQ(r["object"], "text_completion");
  EXPECT_EQ(r["id"].get<std::string>().rfind("cmpl-", 0), 0u);
  EXPECT_EQ(r["choices"][0]["text"], "hello world");
  EXPECT_EQ(f.backend.submitted.back().max_tokens, 16);  // the completions default
  const json batch = f.post("/v1/completions", {{"prompt", {"a", "b"}}, {"n", 2}, {"max_tokens", 4}});
  EXPECT_EQ(batch["choices"].size(), 4u);
  EXPECT_EQ(batch["usage"]["prompt_tokens"], static_cast<int>(ids("a").size() + ids("b").size()));
  const json tokens = f.post("/v1/completions", {{"prompt", {1, 2, 3}}});
  EXPECT_EQ(f.backend.submitted.back().prompt_ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(tokens["choices"][0]["text"], " world");
  json stream_req = {{"prompt", "hello"}, {"stream", true}};
  std::string text;
  for (const std::string& e : f.stream("/v1/completions", stream_req))
    if (e != "[DONE]") {
      EXPECT_EQ(json::parse(e)["object"], "text_completion");
      text += json::parse(e)["choices"][0]["text"].get<std::string>();
    }
  EXPECT_EQ(text, " world");
  // Special tokens are dropped from completions text unless asked for.
  f.backend.script = [](const engine::RequestParams&) { return std::vector<int32_t>{ids("a")[0], 8182, 8170}; };
  EXPECT_EQ(f.post("/v1/completions", {{"prompt", "x"}})["choices"][0]["text"], "a");
  EXPECT_EQ(f.post("/v1/completions", {{"prompt", "x"}, {"skip_special_tokens", false}})["choices"][0]["text"],
            "a<think>");
}

TEST(Service, Logprobs) {
  Fixture f;
  f.say("ab");
  json req = chat("x");
  req["logprobs"] = true;
  req["top_logprobs"] = 2;
  const json r = f.post("/v1/chat/completions", req);
  const json& content = r["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), ids("ab").size() + 1);
  EXPECT_TRUE(content[0]["token"].is_string());
  EXPECT_EQ(content[0]["logprob"], -0.5);
  EXPECT_TRUE(content[0]["bytes"].is_array());
  EXPECT_EQ(content[0]["top_logprobs"].size(), 2u);
  EXPECT_EQ(content[0]["top_logprobs"][1]["logprob"], -1.5);
  EXPECT_EQ(f.backend.submitted.back().top_logprobs, 2);
  const json c = f.post("/v1/completions", {{"prompt", "x"}, {"logprobs", 1}});
  const json& lp = c["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"].size(), lp["token_logprobs"].size());
  EXPECT_EQ(lp["text_offset"][0], 0);
  EXPECT_TRUE(lp["top_logprobs"][0].is_object());
}

TEST(Service, Errors) {
  Fixture f;
  f.say("x");
  auto check = [&](const std::string& path, const std::string& body, int status, const std::string& needle) {
    auto r = f.call("POST", path, body);
    EXPECT_EQ(r->response.status, status) << body << " -> " << r->response.body;
    expect_error_shape(r->response.body, status);
    EXPECT_NE(r->response.body.find(needle), std::string::npos) << r->response.body;
  };
  check("/v1/chat/completions", "{", 400, "not valid JSON");
  check("/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}], "model": "gpt-4"})", 404,
        "The model `gpt-4` does not exist.");
  check("/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 1000})", 400,
        "maximum context length is 256 tokens");
  check("/v1/completions", R"({"prompt": [1, 99999]})", 400, "outside the vocabulary");
  check("/v1/completions", json{{"prompt", std::vector<int>(300, 5)}}.dump(), 400, "input tokens");
  check("/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"})", 400,
        "temperature");
  f.backend.queue_full = true;
  auto busy = f.call("POST", "/v1/chat/completions", chat("x").dump());
  EXPECT_EQ(busy->response.status, 429);
  ASSERT_FALSE(busy->response.headers.empty());
  EXPECT_EQ(busy->response.headers[0].first, "Retry-After");
  f.backend.queue_full = false;
  auto form = f.call("POST", "/v1/chat/completions", chat("x").dump(), {{"content-type", "application/x-www-form-urlencoded"}});
  EXPECT_EQ(form->response.status, 200);
  f.service->stop_accepting();
  EXPECT_EQ(f.call("POST", "/v1/chat/completions", chat("x").dump())->response.status, 503);
  EXPECT_EQ(f.call("GET", "/health")->response.status, 200);
}

TEST(Service, BodyLimit) {
  ServiceConfig config;
  config.max_body_bytes = 100;
  Fixture f(config);
  auto r = f.call("POST", "/v1/completions", "{\"prompt\": \"" + std::string(200, 'a') + "\"}");
  EXPECT_EQ(r->response.status, 413);
  expect_error_shape(r->response.body, 413);
}

TEST(Service, AuthAndRateLimit) {
  ServiceConfig config;
  config.api_keys = {"k1", "k2"};
  config.jwt_secret = "0123456789abcdef0123456789abcdef";
  config.rate_limit_rps = 0.001;
  config.rate_limit_burst = 2;
  Fixture f(config);
  f.say("x");
  EXPECT_EQ(f.call("GET", "/health")->response.status, 200);  // health and metrics stay open
  EXPECT_EQ(f.call("GET", "/metrics")->response.status, 200);
  auto denied = f.call("GET", "/v1/models");
  EXPECT_EQ(denied->response.status, 401);
  expect_error_shape(denied->response.body, 401);
  EXPECT_EQ(f.call("GET", "/v1/models", "", {{"authorization", "Bearer k3"}})->response.status, 401);
  EXPECT_EQ(f.call("GET", "/v1/models", "", {{"authorization", "Bearer k2"}})->response.status, 200);
  const std::string jwt = make_hs256_jwt(config.jwt_secret, R"({"sub": "u"})");
  EXPECT_EQ(f.call("GET", "/v1/models", "", {{"authorization", "Bearer " + jwt}})->response.status, 200);
  const std::string body = chat("x").dump();
  const std::map<std::string, std::string> k1 = {{"authorization", "Bearer k1"}};
  EXPECT_EQ(f.call("POST", "/v1/chat/completions", body, k1)->response.status, 200);
  EXPECT_EQ(f.call("POST", "/v1/chat/completions", body, k1)->response.status, 200);
  auto limited = f.call("POST", "/v1/chat/completions", body, k1);
  EXPECT_EQ(limited->response.status, 429);
  expect_error_shape(limited->response.body, 429);
  EXPECT_EQ(limited->response.headers[0].first, "Retry-After");
  // Another key has its own bucket.
  EXPECT_EQ(f.call("POST", "/v1/chat/completions", body, {{"authorization", "Bearer k2"}})->response.status, 200);
}

TEST(Service, DisconnectCancels) {
  Fixture f;
  f.backend.delay = std::chrono::milliseconds(20);
  f.backend.script = [](const engine::RequestParams&) { return std::vector<int32_t>(200, ids("a")[0]); };
  json req = chat("x");
  req["stream"] = true;
  req["max_tokens"] = 200;
  HttpRequest http{"POST", "/v1/chat/completions", {}, req.dump(), "c"};
  auto responder = std::make_shared<RecordingResponder>();
  f.service->handle(http, responder);
  ASSERT_TRUE(responder->wait_writes(3));
  responder->disconnect();
  EXPECT_EQ(f.backend.cancelled_ids().size(), 1u);
  for (int i = 0; i < 200 && f.backend.num_active() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(f.backend.num_active(), 0u);
  const std::string metrics = f.call("GET", "/metrics")->response.body;
  EXPECT_NE(metrics.find("finished_reason=\"abort\"} 1"), std::string::npos) << metrics;
}

TEST(Service, GlmReasoningAndToolCalls) {
  Fixture f({}, glm_parser_factory());
  f.say("<think>need weather</think>Let me check.<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris"
        "</arg_value><arg_key>days</arg_key><arg_value>3</arg_value></tool_call>");
  json req = chat("weather in Paris?");
  req["tools"] = json::parse(R"([{"type": "function", "function": {"name": "get_weather", "parameters":
      {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}])");
  const json r = f.post("/v1/chat/completions", req);
  const json& m = r["choices"][0]["message"];
  EXPECT_EQ(m["reasoning_content"], "need weather");
  EXPECT_EQ(m["content"], "Let me check.");
  ASSERT_EQ(m["tool_calls"].size(), 1u);
  EXPECT_EQ(m["tool_calls"][0]["type"], "function");
  EXPECT_FALSE(m["tool_calls"][0]["id"].get<std::string>().empty());
  EXPECT_EQ(m["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(m["tool_calls"][0]["function"]["arguments"].get<std::string>()),
            (json{{"city", "Paris"}, {"days", 3}}));
  EXPECT_EQ(r["choices"][0]["finish_reason"], "tool_calls");

  req["stream"] = true;
  std::string reasoning, content, name, arguments, finish;
  for (const std::string& e : f.stream("/v1/chat/completions", req)) {
    if (e == "[DONE]") continue;
    const json chunk = json::parse(e);
    const json& choice = chunk["choices"][0];
    const json& d = choice["delta"];
    if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
    if (d.contains("content")) content += d["content"].get<std::string>();
    if (d.contains("tool_calls"))
      for (const json& call : d["tool_calls"]) {
        EXPECT_EQ(call["index"], 0);
        if (call["function"].contains("name")) name += call["function"]["name"].get<std::string>();
        arguments += call["function"]["arguments"].get<std::string>();
      }
    if (!choice["finish_reason"].is_null()) finish = choice["finish_reason"];
  }
  EXPECT_EQ(reasoning, "need weather");
  EXPECT_EQ(content, "Let me check.");
  EXPECT_EQ(name, "get_weather");
  EXPECT_EQ(json::parse(arguments), (json{{"city", "Paris"}, {"days", 3}}));
  EXPECT_EQ(finish, "tool_calls");

  // tool_choice "none": no tool parsing, the markup stays in the content.
  req["stream"] = false;
  req["tool_choice"] = "none";
  const json none = f.post("/v1/chat/completions", req);
  EXPECT_NE(none["choices"][0]["message"]["content"].get<std::string>().find("<tool_call>get_weather"),
            std::string::npos);
  EXPECT_EQ(none["choices"][0]["finish_reason"], "stop");

  // Only whitespace before the calls (a forced call's grammar allows some): no content, as vLLM's
  // GLM parser gives none; text that is not blank stays.
  req["tool_choice"] = "required";
  f.say(" \n\t<tool_call>get_weather<arg_key>city</arg_key><arg_value>Oslo</arg_value></tool_call>");
  const json forced = f.post("/v1/chat/completions", req);
  EXPECT_TRUE(forced["choices"][0]["message"]["content"].is_null()) << forced.dump();
  EXPECT_EQ(forced["choices"][0]["message"]["tool_calls"].size(), 1u);
  f.say(" ok\n<tool_call>get_weather<arg_key>city</arg_key><arg_value>Oslo</arg_value></tool_call>");
  EXPECT_EQ(f.post("/v1/chat/completions", req)["choices"][0]["message"]["content"], " ok\n");
}

TEST(Service, PromptEndingInThinkStartsInReasoning) {
  Fixture f({}, glm_parser_factory());
  f.say("plan it</think>done");
  json req = chat("x");
  req["chat_template_kwargs"] = {{"enable_thinking", true}};  // the test renderer then ends in <think>
  const json r = f.post("/v1/chat/completions", req);
  EXPECT_EQ(r["choices"][0]["message"]["reasoning_content"], "plan it");
  EXPECT_EQ(r["choices"][0]["message"]["content"], "done");
  // Without the open tag everything is content.
  f.say("plain answer");
  const json plain = f.post("/v1/chat/completions", chat("x"));
  EXPECT_EQ(plain["choices"][0]["message"]["content"], "plain answer");
  EXPECT_TRUE(plain["choices"][0]["message"]["reasoning_content"].is_null());
}

// The web UI: the page at / and /dashboard (HTML from the binary), what it shows at the top at
// /dashboard/info, all open without the API key (as /metrics is); --no-web-ui turns them off.
TEST(Service, WebUiPagesAndInfo) {
  ServiceConfig config;
  config.api_keys = {"sk-x"};
  config.banner = {"layout one rank on cpu; KV cache 8 blocks"};
  Fixture f(config);
  for (const char* path : {"/", "/dashboard"}) {
    auto page = f.call("GET", path);
    EXPECT_EQ(page->response.status, 200) << path;
    EXPECT_EQ(page->response.content_type, "text/html; charset=utf-8");
    EXPECT_NE(page->response.body.find("<title>glmserve</title>"), std::string::npos);
    EXPECT_NE(page->response.body.find("v1/chat/completions"), std::string::npos);  // the playground
    EXPECT_EQ(page->response.body.find("http://"), std::string::npos);  // no CDN, no fixed host
  }
  const json info = json::parse(f.call("GET", "/dashboard/info")->response.body);
  EXPECT_EQ(info["model"], "tiny");
  EXPECT_EQ(info["banner"][0], "layout one rank on cpu; KV cache 8 blocks");
  EXPECT_EQ(info["auth"], true);
  EXPECT_EQ(f.call("POST", "/dashboard")->response.status, 405);
  config.web_ui = false;
  Fixture off(config);
  EXPECT_EQ(off.call("GET", "/")->response.status, 404);
  EXPECT_NE(off.call("GET", "/dashboard")->response.body.find("--no-web-ui"), std::string::npos);
}
