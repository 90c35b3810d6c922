// Structured outputs for tool_choice "required" and named functions: a grammar of GLM's native
// tool-call markup,
//   <tool_call>NAME<arg_key>KEY</arg_key><arg_value>VALUE</arg_value>...</tool_call>
// (newlines allowed between the parts, as GLM-4.5 writes them), whose arguments are valid against
// the function's parameters schema: the declared properties in order, the required ones always
// present, each value raw text where the schema's type is string (how the GLM tool parser reads
// it) and JSON valid against the property's schema otherwise. The markup tokens are the
// reserved bytes of vocabulary.h.
#pragma once

#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "structured/grammar.h"

namespace glms::structured {

struct ToolCallOptions {
  std::string function;        // the one function to call; empty: any of the tools ("required")
  bool parallel = true;        // more than one call allowed (OpenAI's parallel_tool_calls)
  bool opens_reasoning = false;  // the prompt ends in an open <think>: reasoning text and </think> come first
};

// `tools` is the request's validated array of {"type": "function", "function": {...}}. Throws
// glms::Error for a parameters schema outside what json_schema.h supports, naming the tool.
std::shared_ptr<const Grammar> tool_call_grammar(const nlohmann::ordered_json& tools, const ToolCallOptions& options);

}  // namespace glms::structured
