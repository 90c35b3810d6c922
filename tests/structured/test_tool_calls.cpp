// Forced tool calls: random walks over a vocabulary with GLM's markup tokens end on output the GLM
// tool parser reads as calls of the tools offered (only the named one when a function is named),
// with arguments that satisfy each tool's parameters schema.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>

#include "allowed_tokens.h"
#include "core/error.h"
#include "schema_check.h"
#include "structured/recognizer.h"
#include "structured/tool_calls.h"
#include "text/glm_parsers.h"

using namespace glms;
using ordered_json = nlohmann::ordered_json;

namespace {

const char* kTools = R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
    "properties": {"city": {"type": "string", "maxLength": 6}, "days": {"type": "integer", "minimum": 1, "maximum": 14},
                   "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city"]}}},
  {"type": "function", "function": {"name": "add", "parameters": {"type": "object",
    "properties": {"values": {"type": "array", "items": {"type": "number"}, "maxItems": 3}, "exact": {"type": "boolean"}},
    "required": ["values", "exact"]}}},
  {"type": "function", "function": {"name": "now"}}
])";

// Printable ASCII bytes, newline, some longer tokens, and the eight markup tokens at the end.
structured::TokenTexts tool_vocabulary() {
  std::vector<std::string> texts = {""};
  for (int c = 0x20; c < 0x7f; ++c) texts.emplace_back(1, static_cast<char>(c));
  texts.emplace_back("\n");
  for (const char* t : {"get", "_weather", "add", "city", "Paris", "true", "1.5", "celsius", "now"}) texts.emplace_back(t);
  std::vector<int32_t> markup;
  for (size_t i = 0; i < structured::kMarkupTokens.size(); ++i) {
    markup.push_back(static_cast<int32_t>(texts.size()));
    texts.emplace_back();
  }
  return structured::make_vocabulary(std::move(texts), markup);
}

// The output as the server's detokenizer writes it: reserved bytes back to their tags.
std::string as_text(const std::string& bytes) {
  std::string out;
  for (const unsigned char c : bytes)
    out += c >= structured::kFirstMarkupByte ? std::string(structured::kMarkupTokens[c - structured::kFirstMarkupByte])
                                             : std::string(1, static_cast<char>(c));
  return out;
}

std::vector<std::string> walks(const structured::ToolCallOptions& options, int count) {
  const auto vocab = tool_vocabulary();
  const auto grammar = structured::tool_call_grammar(ordered_json::parse(kTools), options);
  std::mt19937 rng(9);
  std::vector<std::string> out;
  for (int w = 0; w < count; ++w) {
    auto c = structured::make_grammar_constraint(grammar, vocab);
    std::string bytes;
    for (int step = 0; step < 400; ++step) {
      const std::vector<int> allowed = glms::testing::allowed_tokens(*c, vocab->vocab_size());
      if (c->may_end() && (allowed.empty() || rng() % 2 == 0)) break;
      if (allowed.empty()) {
        ADD_FAILURE() << "stuck after '" << as_text(bytes) << "'";
        break;
      }
      const int t = allowed[rng() % allowed.size()];
      bytes += vocab->texts[static_cast<size_t>(t)];
      c->accept(t);
    }
    if (c->may_end()) out.push_back(as_text(bytes));
  }
  return out;
}

void expect_valid_calls(const std::string& text, const std::string& only) {
  const text::ToolCallResult r = text::parse_tool_calls(text, kTools);
  ASSERT_FALSE(r.calls.empty()) << "'" << text << "'";
  EXPECT_EQ(r.finish_reason, "tool_calls");
  const ordered_json tools = ordered_json::parse(kTools);
  for (const text::ToolCall& call : r.calls) {
    if (!only.empty()) {
      EXPECT_EQ(call.name, only);
    }
    const ordered_json* params = nullptr;
    for (const auto& t : tools)
      if (t["function"]["name"] == call.name) params = &t["function"];
    ASSERT_NE(params, nullptr) << call.name;
    const ordered_json args = ordered_json::parse(call.arguments);
    if (params->contains("parameters"))
      EXPECT_EQ(glms::testing::schema_violation(args, (*params)["parameters"], (*params)["parameters"]), "")
          << call.arguments << " from '" << text << "'";
    else
      EXPECT_EQ(args, ordered_json::object());
  }
}

}  // namespace

TEST(ToolCalls, RequiredAlwaysYieldsValidCallsOfTheOfferedTools) {
  const std::vector<std::string> outputs = walks({}, 200);
  EXPECT_GT(outputs.size(), 150u);
  for (const std::string& text : outputs) expect_valid_calls(text, "");
}

TEST(ToolCalls, ANamedFunctionIsTheOnlyOneCalledAndOnlyOnceWithoutParallelCalls) {
  structured::ToolCallOptions options;
  options.function = "add";
  options.parallel = false;
  for (const std::string& text : walks(options, 100)) {
    expect_valid_calls(text, "add");
    EXPECT_EQ(text::parse_tool_calls(text, kTools).calls.size(), 1u) << text;
  }
  options.function = "missing";
  EXPECT_THROW(structured::tool_call_grammar(ordered_json::parse(kTools), options), Error);
}

TEST(ToolCalls, AfterAnOpenThinkBlockReasoningComesFirst) {
  structured::ToolCallOptions options;
  options.opens_reasoning = true;
  for (const std::string& text : walks(options, 60)) {
    const size_t close = text.find("</think>");
    ASSERT_NE(close, std::string::npos) << text;
    expect_valid_calls(text.substr(close + 8), "");
  }
}
