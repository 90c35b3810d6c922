// SGLang's native /generate over the completions pipeline (a scripted backend): its fields reach
// the engine as SGLang means them, answers come back in SGLang's shape (one object, or a list for
// a batch or n > 1), streams carry the whole text so far, and what is not supported is a 400.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "service_fixture.h"

using namespace glms;
using glms::test::Fixture;
using glms::test::ids;
using nlohmann::json;

TEST(SglangGenerate, OnePromptsAnswerAndItsSamplingParams) {
  Fixture f;
  f.say("x = 1");
  const json r = f.post("/generate", {{"text", "def f("},
                                      {"sampling_params",
                                       {{"max_new_tokens", 40}, {"temperature", 0.5}, {"top_k", 7}, {"stop", {"END"}},
                                        {"min_new_tokens", 1}, {"no_stop_trim", true}, {"sampling_seed", 9}}},
                                      {"rid", "req-1"}});
  const std::vector<int32_t> said = ids("x = 1");
  EXPECT_EQ(r["text"], "x = 1");
  std::vector<int32_t> with_eos = said;
  with_eos.push_back(8170);
  EXPECT_EQ(r["output_ids"], with_eos);
  const json& meta = r["meta_info"];
  EXPECT_EQ(meta["id"], "req-1");
  EXPECT_EQ(meta["finish_reason"], (json{{"type", "stop"}, {"matched", 8170}})) << "EOS: the token that matched";
  EXPECT_EQ(meta["prompt_tokens"], ids("def f(").size());
  EXPECT_EQ(meta["completion_tokens"], with_eos.size());
  EXPECT_EQ(meta["cached_tokens"], 0);
  const engine::RequestParams& p = f.backend.submitted.back();
  EXPECT_EQ(p.prompt_ids, ids("def f("));
  EXPECT_EQ(p.max_tokens, 40);
  EXPECT_FLOAT_EQ(p.sampling.temperature, 0.5f);
  EXPECT_EQ(p.sampling.top_k, 7);
  EXPECT_EQ(p.min_tokens, 1);
  EXPECT_EQ(p.sampling.seed, 9u);

  f.post("/generate", {{"input_ids", {5, 6, 7}}});  // token ids; SGLang's default of 128 new tokens
  EXPECT_EQ(f.backend.submitted.back().prompt_ids, (std::vector<int32_t>{5, 6, 7}));
  EXPECT_EQ(f.backend.submitted.back().max_tokens, 128);
  const json cut = f.post("/generate", {{"text", "a"}, {"sampling_params", {{"max_new_tokens", 2}}}});
  EXPECT_EQ(cut["meta_info"]["finish_reason"], (json{{"type", "length"}, {"length", 2}}));
}

TEST(SglangGenerate, BatchesAndSeveralChoicesAreLists) {
  Fixture f;
  f.say("ok");
  const json batch = f.post("/generate", {{"text", {"a", "bb"}}, {"rid", "b"}});
  ASSERT_TRUE(batch.is_array());
  ASSERT_EQ(batch.size(), 2u);
  EXPECT_EQ(batch[1]["meta_info"]["id"], "b_1");
  EXPECT_EQ(batch[1]["meta_info"]["prompt_tokens"], ids("bb").size());
  EXPECT_FALSE(batch[1]["meta_info"].contains("cached_tokens")) << "the usage's count is the batch's";
  const json ids_batch = f.post("/generate", {{"input_ids", {{1, 2}, {3}}}});
  EXPECT_EQ(ids_batch.size(), 2u);
  const json several = f.post("/generate", {{"text", "a"}, {"sampling_params", {{"n", 3}, {"temperature", 1.0}}}});
  ASSERT_TRUE(several.is_array());
  EXPECT_EQ(several.size(), 3u);
}

TEST(SglangGenerate, StreamsCarryTheWholeTextSoFar) {
  Fixture f;
  f.say("one two three");
  json body = {{"text", "count:"}, {"stream", true}};
  const std::vector<std::string> events = f.stream("/generate", body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  std::string previous;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const json e = json::parse(events[i]);
    const std::string text = e["text"];
    EXPECT_EQ(text.rfind(previous, 0), 0u) << "each event holds the one before it: '" << text << "'";
    EXPECT_EQ(e["output_ids"].size(), e["meta_info"]["completion_tokens"]);
    previous = text;
  }
  const json last = json::parse(events[events.size() - 2]);
  EXPECT_EQ(last["text"], "one two three");
  EXPECT_EQ(last["meta_info"]["finish_reason"]["type"], "stop");
  EXPECT_EQ(last["meta_info"]["cached_tokens"], 0);
}

TEST(SglangGenerate, LogprobsCarryTokenIds) {
  Fixture f;
  f.say("ab");
  const json r = f.post("/generate", {{"text", "x"}, {"return_logprob", true}, {"top_logprobs_num", 2}});
  const json& meta = r["meta_info"];
  ASSERT_EQ(meta["output_token_logprobs"].size(), r["output_ids"].size());
  EXPECT_EQ(meta["output_token_logprobs"][0][1], r["output_ids"][0]);
  EXPECT_FLOAT_EQ(meta["output_token_logprobs"][0][0].get<float>(), -0.5f);
  EXPECT_EQ(meta["output_top_logprobs"][0].size(), 2u);
}

TEST(SglangGenerate, StructuredOutputsAndRefusals) {
  Fixture f;
  f.say("7");
  f.post("/generate", {{"text", "n ="}, {"sampling_params", {{"json_schema", R"({"type": "integer"})"}}}});
  EXPECT_NE(f.backend.submitted.back().constraint, nullptr);
  f.post("/generate", {{"text", "n ="}, {"sampling_params", {{"regex", "[0-9]+"}}}});
  EXPECT_NE(f.backend.submitted.back().constraint, nullptr);
  const size_t sent = f.backend.submitted.size();
  for (const auto& [body, param] : std::vector<std::pair<json, std::string>>{
           {{{"text", "a"}, {"input_ids", {1}}}, "input_ids"},
           {json::object(), "text"},
           {{{"text", "a"}, {"sampling_params", {{"frobnicate", 1}}}}, "sampling_params.frobnicate"},
           {{{"text", "a"}, {"image_data", "x.png"}}, "image_data"},
           {{{"text", "a"}, {"return_logprob", true}, {"logprob_start_len", 0}}, "logprob_start_len"},
           {{{"text", 5}}, "text"}}) {
    EXPECT_EQ(f.post("/generate", body, 400)["error"]["param"], param) << body.dump();
  }
  EXPECT_EQ(f.backend.submitted.size(), sent) << "no refused request reached the engine";
}
