// libFuzzer target: the GLM reasoning and tool-call parsers fed byte-split streams. The first
// byte picks the options and the chunking; the rest is model output. Streaming in those chunks
// must give exactly the one-shot result (the parsers' contract), with tool calls in the same
// order, names and arguments, and every arguments string valid JSON.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "text/glm_parsers.h"

namespace {
constexpr const char* kTools =
    R"([{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"s":{"type":"string"},"n":{"type":"integer"}}}}}])";
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  using namespace glms::text;
  const bool starts_in_reasoning = data[0] & 1;
  const size_t chunk = 1 + (data[0] >> 1) % 7;
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  ToolParserOptions options;
  options.id_prefix = "call_";

  const ReasoningDelta whole = parse_reasoning(text, starts_in_reasoning);
  const ToolCallResult whole_calls = parse_tool_calls(whole.content, kTools, options);

  ReasoningParser reasoning(starts_in_reasoning);
  ToolCallParser tools(kTools, options);
  std::string reasoning_text, content;
  std::vector<ToolCallDelta> calls;
  auto take = [&](const ToolDelta& d) {
    content += d.content;
    calls.insert(calls.end(), d.calls.begin(), d.calls.end());
  };
  for (size_t at = 0; at < text.size(); at += chunk) {
    const ReasoningDelta d = reasoning.feed(text.substr(at, chunk));
    reasoning_text += d.reasoning;
    take(tools.feed(d.content));
  }
  const ReasoningDelta last = reasoning.finish();
  reasoning_text += last.reasoning;
  take(tools.feed(last.content));
  take(tools.finish());

  if (reasoning_text != whole.reasoning || content != whole_calls.content || calls.size() != whole_calls.calls.size())
    std::abort();
  for (size_t i = 0; i < calls.size(); ++i) {
    if (calls[i].name != whole_calls.calls[i].name || calls[i].arguments != whole_calls.calls[i].arguments) std::abort();
    if (!nlohmann::json::accept(calls[i].arguments)) std::abort();
  }
  return 0;
}
