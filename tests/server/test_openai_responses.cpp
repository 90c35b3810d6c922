// OpenAI's Responses API over the chat pipeline (server/openai_responses.h): a Responses request
// becomes the chat completion request that means the same, a chat completion becomes the Response,
// and a chat completion stream becomes the Responses events whose last carries that Response.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "fakes.h"
#include "server/api_error.h"
#include "server/openai_responses.h"
#include "server/responses_store.h"
#include "service_fixture.h"

using namespace glms;
using nlohmann::json;

namespace {

json chat_of(const json& request) {
  return json::parse(server::chat_request_of_response_request(request.dump()).chat_request);
}

// The ApiException converting `request` throws: its message and param ("" when none).
std::pair<std::string, std::string> refusal(const json& request) {
  try {
    server::chat_request_of_response_request(request.dump());
  } catch (const server::ApiException& e) {
    return {e.error.message, e.error.param};
  }
  return {"", ""};
}

// The Responses events in order: (event name, data); each data's type is its name.
std::vector<std::pair<std::string, json>> events_of(const std::string& stream) {
  auto events = glms::test::named_events_of(stream);
  for (const auto& [name, data] : events) EXPECT_EQ(data["type"], name);
  return events;
}

json chunk(const json& delta, const json& finish, int completion_tokens) {
  return {{"id", "chatcmpl-xyz"},
          {"created", 1700000000},
          {"model", "glm-5"},
          {"choices", json::array({{{"index", 0}, {"delta", delta}, {"finish_reason", finish}}})},
          {"usage", {{"prompt_tokens", 20}, {"completion_tokens", completion_tokens}}}};
}

}  // namespace

TEST(OpenAiResponses, AConversationOfItemsBecomesItsChatCompletionRequest) {
  const json tools = json::array({{{"type", "function"}, {"name", "ls"}, {"description", "List a folder"},
                                   {"parameters", {{"type", "object"}, {"properties", {{"path", {{"type", "string"}}}}}}},
                                   {"strict", true}}});
  const json request = {
      {"model", "glm-5"},
      {"instructions", "Be brief."},
      {"input",
       json::array({{{"role", "developer"}, {"content", "Use tools."}},
                    {{"type", "message"}, {"role", "user"},
                     {"content", json::array({{{"type", "input_text"}, {"text", "What is in /tmp?"}},
                                              {{"type", "input_image"}, {"image_url", "data:..."}}})}},
                    {{"type", "reasoning"}, {"id", "rs_1"}, {"summary", json::array()},
                     {"content", json::array({{{"type", "reasoning_text"}, {"text", "List it."}}})},
                     {"encrypted_content", "opaque"}},
                    {{"type", "function_call"}, {"call_id", "call_1"}, {"name", "ls"}, {"arguments", R"({"path":"/tmp"})"}},
                    {{"type", "function_call_output"}, {"call_id", "call_1"}, {"output", "a.txt"}},
                    {{"type", "message"}, {"role", "assistant"},
                     {"content", json::array({{{"type", "output_text"}, {"text", "It holds a.txt."}, {"annotations", json::array()}}})}},
                    {{"role", "user"}, {"content", "And now?"}}})},
      {"tools", tools},
      {"tool_choice", {{"type", "function"}, {"name", "ls"}}},
      {"parallel_tool_calls", false},
      {"text", {{"format", {{"type", "json_schema"}, {"name", "answer"}, {"schema", {{"type", "object"}}}, {"strict", true}}}}},
      {"reasoning", {{"effort", "none"}, {"summary", "auto"}}},
      {"max_output_tokens", 64},
      {"temperature", 0.5},
      {"top_k", 20},
      {"stream", true},
      {"store", false},
      {"include", json::array({"reasoning.encrypted_content"})},
      {"metadata", {{"run", "1"}}},
      {"prompt_cache_key", "k"}};
  const json expected = {
      {"model", "glm-5"},
      {"messages",
       json::array({{{"role", "system"}, {"content", "Be brief."}},
                    {{"role", "system"}, {"content", "Use tools."}},
                    {{"role", "user"},
                     {"content", json::array({{{"type", "text"}, {"text", "What is in /tmp?"}},
                                              {{"type", "text"}, {"text", "[input_image omitted: the model reads text only]"}}})}},
                    {{"role", "assistant"},
                     {"content", ""},
                     {"reasoning_content", "List it."},
                     {"tool_calls", json::array({{{"id", "call_1"}, {"type", "function"},
                                                  {"function", {{"name", "ls"}, {"arguments", R"({"path":"/tmp"})"}}}}})}},
                    {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "a.txt"}},
                    {{"role", "assistant"}, {"content", "It holds a.txt."}},
                    {{"role", "user"}, {"content", "And now?"}}})},
      {"max_tokens", 64},
      {"temperature", 0.5},
      {"top_k", 20},
      {"parallel_tool_calls", false},
      {"stream", true},
      {"stream_options", {{"include_usage", true}, {"continuous_usage_stats", true}}},
      {"chat_template_kwargs", {{"enable_thinking", false}}},
      {"response_format",
       {{"type", "json_schema"}, {"json_schema", {{"name", "answer"}, {"schema", {{"type", "object"}}}, {"strict", true}}}}},
      {"tools", json::array({{{"type", "function"},
                              {"function", {{"name", "ls"}, {"description", "List a folder"},
                                            {"parameters", tools[0]["parameters"]}}}}})},
      {"tool_choice", {{"type", "function"}, {"function", {{"name", "ls"}}}}}};
  EXPECT_EQ(chat_of(request), expected) << chat_of(request).dump(2);
  // The echo repeats what the request set, with the API's defaults elsewhere.
  const json echo = json::parse(server::chat_request_of_response_request(request.dump()).echo);
  EXPECT_EQ(echo["instructions"], "Be brief.");
  EXPECT_EQ(echo["tools"], tools);
  EXPECT_EQ(echo["reasoning"], (json{{"effort", "none"}, {"summary", "auto"}}));
  EXPECT_EQ(echo["text"]["format"]["name"], "answer");
  EXPECT_EQ(echo["parallel_tool_calls"], false);
  EXPECT_EQ(echo["store"], false);
  EXPECT_EQ(echo["metadata"], (json{{"run", "1"}}));
  // A string input is one user message; a plain request keeps GLM's thinking as the template has it.
  const json plain = chat_of({{"input", "hi"}});
  EXPECT_EQ(plain, (json{{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}}));
  EXPECT_EQ(chat_of({{"input", "hi"}, {"reasoning", {{"effort", "high"}}}}).count("chat_template_kwargs"), 0u);
  const json plain_echo = json::parse(server::chat_request_of_response_request(json{{"input", "hi"}}.dump()).echo);
  EXPECT_EQ(plain_echo["tool_choice"], "auto");
  EXPECT_EQ(plain_echo["text"], (json{{"format", {{"type", "text"}}}}));
  EXPECT_EQ(plain_echo["parallel_tool_calls"], true);
}

TEST(OpenAiResponses, WhatCannotBeAnsweredIsRefusedNamingIt) {
  const json input = "hi";
  const std::vector<std::pair<json, std::string>> cases = {
      {{{"input", input}, {"previous_response_id", "resp_1"}}, "previous_response_id"},
      {{{"input", input}, {"conversation", "conv_1"}}, "conversation"},
      {{{"input", input}, {"background", true}}, "background"},
      {{{"input", input}, {"truncation", "auto"}}, "truncation"},
      {{{"input", input}, {"top_logprobs", 3}}, "top_logprobs"},
      {{{"input", input}, {"include", json::array({"message.output_text.logprobs"})}}, "top_logprobs"},
      {{{"input", input}, {"tools", json::array({{{"type", "web_search"}}})}}, "tools.0.type"},
      {{{"input", input}, {"tools", json::array({{{"type", "function"}}})}}, "tools.0.name"},
      {{{"input", input}, {"tool_choice", "sometimes"}}, "tool_choice"},
      {{{"input", input}, {"tool_choice", {{"type", "web_search_preview"}}}}, "tool_choice.type"},
      {{{"input", input}, {"text", {{"format", {{"type", "yaml"}}}}}}, "text.format.type"},
      {{{"input", input}, {"text", {{"format", {{"type", "json_schema"}}}}}}, "text.format.schema"},
      {{{"input", input}, {"reasoning", {{"effort", "extreme"}}}}, "reasoning.effort"},
      {{{"input", input}, {"max_output_tokens", "64"}}, "max_output_tokens"},
      {{{"model", "glm-5"}}, "input"},
      {{{"input", json::array()}}, "input"},
      {{{"input", json::array({{{"type", "item_reference"}, {"id", "msg_1"}}})}}, "input.0.type"},
      {{{"input", json::array({{{"type", "computer_call_output"}}})}}, "input.0.type"},
      {{{"input", json::array({{{"role", "robot"}, {"content", "x"}}})}}, "input.0.role"},
      {{{"input", json::array({{{"role", "user"}, {"content", 3}}})}}, "input.0.content"},
      {{{"input", json::array({{{"type", "function_call"}, {"name", "ls"}}})}}, "input.0.call_id"},
      {{{"input", json::array({{{"type", "function_call_output"}, {"call_id", "c"}}})}}, "input.0.output"},
      {{{"input", json::array({{{"type", "function_call_output"}, {"call_id", "c"}, {"output", 3}}})}}, "input.0.output"},
      {{{"input", json::array({"text"})}}, "input.0"},
  };
  for (const auto& [request, param] : cases) {
    const auto [message, given_param] = refusal(request);
    EXPECT_FALSE(message.empty()) << request.dump();
    EXPECT_EQ(given_param, param) << request.dump() << ": " << message;
  }
  EXPECT_NE(refusal({{"input", input}, {"previous_response_id", "r"}}).first.find("send the whole conversation"),
            std::string::npos);
  EXPECT_EQ(refusal({{"input", input}, {"truncation", "disabled"}, {"top_logprobs", 0}}).first, "");
}

TEST(OpenAiResponses, AChatCompletionBecomesAResponse) {
  const json completion = glms::test::chat_completion_with_a_call();
  const std::string echo = server::chat_request_of_response_request(json{{"input", "hi"}, {"temperature", 0.2}}.dump()).echo;
  const json response = json::parse(server::response_of_chat_completion(completion.dump(), echo));
  EXPECT_EQ(response["id"], "resp_abc");
  EXPECT_EQ(response["object"], "response");
  EXPECT_EQ(response["created_at"], 1700000000);
  EXPECT_EQ(response["model"], "glm-5");
  EXPECT_EQ(response["status"], "completed");
  EXPECT_EQ(response["incomplete_details"], nullptr);
  EXPECT_EQ(response["error"], nullptr);
  EXPECT_EQ(response["temperature"], 0.2);
  const json expected_output = json::array(
      {{{"id", "rs_abc_0"}, {"type", "reasoning"}, {"summary", json::array()},
        {"content", json::array({{{"type", "reasoning_text"}, {"text", "Think."}}})}, {"status", "completed"}},
       {{"id", "msg_abc_1"}, {"type", "message"}, {"role", "assistant"}, {"status", "completed"},
        {"content", json::array({{{"type", "output_text"}, {"text", "Here."}, {"annotations", json::array()},
                                  {"logprobs", json::array()}}})}},
       {{"id", "fc_abc_2"}, {"type", "function_call"}, {"call_id", "call_1"}, {"name", "ls"},
        {"arguments", R"({"path":"/"})"}, {"status", "completed"}}});
  EXPECT_EQ(response["output"], expected_output) << response["output"].dump(2);
  EXPECT_EQ(response["usage"], (json{{"input_tokens", 12}, {"input_tokens_details", {{"cached_tokens", 8}}},
                                     {"output_tokens", 5}, {"output_tokens_details", {{"reasoning_tokens", 0}}},
                                     {"total_tokens", 17}}));
  // The token limit leaves the Response, and its last item, incomplete.
  json cut = completion;
  cut["choices"][0]["finish_reason"] = "length";
  cut["choices"][0]["message"].erase("tool_calls");
  const json incomplete = json::parse(server::response_of_chat_completion(cut.dump(), echo));
  EXPECT_EQ(incomplete["status"], "incomplete");
  EXPECT_EQ(incomplete["incomplete_details"], (json{{"reason", "max_output_tokens"}}));
  EXPECT_EQ(incomplete["output"].back()["status"], "incomplete");
  EXPECT_EQ(incomplete["output"][0]["status"], "completed");
}

TEST(OpenAiResponses, AStreamBecomesItemsOfReasoningTextAndFunctionCalls) {
  auto recording = std::make_shared<glms::test::RecordingResponder>();
  const server::ResponsesRequest request = server::chat_request_of_response_request(json{{"input", "hi"}}.dump());
  const std::string& echo = request.echo;
  const auto responder = server::responses_responder(recording, request);
  responder->begin_stream({});
  responder->write(server::sse_event(chunk({{"role", "assistant"}, {"content", ""}}, nullptr, 0).dump()));
  responder->write(server::sse_event(chunk({{"reasoning_content", "Hm"}}, nullptr, 1).dump()) +
                   server::sse_event(chunk({{"reasoning_content", "m."}}, nullptr, 2).dump()));
  responder->write(server::sse_event(chunk({{"content", "Sure"}}, nullptr, 3).dump()));
  const json call = {{"index", 0}, {"id", "call_9"}, {"type", "function"}, {"function", {{"name", "ls"}, {"arguments", R"({"pa)"}}}};
  responder->write(server::sse_event(chunk({{"tool_calls", json::array({call})}}, nullptr, 8).dump()));
  const json rest = {{"index", 0}, {"function", {{"arguments", R"(th":"/"})"}}}};
  responder->write(server::sse_event(chunk({{"tool_calls", json::array({rest})}}, "tool_calls", 9).dump()));
  responder->write(server::sse_done());
  responder->end_stream();
  const auto events = events_of(recording->stream_body());
  std::vector<std::string> names;
  for (size_t i = 0; i < events.size(); ++i) {
    names.push_back(events[i].first);
    EXPECT_EQ(events[i].second["sequence_number"], i);
  }
  EXPECT_EQ(names, (std::vector<std::string>{
                       "response.created", "response.in_progress",
                       "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
                       "response.reasoning_text.delta", "response.reasoning_text.done", "response.content_part.done",
                       "response.output_item.done",
                       "response.output_item.added", "response.content_part.added", "response.output_text.delta",
                       "response.output_text.done", "response.content_part.done", "response.output_item.done",
                       "response.output_item.added", "response.function_call_arguments.delta",
                       "response.function_call_arguments.delta", "response.function_call_arguments.done",
                       "response.output_item.done", "response.completed"}));
  EXPECT_EQ(events[0].second["response"]["status"], "in_progress");
  EXPECT_EQ(events[0].second["response"]["output"], json::array());
  EXPECT_EQ(events[2].second["item"]["content"], json::array());  // parts arrive by content_part.added
  EXPECT_EQ(events[5].second["delta"], "m.");
  EXPECT_EQ(events[6].second["text"], "Hmm.");
  EXPECT_EQ(events[11].second["item_id"], "msg_xyz_1");
  EXPECT_EQ(events[11].second["output_index"], 1);
  EXPECT_EQ(events[15].second["item"]["call_id"], "call_9");
  EXPECT_EQ(events[18].second["arguments"], R"({"path":"/"})");
  // The last event's Response is the one the whole answer would have been.
  const json whole = {
      {"id", "chatcmpl-xyz"},
      {"created", 1700000000},
      {"model", "glm-5"},
      {"choices", json::array({{{"index", 0},
                                {"message", {{"role", "assistant"}, {"content", "Sure"}, {"reasoning_content", "Hmm."},
                                             {"tool_calls", json::array({{{"id", "call_9"}, {"type", "function"},
                                                                          {"function", {{"name", "ls"},
                                                                                        {"arguments", R"({"path":"/"})"}}}}})}}},
                                {"finish_reason", "tool_calls"}}})},
      {"usage", {{"prompt_tokens", 20}, {"completion_tokens", 9}}}};
  EXPECT_EQ(events.back().second["response"], json::parse(server::response_of_chat_completion(whole.dump(), echo)))
      << events.back().second.dump(2);
}

TEST(OpenAiResponses, TheTokenLimitAndErrorsEndTheStream) {
  const server::ResponsesRequest request = server::chat_request_of_response_request(json{{"input", "hi"}}.dump());
  auto recording = std::make_shared<glms::test::RecordingResponder>();
  auto responder = server::responses_responder(recording, request);
  responder->begin_stream({});
  responder->write(server::sse_event(chunk({{"content", "Su"}}, "length", 1).dump()) + server::sse_done());
  auto events = events_of(recording->stream_body());
  EXPECT_EQ(events.back().first, "response.incomplete");
  EXPECT_EQ(events.back().second["response"]["incomplete_details"]["reason"], "max_output_tokens");
  EXPECT_EQ(events[events.size() - 2].second["item"]["status"], "incomplete");
  // Mid-stream, response.failed, and nothing after it.
  recording = std::make_shared<glms::test::RecordingResponder>();
  responder = server::responses_responder(recording, request);
  responder->begin_stream({});
  responder->write(server::sse_event(chunk({{"content", "Su"}}, nullptr, 1).dump()));
  responder->write(server::sse_event(server::error_body({503, "the engine stopped", "", 0.0})) + server::sse_done());
  events = events_of(recording->stream_body());
  EXPECT_EQ(events.back().first, "response.failed");
  EXPECT_EQ(events.back().second["response"]["status"], "failed");
  EXPECT_EQ(events.back().second["response"]["error"]["message"], "the engine stopped");
  // An error before the stream keeps OpenAI's error shape, which the Responses API shares.
  recording = std::make_shared<glms::test::RecordingResponder>();
  server::HttpResponse error;
  error.status = 400;
  error.body = server::error_body({400, "max_tokens is too large", "max_tokens", 0.0});
  server::responses_responder(recording, request)->reply(error);
  EXPECT_EQ(recording->response.body, error.body);
}

TEST(OpenAiResponses, TheServiceAnswersOnV1Responses) {
  glms::test::Fixture f;
  f.say("Hello there");
  const json response = f.post("/v1/responses", {{"model", "tiny"}, {"input", "hi"}, {"max_output_tokens", 16}});
  EXPECT_EQ(response["status"], "completed");
  ASSERT_EQ(response["output"].size(), 1u);
  EXPECT_EQ(response["output"][0]["content"][0]["text"], "Hello there");
  EXPECT_EQ(response["usage"]["output_tokens"], static_cast<int>(glms::test::ids("Hello there").size()) + 1);
  // The input's tokens, counted as the generation sees them.
  const json count = f.post("/v1/responses/input_tokens", {{"model", "tiny"}, {"input", "hi"}});
  EXPECT_EQ(count["object"], "response.input_tokens");
  EXPECT_EQ(count["input_tokens"], response["usage"]["input_tokens"]);
  const json unknown_model = f.post("/v1/responses", {{"model", "gpt-5"}, {"input", "hi"}}, 404);
  glms::test::expect_error_shape(unknown_model.dump(), 404);
  const auto stored = f.call("GET", "/v1/responses/resp_1");
  EXPECT_EQ(stored->response.status, 404);
  EXPECT_NE(stored->response.body.find("stores no responses"), std::string::npos);
}

// A forced call's grammar lets the model write blanks before its calls: no message item of them,
// streamed or whole.
TEST(OpenAiResponses, BlankTextBeforeFunctionCallsMakesNoMessage) {
  const server::ResponsesRequest request = server::chat_request_of_response_request(json{{"input", "hi"}}.dump());
  const std::string& echo = request.echo;
  auto recording = std::make_shared<glms::test::RecordingResponder>();
  const auto responder = server::responses_responder(recording, request);
  responder->begin_stream({});
  responder->write(server::sse_event(chunk({{"content", "  \t"}}, nullptr, 1).dump()));
  responder->write(server::sse_event(chunk({{"content", "\n"}}, nullptr, 2).dump()));
  const json call = {{"index", 0}, {"id", "call_1"}, {"type", "function"}, {"function", {{"name", "ls"}, {"arguments", "{}"}}}};
  responder->write(server::sse_event(chunk({{"tool_calls", json::array({call})}}, "tool_calls", 5).dump()) +
                   server::sse_done());
  const auto events = events_of(recording->stream_body());
  const json& output = events.back().second["response"]["output"];
  ASSERT_EQ(output.size(), 1u) << output.dump(2);
  EXPECT_EQ(output[0]["type"], "function_call");
  EXPECT_EQ(output[0]["id"], "fc_xyz_0");
  const json whole = {{"id", "chatcmpl-xyz"}, {"created", 1700000000}, {"model", "glm-5"},
                      {"choices", json::array({{{"index", 0},
                                                {"message", {{"role", "assistant"}, {"content", "  \t\n"},
                                                             {"tool_calls", json::array({call})}}},
                                                {"finish_reason", "tool_calls"}}})},
                      {"usage", {{"prompt_tokens", 20}, {"completion_tokens", 5}}}};
  json expected = json::parse(server::response_of_chat_completion(whole.dump(), echo));
  EXPECT_EQ(events.back().second["response"]["output"], expected["output"]);
  // Text that is not blank keeps the blanks before it.
  recording = std::make_shared<glms::test::RecordingResponder>();
  const auto second = server::responses_responder(recording, request);
  second->begin_stream({});
  second->write(server::sse_event(chunk({{"content", "\n"}}, nullptr, 1).dump()) +
                server::sse_event(chunk({{"content", "ok"}}, "stop", 2).dump()) + server::sse_done());
  EXPECT_EQ(events_of(recording->stream_body()).back().second["response"]["output"][0]["content"][0]["text"], "\nok");
}

TEST(OpenAiResponses, TheStoreKeepsTheNewestResponses) {
  server::ResponsesStore store(2);
  store.put("a", {"{\"id\": \"a\"}", "[]"});
  store.put("b", {"{\"id\": \"b\"}", "[]"});
  store.put("a", {"{\"id\": \"a2\"}", "[]"});  // a again: the newest now
  store.put("c", {"{\"id\": \"c\"}", "[]"});   // b, the oldest, goes
  EXPECT_EQ(store.size(), 2u);
  EXPECT_FALSE(store.get("b"));
  ASSERT_TRUE(store.get("a"));
  EXPECT_EQ(store.get("a")->response, "{\"id\": \"a2\"}");
  EXPECT_TRUE(store.erase("c"));
  EXPECT_FALSE(store.erase("c"));
  EXPECT_EQ(store.size(), 1u);
  server::ResponsesStore none(0);
  none.put("a", {"{}", "[]"});
  EXPECT_EQ(none.size(), 0u);
}

// serve --responses-store N: a response continues another's conversation by previous_response_id,
// whole or streamed; stored responses are read and deleted at /v1/responses/{id}.
TEST(OpenAiResponses, PreviousResponseIdContinuesAStoredConversation) {
  server::ServiceConfig config;
  config.responses_store_capacity = 8;
  glms::test::Fixture f(config);
  f.say("Hello there");
  const json first = f.post("/v1/responses", {{"model", "tiny"}, {"instructions", "Be brief."}, {"input", "hi"}});
  EXPECT_EQ(first["store"], true);
  const std::string id = first["id"];
  const auto stored = f.call("GET", "/v1/responses/" + id);
  ASSERT_EQ(stored->response.status, 200);
  EXPECT_EQ(json::parse(stored->response.body), first);
  // The follow-up's prompt holds the first turn and its answer, and its own instructions only.
  const json follow = {{"model", "tiny"}, {"input", "and more?"}, {"previous_response_id", id}, {"stream", true}};
  const auto streamed = f.call("POST", "/v1/responses", follow.dump());
  ASSERT_TRUE(streamed->streaming);
  ASSERT_EQ(f.backend.submitted.size(), 2u);
  const std::string prompt = glms::test::tokenizer().decode(f.backend.submitted[1].prompt_ids);
  EXPECT_NE(prompt.find("hi"), std::string::npos) << prompt;
  EXPECT_NE(prompt.find("Hello there"), std::string::npos) << prompt;
  EXPECT_NE(prompt.find("and more?"), std::string::npos) << prompt;
  EXPECT_EQ(prompt.find("Be brief."), std::string::npos) << prompt;
  const json second = events_of(streamed->stream_body()).back().second["response"];
  EXPECT_EQ(second["previous_response_id"], id);
  EXPECT_EQ(json::parse(f.call("GET", "/v1/responses/" + second["id"].get<std::string>())->response.body), second);
  // A chain: the third prompt holds both earlier turns.
  f.post("/v1/responses", {{"model", "tiny"}, {"input", "last"}, {"previous_response_id", second["id"]}});
  const std::string third = glms::test::tokenizer().decode(f.backend.submitted[2].prompt_ids);
  EXPECT_NE(third.find("hi"), std::string::npos) << third;
  EXPECT_NE(third.find("and more?"), std::string::npos) << third;
  // store: false keeps nothing; an unknown id is a 404 naming previous_response_id; DELETE forgets.
  const json unstored = f.post("/v1/responses", {{"model", "tiny"}, {"input", "x"}, {"store", false}});
  EXPECT_EQ(unstored["store"], false);
  EXPECT_EQ(f.call("GET", "/v1/responses/" + unstored["id"].get<std::string>())->response.status, 404);
  const json missing = f.post("/v1/responses", {{"model", "tiny"}, {"input", "x"}, {"previous_response_id", "resp_0"}}, 404);
  EXPECT_EQ(missing["error"]["param"], "previous_response_id");
  const auto deleted = f.call("DELETE", "/v1/responses/" + id);
  EXPECT_EQ(json::parse(deleted->response.body)["deleted"], true);
  EXPECT_EQ(f.call("GET", "/v1/responses/" + id)->response.status, 404);
}
