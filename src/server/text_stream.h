// Text-side stages of one output stream: stop-string matching over the detokenized text, and
// the chat output parser seam (reasoning + tool calls) that turns released text into deltas.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "text/glm_parsers.h"

namespace glms::server {

// Finds the first occurrence of any stop string in a text that arrives in pieces. Text that could
// still be the start of a stop string is held back (at most longest-1 bytes, cut at a UTF-8
// character boundary), so what push() releases never has to be taken back.
// A piece pushed with search = false (the text of a request's first min_tokens tokens, as vLLM
// does) is not searched: a stop string counts only where it ends inside a searched piece, though
// it may begin in the text before.
class StopMatcher {
 public:
  StopMatcher(std::vector<std::string> stops, bool include_stop);
  struct Result {
    std::string released;  // text that is final
    bool matched = false;  // a stop string was found; `released` ends before (or with) it
    std::string stop;      // which one
  };
  Result push(std::string_view piece, bool search = true);
  std::string finish();  // releases what is held back (no match possible any more)

 private:
  std::vector<std::string> stops_;
  bool include_stop_ = false;
  size_t longest_ = 0;
  std::string pending_;
  bool matched_ = false;
};

using ToolCall = text::ToolCall;  // id, name, arguments (a JSON object, serialised)

// What parsing a piece of model output yields.
struct ParsedDelta {
  std::string reasoning;
  std::string content;
  std::vector<ToolCall> tool_calls;  // complete calls, in order
  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
};

// Splits chat output into reasoning, content and tool calls as text streams in. Pieces may be
// cut anywhere; the parser holds back what it cannot classify yet.
class OutputParser {
 public:
  virtual ~OutputParser() = default;
  virtual ParsedDelta feed(std::string_view text) = 0;
  virtual ParsedDelta finish() = 0;
};

struct ParserOptions {
  bool prompt_ends_in_think = false;  // generation starts inside <think>
  bool tools = false;                 // parse tool calls (tools given and tool_choice != "none")
  std::string tools_json;             // the request's tools array (parameter types for the parser)
};

using ParserFactory = std::function<std::unique_ptr<OutputParser>(const ParserOptions&)>;

// Everything is content.
std::unique_ptr<OutputParser> make_plain_parser();

// Text of only spaces, tabs and newlines (or none), as a forced tool call's grammar lets the
// model write before its calls: no content of its own beside tool calls, as vLLM's GLM parser
// gives none.
inline bool blank(std::string_view text) { return text.find_first_not_of(" \t\r\n") == std::string_view::npos; }

// A fresh response id: `prefix` + 32 hex digits ("chatcmpl-...", "cmpl-...").
std::string random_id(const std::string& prefix);

}  // namespace glms::server

namespace glms::server {

// GLM output: text::ReasoningParser (<think>...</think>) feeding text::ToolCallParser
// (<tool_call>...</tool_call>, when options.tools), composed as text/glm_parsers.h describes.
ParserFactory glm_parser_factory();

}  // namespace glms::server
