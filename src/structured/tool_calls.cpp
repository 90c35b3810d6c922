#include "structured/tool_calls.h"

#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "structured/json_schema.h"
#include "structured/vocabulary.h"

namespace glms::structured {

namespace {

using ordered_json = nlohmann::ordered_json;

Expr markup(std::string_view tag) { return literal(std::string(1, markup_byte(tag))); }
Expr newline() { return optional(literal("\n")); }

// What the GLM tool parser keeps as a raw string: a property whose type is, or includes, string.
bool raw_string_type(const ordered_json& schema) {
  if (!schema.is_object() || !schema.contains("type")) return false;
  const ordered_json& type = schema["type"];
  if (type.is_string()) return type.get<std::string>() == "string";
  if (type.is_array())
    for (const auto& t : type)
      if (t == "string") return true;
  return false;
}

Expr arguments(SchemaCompiler& compiler, const ordered_json& parameters, const std::string& path) {
  if (!parameters.is_object() || !parameters.contains("properties")) return Expr{};
  const ordered_json& props = parameters["properties"];
  if (!props.is_object()) fail(path + ": properties must be an object");
  std::set<std::string> required;
  if (parameters.contains("required") && parameters["required"].is_array())
    for (const auto& r : parameters["required"])
      if (r.is_string()) required.insert(r.get<std::string>());
  std::vector<std::pair<Expr, bool>> members;
  for (const auto& [key, schema] : props.items()) {
    const std::string at = path + "/properties/" + key;
    const Expr value = raw_string_type(schema) ? compiler.raw_string(schema, at) : compiler.value(schema, at);
    members.push_back({sequence({markup("<arg_key>"), literal(key), markup("</arg_key>"), newline(), markup("<arg_value>"),
                                 value, markup("</arg_value>"), newline()}),
                       required.count(key) > 0});
  }
  return compiler.members(members, Expr{}, "arguments");
}

}  // namespace

std::shared_ptr<const Grammar> tool_call_grammar(const ordered_json& tools, const ToolCallOptions& options) {
  GrammarBuilder builder;
  std::vector<Expr> calls;
  for (size_t i = 0; i < tools.size(); ++i) {
    const ordered_json& fn = tools[i]["function"];
    const std::string name = fn["name"].get<std::string>();
    if (!options.function.empty() && name != options.function) continue;
    const ordered_json none = ordered_json::object();
    const ordered_json& parameters = fn.contains("parameters") ? fn["parameters"] : none;
    Expr args;
    try {
      // $refs inside a tool's parameters resolve against the parameters object.
      SchemaCompiler compiler(builder, parameters, "tool" + std::to_string(i));
      args = arguments(compiler, parameters, "#");
    } catch (const Error& e) {
      fail("tool '" + name + "': " + e.what());
    }
    calls.push_back(sequence({markup("<tool_call>"), literal(name), newline(), args, markup("</tool_call>")}));
  }
  if (calls.empty()) fail("tool_choice names function '" + options.function + "', which is not among the tools");
  std::vector<Expr> root;
  if (options.opens_reasoning) {
    ByteSet reasoning = text_bytes();
    reasoning.reset(0);
    root.push_back(repeat(bytes(reasoning), 0, -1));
    root.push_back(markup("</think>"));
  }
  SchemaCompiler compiler(builder, tools, "calls");
  builder.define("call", choice(std::move(calls)));
  root.push_back(compiler.whitespace());
  root.push_back(builder.ref("call"));
  if (options.parallel) root.push_back(repeat(sequence({compiler.whitespace(), builder.ref("call")}), 0, -1));
  builder.define("root", sequence(std::move(root)));
  return builder.build("root", "tool calls");
}

}  // namespace glms::structured
