// GLM reasoning and tool-call parsers: table-driven cases (expected results follow vLLM's glm45
// reasoning and glm45/glm47 tool parsers, with the documented differences), value decoding, and
// a property test: any chunking of the input gives the one-shot result and never splits a tag.
#include <gtest/gtest.h>

#include <random>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/glm_arg_values.h"
#include "text/glm_parsers.h"

namespace glms::text {
namespace {

// ---------------------------------------------------------------------------------------------
// Cases

struct ReasoningCase {
  const char* name;
  std::string text;
  bool starts_in_reasoning;
  std::string reasoning;
  std::string content;
};

const std::vector<ReasoningCase>& reasoning_cases() {
  static const std::vector<ReasoningCase> cases = {
      {"plain", "Hello world", false, "", "Hello world"},
      {"empty", "", false, "", ""},
      {"empty_in_reasoning", "", true, "", ""},
      {"whitespace_only", "\n\n", false, "", "\n\n"},
      {"model_opens_block", "<think>abc</think>xyz", false, "abc", "xyz"},
      {"model_opens_after_newline", "\n<think>let me see\n</think>\nThe answer.", false, "let me see\n",
       "\nThe answer."},
      {"prompt_opened", "abc</think>xyz", true, "abc", "xyz"},
      {"prompt_opened_closes_at_once", "</think>Answer", true, "", "Answer"},
      {"prompt_opened_never_closed", "I answer directly.", true, "I answer directly.", ""},
      {"prompt_opened_model_repeats_open", "<think>abc</think>xyz", true, "abc", "xyz"},
      {"nested_open_dropped", "a<think>b</think>c", true, "ab", "c"},
      {"tags_after_close_are_content", "a</think>b<think>c</think>", true, "a", "b<think>c</think>"},
      {"thinking_disabled_all_content", "Answer </think> literal <think>", false, "",
       "Answer </think> literal <think>"},
      {"close_without_open_is_content", "abc</think>def", false, "", "abc</think>def"},
      {"tag_lookalikes", "a < b </thin and <th", true, "a < b </thin and <th", ""},
      {"thinking_word_not_tag", "<thinking>hi</thinking>", false, "", "<thinking>hi</thinking>"},
      {"unicode", "<think>思考 🤔</think>答案", false, "思考 🤔", "答案"},
      {"tool_call_ends_reasoning", "<tool_call>f\n</tool_call>", true, "", "<tool_call>f\n</tool_call>"},
      {"think_then_tool_call", "plan</think>\n<tool_call>f</tool_call>", true, "plan", "\n<tool_call>f</tool_call>"},
  };
  return cases;
}

const char* kTools = R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "zip": {"type": "string"},
                   "opts": {"type": "object"}, "tags": {"type": "array"}, "flag": {"type": "boolean"},
                   "note": {"type": ["string", "null"]}}}}},
  {"type": "function", "function": {"name": "get_time"}}
])";

struct ToolCase {
  const char* name;
  std::string text;
  std::string content;
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments
  bool with_tools = true;
};

const std::vector<ToolCase>& tool_cases() {
  static const std::vector<ToolCase> cases = {
      {"plain", "Just text, no calls.", "Just text, no calls.", {}},
      {"glm45_one_call",
       "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n"
       "<arg_value>3</arg_value>\n</tool_call>",
       "",
       {{"get_weather", R"({"city": "Paris", "days": 3})"}}},
      {"glm47_one_call", "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>", "",
       {{"get_weather", R"({"city": "Paris"})"}}},
      {"text_before", "Let me check.\n<tool_call>get_time</tool_call>", "Let me check.\n", {{"get_time", "{}"}}},
      {"no_args_newline", "<tool_call>get_time\n</tool_call>", "", {{"get_time", "{}"}}},
      {"two_calls",
       "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>\n"
       "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Rome</arg_value></tool_call>\n",
       "",
       {{"get_weather", R"({"city": "Paris"})"}, {"get_weather", R"({"city": "Rome"})"}}},
      {"typed_values",
       "<tool_call>get_weather\n<arg_key>zip</arg_key><arg_value>01234</arg_value>"
       "<arg_key>days</arg_key><arg_value>7</arg_value><arg_key>flag</arg_key><arg_value>true</arg_value>"
       "<arg_key>opts</arg_key><arg_value>{\"units\": \"metric\", \"n\": [1, 2.5]}</arg_value>"
       "<arg_key>tags</arg_key><arg_value>[\"a\", \"b\"]</arg_value><arg_key>city</arg_key><arg_value>42</arg_value>"
       "<arg_key>note</arg_key><arg_value>null</arg_value><arg_key>extra</arg_key><arg_value>1.5</arg_value>"
       "</tool_call>",
       "",
       {{"get_weather", R"({"zip": "01234", "days": 7, "flag": true, "opts": {"units": "metric", "n": [1, 2.5]}, )"
                        R"("tags": ["a", "b"], "city": "42", "note": "null", "extra": 1.5})"}}},
      {"python_literals",
       "<tool_call>get_weather<arg_key>flag</arg_key><arg_value>True</arg_value>"
       "<arg_key>opts</arg_key><arg_value>{'a': (1, 2), 'b': None}</arg_value>"
       "<arg_key>w</arg_key><arg_value>hello world</arg_value></tool_call>",
       "",
       {{"get_weather", R"({"flag": true, "opts": {"a": [1, 2], "b": null}, "w": "hello world"})"}}},
      {"no_schema_numbers",
       "<tool_call>anything<arg_key>zip</arg_key><arg_value>01234</arg_value>"
       "<arg_key>n</arg_key><arg_value>12345</arg_value><arg_key>s</arg_key><arg_value>\"quoted\"</arg_value>"
       "</tool_call>",
       "",
       {{"anything", R"({"zip": "01234", "n": 12345, "s": "quoted"})"}},
       false},
      {"unicode_and_escapes",
       "<tool_call>get_weather<arg_key>city</arg_key><arg_value>東京 🗼</arg_value>"
       "<arg_key>note</arg_key><arg_value>say \"hi\"\n\tthere\\</arg_value></tool_call>",
       "",
       {{"get_weather", R"({"city": "東京 🗼", "note": "say \"hi\"\n\tthere\\"})"}}},
      {"values_trimmed", "<tool_call>get_weather<arg_key> city </arg_key>\n<arg_value>\n  Paris \u3000\n</arg_value></tool_call>",
       "",
       {{"get_weather", R"({"city": "Paris"})"}}},
      {"duplicate_key",
       "<tool_call>f<arg_key>a</arg_key><arg_value>1</arg_value><arg_key>b</arg_key><arg_value>2</arg_value>"
       "<arg_key>a</arg_key><arg_value>3</arg_value></tool_call>",
       "",
       {{"f", R"({"a": 3, "b": 2})"}}},
      {"markup_inside_value",
       "<tool_call>f<arg_key>code</arg_key><arg_value>use <arg_key>k</arg_key> and <tool_call> here</arg_value>"
       "</tool_call>",
       "",
       {{"f", R"({"code": "use <arg_key>k</arg_key> and <tool_call> here"})"}}},
      {"text_after_call", "<tool_call>get_time</tool_call>\nDone.", "\nDone.", {{"get_time", "{}"}}},
      {"text_between_calls", "A<tool_call>get_time</tool_call> B <tool_call>get_time</tool_call>  ", "A B ",
       {{"get_time", "{}"}, {"get_time", "{}"}}},
      {"malformed_no_name", "x<tool_call>\n<arg_key>a</arg_key><arg_value>1</arg_value></tool_call>y",
       "x<tool_call>\n<arg_key>a</arg_key><arg_value>1</arg_value></tool_call>y", {}},
      {"malformed_name_with_space", "<tool_call>get weather</tool_call>", "<tool_call>get weather</tool_call>", {}},
      {"malformed_junk_between", "<tool_call>f<arg_key>a</arg_key>junk<arg_value>1</arg_value></tool_call>",
       "<tool_call>f<arg_key>a</arg_key>junk<arg_value>1</arg_value></tool_call>", {}},
      {"malformed_then_good", "<tool_call>f<arg_key>a</tool_call>\n<tool_call>get_time</tool_call>",
       "<tool_call>f<arg_key>a</tool_call>\n", {{"get_time", "{}"}}},
      {"close_tag_inside_value_ends_call",
       "<tool_call>f<arg_key>a</arg_key><arg_value>x</tool_call>y</arg_value></tool_call>",
       "<tool_call>f<arg_key>a</arg_key><arg_value>x</tool_call>y</arg_value></tool_call>", {}},
      {"unterminated", "Hi <tool_call>get_weather\n<arg_key>city</arg_key><arg_value>Par",
       "Hi <tool_call>get_weather\n<arg_key>city</arg_key><arg_value>Par", {}},
      {"call_then_unterminated", "<tool_call>get_time</tool_call>\n<tool_call>get_weather", "<tool_call>get_weather",
       {{"get_time", "{}"}}},
      {"tag_lookalikes", "a <tool b <tool_ca </tool_call> <arg_key>", "a <tool b <tool_ca </tool_call> <arg_key>", {}},
  };
  return cases;
}

const std::vector<std::string_view>& all_tags() {
  static const std::vector<std::string_view> tags = {kThinkOpen, kThinkClose, kToolCallOpen, kToolCallClose,
                                                     kArgKeyOpen, kArgKeyClose, kArgValueOpen, kArgValueClose};
  return tags;
}

// ---------------------------------------------------------------------------------------------
// Streaming helpers

// Concatenated deltas of one channel, with the offsets where deltas ended.
struct Channel {
  std::string text;
  std::vector<size_t> cuts;
  void add(const std::string& piece) {
    if (piece.empty()) return;
    text += piece;
    cuts.push_back(text.size());
  }
};

// No tag occurrence in `c` may straddle a delta boundary.
void expect_tags_whole(const Channel& c, const std::string& what) {
  for (std::string_view tag : all_tags()) {
    for (size_t at = c.text.find(tag); at != std::string::npos; at = c.text.find(tag, at + 1)) {
      for (size_t cut : c.cuts) {
        EXPECT_FALSE(cut > at && cut < at + tag.size()) << what << ": delta boundary inside " << tag << " at " << at;
      }
    }
  }
}

std::vector<std::string> split_at(const std::string& text, std::vector<size_t> cuts) {
  std::sort(cuts.begin(), cuts.end());
  std::vector<std::string> chunks;
  size_t prev = 0;
  for (size_t cut : cuts) {
    chunks.push_back(text.substr(prev, cut - prev));
    prev = cut;
  }
  chunks.push_back(text.substr(prev));
  return chunks;
}

// Every chunking tried on a text: whole, each two-way split, single bytes, and seeded random
// multi-way splits.
std::vector<std::vector<std::string>> chunkings(const std::string& text, uint32_t seed) {
  std::vector<std::vector<std::string>> out = {{text}};
  for (size_t i = 0; i <= text.size(); ++i) out.push_back(split_at(text, {i}));
  std::vector<size_t> every;
  for (size_t i = 1; i < text.size(); ++i) every.push_back(i);
  out.push_back(split_at(text, every));
  std::mt19937 rng(seed);
  for (int r = 0; r < 40 && text.size() > 1; ++r) {
    std::vector<size_t> cuts;
    size_t n = 1 + rng() % 8;
    for (size_t k = 0; k < n; ++k) cuts.push_back(rng() % (text.size() + 1));
    out.push_back(split_at(text, cuts));
  }
  return out;
}

struct Streamed {
  Channel reasoning, content;
  std::vector<ToolCallDelta> calls;
};

Streamed stream_reasoning(const std::vector<std::string>& chunks, bool starts) {
  Streamed s;
  ReasoningParser p(starts);
  for (const std::string& c : chunks) {
    ReasoningDelta d = p.feed(c);
    s.reasoning.add(d.reasoning);
    s.content.add(d.content);
  }
  ReasoningDelta d = p.finish();
  s.reasoning.add(d.reasoning);
  s.content.add(d.content);
  return s;
}

// The server's composition: reasoning first, tool calls on its content channel.
Streamed stream_pipeline(const std::vector<std::string>& chunks, bool starts, const std::string& tools) {
  Streamed s;
  ReasoningParser rp(starts);
  ToolCallParser tp(tools, {"call_"});
  auto take = [&](const ToolDelta& d) {
    s.content.add(d.content);
    for (const ToolCallDelta& c : d.calls) s.calls.push_back(c);
  };
  for (const std::string& c : chunks) {
    ReasoningDelta d = rp.feed(c);
    s.reasoning.add(d.reasoning);
    take(tp.feed(d.content));
  }
  ReasoningDelta d = rp.finish();
  s.reasoning.add(d.reasoning);
  take(tp.feed(d.content));
  take(tp.finish());
  return s;
}

// ---------------------------------------------------------------------------------------------
// Tests

TEST(GlmReasoning, Cases) {
  for (const ReasoningCase& c : reasoning_cases()) {
    ReasoningDelta r = parse_reasoning(c.text, c.starts_in_reasoning);
    EXPECT_EQ(r.reasoning, c.reasoning) << c.name;
    EXPECT_EQ(r.content, c.content) << c.name;
  }
}

TEST(GlmReasoning, ToolCallEndsReasoningCanBeTurnedOff) {
  ReasoningDelta r = parse_reasoning("<tool_call>f</tool_call>", true, /*tool_call_ends_reasoning=*/false);
  EXPECT_EQ(r.reasoning, "<tool_call>f</tool_call>");
  EXPECT_EQ(r.content, "");
}

TEST(GlmReasoning, HoldsOnlyPossibleTagPrefixes) {
  ReasoningParser p(true);
  EXPECT_EQ(p.feed("abc</th").reasoning, "abc");
  ReasoningDelta d = p.feed("ink>x");
  EXPECT_EQ(d.reasoning, "");
  EXPECT_EQ(d.content, "x");
  EXPECT_FALSE(p.in_reasoning());
  EXPECT_EQ(p.feed("<").content, "");  // could become a tag: held, in content too
  EXPECT_EQ(p.feed("b").content, "<b");
  EXPECT_TRUE(p.finish().empty());

  ReasoningParser q(true);
  EXPECT_EQ(q.feed("a <b").reasoning, "a <b");
  EXPECT_EQ(q.feed("<tool_").reasoning, "");
  EXPECT_EQ(q.finish().reasoning, "<tool_");

  ReasoningParser start(false);
  EXPECT_TRUE(start.feed("\n").empty());  // may still be followed by <think>
  EXPECT_TRUE(start.feed("<thi").empty());
  EXPECT_EQ(start.feed("s").content, "\n<this");
}

TEST(GlmReasoning, SpecialTokensArriveWhole) {
  ReasoningParser p(false);
  std::string reasoning, content;
  for (const char* piece : {"<think>", "Let", " me", " think", "</think>", "\n\n", "Hi", "!"}) {
    ReasoningDelta d = p.feed(piece);
    reasoning += d.reasoning;
    content += d.content;
  }
  EXPECT_TRUE(p.finish().empty());
  EXPECT_EQ(reasoning, "Let me think");
  EXPECT_EQ(content, "\n\nHi!");
}

TEST(GlmReasoning, PromptOpensReasoning) {
  EXPECT_TRUE(prompt_opens_reasoning("[gMASK]<sop><|user|>\nhi<|assistant|><think>"));
  EXPECT_TRUE(prompt_opens_reasoning("<|assistant|>\n<think>\n"));
  EXPECT_FALSE(prompt_opens_reasoning("<|assistant|></think>"));
  EXPECT_FALSE(prompt_opens_reasoning("<|assistant|>\n<think></think>"));
  EXPECT_FALSE(prompt_opens_reasoning("<|assistant|>\n"));
  EXPECT_FALSE(prompt_opens_reasoning(""));
}

TEST(GlmToolCalls, Cases) {
  for (const ToolCase& c : tool_cases()) {
    ToolCallResult r = parse_tool_calls(c.text, c.with_tools ? kTools : "", {"call_"});
    EXPECT_EQ(r.content, c.content) << c.name;
    ASSERT_EQ(r.calls.size(), c.calls.size()) << c.name;
    for (size_t i = 0; i < c.calls.size(); ++i) {
      EXPECT_EQ(r.calls[i].id, "call_" + std::to_string(i)) << c.name;
      EXPECT_EQ(r.calls[i].name, c.calls[i].first) << c.name;
      EXPECT_EQ(r.calls[i].arguments, c.calls[i].second) << c.name;
      EXPECT_TRUE(nlohmann::json::parse(r.calls[i].arguments).is_object()) << c.name;
    }
    EXPECT_EQ(r.finish_reason, c.calls.empty() ? "" : "tool_calls") << c.name;
  }
}

TEST(GlmToolCalls, RandomIdsAndStreamingShape) {
  ToolCallParser p(kTools);
  ToolDelta a = p.feed("Checking.<tool_call>get_weather\n<arg_key>city</arg_key>");
  EXPECT_EQ(a.content, "Checking.");
  EXPECT_TRUE(a.calls.empty());
  ToolDelta b = p.feed("<arg_value>Oslo</arg_value></tool_call><tool_call>get_time</tool_call>");
  ASSERT_EQ(b.calls.size(), 2u);
  EXPECT_EQ(b.calls[0].index, 0);
  EXPECT_EQ(b.calls[1].index, 1);
  EXPECT_EQ(b.calls[0].name, "get_weather");
  EXPECT_EQ(b.calls[0].arguments, R"({"city": "Oslo"})");
  for (const ToolCallDelta& c : b.calls) {
    ASSERT_EQ(c.id.size(), 5u + 24u);
    EXPECT_EQ(c.id.substr(0, 5), "call_");
    EXPECT_EQ(c.id.find_first_not_of("0123456789abcdef", 5), std::string::npos);
  }
  EXPECT_NE(b.calls[0].id, b.calls[1].id);
  EXPECT_EQ(p.calls_parsed(), 2);
  EXPECT_TRUE(p.finish().empty());
}

TEST(GlmToolCalls, BadToolsJsonThrows) {
  EXPECT_THROW(ToolCallParser("[{"), Error);
  EXPECT_THROW(ToolCallParser(R"({"type": "function"})"), Error);
  EXPECT_NO_THROW(ToolCallParser(R"([{"type": "function"}, 3, {"function": {"name": "x", "parameters": 1}}])"));
}

TEST(GlmToolCalls, ValueDecoding) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"5", "5"}, {"-3", "-3"}, {"1.5", "1.5"}, {"1E5", "100000.0"}, {"1e16", "1e+16"},
      {"1e15", "1000000000000000.0"}, {"0.0001", "0.0001"}, {"0.00001", "1e-05"}, {"-0.0", "-0.0"},
      {"0.1", "0.1"}, {"123456789.125", "123456789.125"}, {"true", "true"}, {"null", "null"},
      {"True", "true"}, {"False", "false"}, {"None", "null"}, {"'x'", R"("x")"}, {R"("x")", R"("x")"},
      {"{'a': (1, 2), 'b': None}", R"({"a": [1, 2], "b": null})"}, {"[1, 2,]", "[1, 2]"}, {"(1,)", "[1]"},
      {"()", "[]"}, {"(5)", "5"}, {"1, 2", "[1, 2]"}, {"1_000", "1000"}, {"0x1F", "31"}, {"0o17", "15"},
      {"0b101", "5"}, {"+5", "5"}, {"- 2.5", "-2.5"}, {"5.", "5.0"}, {".5", "0.5"}, {"007", R"("007")"},
      {"000", "0"}, {"{1, 2}", R"("{1, 2}")"}, {"1j", R"("1j")"}, {"abc", R"("abc")"}, {"'a' \"b\"", R"("ab")"},
      {R"('\u00e9\n')", R"("é\n")"}, {R"(r'\n')", R"("\\n")"}, {"b'x'", R"("b'x'")"}, {"{True: 1, 2: 'x'}",
      R"({"true": 1, "2": "x"})"}, {"[1,\n 2]", "[1, 2]"}, {"'a'\n'b'", R"("'a'\n'b'")"},
      {R"({"a": {"b": [true, false, 1.0]}})", R"({"a": {"b": [true, false, 1.0]}})"},
      {"{\"k\": \"\\u0001\"}", R"({"k": "\u0001"})"}, {"'''multi\nline'''", R"("multi\nline")"},
      {"[1, [2, [3]]]", "[1, [2, [3]]]"}, {"18446744073709551615", "18446744073709551615"},
      {"-9223372036854775808", "-9223372036854775808"}, {"--5", R"("--5")"}, {"1__0", R"("1__0")"},
      {"'unterminated", R"("'unterminated")"}, {"[1, 2", R"("[1, 2")"}, {"NaN", R"("NaN")"},
      {"1e999", R"("1e999")"}, {"[1, -1e400]", R"("[1, -1e400]")"},
  };
  for (const auto& [in, want] : cases) EXPECT_EQ(detail::decode_value_json(in), want) << in;
}

TEST(GlmToolCalls, PyStrip) {
  EXPECT_EQ(detail::py_strip(" \t\n a b \r\n"), "a b");
  EXPECT_EQ(detail::py_strip("\u3000\u00a0x\u2003\u0085"), "x");
  EXPECT_EQ(detail::py_strip("\u200bx"), "\u200bx");  // zero-width space is not whitespace
  EXPECT_EQ(detail::py_strip("  "), "");
  EXPECT_EQ(detail::py_strip("é"), "é");
}

// Property: every chunking gives the one-shot result and keeps every tag in one delta.
TEST(GlmParsersProperty, ReasoningChunkingInvariant) {
  uint32_t seed = 1;
  for (const ReasoningCase& c : reasoning_cases()) {
    ReasoningDelta whole = parse_reasoning(c.text, c.starts_in_reasoning);
    for (const auto& chunks : chunkings(c.text, seed++)) {
      Streamed s = stream_reasoning(chunks, c.starts_in_reasoning);
      ASSERT_EQ(s.reasoning.text, whole.reasoning) << c.name << " in " << chunks.size() << " chunks";
      ASSERT_EQ(s.content.text, whole.content) << c.name << " in " << chunks.size() << " chunks";
      expect_tags_whole(s.reasoning, c.name);
      expect_tags_whole(s.content, c.name);
    }
  }
}

TEST(GlmParsersProperty, ToolCallChunkingInvariant) {
  uint32_t seed = 100;
  for (const ToolCase& c : tool_cases()) {
    std::string tools = c.with_tools ? kTools : "";
    ToolCallResult whole = parse_tool_calls(c.text, tools, {"call_"});
    for (const auto& chunks : chunkings(c.text, seed++)) {
      Streamed s;
      ToolCallParser p(tools, {"call_"});
      for (const std::string& chunk : chunks) {
        ToolDelta d = p.feed(chunk);
        s.content.add(d.content);
        s.calls.insert(s.calls.end(), d.calls.begin(), d.calls.end());
      }
      ToolDelta d = p.finish();
      s.content.add(d.content);
      s.calls.insert(s.calls.end(), d.calls.begin(), d.calls.end());
      ASSERT_EQ(s.content.text, whole.content) << c.name << " in " << chunks.size() << " chunks";
      ASSERT_EQ(s.calls.size(), whole.calls.size()) << c.name;
      for (size_t i = 0; i < s.calls.size(); ++i) {
        EXPECT_EQ(s.calls[i].index, static_cast<int>(i));
        EXPECT_EQ(s.calls[i].id, whole.calls[i].id);
        EXPECT_EQ(s.calls[i].name, whole.calls[i].name);
        EXPECT_EQ(s.calls[i].arguments, whole.calls[i].arguments);
      }
      expect_tags_whole(s.content, c.name);
    }
  }
}

// The composed pipeline (thinking, then calls) against the composed one-shot helpers.
TEST(GlmParsersProperty, PipelineChunkingInvariant) {
  struct Case {
    std::string text;
    bool starts;
  };
  const std::vector<Case> cases = {
      {"I should look up the weather.</think>\nSure.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n"
       "<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>",
       true},
      {"\n<think>hmm <b>bold</b></think>\nAnswer: 42", false},
      {"<tool_call>get_time</tool_call>", true},
      {"</think><tool_call>get_weather<arg_key>zip</arg_key><arg_value>007</arg_value></tool_call>\n", true},
      {"No think block, <tool_call>broken", false},
  };
  uint32_t seed = 1000;
  for (const Case& c : cases) {
    ReasoningDelta r = parse_reasoning(c.text, c.starts);
    ToolCallResult t = parse_tool_calls(r.content, kTools, {"call_"});
    for (const auto& chunks : chunkings(c.text, seed++)) {
      Streamed s = stream_pipeline(chunks, c.starts, kTools);
      ASSERT_EQ(s.reasoning.text, r.reasoning) << c.text;
      ASSERT_EQ(s.content.text, t.content) << c.text;
      ASSERT_EQ(s.calls.size(), t.calls.size()) << c.text;
      for (size_t i = 0; i < s.calls.size(); ++i) EXPECT_EQ(s.calls[i].arguments, t.calls[i].arguments);
      expect_tags_whole(s.reasoning, c.text);
      expect_tags_whole(s.content, c.text);
    }
  }
  ReasoningDelta r = parse_reasoning(cases[0].text, true);
  ToolCallResult t = parse_tool_calls(r.content, kTools, {"call_"});
  EXPECT_EQ(r.reasoning, "I should look up the weather.");
  EXPECT_EQ(t.content, "\nSure.\n");
  ASSERT_EQ(t.calls.size(), 1u);
  EXPECT_EQ(t.calls[0].arguments, R"({"city": "Paris", "days": 2})");
}

}  // namespace
}  // namespace glms::text
