// GLM output parsers: split the model's decoded text into the OpenAI fields `reasoning_content`,
// `content` and `tool_calls`, while it streams (in arbitrary chunks) or all at once. They give
// the results of vLLM's `glm45` reasoning parser and `glm45`/`glm47` tool-call parsers, with the
// deliberate differences listed in docs/tool_calls.md.
//
// Composition (what the server does): feed the decoded text into a ReasoningParser; feed the
// `content` it returns into a ToolCallParser (when the request has tools); send `reasoning` as
// reasoning_content deltas, the tool parser's `content` as content deltas and its calls as
// tool_calls deltas. At the end call finish() on both, in that order, feeding the reasoning
// parser's last content into the tool parser before its finish().
//
// Streaming contract shared by both parsers:
//  - Concatenating every delta of feed()* + finish() gives exactly the one-shot result
//    (parse_reasoning / parse_tool_calls) for the concatenated input, however it was chunked.
//  - A delta never holds part of a GLM tag (the k* constants below, markup or literal text):
//    a suffix that could still become one ("<", "</th", "<tool_ca") is held back until the next
//    chunk decides it, or finish(). Nothing else is held back, except where documented below.
//  - Bytes are passed through unchanged; splits only happen before '<' or at the callers' chunk
//    boundaries, so valid UTF-8 chunks in give valid UTF-8 deltas out.
//  - An empty string means "nothing on this channel"; the server maps it to an absent field.
#pragma once

#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace glms::text {

inline constexpr std::string_view kThinkOpen = "<think>";
inline constexpr std::string_view kThinkClose = "</think>";
inline constexpr std::string_view kToolCallOpen = "<tool_call>";
inline constexpr std::string_view kToolCallClose = "</tool_call>";
inline constexpr std::string_view kArgKeyOpen = "<arg_key>";
inline constexpr std::string_view kArgKeyClose = "</arg_key>";
inline constexpr std::string_view kArgValueOpen = "<arg_value>";
inline constexpr std::string_view kArgValueClose = "</arg_value>";

// ---------------------------------------------------------------------------------------------
// Reasoning (`<think>` ... `</think>`)

struct ReasoningDelta {
  std::string reasoning;  // -> reasoning_content
  std::string content;    // -> content (or the tool-call parser's input)
  bool empty() const { return reasoning.empty() && content.empty(); }
};

// True when the rendered prompt leaves a think block open, i.e. it ends (ignoring trailing
// whitespace) in `<think>`: the GLM-4.7/5 templates write `<|assistant|><think>` when thinking
// is on and `<|assistant|></think>` or `<think></think>` when it is off. This is the value to
// pass as `starts_in_reasoning`.
bool prompt_opens_reasoning(std::string_view prompt);

// States and rules (vLLM glm45 = DeepSeek-R1 rules while thinking, identity otherwise):
//  - starts_in_reasoning: everything up to the first `</think>` is reasoning; the tag is dropped
//    and everything after it is content, verbatim (later tags included). A `<think>` tag inside
//    the reasoning is dropped. If `</think>` never comes, all of the text is reasoning (as vLLM):
//    content stays empty. One exception (not in vLLM, on by default): a `<tool_call>` tag ends
//    the reasoning implicitly, so a model that skips thinking and calls a tool at once still
//    gets its call parsed; the tag and what follows are content.
//  - !starts_in_reasoning: leading whitespace is held; if the first non-whitespace text is
//    `<think>`, that whitespace and the tag are dropped and a think block starts as above (the
//    GLM-4.5 style, where the model opens the block itself). Otherwise everything is content,
//    verbatim, with no tag handling at all (this includes `<think></think>` prompts: thinking
//    disabled means the output is all content).
// Whitespace around the tags is kept (vLLM does not strip either).
class ReasoningParser {
 public:
  explicit ReasoningParser(bool starts_in_reasoning, bool tool_call_ends_reasoning = true);

  ReasoningDelta feed(std::string_view text);
  // Flushes what was held back. Feeding after finish() is a logic error (GLMS_CHECK).
  ReasoningDelta finish();

  // True while the parser is inside a think block (or may still open one at the start).
  bool in_reasoning() const { return state_ != State::kContent; }

 private:
  enum class State { kStart, kReasoning, kContent };
  void run(ReasoningDelta& out, bool at_end);

  State state_;
  bool tool_call_ends_reasoning_;
  bool finished_ = false;
  std::string pending_;  // text not yet decided (held-back tag prefix, leading whitespace)
};

// One-shot form: the same as feed(text) + finish() on a fresh parser.
ReasoningDelta parse_reasoning(std::string_view text, bool starts_in_reasoning,
                               bool tool_call_ends_reasoning = true);

// ---------------------------------------------------------------------------------------------
// Tool calls (`<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>...</tool_call>`)

// A complete call, as in the OpenAI `tool_calls` array (type is always "function").
struct ToolCall {
  std::string id;         // "call_" + 24 hex digits, or options' id_prefix + index
  std::string name;
  std::string arguments;  // JSON object text, e.g. {"city": "Paris", "days": 3}
};

// One streamed `tool_calls` element: {index, id, type: "function", function: {name, arguments}}.
// This implementation sends each call exactly once, complete (id, name and the whole arguments
// string), when its `</tool_call>` arrives, so that a call that turns out malformed can still
// come back as content. A client that appends arguments pieces per index works unchanged.
struct ToolCallDelta {
  int index = 0;          // position of the call in the response's tool_calls (0, 1, ...)
  std::string id;
  std::string name;
  std::string arguments;
};

struct ToolDelta {
  std::string content;
  std::vector<ToolCallDelta> calls;
  bool empty() const { return content.empty() && calls.empty(); }
};

struct ToolParserOptions {
  // Empty: ids are "call_" + 24 random hex digits. Otherwise id = id_prefix + call index
  // (deterministic; for tests and replay).
  std::string id_prefix;
};

// Parsing rules:
//  - A call runs from `<tool_call>` to the first `</tool_call>`. The name is the text before the
//    first `<arg_key>` (or before `</tool_call>`), trimmed; glm45 writes a newline after it,
//    glm47 does not; both are accepted. Then zero or more `<arg_key>K</arg_key>` +
//    `<arg_value>V</arg_value>` pairs, with only whitespace between elements. A value ends at the
//    first `</arg_value>`: other markup inside a value (`<arg_key>`, `<tool_call>`) is literal.
//  - K and V are trimmed of (Unicode) whitespace as Python's str.strip() does. If the tool's
//    JSON schema types the parameter as "string" (or a type list holding "string"), V stays a
//    string; otherwise V is parsed as JSON, then as a Python literal (True, None, 'x',
//    {'a': 1}, (1, 2) ...), and kept as a string when both fail. A repeated key keeps its last
//    value at its first position. arguments is then serialized as Python's
//    json.dumps(ensure_ascii=False) does (", " and ": " separators, non-ASCII kept).
//  - A call that does not follow this shape (empty name, whitespace inside the name, text
//    between elements, an unclosed element) is malformed: its raw text, tags included, is
//    content. So is an unterminated call at the end of the stream. Other calls are unaffected.
//  - Content: text before the first call is content, verbatim. Whitespace between a parsed call
//    and the next `<tool_call>` tag (or the end) is dropped; any other text there is content.
// Streaming: content is sent as soon as it is safe; from `<tool_call>` on, text is held until
// `</tool_call>` (or finish) decides between a call and content.
class ToolCallParser {
 public:
  // `tools_json`: the request's `tools` array as JSON text ([{"type": "function", "function":
  // {"name", "parameters": {...}}}]); empty = no schema (every value is parsed as JSON).
  // Throws glms::Error when tools_json is not valid JSON.
  explicit ToolCallParser(std::string_view tools_json = {}, ToolParserOptions options = {});

  ToolDelta feed(std::string_view content);
  // Flushes what was held back. Feeding after finish() is a logic error (GLMS_CHECK).
  ToolDelta finish();

  // Calls parsed so far; when > 0 the finish_reason is "tool_calls" (also over "length").
  int calls_parsed() const { return next_index_; }

 private:
  enum class State { kText, kAfterCall, kInCall };
  void run(ToolDelta& out, bool at_end);
  void close_call(ToolDelta& out, std::string_view call_text);
  std::string make_id(int index) const;

  std::unordered_map<std::string, std::unordered_set<std::string>> string_params_;
  ToolParserOptions options_;
  State state_ = State::kText;
  std::string pending_;      // undecided text: a tag prefix, post-call whitespace, an open call
  size_t scanned_ = 0;       // in kInCall: pending_ before this offset holds no `</tool_call>`
  int next_index_ = 0;
  bool finished_ = false;
};

struct ToolCallResult {
  std::string content;
  std::vector<ToolCall> calls;
  std::string finish_reason;  // "tool_calls" when calls is not empty, else "" (keep the engine's)
};

// One-shot form: the same as feed(text) + finish() on a fresh parser.
ToolCallResult parse_tool_calls(std::string_view text, std::string_view tools_json = {},
                                ToolParserOptions options = {});

}  // namespace glms::text
