// Value: Python-compatible printing, equality and JSON conversion. See jinja_value.h.
#include "text/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace glms::jinja {

const Value* DictData::find(const std::string& key) const {
  auto it = index.find(key);
  return it == index.end() ? nullptr : &items[it->second].second;
}

void DictData::set(const std::string& key, Value value) {
  auto it = index.find(key);
  if (it != index.end()) {
    items[it->second].second = std::move(value);
    return;
  }
  index.emplace(key, items.size());
  items.emplace_back(key, std::move(value));
}

const Value* CallArgs::get(const std::string& name, int pos) const {
  for (const auto& [k, v] : keyword)
    if (k == name) return &v;
  if (pos >= 0 && static_cast<size_t>(pos) < positional.size()) return &positional[pos];
  return nullptr;
}

Value Value::undefined(std::string hint) {
  Value v;
  v.v_ = std::make_shared<const UndefinedData>(UndefinedData{std::move(hint)});
  return v;
}

Value Value::list(std::vector<Value> items) {
  Value v;
  auto data = std::make_shared<ListData>();
  data->items = std::move(items);
  v.v_ = std::move(data);
  return v;
}

Value Value::tuple(std::vector<Value> items) {
  Value v = list(std::move(items));
  std::get<6>(v.v_)->is_tuple = true;
  return v;
}

Value Value::dict() {
  Value v;
  v.v_ = std::make_shared<DictData>();
  return v;
}

Value Value::make_namespace() {
  Value v = dict();
  std::get<7>(v.v_)->is_namespace = true;
  return v;
}

Value Value::function(std::string name, std::function<Value(const CallArgs&)> fn) {
  Value v;
  v.v_ = std::make_shared<const Callable>(Callable{std::move(name), std::move(fn)});
  return v;
}

namespace {

Value from_nlohmann(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value(nullptr);
    case nlohmann::ordered_json::value_t::boolean: return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      uint64_t u = j.get<uint64_t>();
      if (u <= static_cast<uint64_t>(INT64_MAX)) return Value(static_cast<int64_t>(u));
      return Value(static_cast<double>(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_nlohmann(e));
      return Value::list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Value d = Value::dict();
      for (auto it = j.begin(); it != j.end(); ++it) d.dict_data().set(it.key(), from_nlohmann(*it));
      return d;
    }
    default: return Value(nullptr);
  }
}

// Decodes one UTF-8 code point at s[i] (advancing i); invalid bytes decode as themselves.
uint32_t next_cp(const std::string& s, size_t& i) {
  unsigned char c = s[i];
  int n = c < 0x80 ? 0 : (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : (c >> 3) == 30 ? 3 : -1;
  bool ok = n > 0 && i + n < s.size();
  for (int k = 1; ok && k <= n; ++k) ok = (static_cast<unsigned char>(s[i + k]) >> 6) == 2;
  if (!ok) {
    ++i;
    return c;
  }
  uint32_t cp = c & (0x3f >> n);
  for (int k = 1; k <= n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
  i += n + 1;
  return cp;
}

void append_hex(std::string& out, const char* prefix, uint32_t v, int width) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%s%0*x", prefix, width, v);
  out += buf;
}

// Python's str.isprintable() for the code points that commonly occur; others are printable.
bool py_printable(uint32_t cp) {
  if (cp < 0x20 || cp == 0x7f) return false;
  if (cp >= 0x80 && cp <= 0xa0) return false;
  if (cp == 0xad || cp == 0x1680 || cp == 0x180e || cp == 0x3000 || cp == 0xfeff) return false;
  if (cp >= 0x2000 && cp <= 0x200f) return false;
  if (cp >= 0x2028 && cp <= 0x202f) return false;
  if (cp >= 0x205f && cp <= 0x206f) return false;
  if (cp >= 0xd800 && cp <= 0xdfff) return false;
  if (cp >= 0xe000 && cp <= 0xf8ff) return false;  // private use (category Co)
  return true;
}

std::string string_repr(const std::string& s) {
  bool has_single = s.find('\'') != std::string::npos;
  bool has_double = s.find('"') != std::string::npos;
  char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (size_t i = 0; i < s.size();) {
    size_t start = i;
    uint32_t cp = next_cp(s, i);
    if (cp == '\\') out += "\\\\";
    else if (cp == static_cast<uint32_t>(quote)) (out += '\\') += quote;
    else if (cp == '\n') out += "\\n";
    else if (cp == '\r') out += "\\r";
    else if (cp == '\t') out += "\\t";
    else if (py_printable(cp)) out.append(s, start, i - start);
    else if (cp <= 0xff) append_hex(out, "\\x", cp, 2);
    else if (cp <= 0xffff) append_hex(out, "\\u", cp, 4);
    else append_hex(out, "\\U", cp, 8);
  }
  out += quote;
  return out;
}

void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  for (size_t i = 0; i < s.size();) {
    size_t start = i;
    uint32_t cp = next_cp(s, i);
    switch (cp) {
      case '"': out += "\\\""; continue;
      case '\\': out += "\\\\"; continue;
      case '\n': out += "\\n"; continue;
      case '\r': out += "\\r"; continue;
      case '\t': out += "\\t"; continue;
      case '\b': out += "\\b"; continue;
      case '\f': out += "\\f"; continue;
      default: break;
    }
    if (cp < 0x20) append_hex(out, "\\u", cp, 4);
    else if (cp < 0x80 || !ensure_ascii) out.append(s, start, i - start);
    else if (cp <= 0xffff) append_hex(out, "\\u", cp, 4);
    else {
      uint32_t v = cp - 0x10000;
      append_hex(out, "\\u", 0xd800 + (v >> 10), 4);
      append_hex(out, "\\u", 0xdc00 + (v & 0x3ff), 4);
    }
  }
  out += '"';
}

struct JsonOptions {
  bool ensure_ascii;
  int indent;
  std::string item_sep, key_sep;
  bool sort_keys;
};

void to_json_impl(std::string& out, const Value& v, const JsonOptions& o, int depth) {
  if (depth > 512) fail("tojson: structure nested too deeply");
  auto newline = [&](int level) {
    if (o.indent < 0) return;
    out += '\n';
    out.append(static_cast<size_t>(o.indent) * level, ' ');
  };
  switch (v.kind()) {
    case Value::Kind::None: out += "null"; return;
    case Value::Kind::Bool: out += v.as_bool() ? "true" : "false"; return;
    case Value::Kind::Int: out += std::to_string(v.as_int()); return;
    case Value::Kind::Float: {
      double f = v.as_float();
      if (std::isnan(f)) out += "NaN";
      else if (std::isinf(f)) out += f > 0 ? "Infinity" : "-Infinity";
      else out += float_repr(f);
      return;
    }
    case Value::Kind::String: json_string(out, v.as_string(), o.ensure_ascii); return;
    case Value::Kind::List: {
      const auto& items = v.items();
      if (items.empty()) { out += "[]"; return; }
      out += '[';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += o.item_sep;
        newline(depth + 1);
        to_json_impl(out, items[i], o, depth + 1);
      }
      newline(depth);
      out += ']';
      return;
    }
    case Value::Kind::Dict: {
      if (v.is_namespace()) fail("tojson: Object of type Namespace is not JSON serializable");
      const auto& d = v.dict_data();
      if (d.items.empty()) { out += "{}"; return; }
      std::vector<const std::pair<std::string, Value>*> entries;
      for (const auto& e : d.items) entries.push_back(&e);
      if (o.sort_keys)
        std::stable_sort(entries.begin(), entries.end(),
                         [](auto* a, auto* b) { return a->first < b->first; });
      out += '{';
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i) out += o.item_sep;
        newline(depth + 1);
        json_string(out, entries[i]->first, o.ensure_ascii);
        out += o.key_sep;
        to_json_impl(out, entries[i]->second, o, depth + 1);
      }
      newline(depth);
      out += '}';
      return;
    }
    case Value::Kind::Undefined:
      fail("tojson: Object of type Undefined is not JSON serializable");
    case Value::Kind::Callable:
      fail("tojson: Object of type function is not JSON serializable");
  }
}

}  // namespace

Value Value::from_json(std::string_view json) {
  nlohmann::ordered_json j;
  try {
    j = nlohmann::ordered_json::parse(json.begin(), json.end());
  } catch (const std::exception& e) {
    fail(std::string("invalid JSON: ") + e.what());
  }
  return from_nlohmann(j);
}

double Value::to_double() const {
  if (is_bool()) return as_bool() ? 1.0 : 0.0;
  if (is_int()) return static_cast<double>(as_int());
  return as_float();
}

std::string Value::undefined_hint() const {
  const auto& p = std::get<0>(v_);
  return p && !p->hint.empty() ? p->hint : "value is undefined";
}

bool Value::truthy() const {
  switch (kind()) {
    case Kind::Undefined: case Kind::None: return false;
    case Kind::Bool: return as_bool();
    case Kind::Int: return as_int() != 0;
    case Kind::Float: return as_float() != 0.0;
    case Kind::String: return !as_string().empty();
    case Kind::List: return !items().empty();
    case Kind::Dict: return is_namespace() || !dict_data().items.empty();
    case Kind::Callable: return true;
  }
  return false;
}

std::string Value::str() const {
  switch (kind()) {
    case Kind::Undefined: return "";
    case Kind::String: return as_string();
    default: return repr();
  }
}

std::string Value::repr() const {
  switch (kind()) {
    case Kind::Undefined: return "Undefined";
    case Kind::None: return "None";
    case Kind::Bool: return as_bool() ? "True" : "False";
    case Kind::Int: return std::to_string(as_int());
    case Kind::Float: return float_repr(as_float());
    case Kind::String: return string_repr(as_string());
    case Kind::List: {
      const auto& items = this->items();
      std::string out = is_tuple() ? "(" : "[";
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += ", ";
        out += items[i].repr();
      }
      if (is_tuple() && items.size() == 1) out += ',';
      out += is_tuple() ? ")" : "]";
      return out;
    }
    case Kind::Dict: {
      std::string out = is_namespace() ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [k, v] : dict_data().items) {
        if (!first) out += ", ";
        first = false;
        out += string_repr(k) + ": " + v.repr();
      }
      out += is_namespace() ? "}>" : "}";
      return out;
    }
    case Kind::Callable: return "<function " + callable().name + ">";
  }
  return "";
}

std::string Value::type_name() const {
  switch (kind()) {
    case Kind::Undefined: return "Undefined";
    case Kind::None: return "NoneType";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::String: return "str";
    case Kind::List: return is_tuple() ? "tuple" : "list";
    case Kind::Dict: return is_namespace() ? "Namespace" : "dict";
    case Kind::Callable: return "function";
  }
  return "";
}

std::string Value::to_json(bool ensure_ascii, int indent,
                           std::optional<std::pair<std::string, std::string>> separators,
                           bool sort_keys) const {
  JsonOptions o{ensure_ascii, indent, indent < 0 ? ", " : ",", ": ", sort_keys};
  if (separators) {
    o.item_sep = separators->first;
    o.key_sep = separators->second;
  }
  std::string out;
  to_json_impl(out, *this, o, 0);
  return out;
}

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (!a.is_float() && !b.is_float()) {
      int64_t x = a.is_bool() ? a.as_bool() : a.as_int();
      int64_t y = b.is_bool() ? b.as_bool() : b.as_int();
      return x == y;
    }
    return a.to_double() == b.to_double();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::Undefined: case Value::Kind::None: return true;
    case Value::Kind::String: return a.as_string() == b.as_string();
    case Value::Kind::List: {
      if (a.is_tuple() != b.is_tuple()) return false;
      const auto &x = a.items(), &y = b.items();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i)
        if (!equals(x[i], y[i])) return false;
      return true;
    }
    case Value::Kind::Dict: {
      if (a.is_namespace() || b.is_namespace()) return &a.dict_data() == &b.dict_data();
      const auto &x = a.dict_data(), &y = b.dict_data();
      if (x.items.size() != y.items.size()) return false;
      for (const auto& [k, v] : x.items) {
        const Value* other = y.find(k);
        if (!other || !equals(v, *other)) return false;
      }
      return true;
    }
    case Value::Kind::Callable: return &a.callable() == &b.callable();
    default: return false;
  }
}

std::string float_repr(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  if (f == 0) return std::signbit(f) ? "-0.0" : "0.0";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, f, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  bool neg = sci[0] == '-';
  if (neg) sci.erase(0, 1);
  size_t e = sci.find('e');
  std::string digits;
  for (size_t i = 0; i < e; ++i)
    if (sci[i] != '.') digits += sci[i];
  int exp = std::stoi(sci.substr(e + 1));
  std::string out = neg ? "-" : "";
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out += "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    } else if (static_cast<size_t>(exp) + 1 >= digits.size()) {
      out += digits + std::string(exp + 1 - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, exp + 1) + "." + digits.substr(exp + 1);
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char ebuf[16];
  std::snprintf(ebuf, sizeof ebuf, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
  return out + ebuf;
}

}  // namespace glms::jinja
