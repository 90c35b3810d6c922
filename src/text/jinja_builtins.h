// Internal interface between the Jinja evaluator (jinja_eval.cpp) and the built-in operations:
// operators and item/attribute access (jinja_ops.cpp), filters and tests (jinja_filters.cpp),
// methods of str/dict/list and global functions (jinja_methods.cpp). All of these follow
// jinja2 (ImmutableSandboxedEnvironment) semantics and report errors as glms::Error whose
// message is the Python/jinja2 message (the evaluator adds the template line).
#pragma once

#include <string>
#include <vector>

#include "core/error.h"
#include "text/jinja.h"
#include "text/jinja_value.h"

namespace glms::jinja {

// Largest string or list an operation may build (guards `'x' * 10**12` and the like).
inline constexpr size_t kMaxBuiltSize = 64u << 20;

// ---- UTF-8 helpers (code points, as Python str indexes) ----
std::u32string to_u32(const std::string& s);
std::string from_u32(const std::u32string& s);
size_t utf8_length(const std::string& s);
bool py_isspace(char32_t c);
std::string py_strip(const std::string& s, const Value* chars, bool left, bool right);
std::string py_lower(const std::string& s);
std::string py_upper(const std::string& s);

// ---- access and operators (jinja_ops.cpp) ----
[[noreturn]] void fail_undefined(const Value& v);
// `obj.name`: methods of str/dict/list first, then dict keys; missing -> Undefined with hint.
Value get_attr(const Value& obj, const std::string& name);
// `obj[key]`: items first, then attributes; missing -> Undefined with hint.
Value get_item(const Value& obj, const Value& key);
Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step);
Value binary_op(const std::string& op, const Value& a, const Value& b);
Value unary_op(const std::string& op, const Value& a);
// op: == != < > <= >= in notin
bool compare(const std::string& op, const Value& a, const Value& b);
// The items `for x in v` visits (dict: keys; str: characters; Undefined: none).
std::vector<Value> iterate(const Value& v);
// Python printf-style `fmt % args` (%s %r %d %i %f %x %%, with flags/width/precision).
std::string percent_format(const std::string& fmt, const Value& args);
// Python ordering used by sort/min/max; throws TypeError-like glms::Error for mixed types.
int order(const Value& a, const Value& b);

// ---- filters and tests (jinja_filters.cpp) ----
bool has_filter(const std::string& name);
Value apply_filter(const std::string& name, const Value& input, const CallArgs& args);
bool has_test(const std::string& name);
bool apply_test(const std::string& name, const Value& value, const CallArgs& args);

// ---- methods and globals (jinja_methods.cpp) ----
// A bound method of str/dict/list, or Undefined (with hint) if there is none.
Value bound_method(const Value& obj, const std::string& name, bool& found);
// range, dict, namespace, raise_exception, strftime_now.
void add_globals(DictData& globals);

}  // namespace glms::jinja
