// The JSON schema constraint: for 100 generated schemas, random walks over the allowed tokens of a
// JSON-ish vocabulary end on text that parses and satisfies the schema (checked by an independent
// validator, schema_check.h); integer bounds admit exactly the integers in range; properties keep
// their declared order; unsupported keywords are refused by name.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <random>

#include "allowed_tokens.h"
#include "core/error.h"
#include "schema_check.h"
#include "schema_generator.h"
#include "structured/json_schema.h"

using namespace glms;
using ordered_json = nlohmann::ordered_json;

namespace {

// Every printable ASCII byte and newline as a token, and some longer tokens JSON often uses.
structured::TokenTexts walk_vocabulary() {
  std::vector<std::string> texts = {""};
  for (int c = 0x20; c < 0x7f; ++c) texts.emplace_back(1, static_cast<char>(c));
  texts.emplace_back("\n");
  for (const char* t : {"{\"", "\":", "\": ", "\",", ", \"", "true", "false", "null", "12", "2024", "-0", "é", "日本",
                        "\\n", "\\u00e9", "abc", "  ", "\"}", "]}", "[{", "1.5", "e+"})
    texts.emplace_back(t);
  return structured::make_vocabulary(std::move(texts));
}
int byte_token(unsigned char c) { return c == '\n' ? 0x7f - 0x20 + 1 : (c >= 0x20 && c < 0x7f ? c - 0x20 + 1 : -1); }

// Walks of up to 3000 tokens; returns the texts of the walks that ended.
std::vector<std::string> walks(const ordered_json& schema, int count, uint32_t seed) {
  const auto vocab = walk_vocabulary();
  const int n = vocab->vocab_size();
  std::mt19937 rng(seed);
  std::vector<std::string> out;
  for (int w = 0; w < count; ++w) {
    auto c = structured::make_json_schema_constraint(schema, vocab);
    std::string text;
    for (int step = 0; step < 3000; ++step) {
      const std::vector<int> options = glms::testing::allowed_tokens(*c, n);
      if (c->may_end() && (options.empty() || rng() % 4 == 0)) break;
      if (options.empty()) {
        ADD_FAILURE() << "stuck after '" << text << "' for " << schema.dump();
        return out;
      }
      const int t = options[rng() % options.size()];
      text += vocab->texts[static_cast<size_t>(t)];
      c->accept(t);
    }
    if (c->may_end()) out.push_back(text);
  }
  return out;
}

}  // namespace

TEST(JsonSchema, HundredGeneratedSchemasEveryOutputParsesAndValidates) {
  glms::testing::SchemaGenerator gen(11);
  int outputs = 0;
  for (int i = 0; i < 100; ++i) {
    const ordered_json schema = i % 3 == 0 ? gen.object_schema(0) : gen.schema(0);
    for (const std::string& text : walks(schema, 6, static_cast<uint32_t>(i))) {
      ++outputs;
      const ordered_json v = ordered_json::parse(text, nullptr, false);
      ASSERT_FALSE(v.is_discarded()) << "'" << text << "' does not parse; schema " << schema.dump();
      EXPECT_EQ(glms::testing::schema_violation(v, schema, schema), "") << "'" << text << "' for " << schema.dump();
    }
  }
  EXPECT_GT(outputs, 500);  // nearly every walk ends: the grammar bounds every length
}

TEST(JsonSchema, IntegerBoundsAdmitExactlyTheIntegersInRange) {
  const auto vocab = walk_vocabulary();
  for (const auto& [lo, hi] : std::vector<std::pair<int, int>>{{-17, 42}, {0, 9}, {5, 1000}, {-250, -3}, {99, 101}}) {
    const ordered_json schema{{"type", "integer"}, {"minimum", lo}, {"maximum", hi}};
    for (int x = -300; x <= 1100; ++x) {
      auto c = structured::make_json_schema_constraint(schema, vocab);
      EXPECT_EQ(glms::testing::writes_whole(*c, vocab->vocab_size(), std::to_string(x), byte_token), x >= lo && x <= hi)
          << x << " in [" << lo << ", " << hi << "]";
    }
  }
  auto leading_zero = structured::make_json_schema_constraint(ordered_json{{"type", "integer"}}, vocab);
  EXPECT_FALSE(glms::testing::writes_whole(*leading_zero, vocab->vocab_size(), "012", byte_token));
}

// Number bounds, inclusive and exclusive, fractional and not, of either sign: a number is written
// exactly when its value lies within them, bare or with at least as many fraction digits as the
// bounds have (at most 16), never with an exponent, never as a negative zero.
TEST(JsonSchema, NumberBoundsAdmitExactlyTheNumbersInRange) {
  const auto vocab = walk_vocabulary();
  constexpr double kNone = std::numeric_limits<double>::infinity();
  struct Case {
    const char* schema;
    double lo, hi;  // the bounds the schema means (-kNone, kNone: none)
    bool lo_exclusive, hi_exclusive;
    int scale;  // fraction digits a written fraction needs at least
  };
  const std::vector<Case> cases = {
      {R"({"type":"number","minimum":0.5,"maximum":2.75})", 0.5, 2.75, false, false, 2},
      {R"({"type":"number","exclusiveMinimum":-1.25,"maximum":0})", -1.25, 0, true, false, 2},
      {R"({"type":"number","minimum":-3,"exclusiveMaximum":3})", -3, 3, false, true, 0},
      {R"({"type":"number","minimum":0,"maximum":1})", 0, 1, false, false, 0},
      {R"({"type":"number","exclusiveMinimum":0})", 0, kNone, true, false, 0},
      {R"({"type":"number","maximum":-0.125})", -kNone, -0.125, false, false, 3},
      {R"({"type":"number","minimum":-2.5,"exclusiveMinimum":-2,"maximum":1.5,"exclusiveMaximum":1.5})", -2, 1.5, true, true, 1},
      {R"({"type":"number","minimum":1.5,"exclusiveMinimum":true,"maximum":3.5})", 1.5, 3.5, true, false, 1},
  };
  std::vector<std::string> texts;
  for (int eighths = -40; eighths <= 40; ++eighths) {
    const double x = eighths / 8.0;
    for (const char* format : {"%.0f", "%.1f", "%.2f", "%.3f", "%.5f"}) {
      char text[32];
      std::snprintf(text, sizeof(text), format, x);
      if (std::strtod(text, nullptr) == x) texts.emplace_back(text);  // only exact renderings
    }
  }
  for (const char* extra : {"0.0001", "-0.0001", "2.7500", "2.7501", "0.4999", "-0", "-0.0", "1e0", "0.5e1", "3.", ".5",
                            "01", "-1.2500001", "1.50000000000000001"})
    texts.emplace_back(extra);
  for (const Case& c : cases) {
    const ordered_json schema = ordered_json::parse(c.schema);
    for (const std::string& text : texts) {
      const double x = std::strtod(text.c_str(), nullptr);
      const size_t point = text.find('.');
      const int fraction = point == std::string::npos ? 0 : static_cast<int>(text.size() - point - 1);
      const bool json = !ordered_json::parse(text, nullptr, false).is_discarded();
      const bool within = (c.lo_exclusive ? x > c.lo : x >= c.lo) && (c.hi_exclusive ? x < c.hi : x <= c.hi);
      const bool written_so = text.find_first_of("eE") == std::string::npos && !(text[0] == '-' && x == 0.0) &&
                              (point == std::string::npos || (fraction >= c.scale && fraction <= 16));
      auto constraint = structured::make_json_schema_constraint(schema, vocab);
      EXPECT_EQ(glms::testing::writes_whole(*constraint, vocab->vocab_size(), text, byte_token), json && within && written_so)
          << "'" << text << "' for " << c.schema;
    }
  }
}

TEST(JsonSchema, PropertiesKeepTheirOrderAndRequiredOnesAppear) {
  const auto vocab = walk_vocabulary();
  const ordered_json schema = ordered_json::parse(
      R"({"type":"object","properties":{"zeta":{"type":"integer"},"alpha":{"type":"boolean"},"mid":{"type":"null"}},
          "required":["alpha"]})");
  auto ok = [&](const std::string& text) {
    auto c = structured::make_json_schema_constraint(schema, vocab);
    return glms::testing::writes_whole(*c, vocab->vocab_size(), text, byte_token);
  };
  EXPECT_TRUE(ok(R"({"zeta": 3, "alpha": true})"));
  EXPECT_TRUE(ok(R"({"alpha":false,"mid":null})"));
  EXPECT_FALSE(ok(R"({"alpha": true, "zeta": 3})"));  // out of order
  EXPECT_FALSE(ok(R"({"zeta": 3})"));                 // alpha is required
  EXPECT_FALSE(ok(R"({"alpha": true, "other": 1})"));  // no undeclared properties
  EXPECT_FALSE(ok(R"({"alpha": true,})"));
}

TEST(JsonSchema, RecursiveReferencesWork) {
  const auto vocab = walk_vocabulary();
  const ordered_json schema = ordered_json::parse(
      R"({"$ref":"#/$defs/node","$defs":{"node":{"type":"object","properties":{"v":{"type":"integer","minimum":0,"maximum":9},
          "next":{"anyOf":[{"$ref":"#/$defs/node"},{"type":"null"}]}},"required":["v","next"]}}})");
  auto c = structured::make_json_schema_constraint(schema, vocab);
  EXPECT_TRUE(glms::testing::writes_whole(*c, vocab->vocab_size(), R"({"v":1,"next":{"v":2,"next":null}})", byte_token));
}

// Arrays of arrays and objects of optional objects 100 deep compile (each subschema once: its
// uses refer to it, where copies of copies grew exponentially, 23 s at 16 levels of arrays);
// 2000 deep are refused by name, not by the stack.
TEST(JsonSchema, SubschemasNestedPastTheLimitAreRefused) {
  const auto vocab = walk_vocabulary();
  auto nested = [](int depth, const std::string& open = R"({"type":"array","items":)") {
    std::string text;
    for (int i = 0; i < depth; ++i) text += open;
    text += R"({"type":"integer"})";
    const auto unclosed = std::count(open.begin(), open.end(), '{') - std::count(open.begin(), open.end(), '}');
    return ordered_json::parse(text + std::string(depth * unclosed, '}'));
  };
  EXPECT_NO_THROW(structured::make_json_schema_constraint(nested(100), vocab));
  const auto objects = nested(100, R"({"type":"object","properties":{"b":{"type":"integer"},"a":)");
  auto c = structured::make_json_schema_constraint(objects, vocab);
  EXPECT_TRUE(glms::testing::writes_whole(*c, vocab->vocab_size(), R"({"b":1,"a":{"a":{}}})", byte_token));
  try {
    structured::make_json_schema_constraint(nested(2000), vocab);
    ADD_FAILURE() << "2000 levels were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nest deeper than 128"), std::string::npos) << e.what();
  }
}

TEST(JsonSchema, UnsupportedKeywordsAreRefusedByName) {
  const auto vocab = walk_vocabulary();
  for (const auto& [schema, word] : std::vector<std::pair<const char*, const char*>>{
           {R"({"type":"string","contentEncoding":"base64"})", "contentEncoding"},
           {R"({"type":"array","uniqueItems":true})", "uniqueItems"},
           {R"({"type":"number","multipleOf":0.5})", "multipleOf"},
           {R"({"type":"number","minimum":3,"maximum":2.5})", "no number lies within"},
           {R"({"type":"number","minimum":0.12345678901234567})", "fraction digits"},
           {R"({"not":{"type":"null"}})", "not"},
           {R"({"type":"object","properties":{"a":{"type":"string"}},"required":["b"]})", "'b'"},
           {R"({"$ref":"http://example.com/s.json"})", "not local"}}) {
    try {
      structured::make_json_schema_constraint(ordered_json::parse(schema), vocab);
      ADD_FAILURE() << schema << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(word), std::string::npos) << e.what();
    }
  }
}
