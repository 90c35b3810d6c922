// vLLM's structural tags: strings are accepted exactly when their every trigger opens one of its
// structures (the rest of the begin, JSON valid against the schema, the end) with free text
// around; random walks over a vocabulary end on such text (checked by a scanner written from
// the definition, and the schema oracle); markup triggers stand for their reserved bytes; specs
// that cannot be followed are refused naming what is wrong.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>

#include "allowed_tokens.h"
#include "core/error.h"
#include "schema_check.h"
#include "structured/recognizer.h"
#include "structured/structural_tag.h"
#include "structured/vocabulary.h"

using namespace glms;
using ordered_json = nlohmann::ordered_json;

namespace {

const char* kSpec = R"({
  "type": "structural_tag",
  "structures": [
    {"begin": "<function=weather>", "schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 5}},
                                               "required": ["city"]}, "end": "</function>"},
    {"begin": "<function=add>", "schema": {"type": "array", "items": {"type": "integer"}, "maxItems": 3},
     "end": "</function>"}],
  "triggers": ["<function="]
})";

bool accepts(const std::shared_ptr<const structured::Grammar>& grammar, const std::string& text) {
  structured::Recognizer r(grammar);
  int32_t state = r.start();
  for (const unsigned char c : text) {
    state = r.step(state, c);
    if (state == structured::Recognizer::kDead) return false;
  }
  return r.accepting(state);
}

// Where `text` breaks the structural tag of kSpec (empty: nowhere): each "<function=" must begin
// one structure whose JSON (up to some "</function>") satisfies its schema.
std::string violation(const std::string& text) {
  const ordered_json spec = ordered_json::parse(kSpec);
  size_t at = 0;
  while (true) {
    const size_t trigger = text.find("<function=", at);
    if (trigger == std::string::npos) return "";
    bool matched = false;
    for (const ordered_json& s : spec["structures"]) {
      const std::string begin = s["begin"];
      if (text.compare(trigger, begin.size(), begin) != 0) continue;
      const size_t body = trigger + begin.size();
      for (size_t end = text.find("</function>", body); end != std::string::npos && !matched;
           end = text.find("</function>", end + 1)) {
        const ordered_json value = ordered_json::parse(text.substr(body, end - body), nullptr, false);
        if (value.is_discarded() || !glms::testing::schema_violation(value, s["schema"], s["schema"]).empty()) continue;
        matched = true;
        at = end + std::string("</function>").size();
      }
      if (matched) break;
    }
    if (!matched) return "no structure follows the trigger at " + std::to_string(trigger);
  }
}

}  // namespace

TEST(StructuralTag, AcceptsFreeTextAroundItsStructuresOnly) {
  const auto g = structured::structural_tag_grammar(ordered_json::parse(kSpec));
  EXPECT_TRUE(accepts(g, ""));
  EXPECT_TRUE(accepts(g, "no call at all, <function but not a trigger"));
  EXPECT_TRUE(accepts(g, R"(Let me look. <function=weather>{"city": "Paris"}</function> and then <function=add>[1, 2]</function>.)"));
  EXPECT_TRUE(accepts(g, R"(<function=weather>{"city":"Rome"}</function>)"));
  EXPECT_TRUE(accepts(g, "<function=add>\n[3]\n</function>")) << "whitespace around the JSON";
  EXPECT_FALSE(accepts(g, R"(<function=other>{"city": "Paris"}</function>)")) << "a begin no structure has";
  EXPECT_FALSE(accepts(g, R"(<function=weather>{"city": 7}</function>)")) << "JSON outside the schema";
  EXPECT_FALSE(accepts(g, R"(<function=weather>{"city": "Berlin"}</function>)")) << "maxLength 5";
  EXPECT_FALSE(accepts(g, R"(<function=add>[1, 2, 3, 4]</function>)")) << "maxItems 3";
  EXPECT_FALSE(accepts(g, R"(text <function=add>[1])")) << "ended inside a structure";
  EXPECT_FALSE(accepts(g, R"(<function=add>[1]</func)")) << "ended inside its end";
}

TEST(StructuralTag, RandomWalksEndOnStructuredText) {
  std::vector<std::string> texts = {""};
  for (const char* t : {"<function=", "<function=weather>", "weather>", "add>", "<func", "tion=", "</function>", "{", "}",
                        "\"city\"", "\"Rome\"", "23", "hi"})
    texts.emplace_back(t);
  for (int c = 0x20; c < 0x7f; ++c) texts.emplace_back(1, static_cast<char>(c));  // every text can be spelt
  texts.emplace_back("\n");
  const auto vocab = structured::make_vocabulary(texts);
  const auto grammar = structured::structural_tag_grammar(ordered_json::parse(kSpec));
  std::mt19937 rng(17);
  int structured_walks = 0;
  for (int w = 0; w < 300; ++w) {
    auto c = structured::make_grammar_constraint(grammar, vocab);
    std::string text;
    for (int step = 0; step < 60; ++step) {
      const std::vector<int> allowed = glms::testing::allowed_tokens(*c, vocab->vocab_size());
      if (c->may_end() && (allowed.empty() || rng() % 8 == 0)) break;
      ASSERT_FALSE(allowed.empty()) << "stuck after '" << text << "'";
      // Lean towards the trigger, so that walks reach the structures.
      int t = allowed[rng() % allowed.size()];
      if (rng() % 3 == 0 && std::find(allowed.begin(), allowed.end(), 1) != allowed.end()) t = 1;
      text += vocab->texts[static_cast<size_t>(t)];
      c->accept(t);
    }
    if (!c->may_end()) continue;
    EXPECT_EQ(violation(text), "") << text;
    EXPECT_TRUE(accepts(grammar, text)) << text;
    structured_walks += text.find("</function>") != std::string::npos;
  }
  EXPECT_GT(structured_walks, 10);
}

// GLM's markup tokens in a trigger, begin or end are their reserved bytes, as the constraint
// sees the tokens; outside a trigger the free text holds no markup.
TEST(StructuralTag, MarkupTokensAreTheirReservedBytes) {
  const auto g = structured::structural_tag_grammar(ordered_json::parse(R"({
    "structures": [{"begin": "<tool_call>lookup", "schema": {"type": "boolean"}, "end": "</tool_call>"}],
    "triggers": ["<tool_call>"]})"));
  const std::string open(1, structured::markup_byte("<tool_call>")), close(1, structured::markup_byte("</tool_call>"));
  EXPECT_TRUE(accepts(g, "ok " + open + "lookup true" + close + " done"));
  EXPECT_FALSE(accepts(g, "ok " + open + "lookup maybe" + close));
  EXPECT_TRUE(accepts(g, "ok <tool_call>lookup maybe</tool_call>")) << "the tag's text is free text, not the trigger";
  EXPECT_FALSE(accepts(g, "ok " + close)) << "markup outside a structure";
}

// After a prompt that opens the reasoning, its text and </think> come first, unconstrained; the
// tag holds from there.
TEST(StructuralTag, ReasoningComesFirstWhereThePromptOpensIt) {
  const auto g = structured::structural_tag_grammar(ordered_json::parse(kSpec), true);
  const std::string close(1, structured::markup_byte("</think>"));
  EXPECT_TRUE(accepts(g, "let me think: <function=other> is fine here" + close + R"(ok <function=add>[1]</function>)"));
  EXPECT_FALSE(accepts(g, "thinking" + close + "<function=other>[1]</function>")) << "after the reasoning the tag holds";
  EXPECT_FALSE(accepts(g, "no reasoning closed")) << "the reasoning must end";
  EXPECT_FALSE(accepts(structured::structural_tag_grammar(ordered_json::parse(kSpec)), "a" + close))
      << "without an open reasoning, no </think>";
}

// A structure without a schema takes any JSON value; 64 triggers of 16 bytes build at once.
TEST(StructuralTag, NoSchemaTakesAnyJsonAndManyTriggersBuild) {
  const auto g = structured::structural_tag_grammar(
      ordered_json::parse(R"({"structures": [{"begin": "<v>", "end": "</v>"}], "triggers": ["<v>"]})"));
  EXPECT_TRUE(accepts(g, R"(x <v>{"a": [1, "b", null]}</v> y <v>3</v>)"));
  EXPECT_FALSE(accepts(g, R"(x <v>{"a": </v>)"));
  ordered_json many = {{"structures", ordered_json::array()}, {"triggers", ordered_json::array()}};
  for (int i = 0; i < 64; ++i) {
    const std::string trigger = "<call_" + std::to_string(100000 + i) + "_nm=";  // 16 bytes
    many["triggers"].push_back(trigger);
    many["structures"].push_back({{"begin", trigger + ">"}, {"schema", {{"type", "integer"}}}, {"end", "</call>"}});
  }
  const auto big = structured::structural_tag_grammar(many);
  EXPECT_TRUE(accepts(big, "a <call_100063_nm=>7</call> b <call_100000_nm=>-2</call>"));
  EXPECT_FALSE(accepts(big, "a <call_100063_nm=>x</call>"));
}

TEST(StructuralTag, SpecsThatCannotBeFollowedAreRefused) {
  auto refusal = [](const char* spec) {
    try {
      structured::structural_tag_grammar(ordered_json::parse(spec));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  const char* schema = R"("schema": {"type": "null"})";
  EXPECT_NE(refusal((std::string(R"({"structures": [{"begin": "<a>", )") + schema + R"(, "end": "</a>"}], "triggers": ["<a", "a"]})").c_str())
                .find("is inside trigger"),
            std::string::npos);
  EXPECT_NE(refusal((std::string(R"({"structures": [{"begin": "<b>", )") + schema + R"(, "end": ""}], "triggers": ["<a"]})").c_str())
                .find("starts with none of the triggers"),
            std::string::npos);
  EXPECT_NE(refusal((std::string(R"({"structures": [{"begin": "<a>", )") + schema + R"(, "end": ""}], "triggers": ["<a", "<c"]})").c_str())
                .find("no structure's begin starts with trigger '<c'"),
            std::string::npos);
  EXPECT_NE(refusal((std::string(R"({"structures": [{"begin": "<a>", )") + schema + R"(, "end": ""}], "triggers": [)" +
                     [] {
                       std::string many;
                       for (int i = 0; i < 65; ++i) many += (i ? ",\"<" : "\"<") + std::to_string(1000 + i) + "\"";
                       return many;
                     }() + "]}")
                        .c_str())
                .find("at most 64 triggers"),
            std::string::npos);
  EXPECT_NE(refusal(("{\"structures\": [{\"begin\": \"<a>\", \"end\": \"\"}], \"triggers\": [\"<a" + std::string(1100, 'x') +
                     "\"]}")
                        .c_str())
                .find("more than 1024"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"format": {"type": "triggered_tags"}})").find("format form is not supported"), std::string::npos);
  EXPECT_NE(refusal(R"({"structures": [], "triggers": ["<a"]})").find("structures must be"), std::string::npos);
  EXPECT_NE(refusal(R"({"structures": [{"begin": "<a>", "schema": {"type": "nonsense"}, "end": ""}], "triggers": ["<a"]})"),
            "accepted")
      << "the schema compiler's own refusal";
}
