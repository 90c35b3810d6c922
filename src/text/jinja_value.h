// Values of the Jinja interpreter (src/text/jinja*.{h,cpp}): a small dynamic type that mirrors
// the Python objects a Hugging Face chat template sees (None, bool, int, float, str, list,
// tuple, dict, jinja2 Undefined, namespace(), callables).
//
// Contracts:
// - Lists and dicts have reference semantics (copying a Value shares the container), like
//   Python objects; strings are immutable and shared.
// - Dicts keep insertion order (JSON object order is preserved end to end) and have string
//   keys only.
// - str(), repr() and to_json() print exactly what Python's str(), repr() and json.dumps()
//   print for the same objects (floats as the shortest round-trip repr; see
//   docs/chat_templates.md for the few unicode differences of repr()).
// - Integers are 64-bit; arithmetic that overflows raises glms::Error instead of growing.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

namespace glms::jinja {

class Value;

struct ListData {
  std::vector<Value> items;
  bool is_tuple = false;
};

struct DictData {
  std::vector<std::pair<std::string, Value>> items;
  std::unordered_map<std::string, size_t> index;
  bool is_namespace = false;  // namespace(): attributes may be assigned with {% set ns.x = %}
  const Value* find(const std::string& key) const;
  void set(const std::string& key, Value value);
};

// Positional and keyword arguments of a call.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
  // The keyword argument `name`, else positional argument `pos` (if pos >= 0 and present),
  // else nullptr.
  const Value* get(const std::string& name, int pos = -1) const;
};

struct Callable {
  std::string name;
  std::function<Value(const CallArgs&)> fn;
};

struct UndefinedData {
  std::string hint;  // the error message when the value is used in a way that needs a value
};

class Value {
 public:
  enum class Kind : uint8_t { Undefined, None, Bool, Int, Float, String, List, Dict, Callable };

  Value() : v_(std::shared_ptr<const UndefinedData>()) {}
  Value(std::nullptr_t) : v_(nullptr) {}
  Value(bool b) : v_(b) {}
  Value(int i) : v_(static_cast<int64_t>(i)) {}
  Value(int64_t i) : v_(i) {}
  Value(double f) : v_(f) {}
  Value(const char* s) : v_(std::make_shared<const std::string>(s)) {}
  Value(std::string s) : v_(std::make_shared<const std::string>(std::move(s))) {}
  Value(std::string_view s) : v_(std::make_shared<const std::string>(s)) {}

  static Value undefined(std::string hint);
  static Value list(std::vector<Value> items = {});
  static Value tuple(std::vector<Value> items);
  static Value dict();
  static Value make_namespace();
  static Value function(std::string name, std::function<Value(const CallArgs&)> fn);
  // Parses JSON text (objects keep their key order). Throws glms::Error on invalid JSON.
  static Value from_json(std::string_view json);

  Kind kind() const { return static_cast<Kind>(v_.index()); }
  bool is_undefined() const { return kind() == Kind::Undefined; }
  bool is_none() const { return kind() == Kind::None; }
  bool is_bool() const { return kind() == Kind::Bool; }
  bool is_int() const { return kind() == Kind::Int; }
  bool is_float() const { return kind() == Kind::Float; }
  bool is_number() const { return is_int() || is_float() || is_bool(); }
  bool is_string() const { return kind() == Kind::String; }
  bool is_list() const { return kind() == Kind::List; }
  bool is_tuple() const { return is_list() && std::get<6>(v_)->is_tuple; }
  bool is_dict() const { return kind() == Kind::Dict; }
  bool is_namespace() const { return is_dict() && std::get<7>(v_)->is_namespace; }
  bool is_callable() const { return kind() == Kind::Callable; }

  bool as_bool() const { return std::get<2>(v_); }
  int64_t as_int() const { return std::get<3>(v_); }
  double as_float() const { return std::get<4>(v_); }
  // Numeric value of a bool/int/float as double.
  double to_double() const;
  const std::string& as_string() const { return *std::get<5>(v_); }
  std::vector<Value>& items() const { return std::get<6>(v_)->items; }
  DictData& dict_data() const { return *std::get<7>(v_); }
  const Callable& callable() const { return *std::get<8>(v_); }
  // The message an operation on this Undefined reports.
  std::string undefined_hint() const;

  // Python truthiness (Undefined is false).
  bool truthy() const;
  // Python str() (Undefined prints as the empty string, as jinja2's default Undefined).
  std::string str() const;
  // Python repr().
  std::string repr() const;
  // Python type name as jinja2 error messages print it ("dict", "list", "str", ...).
  std::string type_name() const;
  // json.dumps(self, ensure_ascii, indent, separators, sort_keys). indent < 0 means None;
  // separators nullopt means Python's default (", " or "," with indent, and ": ").
  // Throws glms::Error for values JSON cannot represent (Undefined, callables).
  std::string to_json(bool ensure_ascii = false, int indent = -1,
                      std::optional<std::pair<std::string, std::string>> separators = {},
                      bool sort_keys = false) const;

 private:
  std::variant<std::shared_ptr<const UndefinedData>, std::nullptr_t, bool, int64_t, double,
               std::shared_ptr<const std::string>, std::shared_ptr<ListData>,
               std::shared_ptr<DictData>, std::shared_ptr<const Callable>>
      v_;
};

// Python equality (1 == 1.0 == True; lists and dicts compare deeply).
bool equals(const Value& a, const Value& b);
// Python float repr (shortest round trip): 1.0, 0.1, 1e+20, 1e-05, inf, nan.
std::string float_repr(double f);

}  // namespace glms::jinja
