// What a client written for vLLM finds on the service: several model ids and GET /v1/models/{id},
// /tokenize and /detokenize with vLLM's shapes, a 404 that names the endpoints served, and the
// server-wide seed of requests that give none.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "service_fixture.h"
#include "server/openai_request.h"
#include "text/chat_template.h"
#include "log/log.h"
#include "server/stats_log.h"

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

using namespace glms;
using glms::test::chat;
using glms::test::expect_error_shape;
using glms::test::Fixture;
using glms::test::ids;
using glms::server::glm_parser_factory;
using glms::test::tokenizer;
using nlohmann::json;

namespace {
server::ServiceConfig with_aliases() {
  server::ServiceConfig c;
  c.model_aliases = {"glm-5", "zai-org/GLM-5"};
  return c;
}
}  // namespace

TEST(VllmCompat, EveryServedNameIsListedAndAccepted) {
  Fixture f(with_aliases());
  f.say("ok");
  const json models = json::parse(f.call("GET", "/v1/models")->response.body);
  ASSERT_EQ(models["data"].size(), 3u);
  EXPECT_EQ(models["data"][0]["id"], "tiny");
  EXPECT_EQ(models["data"][2]["id"], "zai-org/GLM-5");
  const json one = json::parse(f.call("GET", "/v1/models/zai-org/GLM-5")->response.body);
  EXPECT_EQ(one["id"], "zai-org/GLM-5");
  EXPECT_EQ(one["object"], "model");
  EXPECT_EQ(one["max_model_len"], 256);
  auto unknown = f.call("GET", "/v1/models/llama");
  EXPECT_EQ(unknown->response.status, 404);
  expect_error_shape(unknown->response.body, 404);
  json request = chat("hi");
  request["model"] = "glm-5";
  const json r = f.post("/v1/chat/completions", request);
  EXPECT_EQ(r["model"], "tiny");  // responses carry the first name, as vLLM's
  request["model"] = "gpt-4";
  f.post("/v1/chat/completions", request, 404);
}

TEST(VllmCompat, TokenizeAndDetokenize) {
  Fixture f;
  const std::string text = "def add(a, b):\n    return a + b";
  const json t = f.post("/tokenize", {{"prompt", text}, {"add_special_tokens", false}, {"return_token_strs", true}});
  const std::vector<int32_t> expected = tokenizer().encode(text, false);
  EXPECT_EQ(t["tokens"].get<std::vector<int32_t>>(), expected);
  EXPECT_EQ(t["count"], expected.size());
  EXPECT_EQ(t["max_model_len"], 256);
  ASSERT_EQ(t["token_strs"].size(), expected.size());
  std::string joined;
  for (const json& s : t["token_strs"]) joined += s.get<std::string>();
  EXPECT_EQ(joined, text);
  EXPECT_EQ(f.post("/detokenize", {{"tokens", expected}})["prompt"], text);
  // Chat messages go through the template (the fixture's: "[gMASK]<sop><|user|>\n...").
  const json c = f.post("/tokenize", {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"add_generation_prompt", true}});
  EXPECT_EQ(c["tokens"].get<std::vector<int32_t>>(), tokenizer().encode("[gMASK]<sop><|user|>\nhi<|assistant|>\n", false));
  EXPECT_TRUE(c["token_strs"].is_null());
}

TEST(VllmCompat, TokenizerEndpointsRefuseBadInputByName) {
  Fixture f;
  expect_error_shape(f.post("/detokenize", {{"tokens", {1, -2}}}, 400).dump(), 400);
  EXPECT_EQ(f.post("/detokenize", {{"tokens", {1, 99999999}}}, 400)["error"]["param"], "tokens");
  EXPECT_EQ(f.post("/tokenize", {{"prompt", 3}}, 400)["error"]["param"], "prompt");
  f.post("/tokenize", {{"prompt", "a"}, {"messages", json::array()}}, 400);
  f.post("/tokenize", json::object(), 400);
  f.post("/tokenize", {{"prompt", "a"}, {"model", "other"}}, 404);
  EXPECT_EQ(f.call("GET", "/tokenize")->response.status, 405);
  EXPECT_EQ(f.call("POST", "/detokenize", "[1, 2")->response.status, 400);
}

TEST(VllmCompat, AnUnservedEndpointIsNamedWithTheOnesServed) {
  Fixture f;
  auto r = f.call("POST", "/v1/embeddings", "{}");
  EXPECT_EQ(r->response.status, 404);
  const std::string message = json::parse(r->response.body)["error"]["message"];
  EXPECT_NE(message.find("/v1/embeddings"), std::string::npos) << message;
  EXPECT_NE(message.find("/v1/chat/completions"), std::string::npos) << message;
}

TEST(VllmCompat, TheServerSeedFixesTheDrawsOfRequestsWithoutOne) {
  auto seeds_of = [](std::optional<uint64_t> seed) {
    server::ServiceConfig c;
    c.seed = seed;
    Fixture f(c);
    f.say("x");
    for (int i = 0; i < 3; ++i) f.post("/v1/completions", {{"prompt", "a"}, {"max_tokens", 1}, {"temperature", 0.7}});
    std::vector<uint64_t> out;
    for (const auto& p : f.backend.submitted) out.push_back(p.sampling.seed);
    return out;
  };
  const auto a = seeds_of(7), b = seeds_of(7), c = seeds_of(8), d = seeds_of(std::nullopt);
  ASSERT_EQ(a.size(), 3u);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_NE(a[0], a[1]);  // each request its own draw
  EXPECT_NE(a, d);
}

TEST(VllmCompat, ContentPartsReachTheTemplateAsAList) {
  // GLM's template concatenates text parts, as transformers renders them.
  const ChatTemplate tmpl = ChatTemplate::load(GLMS_SOURCE_DIR "/models/glm5-tiny-code");
  const server::ChatRequest r = server::parse_chat_request(
      R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "first"}, "second"]}]})");
  const std::string prompt = tmpl.render(r.messages->dump(), "", true);
  EXPECT_NE(prompt.find("firstsecond"), std::string::npos) << prompt;
}

TEST(VllmCompat, CompletionTopLogprobsListTheLikeliestFirst) {
  Fixture f;
  f.say("def add(a, b):");
  // The body's text, not a parsed object (which would sort its keys): likeliest first.
  auto r = f.call("POST", "/v1/completions", json{{"prompt", "x"}, {"max_tokens", 3}, {"logprobs", 4}}.dump());
  ASSERT_EQ(r->response.status, 200) << r->response.body;
  const auto ordered = nlohmann::ordered_json::parse(r->response.body);
  const auto& tops = ordered["choices"][0]["logprobs"]["top_logprobs"];
  ASSERT_FALSE(tops.empty());
  for (const auto& top : tops) {
    ASSERT_EQ(top.size(), 4u) << top.dump();
    double previous = 1.0;
    for (const auto& [token, logprob] : top.items()) {
      EXPECT_LE(logprob.get<double>(), previous) << top.dump();
      previous = logprob.get<double>();
    }
  }
}

// OpenAI's and vLLM's completions logprobs: up to logprobs + 1 entries a position, the chosen
// token last where it is not among the likeliest; logprobs 0 gives the chosen token alone.
TEST(VllmCompat, CompletionTopLogprobsHoldTheChosenToken) {
  Fixture f;
  f.say("def add(a, b):");
  f.backend.sampled_below_top = true;
  const std::vector<int32_t> said = ids("def add(a, b):");
  auto tops_for = [&](int logprobs) {
    auto r = f.call("POST", "/v1/completions", json{{"prompt", "x"}, {"max_tokens", 2}, {"logprobs", logprobs}}.dump());
    EXPECT_EQ(r->response.status, 200) << r->response.body;
    return nlohmann::ordered_json::parse(r->response.body)["choices"][0]["logprobs"]["top_logprobs"];
  };
  const auto two = tops_for(2);
  ASSERT_EQ(two.size(), 2u);
  for (size_t i = 0; i < two.size(); ++i) {
    ASSERT_EQ(two[i].size(), 3u) << two[i].dump();
    const std::string chosen = tokenizer().decode(std::vector<int32_t>{said[i]});
    EXPECT_EQ(std::prev(two[i].end()).key(), chosen) << two[i].dump();
    EXPECT_EQ(two[i][chosen], -0.5);
    EXPECT_FLOAT_EQ(two[i].begin().value().get<float>(), -0.1f);  // the likeliest first
  }
  const auto zero = tops_for(0);
  ASSERT_EQ(zero.size(), 2u);
  EXPECT_EQ(zero[0].size(), 1u) << zero[0].dump();
  EXPECT_EQ(zero[0].begin().key(), tokenizer().decode(std::vector<int32_t>{said[0]}));
}

// vLLM's model card: `root` is the model as given to serve, `id` the served name.
TEST(VllmCompat, ModelCardRootIsTheModelPath) {
  server::ServiceConfig config;
  config.model_path = "models/glm5-tiny-code";
  Fixture f(config);
  const json card = json::parse(f.call("GET", "/v1/models")->response.body)["data"][0];
  EXPECT_EQ(card["id"], "tiny");
  EXPECT_EQ(card["root"], "models/glm5-tiny-code");
}

// vLLM's chat echo: the final assistant message's text starts each choice's content; nothing
// when the final message is the user's.
TEST(VllmCompat, ChatEchoPrependsTheFinalAssistantMessage) {
  Fixture f;
  f.say("b):");
  json req = chat("write f");
  req["messages"].push_back({{"role", "assistant"}, {"content", json::array({"def f(", {{"type", "text"}, {"text", "a,"}}})}});
  req["continue_final_message"] = true;
  req["add_generation_prompt"] = false;
  req["echo"] = true;
  req["n"] = 2;
  const json r = f.post("/v1/chat/completions", req);
  for (const json& choice : r["choices"]) EXPECT_EQ(choice["message"]["content"], "def f(\na,b):");
  req["stream"] = true;
  std::string content;
  for (const std::string& e : f.stream("/v1/chat/completions", req))
    if (e != "[DONE]") {
      const json chunk = json::parse(e);
      const json& choice = chunk["choices"][0];
      if (choice["index"] == 0 && choice["delta"].contains("content")) content += choice["delta"]["content"].get<std::string>();
    }
  EXPECT_EQ(content, "def f(\na,b):");
  json plain = chat("write f");
  plain["echo"] = true;
  EXPECT_EQ(f.post("/v1/chat/completions", plain)["choices"][0]["message"]["content"], "b):");
}

// vLLM's truncate_prompt_tokens keeps the prompt's last k tokens (chat: of the rendered prompt);
// -1 means the model's length, 0 or more than the model's length is a 400.
TEST(VllmCompat, TruncatePromptTokensKeepsTheLastOnes) {
  Fixture f;
  f.say("ok");
  const std::string prompt = "def add(a, b):\n    return a + b";
  const std::vector<int32_t> all = ids(prompt);
  ASSERT_GT(all.size(), 3u);
  json req = {{"prompt", prompt}, {"max_tokens", 2}, {"truncate_prompt_tokens", 3}};
  const json r = f.post("/v1/completions", req);
  EXPECT_EQ(f.backend.submitted.back().prompt_ids, std::vector<int32_t>(all.end() - 3, all.end()));
  EXPECT_EQ(r["usage"]["prompt_tokens"], 3);
  req["truncate_prompt_tokens"] = -1;  // the model's length (256): nothing to cut
  f.post("/v1/completions", req);
  EXPECT_EQ(f.backend.submitted.back().prompt_ids, all);
  json c = chat("a question that renders to more than four tokens");
  c["truncate_prompt_tokens"] = 4;
  f.post("/v1/chat/completions", c);
  EXPECT_EQ(f.backend.submitted.back().prompt_ids.size(), 4u);
  for (int bad : {0, 257}) {
    req["truncate_prompt_tokens"] = bad;
    auto e = f.call("POST", "/v1/completions", req.dump());
    EXPECT_EQ(e->response.status, 400) << bad;
    EXPECT_NE(e->response.body.find("truncate_prompt_tokens"), std::string::npos) << e->response.body;
  }
}

// return_tokens_as_token_ids names every logprobs token "token_id:N"; use_beam_search is refused.
TEST(VllmCompat, TokensAsIdsAndNoBeamSearch) {
  Fixture f;
  f.say("def add");
  const std::vector<int32_t> said = ids("def add");
  json req = {{"prompt", "x"}, {"max_tokens", 1}, {"logprobs", 1}, {"return_tokens_as_token_ids", true}};
  const json lp = f.post("/v1/completions", req)["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"][0], "token_id:" + std::to_string(said[0]));
  EXPECT_TRUE(lp["top_logprobs"][0].contains("token_id:" + std::to_string(said[0]))) << lp.dump();
  json c = chat("x");
  c["max_tokens"] = 1;
  c["logprobs"] = true;
  c["top_logprobs"] = 1;
  c["return_tokens_as_token_ids"] = true;
  const json entry = f.post("/v1/chat/completions", c)["choices"][0]["logprobs"]["content"][0];
  EXPECT_EQ(entry["token"], "token_id:" + std::to_string(said[0]));
  EXPECT_EQ(entry["top_logprobs"][0]["token"], "token_id:" + std::to_string(said[0]));
  req["use_beam_search"] = true;
  auto e = f.call("POST", "/v1/completions", req.dump());
  EXPECT_EQ(e->response.status, 400);
  EXPECT_NE(e->response.body.find("use_beam_search"), std::string::npos) << e->response.body;
  req["use_beam_search"] = false;
  EXPECT_EQ(f.call("POST", "/v1/completions", req.dump())->response.status, 200);
}

// vLLM's return_token_ids: chat answers carry prompt_token_ids and each choice its token_ids
// (the EOS included); completions choices both; streams the prompt's in the first chunk and
// each chunk's new ids.
TEST(VllmCompat, ReturnTokenIds) {
  Fixture f;
  f.say("def add");
  std::vector<int32_t> said = ids("def add");
  said.push_back(8170);  // the script's EOS
  json c = chat("x");
  c["return_token_ids"] = true;
  const json r = f.post("/v1/chat/completions", c);
  EXPECT_EQ(r["prompt_token_ids"].get<std::vector<int32_t>>(), f.backend.submitted.back().prompt_ids);
  EXPECT_EQ(r["choices"][0]["token_ids"].get<std::vector<int32_t>>(), said);
  EXPECT_FALSE(f.post("/v1/chat/completions", chat("x"))["choices"][0].contains("token_ids"));

  const json cr = f.post("/v1/completions", {{"prompt", "x"}, {"return_token_ids", true}});
  EXPECT_EQ(cr["choices"][0]["prompt_token_ids"].get<std::vector<int32_t>>(), ids("x"));
  EXPECT_EQ(cr["choices"][0]["token_ids"].get<std::vector<int32_t>>(), said);

  for (const char* path : {"/v1/chat/completions", "/v1/completions"}) {
    json req = std::string(path) == "/v1/completions" ? json{{"prompt", "x"}} : chat("x");
    req["return_token_ids"] = true;
    req["stream"] = true;
    std::vector<int32_t> streamed, prompt;
    for (const std::string& e : f.stream(path, req)) {
      if (e == "[DONE]") continue;
      const json chunk = json::parse(e);
      if (chunk.contains("prompt_token_ids")) prompt = chunk["prompt_token_ids"].get<std::vector<int32_t>>();
      if (chunk["choices"].empty()) continue;
      const json& choice = chunk["choices"][0];
      if (choice.contains("prompt_token_ids")) prompt = choice["prompt_token_ids"].get<std::vector<int32_t>>();
      if (choice.contains("token_ids"))
        for (const json& id : choice["token_ids"]) streamed.push_back(id.get<int32_t>());
    }
    EXPECT_EQ(streamed, said) << path;
    EXPECT_EQ(prompt, f.backend.submitted.back().prompt_ids) << path;
  }
}

// vLLM's `reasoning` beside `reasoning_content`; include_reasoning: false drops it.
TEST(VllmCompat, ReasoningFieldsAndIncludeReasoning) {
  Fixture f({}, glm_parser_factory());
  f.say("<think>plan</think>done");
  json req = chat("x");
  const json m = f.post("/v1/chat/completions", req)["choices"][0]["message"];
  EXPECT_EQ(m["reasoning"], "plan");
  EXPECT_EQ(m["reasoning_content"], "plan");
  EXPECT_EQ(m["content"], "done");
  req["include_reasoning"] = false;
  const json without = f.post("/v1/chat/completions", req)["choices"][0]["message"];
  EXPECT_TRUE(without["reasoning"].is_null());
  EXPECT_TRUE(without["reasoning_content"].is_null());
  EXPECT_EQ(without["content"], "done");
  req["stream"] = true;
  for (const std::string& e : f.stream("/v1/chat/completions", req)) {
    if (e == "[DONE]") continue;
    EXPECT_EQ(e.find("plan"), std::string::npos) << e;
  }
}

TEST(VllmCompat, TheEngineStatsLineReadsLikeVllms) {
  server::BackendStats before, now;
  before.prompt_tokens_total = 100;
  now.prompt_tokens_total = 1100;
  now.generation_tokens_total = 250;
  now.num_running = 3;
  now.num_waiting = 1;
  now.kv_cache_usage = 0.125;
  before.prefix_cache_queries = 1000;
  now.prefix_cache_queries = 2000;
  now.prefix_cache_hits = 600;
  now.spec_drafts = 10;
  now.spec_accepted_tokens = 13;
  EXPECT_EQ(server::engine_stats_line(before, now, 10.0),
            "Avg prompt throughput: 100.0 tokens/s, Avg generation throughput: 25.0 tokens/s, Running: 3 reqs, "
            "Waiting: 1 reqs, KV cache usage: 12.5%, Prefix cache hit rate: 60.0%, Spec acceptance length: 2.30");
}

TEST(VllmCompat, EachRequestGetsAnAccessLine) {
  std::ostringstream out;
  log::configure(log::Level::kInfo, log::Format::kText, &out);
  server::ServiceConfig config;
  config.log_requests = true;
  {
    Fixture f(config);
    f.say("ok");
    f.post("/v1/completions", {{"prompt", "a"}, {"max_tokens", 5}});
    f.post("/v1/completions", {{"prompt", 3}}, 400);
    f.call("GET", "/health");  // probes are not logged
  }
  log::configure(log::Level::kInfo, log::Format::kText);
  const std::string text = out.str();
  EXPECT_TRUE(std::regex_search(text, std::regex(R"(127\.0\.0\.1 POST /v1/completions 200 \d+\.\d{3} s prompt 1 cached 0 completion \d+ finish stop id cmpl-[0-9a-f]{32})")))
      << text;
  EXPECT_NE(text.find("127.0.0.1 POST /v1/completions 400: prompt"), std::string::npos) << text;
  EXPECT_EQ(text.find("/health"), std::string::npos) << text;
}

// --enable-force-include-usage: a stream ends with its usage chunk though the request did not ask.
TEST(VllmCompat, ForcedUsageEndsEveryStream) {
  auto last_usage = [](bool forced) {
    server::ServiceConfig c;
    c.force_include_usage = forced;
    Fixture f(c);
    f.say("Hello there");
    json body = chat("hi");
    body["stream"] = true;
    const std::vector<std::string> events = f.stream("/v1/chat/completions", body);
    EXPECT_EQ(events.back(), "[DONE]");
    return json::parse(events[events.size() - 2]).value("usage", json());
  };
  EXPECT_TRUE(last_usage(false).is_null());
  const json usage = last_usage(true);
  ASSERT_TRUE(usage.is_object());
  EXPECT_EQ(usage["completion_tokens"], static_cast<int>(glms::test::ids("Hello there").size()) + 1);
}

// --exclude-tools-when-tool-choice-none: the template gets no tools when the request says none.
TEST(VllmCompat, ToolsCanBeLeftOutOfThePromptWithToolChoiceNone) {
  auto rendered_tools = [](bool exclude, const std::string& tool_choice) {
    server::ServiceConfig c;
    c.served_model_name = "tiny";
    c.exclude_tools_when_none = exclude;
    glms::test::FakeBackend backend;
    backend.script = [](const engine::RequestParams&) { return std::vector<int32_t>{8170}; };
    bool saw_tools = false;
    server::ApiService service(
        backend, tokenizer(),
        [&](const server::ChatRequest& r) {
          saw_tools = r.tools && !r.tools->is_null();
          return glms::test::render(r);
        },
        nullptr, c);
    json body = chat("hi");
    body["tools"] = json::array({{{"type", "function"}, {"function", {{"name", "ls"}, {"parameters", json::object()}}}}});
    body["tool_choice"] = tool_choice;
    server::HttpRequest request;
    request.method = "POST";
    request.target = "/v1/chat/completions";
    request.body = body.dump();
    auto responder = std::make_shared<glms::test::RecordingResponder>();
    service.handle(request, responder);
    EXPECT_TRUE(responder->wait());
    EXPECT_EQ(responder->response.status, 200) << responder->response.body;
    return saw_tools;
  };
  EXPECT_TRUE(rendered_tools(false, "none"));  // vLLM's default: the template still shows them
  EXPECT_FALSE(rendered_tools(true, "none"));
  EXPECT_TRUE(rendered_tools(true, "auto"));
}

// SGLang's /health_generate runs one greedy token through the engine: 200 with an empty body, or
// the engine's refusal; it needs no key, as /health does, and writes no access line.
TEST(VllmCompat, HealthGenerateRunsOneTokenThroughTheEngine) {
  server::ServiceConfig c;
  c.api_keys = {"sk-1"};
  Fixture f(c);
  f.say("x");
  const auto ok = f.call("GET", "/health_generate");
  EXPECT_EQ(ok->response.status, 200);
  EXPECT_EQ(ok->response.body, "");
  ASSERT_EQ(f.backend.submitted.size(), 1u);
  EXPECT_EQ(f.backend.submitted[0].max_tokens, 1);
  EXPECT_EQ(f.backend.submitted[0].sampling.temperature, 0.0f);
  f.backend.queue_full = true;
  const auto full = f.call("GET", "/health_generate");
  EXPECT_EQ(full->response.status, 429) << full->response.body;  // the queue is full: the probe fails
  f.service->stop_accepting();
  EXPECT_EQ(f.call("GET", "/health_generate")->response.status, 503);
}

// vLLM's /invocations takes either request by its body; SGLang's /get_model_info names the model.
TEST(VllmCompat, InvocationsAndModelInfo) {
  server::ServiceConfig c;
  c.model_path = "zai-org/GLM-5.2";
  Fixture f(c);
  f.say("Hello there");
  const json chat_answer = f.post("/invocations", chat("hi"));
  EXPECT_EQ(chat_answer["object"], "chat.completion");
  const json completion = f.post("/invocations", {{"prompt", "hi"}, {"max_tokens", 4}});
  EXPECT_EQ(completion["object"], "text_completion");
  const json refused = f.post("/invocations", {{"input", "hi"}}, 400);
  EXPECT_NE(refused["error"]["message"].get<std::string>().find("messages"), std::string::npos);
  const json info = json::parse(f.call("GET", "/get_model_info")->response.body);
  EXPECT_EQ(info["model_path"], "zai-org/GLM-5.2");
  EXPECT_EQ(info["is_generation"], true);
}

// vLLM's cache_salt reaches the engine's request (which parts the prefix cache by it); an empty or
// non-string salt, and a priority under first-come-first-served scheduling, are refused by name.
TEST(VllmCompat, CacheSaltReachesTheEngineAndPriorityIsRefused) {
  Fixture f;
  f.say("ok");
  json body = chat("hi");
  body["cache_salt"] = "tenant-a";
  f.post("/v1/chat/completions", body);
  f.post("/v1/completions", {{"prompt", "hi"}, {"max_tokens", 2}, {"cache_salt", "tenant-b"}});
  ASSERT_EQ(f.backend.submitted.size(), 2u);
  EXPECT_EQ(f.backend.submitted[0].cache_salt, "tenant-a");
  EXPECT_EQ(f.backend.submitted[1].cache_salt, "tenant-b");
  for (const json& salt : {json(""), json(7)}) {
    body["cache_salt"] = salt;
    EXPECT_EQ(f.post("/v1/chat/completions", body, 400)["error"]["param"], "cache_salt");
  }
  body.erase("cache_salt");
  body["priority"] = 0;
  f.post("/v1/chat/completions", body);
  body["priority"] = -5;
  EXPECT_EQ(f.post("/v1/chat/completions", body, 400)["error"]["param"], "priority");
}

// vLLM's /load: the requests the engine holds, running or waiting, with no key needed.
TEST(VllmCompat, LoadCountsTheRequestsTheEngineHolds) {
  server::ServiceConfig c;
  c.api_keys = {"sk-1"};
  Fixture f(c);
  EXPECT_EQ(json::parse(f.call("GET", "/load")->response.body), (json{{"server_load", 0}}));
  f.backend.delay = std::chrono::milliseconds(200);
  f.say("a long answer with several tokens");
  auto slow = std::make_shared<glms::test::RecordingResponder>();
  server::HttpRequest request;
  request.method = "POST";
  request.target = "/v1/completions";
  request.body = json{{"prompt", "hi"}, {"max_tokens", 8}}.dump();
  request.headers = {{"authorization", "Bearer sk-1"}};
  f.service->handle(request, slow);
  EXPECT_EQ(json::parse(f.call("GET", "/load")->response.body)["server_load"], 1);
  EXPECT_TRUE(slow->wait());
}

// vLLM's allowed_token_ids and bad_words reach the engine: the ids as given (within the
// vocabulary), each bad word as its tokens at the text's start and, where a space makes another
// first token of the same count, after a space; malformed ones are 400s naming the field.
TEST(VllmCompat, AllowedTokenIdsAndBadWordsReachTheEngine) {
  Fixture f;
  f.say("ok");
  json body = chat("hi");
  body["allowed_token_ids"] = {5, 9, 11};
  body["bad_words"] = {"\u3000 hello", "world wide"};  // leading whitespace, Unicode's too, is dropped
  f.post("/v1/chat/completions", body);
  f.post("/v1/completions", {{"prompt", "hi"}, {"max_tokens", 2}, {"bad_words", {"return"}}});
  ASSERT_EQ(f.backend.submitted.size(), 2u);
  const engine::RequestParams& p = f.backend.submitted[0];
  EXPECT_EQ(p.allowed_token_ids, (std::vector<int32_t>{5, 9, 11}));
  // The tiny tokenizer: "hello" [280 75 310], " hello" [1453 75 310] (another first token, as many
  // tokens: kept too); "world wide" [86 4237 323 643], " world wide" [7397 323 643] (fewer: not).
  EXPECT_EQ(p.bad_word_ids, (std::vector<std::vector<int32_t>>{{1453, 75, 310}, {280, 75, 310}, {86, 4237, 323, 643}}));
  EXPECT_TRUE(f.backend.submitted[1].allowed_token_ids.empty());
  EXPECT_FALSE(f.backend.submitted[1].bad_word_ids.empty());

  const int vocab = tokenizer().vocab_size();
  for (const auto& [name, value] : std::vector<std::pair<std::string, json>>{
           {"allowed_token_ids", json::array()},
           {"allowed_token_ids", {1, -2}},
           {"allowed_token_ids", {vocab + 10}},
           {"allowed_token_ids", "5"},
           {"bad_words", "hello"},
           {"bad_words", {"  "}},
           {"bad_words", {3}}}) {
    json bad = chat("hi");
    bad[name] = value;
    EXPECT_EQ(f.post("/v1/chat/completions", bad, 400)["error"]["param"], name) << value.dump();
  }
  EXPECT_EQ(f.backend.submitted.size(), 2u) << "no refused request reached the engine";
}

// serve --return-tokens-as-token-ids: the default of requests that do not say; one that says
// false keeps the tokens' text.
TEST(VllmCompat, TokensAsIdsByDefaultUnlessARequestSaysOtherwise) {
  server::ServiceConfig c;
  c.tokens_as_ids = true;
  Fixture f(c);
  f.say("def add");
  const std::string first = "token_id:" + std::to_string(ids("def add")[0]);
  json req = {{"prompt", "x"}, {"max_tokens", 1}, {"logprobs", 0}};
  EXPECT_EQ(f.post("/v1/completions", req)["choices"][0]["logprobs"]["tokens"][0], first);
  req["return_tokens_as_token_ids"] = false;
  EXPECT_NE(f.post("/v1/completions", req)["choices"][0]["logprobs"]["tokens"][0], first);
  json c2 = chat("x");
  c2["max_tokens"] = 1;
  c2["logprobs"] = true;
  EXPECT_EQ(f.post("/v1/chat/completions", c2)["choices"][0]["logprobs"]["content"][0]["token"], first);
}

// vLLM's request_id names the answer (chatcmpl-ID, cmpl-ID, streamed chunks too); an X-Request-Id
// header takes its place; ids that cannot go into a header are 400s; a Response keeps its own.
TEST(VllmCompat, RequestIdNamesTheAnswer) {
  Fixture f;
  f.say("ok");
  json body = chat("hi");
  body["request_id"] = "trace-42";
  EXPECT_EQ(f.post("/v1/chat/completions", body)["id"], "chatcmpl-trace-42");
  body["request_id"] = "id with spaces";  // vLLM takes any string; glmserve refuses control characters only
  EXPECT_EQ(f.post("/v1/chat/completions", body)["id"], "chatcmpl-id with spaces");
  body["request_id"] = "trace-42";
  EXPECT_EQ(f.post("/v1/completions", {{"prompt", "hi"}, {"max_tokens", 2}, {"request_id", "abc"}})["id"], "cmpl-abc");
  auto headed = f.call("POST", "/v1/chat/completions", body.dump(), {{"x-request-id", "from-header"}});
  EXPECT_EQ(json::parse(headed->response.body)["id"], "chatcmpl-from-header");
  body["stream"] = true;
  for (const std::string& e : f.stream("/v1/chat/completions", body)) {
    if (e == "[DONE]") continue;
    EXPECT_EQ(json::parse(e)["id"], "chatcmpl-trace-42");
  }
  body["stream"] = false;
  for (const json& bad : {json(""), json("new\nline"), json(std::string(300, 'x')), json(5)}) {
    body["request_id"] = bad;
    EXPECT_EQ(f.post("/v1/chat/completions", body, 400)["error"]["param"], "request_id") << bad.dump();
  }
  body.erase("request_id");
  auto bad_header = f.call("POST", "/v1/chat/completions", body.dump(), {{"x-request-id", "a\tb"}});
  EXPECT_EQ(bad_header->response.status, 400);
  EXPECT_EQ(json::parse(bad_header->response.body)["error"]["param"], "X-Request-Id");
  const json response = f.post("/v1/responses", {{"model", "tiny"}, {"input", "hi"}, {"request_id", "r1"}});
  EXPECT_EQ(response["id"].get<std::string>().rfind("resp_", 0), 0u);
  EXPECT_EQ(response["id"].get<std::string>().find("r1"), std::string::npos) << response["id"];
}

// serve --enable-request-id-headers: every answer, whole, streamed or an error, carries
// X-Request-Id: the client's, or a fresh one for each request.
TEST(VllmCompat, RequestIdHeadersOnEveryAnswer) {
  auto header = [](const server::HttpResponse& r) {
    std::string value;
    for (const auto& [name, v] : r.headers)
      if (name == "X-Request-Id") value = v;
    return value;
  };
  Fixture plain;
  plain.say("ok");
  EXPECT_EQ(header(plain.call("GET", "/v1/models")->response), "") << "off unless asked";
  server::ServiceConfig c;
  c.request_id_headers = true;
  Fixture f(c);
  f.say("ok");
  EXPECT_EQ(header(f.call("GET", "/v1/models", "", {{"x-request-id", "mine"}})->response), "mine");
  const std::string first = header(f.call("GET", "/v1/models")->response);
  EXPECT_EQ(first.size(), 32u);
  EXPECT_NE(header(f.call("GET", "/v1/models")->response), first);
  json body = chat("hi");
  body["stream"] = true;
  auto streamed = f.call("POST", "/v1/chat/completions", body.dump(), {{"x-request-id", "s1"}});
  EXPECT_TRUE(streamed->streaming);
  EXPECT_EQ(header(streamed->response), "s1");
  EXPECT_EQ(header(f.call("POST", "/v1/chat/completions", "{", {{"x-request-id", "e1"}})->response), "e1");
  // A fresh header id names the answer too.
  auto fresh = f.call("POST", "/v1/chat/completions", chat("hi").dump());
  ASSERT_EQ(fresh->response.status, 200) << fresh->response.body;
  EXPECT_EQ(json::parse(fresh->response.body)["id"], "chatcmpl-" + header(fresh->response));
  EXPECT_EQ(header(fresh->response).size(), 32u);
}

// vLLM's add_special_tokens: a completions text prompt gets the tokenizer's post-processor tokens
// by default (as vLLM and transformers encode it), a chat prompt only when asked (its template
// writes its own); token-id prompts are read as given. Fields glmserve does not read are logged.
TEST(VllmCompat, AddSpecialTokensAndIgnoredFieldsAsVllm) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "glms-special-tokens";
  std::filesystem::create_directories(dir);
  json tokenizer_json = json::parse(std::ifstream(GLMS_SOURCE_DIR "/models/glm5-tiny-code/tokenizer.json"));
  const int32_t gmask = tokenizer().token_to_id("[gMASK]"), sop = tokenizer().token_to_id("<sop>");
  ASSERT_GE(gmask, 0);
  ASSERT_GE(sop, 0);
  auto special = [](const char* name) { return json{{"SpecialToken", {{"id", name}, {"type_id", 0}}}}; };
  tokenizer_json["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single", {special("[gMASK]"), special("<sop>"), {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
      {"pair", json::array()},
      {"special_tokens", {{"[gMASK]", {{"id", "[gMASK]"}, {"ids", {gmask}}, {"tokens", {"[gMASK]"}}}},
                          {"<sop>", {{"id", "<sop>"}, {"ids", {sop}}, {"tokens", {"<sop>"}}}}}}};
  std::ofstream(dir / "tokenizer.json") << tokenizer_json.dump();

  std::ostringstream log_lines;
  log::configure(log::Level::kInfo, log::Format::kText, &log_lines);
  test::FakeBackend backend;
  backend.script = [](const engine::RequestParams&) { return std::vector<int32_t>{8170}; };
  server::ServiceConfig config;
  config.served_model_name = "tiny";
  server::ApiService service(backend, text::Tokenizer::load(dir), test::render, nullptr, config);
  auto post = [&](const std::string& path, const json& body) {
    server::HttpRequest request{"POST", path, {}, body.dump(), "127.0.0.1"};
    auto responder = std::make_shared<test::RecordingResponder>();
    service.handle(request, responder);
    EXPECT_TRUE(responder->wait());
    EXPECT_EQ(responder->response.status, 200) << responder->response.body;
    return backend.submitted.back().prompt_ids;
  };
  const std::vector<int32_t> text = ids("hello");
  std::vector<int32_t> with = {gmask, sop};
  with.insert(with.end(), text.begin(), text.end());
  EXPECT_EQ(post("/v1/completions", {{"prompt", "hello"}, {"max_tokens", 1}}), with);
  EXPECT_EQ(post("/v1/completions", {{"prompt", "hello"}, {"max_tokens", 1}, {"add_special_tokens", false}}), text);
  EXPECT_EQ(post("/v1/completions", {{"prompt", text}, {"max_tokens", 1}}), text);
  json c = chat("hello");
  c["frobnicate"] = true;
  const std::vector<int32_t> rendered = post("/v1/chat/completions", c);
  EXPECT_EQ(rendered, ids(test::render(server::parse_chat_request(chat("hello").dump()))));
  c["add_special_tokens"] = true;
  std::vector<int32_t> doubled = {gmask, sop};
  doubled.insert(doubled.end(), rendered.begin(), rendered.end());
  EXPECT_EQ(post("/v1/chat/completions", c), doubled);
  log::configure(log::Level::kInfo, log::Format::kText);
  EXPECT_NE(log_lines.str().find("/v1/chat/completions: the request's fields frobnicate are not read by glmserve"),
            std::string::npos)
      << log_lines.str();
  std::filesystem::remove_all(dir);
}

// vLLM's POST /reset_prefix_cache and SGLang's /flush_cache (GET too): the blocks freed, behind
// the API key; a 409 while a request is in flight; other methods are 405s.
TEST(VllmCompat, ResetPrefixCacheWhenIdle) {
  server::ServiceConfig c;
  c.api_keys = {"sk-1"};
  Fixture f(c);
  const std::map<std::string, std::string> key = {{"authorization", "Bearer sk-1"}};
  EXPECT_EQ(f.call("POST", "/reset_prefix_cache")->response.status, 401);
  f.backend.cached_blocks = 12;
  auto reset = f.call("POST", "/reset_prefix_cache", "", key);
  EXPECT_EQ(reset->response.status, 200);
  EXPECT_EQ(json::parse(reset->response.body), (json{{"freed_blocks", 12}}));
  EXPECT_EQ(json::parse(f.call("GET", "/flush_cache", "", key)->response.body), (json{{"freed_blocks", 0}}));
  EXPECT_EQ(f.call("GET", "/reset_prefix_cache", "", key)->response.status, 405);

  f.backend.delay = std::chrono::milliseconds(200);
  f.say("a long answer with several tokens");
  auto slow = std::make_shared<glms::test::RecordingResponder>();
  server::HttpRequest request{"POST", "/v1/completions", key, json{{"prompt", "hi"}, {"max_tokens", 8}}.dump(), "c"};
  f.service->handle(request, slow);
  auto busy = f.call("POST", "/flush_cache", "", key);
  EXPECT_EQ(busy->response.status, 409);
  expect_error_shape(busy->response.body, 409);
  EXPECT_NE(busy->response.body.find("1 running"), std::string::npos) << busy->response.body;
  EXPECT_TRUE(slow->wait());
}

// serve --default-chat-template-kwargs: the template gets them under each request's own
// chat_template_kwargs, whose keys win.
TEST(VllmCompat, DefaultChatTemplateKwargsUnderTheRequests) {
  server::ServiceConfig c;
  c.default_template_kwargs = R"({"enable_thinking": false, "style": "terse"})";
  std::vector<json> seen;
  test::FakeBackend backend;
  backend.script = [](const engine::RequestParams&) { return std::vector<int32_t>{8170}; };
  auto render = [&](const server::ChatRequest& r) {
    seen.push_back(*r.template_kwargs);
    return test::render(r);
  };
  server::ApiService service(backend, tokenizer(), render, nullptr, c);
  auto post = [&](const json& body) {
    auto responder = std::make_shared<test::RecordingResponder>();
    service.handle(server::HttpRequest{"POST", "/v1/chat/completions", {}, body.dump(), "c"}, responder);
    EXPECT_TRUE(responder->wait());
    EXPECT_EQ(responder->response.status, 200) << responder->response.body;
  };
  post(chat("hi"));
  json own = chat("hi");
  own["chat_template_kwargs"] = {{"enable_thinking", true}};
  post(own);
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0], (json{{"enable_thinking", false}, {"style", "terse"}}));
  EXPECT_EQ(seen[1], (json{{"enable_thinking", true}, {"style", "terse"}}));
}
