// GLM reasoning and tool-call parsers (contracts in glm_parsers.h, behaviour in
// docs/tool_calls.md). Both are small state machines over a `pending_` buffer holding only text
// whose channel is not decided yet; one-shot parsing is feed() + finish(), so streaming and
// non-streaming results agree by construction.
#include "text/glm_parsers.h"

#include <algorithm>
#include <random>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/glm_arg_values.h"

namespace glms::text {
namespace {

bool starts_with_at(std::string_view s, size_t pos, std::string_view prefix) {
  return s.size() >= pos && s.substr(pos).starts_with(prefix);
}

bool is_ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

size_t skip_ascii_space(std::string_view s, size_t pos) {
  while (pos < s.size() && is_ascii_space(s[pos])) ++pos;
  return pos;
}

size_t skip_py_space(std::string_view s, size_t pos) {
  size_t len = 0;
  while (detail::py_space_at(s, pos, len)) pos += len;
  return pos;
}

constexpr std::string_view kAllTags[] = {kThinkOpen,  kThinkClose,  kToolCallOpen,  kToolCallClose,
                                         kArgKeyOpen, kArgKeyClose, kArgValueOpen, kArgValueClose};

// Length of the longest suffix of `s` that is a proper prefix of a GLM tag: the text that could
// still become a tag with the next chunk. Holding it back (in every state) keeps every tag,
// markup or literal, inside one delta.
size_t partial_tag_suffix(std::string_view s) {
  constexpr size_t kLongest = kArgValueClose.size() - 1;
  for (size_t k = std::min(kLongest, s.size()); k > 0; --k) {
    std::string_view suffix = s.substr(s.size() - k);
    for (std::string_view tag : kAllTags) {
      if (k < tag.size() && tag.starts_with(suffix)) return k;
    }
  }
  return 0;
}

// Moves everything but a possible partial tag at the end of `pending` (all of it at the end of
// the stream) to `out`.
void flush_safe(std::string& pending, std::string& out, bool at_end) {
  size_t hold = at_end ? 0 : partial_tag_suffix(pending);
  out.append(pending, 0, pending.size() - hold);
  pending.erase(0, pending.size() - hold);
}

// A proper prefix of `tag` (the empty string included).
bool is_proper_prefix(std::string_view s, std::string_view tag) { return s.size() < tag.size() && tag.starts_with(s); }

}  // namespace

// ---------------------------------------------------------------------------------------------
// Reasoning

bool prompt_opens_reasoning(std::string_view prompt) {
  while (!prompt.empty() && is_ascii_space(prompt.back())) prompt.remove_suffix(1);
  return prompt.ends_with(kThinkOpen);
}

ReasoningParser::ReasoningParser(bool starts_in_reasoning, bool tool_call_ends_reasoning)
    : state_(starts_in_reasoning ? State::kReasoning : State::kStart),
      tool_call_ends_reasoning_(tool_call_ends_reasoning) {}

ReasoningDelta ReasoningParser::feed(std::string_view text) {
  GLMS_CHECK(!finished_, "ReasoningParser::feed after finish");
  ReasoningDelta out;
  pending_.append(text);
  run(out, false);
  return out;
}

ReasoningDelta ReasoningParser::finish() {
  GLMS_CHECK(!finished_, "ReasoningParser::finish twice");
  ReasoningDelta out;
  run(out, true);
  finished_ = true;
  return out;
}

void ReasoningParser::run(ReasoningDelta& out, bool at_end) {
  for (;;) {
    switch (state_) {
      case State::kStart: {
        // Only whitespace so far: wait to see whether the model opens a think block itself.
        size_t i = skip_ascii_space(pending_, 0);
        std::string_view rest = std::string_view(pending_).substr(i);
        if (rest.starts_with(kThinkOpen)) {
          pending_.erase(0, i + kThinkOpen.size());
          state_ = State::kReasoning;
          continue;
        }
        if (!at_end && is_proper_prefix(rest, kThinkOpen)) return;
        state_ = State::kContent;
        continue;
      }
      case State::kReasoning: {
        std::string_view s = pending_;
        size_t open = s.find(kThinkOpen);
        size_t close = s.find(kThinkClose);
        size_t call = tool_call_ends_reasoning_ ? s.find(kToolCallOpen) : std::string_view::npos;
        size_t first = std::min({open, close, call});
        if (first == std::string_view::npos) {
          flush_safe(pending_, out.reasoning, at_end);
          return;
        }
        out.reasoning.append(s.substr(0, first));
        if (first == open) {  // a nested <think>: dropped
          pending_.erase(0, first + kThinkOpen.size());
        } else if (first == close) {
          pending_.erase(0, first + kThinkClose.size());
          state_ = State::kContent;
        } else {  // <tool_call>: the tag stays, as content
          pending_.erase(0, first);
          state_ = State::kContent;
        }
        continue;
      }
      case State::kContent:
        flush_safe(pending_, out.content, at_end);
        return;
    }
  }
}

ReasoningDelta parse_reasoning(std::string_view text, bool starts_in_reasoning, bool tool_call_ends_reasoning) {
  ReasoningParser parser(starts_in_reasoning, tool_call_ends_reasoning);
  ReasoningDelta out = parser.feed(text);
  ReasoningDelta tail = parser.finish();
  out.reasoning += tail.reasoning;
  out.content += tail.content;
  return out;
}

// ---------------------------------------------------------------------------------------------
// Tool calls

namespace {

bool is_string_type(const nlohmann::json& type) {
  if (type.is_string()) return type.get<std::string>() == "string";
  if (type.is_array()) {
    return std::any_of(type.begin(), type.end(), [](const nlohmann::json& t) { return t == "string"; });
  }
  return false;
}

struct ParsedCall {
  std::string name;
  std::vector<detail::Argument> args;
};

// Parses the text between `<tool_call>` and `</tool_call>`; false when it is malformed.
bool parse_call_body(std::string_view body, ParsedCall& call,
                     const std::unordered_map<std::string, std::unordered_set<std::string>>& string_params) {
  size_t pos = std::min(body.find(kArgKeyOpen), body.size());
  std::string_view name = detail::py_strip(body.substr(0, pos));
  if (name.empty()) return false;
  for (char c : name) {
    if (is_ascii_space(c) || c == '<' || c == '>') return false;
  }
  call.name.assign(name);
  auto tool = string_params.find(call.name);
  while (pos < body.size()) {
    if (!starts_with_at(body, pos, kArgKeyOpen)) return false;
    pos += kArgKeyOpen.size();
    size_t end = body.find(kArgKeyClose, pos);
    if (end == std::string_view::npos) return false;
    detail::Argument arg;
    arg.key.assign(detail::py_strip(body.substr(pos, end - pos)));
    pos = skip_py_space(body, end + kArgKeyClose.size());
    if (!starts_with_at(body, pos, kArgValueOpen)) return false;
    pos += kArgValueOpen.size();
    end = body.find(kArgValueClose, pos);
    if (end == std::string_view::npos) return false;
    arg.value.assign(detail::py_strip(body.substr(pos, end - pos)));
    arg.as_string = tool != string_params.end() && tool->second.count(arg.key) > 0;
    call.args.push_back(std::move(arg));
    pos = skip_py_space(body, end + kArgValueClose.size());
  }
  return true;
}

std::string random_call_id() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id = "call_";
  uint64_t a = rng(), b = rng();
  for (int i = 0; i < 16; ++i) id += kHex[(a >> (4 * i)) & 15];
  for (int i = 0; i < 8; ++i) id += kHex[(b >> (4 * i)) & 15];
  return id;
}

}  // namespace

ToolCallParser::ToolCallParser(std::string_view tools_json, ToolParserOptions options) : options_(std::move(options)) {
  if (tools_json.empty()) return;
  nlohmann::json tools;
  try {
    tools = nlohmann::json::parse(tools_json);
  } catch (const nlohmann::json::exception& e) {
    throw Error(std::string("tool-call parser: `tools` is not valid JSON: ") + e.what());
  }
  if (!tools.is_array()) throw Error("tool-call parser: `tools` must be a JSON array");
  // Shapes other than the OpenAI one are skipped: their parameters are then decoded as JSON.
  for (const nlohmann::json& tool : tools) {
    if (!tool.is_object()) continue;
    const nlohmann::json& f = tool.contains("function") ? tool["function"] : tool;
    if (!f.is_object() || !f.contains("name") || !f["name"].is_string()) continue;
    auto& names = string_params_[f["name"].get<std::string>()];
    if (!f.contains("parameters") || !f["parameters"].is_object()) continue;
    const nlohmann::json& params = f["parameters"];
    if (!params.contains("properties") || !params["properties"].is_object()) continue;
    for (auto it = params["properties"].begin(); it != params["properties"].end(); ++it) {
      if (it.value().is_object() && it.value().contains("type") && is_string_type(it.value()["type"])) {
        names.insert(it.key());
      }
    }
  }
}

std::string ToolCallParser::make_id(int index) const {
  return options_.id_prefix.empty() ? random_call_id() : options_.id_prefix + std::to_string(index);
}

ToolDelta ToolCallParser::feed(std::string_view content) {
  GLMS_CHECK(!finished_, "ToolCallParser::feed after finish");
  ToolDelta out;
  pending_.append(content);
  run(out, false);
  return out;
}

ToolDelta ToolCallParser::finish() {
  GLMS_CHECK(!finished_, "ToolCallParser::finish twice");
  ToolDelta out;
  run(out, true);
  finished_ = true;
  return out;
}

void ToolCallParser::close_call(ToolDelta& out, std::string_view call_text) {
  std::string_view body = call_text.substr(kToolCallOpen.size(),
                                           call_text.size() - kToolCallOpen.size() - kToolCallClose.size());
  ParsedCall call;
  if (!parse_call_body(body, call, string_params_)) {
    out.content.append(call_text);  // malformed: the raw text is content
    state_ = State::kText;
    return;
  }
  ToolCallDelta delta;
  delta.index = next_index_++;
  delta.id = make_id(delta.index);
  delta.name = std::move(call.name);
  delta.arguments = detail::arguments_json(call.args);
  out.calls.push_back(std::move(delta));
  state_ = State::kAfterCall;
}

void ToolCallParser::run(ToolDelta& out, bool at_end) {
  for (;;) {
    std::string_view s = pending_;
    switch (state_) {
      case State::kText: {
        size_t open = s.find(kToolCallOpen);
        if (open == std::string_view::npos) {
          flush_safe(pending_, out.content, at_end);
          return;
        }
        out.content.append(s.substr(0, open));
        pending_.erase(0, open);
        state_ = State::kInCall;
        scanned_ = kToolCallOpen.size();
        continue;
      }
      case State::kAfterCall: {
        // Whitespace after a parsed call is dropped if the next thing is a call or the end.
        size_t i = skip_ascii_space(s, 0);
        std::string_view rest = s.substr(i);
        if (rest.starts_with(kToolCallOpen)) {
          pending_.erase(0, i);
          state_ = State::kInCall;
          scanned_ = kToolCallOpen.size();
          continue;
        }
        if (rest.empty() && at_end) {
          pending_.clear();
          return;
        }
        if (!at_end && is_proper_prefix(rest, kToolCallOpen)) return;
        state_ = State::kText;
        continue;
      }
      case State::kInCall: {
        size_t close = s.find(kToolCallClose, scanned_);
        if (close == std::string_view::npos) {
          if (at_end) {  // unterminated: plain content
            out.content.append(s);
            pending_.clear();
            state_ = State::kText;
            return;
          }
          size_t keep = kToolCallClose.size() - 1;
          scanned_ = std::max(scanned_, s.size() > keep ? s.size() - keep : 0);
          return;
        }
        std::string call_text(s.substr(0, close + kToolCallClose.size()));
        pending_.erase(0, call_text.size());
        close_call(out, call_text);
        continue;
      }
    }
  }
}

ToolCallResult parse_tool_calls(std::string_view text, std::string_view tools_json, ToolParserOptions options) {
  ToolCallParser parser(tools_json, std::move(options));
  ToolDelta a = parser.feed(text);
  ToolDelta b = parser.finish();
  ToolCallResult result;
  result.content = a.content + b.content;
  for (ToolDelta* d : {&a, &b}) {
    for (ToolCallDelta& c : d->calls) result.calls.push_back({std::move(c.id), std::move(c.name), std::move(c.arguments)});
  }
  if (!result.calls.empty()) result.finish_reason = "tool_calls";
  return result;
}

}  // namespace glms::text
