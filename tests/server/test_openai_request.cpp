// Schema tests: every accepted field and every rejected input of the request parser.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "server/api_error.h"
#include "server/openai_request.h"

using namespace glms::server;
using nlohmann::json;

namespace {

// Runs `f` and returns the ApiError it throws (fails the test when nothing is thrown).
template <typename F>
ApiError error_of(F&& f) {
  try {
    f();
  } catch (const ApiException& e) {
    return e.error;
  }
  ADD_FAILURE() << "expected an ApiException";
  return {};
}

json chat_base() { return {{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}}; }

ApiError chat_error(json doc) { return error_of([&] { parse_chat_request(doc.dump()); }); }
ApiError completion_error(json doc) { return error_of([&] { parse_completion_request(doc.dump()); }); }

}  // namespace

TEST(ChatRequest, MinimalDefaults) {
  const ChatRequest r = parse_chat_request(chat_base().dump());
  EXPECT_EQ(r.sampling.n, 1);
  EXPECT_FALSE(r.sampling.max_tokens);
  EXPECT_FALSE(r.sampling.temperature);
  EXPECT_FALSE(r.sampling.stream);
  EXPECT_TRUE(r.sampling.skip_special_tokens);
  EXPECT_EQ(r.sampling.logprobs, -1);
  EXPECT_EQ(r.tool_choice, "none");
  EXPECT_TRUE(r.add_generation_prompt);
  ASSERT_EQ(r.messages->size(), 1u);
  EXPECT_EQ((*r.messages)[0]["content"], "hi");
}

TEST(ChatRequest, EveryField) {
  json doc = chat_base();
  doc.update({{"model", "m"}, {"max_completion_tokens", 7}, {"temperature", 0.5}, {"top_p", 0.9}, {"top_k", 5},
              {"min_p", 0.1}, {"seed", -3}, {"stop", {"a", "bb"}}, {"stop_token_ids", {1, 2}}, {"n", 3},
              {"presence_penalty", 0.5}, {"frequency_penalty", -0.5}, {"repetition_penalty", 1.1},
              {"ignore_eos", true}, {"stream", true}, {"stream_options", {{"include_usage", true}}},
              {"logprobs", true}, {"top_logprobs", 4}, {"skip_special_tokens", false},
              {"chat_template_kwargs", {{"enable_thinking", false}}}, {"user", "u"}, {"unknown_field", {1, 2}},
              {"tools", json::array({{{"type", "function"},
                                      {"function", {{"name", "f"}, {"parameters", json::object()}}}}})},
              {"tool_choice", "auto"}});
  const ChatRequest r = parse_chat_request(doc.dump());
  EXPECT_EQ(r.sampling.model, "m");
  EXPECT_EQ(*r.sampling.max_tokens, 7);
  EXPECT_FLOAT_EQ(*r.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(*r.sampling.top_p, 0.9f);
  EXPECT_EQ(*r.sampling.top_k, 5);
  EXPECT_FLOAT_EQ(*r.sampling.min_p, 0.1f);
  EXPECT_EQ(*r.sampling.seed, static_cast<uint64_t>(-3));
  EXPECT_EQ(r.sampling.stop, (std::vector<std::string>{"a", "bb"}));
  EXPECT_EQ(r.sampling.stop_token_ids, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(r.sampling.n, 3);
  EXPECT_FLOAT_EQ(r.sampling.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(r.sampling.frequency_penalty, -0.5f);
  EXPECT_FLOAT_EQ(r.sampling.repetition_penalty, 1.1f);
  EXPECT_TRUE(r.sampling.ignore_eos);
  EXPECT_TRUE(r.sampling.stream);
  EXPECT_TRUE(r.sampling.include_usage);
  EXPECT_EQ(r.sampling.logprobs, 4);
  EXPECT_FALSE(r.sampling.skip_special_tokens);
  EXPECT_EQ((*r.template_kwargs)["enable_thinking"], false);
  EXPECT_EQ(r.tool_choice, "auto");
  EXPECT_EQ(r.tools->size(), 1u);
}

TEST(ChatRequest, MessagesAreNormalised) {
  json doc = {{"messages",
               {{{"role", "developer"}, {"content", "sys"}},
                {{"role", "user"}, {"content", {{{"type", "text"}, {"text", "a"}}, {{"type", "text"}, {"text", "b"}}}}},
                {{"role", "assistant"},
                 {"content", nullptr},
                 {"reasoning_content", "think"},
                 {"tool_calls", {{{"id", "c1"}, {"type", "function"},
                                  {"function", {{"name", "f"}, {"arguments", "{\"x\": 1}"}}}}}}},
                {{"role", "tool"}, {"tool_call_id", "c1"}, {"content", "42"}}}}};
  const ChatRequest r = parse_chat_request(doc.dump());
  const json& m = *r.messages;
  EXPECT_EQ(m[0]["role"], "system");
  // Text parts reach the template as a list (Hugging Face's form), not joined.
  EXPECT_EQ(m[1]["content"], json::parse(R"([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}])"));
  EXPECT_TRUE(m[2]["content"].is_null());
  EXPECT_EQ(m[2]["reasoning_content"], "think");
  EXPECT_EQ(m[2]["tool_calls"][0]["function"]["arguments"]["x"], 1);
  EXPECT_EQ(m[3]["tool_call_id"], "c1");
}

TEST(ChatRequest, MaxTokensAliases) {
  json doc = chat_base();
  doc["max_tokens"] = 5;
  EXPECT_EQ(*parse_chat_request(doc.dump()).sampling.max_tokens, 5);
  doc["max_tokens"] = 5.0;  // integral floats are integers (as pydantic accepts them)
  EXPECT_EQ(*parse_chat_request(doc.dump()).sampling.max_tokens, 5);
  doc["max_tokens"] = nullptr;  // null = not given
  EXPECT_FALSE(parse_chat_request(doc.dump()).sampling.max_tokens);
}

struct BadField {
  const char* name;
  json value;
};

TEST(ChatRequest, WrongTypesAndRangesNameTheField) {
  const std::vector<BadField> bad = {
      {"model", 3}, {"max_tokens", "10"}, {"max_tokens", 0}, {"max_tokens", 1.5}, {"max_completion_tokens", -1},
      {"temperature", "hot"}, {"temperature", -0.1}, {"top_p", 0.0}, {"top_p", 1.5}, {"top_k", -2}, {"top_k", 0.5},
      {"min_p", 2}, {"seed", "x"}, {"n", 0}, {"n", 1000}, {"presence_penalty", 3}, {"frequency_penalty", "a"},
      {"repetition_penalty", 0}, {"ignore_eos", 1}, {"stream", "true"}, {"stop", 5}, {"stop", json::array({1})},
      {"stop", ""}, {"stop_token_ids", json::array({-1})}, {"stop_token_ids", "1"}, {"logprobs", 1},
      {"top_logprobs", 100}, {"skip_special_tokens", "no"}, {"chat_template_kwargs", json::array()},
      {"tools", json::object()}, {"tool_choice", 3}, {"tool_choice", "sometimes"}, {"response_format", "json"},
      {"user", 1}, {"messages", "hi"}, {"add_generation_prompt", "yes"}};
  for (const BadField& b : bad) {
    json doc = chat_base();
    doc[b.name] = b.value;
    const ApiError e = chat_error(doc);
    EXPECT_EQ(e.status, 400) << b.name << " = " << b.value;
    EXPECT_NE(e.message.find(b.name), std::string::npos) << e.message;
    EXPECT_EQ(e.param.rfind(b.name, 0), 0u) << b.name << ": param " << e.param;
  }
}

TEST(ChatRequest, BadMessages) {
  const std::vector<std::pair<json, std::string>> bad = {
      {json::array(), "messages"},
      {json::array({"hi"}), "messages[0]"},
      {json::array({{{"content", "x"}}}), "messages[0].role"},
      {json::array({{{"role", "wizard"}, {"content", "x"}}}), "messages[0].role"},
      {json::array({{{"role", 1}, {"content", "x"}}}), "messages[0].role"},
      {json::array({{{"role", "user"}}}), "messages[0].content"},
      {json::array({{{"role", "user"}, {"content", 5}}}), "messages[0].content"},
      {json::array({{{"role", "user"}, {"content", {{{"type", "image_url"}}}}}}), "messages[0].content[0].type"},
      {json::array({{{"role", "user"}, {"content", {{{"type", "text"}}}}}}), "messages[0].content[0].text"},
      {json::array({{{"role", "assistant"}, {"tool_calls", {{{"function", {{"arguments", "{}"}}}}}}}}),
       "messages[0].tool_calls[0].function.name"},
      {json::array({{{"role", "assistant"}, {"tool_calls", {{{"function", {{"name", "f"}, {"arguments", "{bad"}}}}}}}}),
       "messages[0].tool_calls[0].function.arguments"},
      {json::array({{{"role", "tool"}, {"content", "x"}, {"tool_call_id", 7}}}), "messages[0].tool_call_id"},
  };
  for (const auto& [messages, param] : bad) {
    const ApiError e = chat_error({{"messages", messages}});
    EXPECT_EQ(e.status, 400) << messages;
    EXPECT_EQ(e.param, param) << messages << ": " << e.message;
  }
  EXPECT_EQ(chat_error(json::object()).param, "messages");
}

TEST(ChatRequest, ToolsAndToolChoice) {
  json doc = chat_base();
  doc["tool_choice"] = "auto";
  EXPECT_EQ(chat_error(doc).param, "tool_choice");  // tool_choice without tools
  doc["tools"] = json::array();  // an empty list: as vLLM and OpenAI, auto and required mean none
  EXPECT_EQ(parse_chat_request(doc.dump()).tool_choice, "none");
  doc["tool_choice"] = "required";
  EXPECT_EQ(parse_chat_request(doc.dump()).tool_choice, "none");
  doc["tools"] = {{{"type", "function"}, {"function", {{"name", "get_weather"}}}}};
  // A forced call: the tools come along in key order for the tool-call grammar.
  doc["tool_choice"] = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  doc["parallel_tool_calls"] = false;
  const ChatRequest named = parse_chat_request(doc.dump());
  EXPECT_EQ(named.tool_choice, "function");
  EXPECT_EQ(named.tool_function, "get_weather");
  EXPECT_FALSE(named.parallel_tool_calls);
  ASSERT_NE(named.tools_in_order, nullptr);
  EXPECT_EQ(named.tools_in_order->size(), 1u);
  doc["tool_choice"] = {{"type", "function"}, {"function", {{"name", "get_time"}}}};
  EXPECT_EQ(chat_error(doc).param, "tool_choice.function.name");  // not among the tools
  doc["tool_choice"] = "required";
  EXPECT_EQ(parse_chat_request(doc.dump()).tool_choice, "required");
  doc["guided_choice"] = {"a", "b"};
  EXPECT_EQ(chat_error(doc).param, "tool_choice");  // forced calls take no other structured output
  doc.erase("guided_choice");
  doc.erase("parallel_tool_calls");
  doc["tool_choice"] = "auto";
  EXPECT_EQ(parse_chat_request(doc.dump()).tool_choice, "auto");
  doc["tool_choice"] = "none";
  EXPECT_EQ(parse_chat_request(doc.dump()).tool_choice, "none");
  doc["tools"] = {{{"type", "retrieval"}}};
  EXPECT_EQ(chat_error(doc).param, "tools[0].type");
  doc["tools"] = {{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", "x"}}}}};
  EXPECT_EQ(chat_error(doc).param, "tools[0].function.parameters");
}

TEST(ChatRequest, StreamOptionsNeedStream) {
  json doc = chat_base();
  doc["stream_options"] = {{"include_usage", true}};
  EXPECT_EQ(chat_error(doc).param, "stream_options");
  doc["stream"] = true;
  doc["stream_options"] = {{"include_usage", "yes"}};
  EXPECT_EQ(chat_error(doc).param, "include_usage");
}

TEST(BodyText, InvalidJsonUtf8AndDepth) {
  EXPECT_EQ(error_of([] { parse_chat_request("{\"messages\": ["); }).status, 400);
  EXPECT_EQ(error_of([] { parse_chat_request("[1, 2]"); }).status, 400);
  EXPECT_EQ(error_of([] { parse_chat_request(""); }).status, 400);
  const std::string bad_utf8 = "{\"messages\": [{\"role\": \"user\", \"content\": \"\xff\xfe\"}]}";
  EXPECT_NE(error_of([&] { parse_chat_request(bad_utf8); }).message.find("UTF-8"), std::string::npos);
  const std::string overlong = "{\"messages\": [{\"role\": \"user\", \"content\": \"\xc0\xaf\"}]}";
  EXPECT_EQ(error_of([&] { parse_chat_request(overlong); }).status, 400);
  const std::string surrogate = "{\"messages\": [{\"role\": \"user\", \"content\": \"\\ud800\"}]}";
  EXPECT_EQ(error_of([&] { parse_chat_request(surrogate); }).status, 400);
  std::string deep = "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"x\": ";
  for (int i = 0; i < 100; ++i) deep += "[";
  for (int i = 0; i < 100; ++i) deep += "]";
  deep += "}";
  EXPECT_NE(error_of([&] { parse_chat_request(deep); }).message.find("nested"), std::string::npos);
  // Brackets inside strings do not count.
  std::string in_string = "{\"messages\": [{\"role\": \"user\", \"content\": \"" + std::string(200, '[') + "\"}]}";
  EXPECT_NO_THROW(parse_chat_request(in_string));
  EXPECT_TRUE(is_valid_utf8("h\xc3\xa9llo \xf0\x9f\x98\x80"));
  EXPECT_FALSE(is_valid_utf8("\xed\xa0\x80"));  // encoded surrogate
  EXPECT_FALSE(is_valid_utf8("\xf4\x90\x80\x80"));  // above U+10FFFF
  EXPECT_FALSE(is_valid_utf8("\xe2\x82"));  // truncated
}

TEST(CompletionRequest, PromptForms) {
  EXPECT_EQ(std::get<std::string>(parse_completion_request(R"({"prompt": "abc"})").prompts[0]), "abc");
  const auto ids = parse_completion_request(R"({"prompt": [1, 2, 3]})");
  EXPECT_EQ(std::get<std::vector<int32_t>>(ids.prompts[0]), (std::vector<int32_t>{1, 2, 3}));
  const auto batch = parse_completion_request(R"({"prompt": ["a", "b"], "n": 2})");
  EXPECT_EQ(batch.prompts.size(), 2u);
  const auto id_batch = parse_completion_request(R"({"prompt": [[1], [2, 3]]})");
  EXPECT_EQ(id_batch.prompts.size(), 2u);
  const auto lp = parse_completion_request(R"({"prompt": "a", "logprobs": 3})");
  EXPECT_EQ(lp.sampling.logprobs, 3);
}

TEST(CompletionRequest, BadPrompts) {
  for (const char* body : {R"({})", R"({"prompt": ""})", R"({"prompt": []})", R"({"prompt": 5})",
                           R"({"prompt": [1, -2]})", R"({"prompt": [1, "a"]})", R"({"prompt": [{"a": 1}]})",
                           R"({"prompt": [[]]})", R"({"prompt": [1.5]})", R"({"prompt": "a", "logprobs": true})",
                           R"({"prompt": "a", "logprobs": 50})", R"({"prompt": "a", "messages": []})"}) {
    const ApiError e = error_of([&] { parse_completion_request(body); });
    EXPECT_EQ(e.status, 400) << body;
    EXPECT_FALSE(e.param.empty()) << body << ": " << e.message;
  }
  EXPECT_EQ(completion_error({{"prompt", "a"}, {"echo", "yes"}}).param, "echo");
}

TEST(ErrorBody, OpenAiShape) {
  const json body = json::parse(error_body(ApiError{404, "The model `x` does not exist.", "model", 0.0}));
  EXPECT_EQ(body["error"]["message"], "The model `x` does not exist.");
  EXPECT_EQ(body["error"]["type"], "NotFoundError");
  EXPECT_EQ(body["error"]["code"], 404);
  EXPECT_EQ(body["error"]["param"], "model");
  const json no_param = json::parse(error_body(ApiError{429, "slow down", "", 2.0}));
  EXPECT_TRUE(no_param["error"]["param"].is_null());
  EXPECT_EQ(no_param["error"]["type"], "RateLimitError");
}

TEST(BodyText, NumberOverflowIsABadRequest) {
  // nlohmann throws out_of_range (not parse_error) for numbers beyond double: found by the fuzzer.
  EXPECT_EQ(error_of([] { parse_chat_request("6666e666"); }).status, 400);
  EXPECT_EQ(error_of([] { parse_completion_request(R"({"prompt": "a", "temperature": 1e999})"); }).status, 400);
  const std::string args = R"({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f",
      "arguments": "{\"x\": 1e999}"}}]}]})";
  EXPECT_EQ(error_of([&] { parse_chat_request(args); }).param, "messages[0].tool_calls[0].function.arguments");
}

TEST(ChatRequest, LogitBiasMinTokensBestOfAndARequestTemplate) {
  json doc = chat_base();
  doc["logit_bias"] = {{"5", 2.5}, {"17", -100}};
  doc["min_tokens"] = 3;
  doc["max_tokens"] = 8;
  doc["n"] = 2;
  doc["best_of"] = 2;
  doc["chat_template"] = "{% for m in messages %}{{ m.content }}{% endfor %}";
  const ChatRequest r = parse_chat_request(doc.dump());
  auto bias = r.sampling.logit_bias;
  std::sort(bias.begin(), bias.end());
  EXPECT_EQ(bias, (std::vector<std::pair<int32_t, float>>{{5, 2.5f}, {17, -100.0f}}));
  EXPECT_EQ(r.sampling.min_tokens, 3);
  EXPECT_EQ(r.chat_template, doc["chat_template"].get<std::string>());
  const std::vector<BadField> bad = {{"logit_bias", json::array()},
                                     {"logit_bias", {{"x", 1}}},
                                     {"logit_bias", {{"-3", 1}}},
                                     {"logit_bias", {{"3", 101}}},
                                     {"logit_bias", {{"3", "big"}}},
                                     {"min_tokens", -1},
                                     {"min_tokens", 9},  // more than max_tokens
                                     {"best_of", 1},     // fewer than n
                                     {"best_of", 3},     // more than n: not generated and dropped
                                     {"chat_template", ""},
                                     {"chat_template", 5}};
  for (const BadField& b : bad) {
    json d = doc;
    d[b.name] = b.value;
    const ApiError e = chat_error(d);
    EXPECT_EQ(e.status, 400) << b.name << " = " << b.value;
    EXPECT_EQ(e.param, b.name) << b.name << " = " << b.value << ": " << e.message;
  }
}

TEST(ChatRequest, FieldsNotImplementedAreRefusedByName) {
  for (const char* name : {"guided_decoding_backend", "suffix", "logits_processors", "prompt_embeds"}) {
    json doc = chat_base();
    doc[name] = json::object();
    const ApiError e = chat_error(doc);
    EXPECT_EQ(e.status, 400) << name;
    EXPECT_EQ(e.param, name);
    EXPECT_NE(e.message.find("not supported"), std::string::npos) << e.message;
  }
  json doc = chat_base();
  doc["top_logprobs"] = 3;  // without logprobs: true
  EXPECT_EQ(chat_error(doc).param, "top_logprobs");
  doc["logprobs"] = true;
  EXPECT_EQ(parse_chat_request(doc.dump()).sampling.logprobs, 3);
}

TEST(CompletionRequest, EchoWithLogprobsAndPromptLogprobs) {
  const CompletionRequest r = parse_completion_request(json{{"prompt", "a"}, {"echo", true}, {"logprobs", 2}}.dump());
  EXPECT_TRUE(r.echo);
  EXPECT_EQ(r.sampling.logprobs, 2);
  // The prompt's logprobs come in the whole response: streams refuse them, naming the field.
  EXPECT_EQ(completion_error({{"prompt", "a"}, {"echo", true}, {"logprobs", 2}, {"stream", true}}).param, "echo");
  EXPECT_EQ(parse_completion_request(json{{"prompt", "a"}, {"prompt_logprobs", 3}}.dump()).sampling.prompt_logprobs, 3);
  EXPECT_EQ(parse_completion_request(json{{"prompt", "a"}, {"prompt_logprobs", nullptr}}.dump()).sampling.prompt_logprobs, -1);
  EXPECT_EQ(completion_error({{"prompt", "a"}, {"prompt_logprobs", 1}, {"stream", true}}).param, "prompt_logprobs");
  EXPECT_EQ(completion_error({{"prompt", "a"}, {"prompt_logprobs", 99}}).param, "prompt_logprobs");
}

TEST(ChatRequest, StructuredOutputForms) {
  json doc = chat_base();
  doc["structured_outputs"] = {{"choice", {"yes", "no"}}};
  EXPECT_EQ(parse_chat_request(doc.dump()).sampling.choice, (std::vector<std::string>{"yes", "no"}));
  doc = chat_base();
  doc["guided_choice"] = {"a", "b c"};
  EXPECT_EQ(parse_chat_request(doc.dump()).sampling.choice, (std::vector<std::string>{"a", "b c"}));
  for (const json& bad : {json{{"structured_outputs", {{"json", 5}}}}, json{{"structured_outputs", {{"json", "{x"}}}},
                          json{{"structured_outputs", {{"structural_tag", "x"}}}},
                          json{{"response_format", {{"type", "json_schema"}}}},
                          json{{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}}}}}},
                          json{{"structured_outputs", {{"grammar", ""}}}},
                          json{{"structured_outputs", {{"choice", json::array()}}}},
                          json{{"structured_outputs", {{"choice", {"a", ""}}}}},
                          json{{"guided_choice", "a"}}, json{{"structured_outputs", "a"}}}) {
    json d = chat_base();
    d.update(bad);
    const ApiError e = chat_error(d);
    EXPECT_EQ(e.status, 400) << bad.dump();
    EXPECT_FALSE(e.param.empty()) << bad.dump();
  }
  doc = chat_base();
  doc["structured_outputs"] = {{"grammar", "root ::= \"a\""}};
  EXPECT_EQ(parse_chat_request(doc.dump()).sampling.grammar, "root ::= \"a\"");
  // Schemas keep the request's key order (the order the output writes the properties in).
  const std::string body = chat_base().dump();
  const std::string with_schema =
      body.substr(0, body.size() - 1) +
      R"(,"response_format":{"type":"json_schema","json_schema":{"name":"s","strict":true,"schema":{"type":"object","properties":{"zeta":{"type":"integer"},"alpha":{"type":"string"}}}}}})";
  const ChatRequest r = parse_chat_request(with_schema);
  ASSERT_NE(r.sampling.json_schema, nullptr);
  EXPECT_EQ(r.sampling.json_schema->dump(), R"({"type":"object","properties":{"zeta":{"type":"integer"},"alpha":{"type":"string"}}})");
  doc = chat_base();
  doc["guided_json"] = R"({"type":"integer"})";  // vLLM also takes the schema as a string
  EXPECT_EQ(parse_chat_request(doc.dump()).sampling.json_schema->dump(), R"({"type":"integer"})");
  doc = chat_base();
  doc["structured_outputs"] = {{"regex", "[0-9]+"}};
  EXPECT_EQ(parse_chat_request(doc.dump()).sampling.regex, "[0-9]+");
  doc = chat_base();
  doc["guided_regex"] = "a|b";
  EXPECT_EQ(parse_chat_request(doc.dump()).sampling.regex, "a|b");
  doc["guided_choice"] = {"a"};
  EXPECT_EQ(chat_error(doc).param, "structured_outputs");  // two structured outputs
}

// Every field the parsers read is known: a request that sets each of them (valid values) has no
// ignored fields; one vLLM does not know either is reported, as vLLM logs it; vLLM's fields with
// no effect here pass quietly; OpenAI's deprecated functions are refused.
TEST(ChatRequest, FieldsNotReadAreReportedAsIgnored) {
  json chat = chat_base();
  const json common = {
      {"model", "m"}, {"cache_salt", "s"}, {"request_id", "r"}, {"max_tokens", 5}, {"max_completion_tokens", 5},
      {"temperature", 0.5}, {"top_p", 0.9}, {"top_k", 5}, {"min_p", 0.1}, {"seed", 3}, {"n", 2},
      {"presence_penalty", 0.1}, {"frequency_penalty", 0.1}, {"repetition_penalty", 1.1}, {"ignore_eos", true},
      {"stream", true}, {"skip_special_tokens", false}, {"include_stop_str_in_output", true},
      {"stream_options", {{"include_usage", true}}}, {"stop", "x"}, {"stop_token_ids", {4}},
      {"response_format", {{"type", "text"}}}, {"logit_bias", {{"5", 1}}}, {"min_tokens", 1},
      {"truncate_prompt_tokens", 4}, {"use_beam_search", false}, {"best_of", 2}, {"allowed_token_ids", {5, 6}},
      {"bad_words", {"w"}}, {"guided_regex", "a+"}, {"user", "u"}, {"return_tokens_as_token_ids", true},
      {"return_token_ids", true}, {"priority", 0}, {"add_special_tokens", true}, {"echo", false},
      {"length_penalty", 1.0}, {"early_stopping", false}, {"spaces_between_special_tokens", true},
      {"documents", json::array()}, {"mm_processor_kwargs", json::object()}, {"kv_transfer_params", nullptr},
      {"vllm_xargs", json::object()}};
  chat.update(common);
  chat.update({{"tools", {{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", json::object()}}}}}},
               {"tool_choice", "auto"}, {"parallel_tool_calls", true},
               {"chat_template_kwargs", json::object()}, {"add_generation_prompt", true},
               {"continue_final_message", false}, {"chat_template", "{{ x }}"}, {"include_reasoning", true},
               {"logprobs", true}, {"top_logprobs", 2}});
  const ChatRequest r = parse_chat_request(chat.dump());
  EXPECT_TRUE(r.sampling.ignored_fields.empty()) << json(r.sampling.ignored_fields).dump();
  EXPECT_TRUE(r.sampling.add_special_tokens);
  json completion = common;
  completion.update({{"prompt", "p"}, {"logprobs", 2}});
  const CompletionRequest c = parse_completion_request(completion.dump());
  EXPECT_TRUE(c.sampling.ignored_fields.empty()) << json(c.sampling.ignored_fields).dump();

  chat = chat_base();
  chat["frobnicate"] = 1;
  chat["store"] = false;
  const ChatRequest unknown = parse_chat_request(chat.dump());
  EXPECT_EQ(unknown.sampling.ignored_fields, (std::vector<std::string>{"frobnicate", "store"}));
  EXPECT_FALSE(unknown.sampling.add_special_tokens) << "chat: the template writes its own";
  EXPECT_TRUE(parse_completion_request(R"({"prompt": "p"})").sampling.add_special_tokens) << "completions: as vLLM";
  EXPECT_EQ(parse_completion_request(R"({"prompt": "p", "top_logprobs": 2})").sampling.ignored_fields,
            std::vector<std::string>{"top_logprobs"}) << "a chat field on completions";
  for (const char* name : {"functions", "function_call"}) {
    json doc = chat_base();
    doc[name] = name == std::string("functions") ? json::array({{{"name", "f"}}}) : json("auto");
    const ApiError e = chat_error(doc);
    EXPECT_EQ(e.param, name);
    EXPECT_NE(e.message.find("tools and tool_choice"), std::string::npos) << e.message;
  }
  json no_functions = chat_base();
  no_functions["functions"] = json::array();  // asks for nothing: passes
  EXPECT_TRUE(parse_chat_request(no_functions.dump()).sampling.ignored_fields.empty());
}

// vLLM's structural tags: response_format's own object, or structured_outputs.structural_tag as an
// object or its JSON text, kept in the request's key order; one structured output at a time.
TEST(ChatRequest, StructuralTagForms) {
  json doc = chat_base();
  doc["response_format"] = {{"type", "structural_tag"}, {"triggers", {"<f="}},
                            {"structures", {{{"begin", "<f=a>"}, {"schema", {{"type", "object"}}}, {"end", "</f>"}}}}};
  ChatRequest r = parse_chat_request(doc.dump());
  ASSERT_NE(r.sampling.structural_tag, nullptr);
  EXPECT_EQ((*r.sampling.structural_tag)["triggers"][0], "<f=");
  EXPECT_EQ(r.sampling.structural_tag_param, "response_format");
  doc = chat_base();
  doc["structured_outputs"] = {{"structural_tag", R"({"structures": [], "triggers": ["x"]})"}};
  r = parse_chat_request(doc.dump());
  ASSERT_NE(r.sampling.structural_tag, nullptr);
  EXPECT_TRUE((*r.sampling.structural_tag)["structures"].is_array());
  EXPECT_EQ(r.sampling.structural_tag_param, "structured_outputs.structural_tag");
  doc["structured_outputs"] = {{"structural_tag", "not json"}};
  EXPECT_EQ(chat_error(doc).param, "structured_outputs.structural_tag");
  doc["structured_outputs"] = {{"structural_tag", 5}};
  EXPECT_EQ(chat_error(doc).param, "structured_outputs.structural_tag");
  doc["structured_outputs"] = {{"structural_tag", json::object()}, {"regex", "a"}};
  EXPECT_EQ(chat_error(doc).param, "structured_outputs");  // two forms
}
