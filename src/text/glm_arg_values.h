// Internal to the GLM tool-call parser: turning `<arg_value>` texts into the JSON `arguments`
// string the way vLLM's glm45/glm47 parsers do (json.loads, then ast.literal_eval, then the raw
// string; json.dumps(ensure_ascii=False) to serialize). Not part of the public API.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace glms::text::detail {

// Python's str.isspace() for the code point that starts at s[pos]; sets `len` to its UTF-8
// length when true.
bool py_space_at(std::string_view s, size_t pos, size_t& len);
// Python's str.strip(): removes leading and trailing whitespace as str.isspace() defines it.
std::string_view py_strip(std::string_view s);

struct Argument {
  std::string key;
  std::string value;  // stripped <arg_value> text
  bool as_string;     // the schema says string: keep `value` as is
};

// The arguments object as JSON text: keys in first-seen order (a repeated key keeps its last
// value), values decoded unless as_string, separators ", " and ": ", non-ASCII unescaped.
std::string arguments_json(const std::vector<Argument>& args);

// The decoded form of one value, serialized alone (for tests): "5" -> 5, "True" -> true,
// "{'a': (1,)}" -> {"a": [1]}, "abc" -> "abc".
std::string decode_value_json(std::string_view value);

// Python's repr() of a float as json.dumps writes it (1.0, 1e+16, 1e-05, Infinity, NaN).
std::string py_float_repr(double value);

}  // namespace glms::text::detail
