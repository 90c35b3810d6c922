// Operators, item/attribute access, slicing, iteration and printf formatting with Python
// semantics. See jinja_builtins.h.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cctype>
#include <limits>
#include <optional>

#include <utf8proc.h>

#include "text/jinja_builtins.h"
#include "text/utf8.h"

namespace glms::jinja {

// ---- UTF-8 ----

std::u32string to_u32(const std::string& s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    unsigned char c = s[i];
    int n = c < 0x80 ? 0 : (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : (c >> 3) == 30 ? 3 : -1;
    bool ok = n >= 0 && i + n < s.size();
    for (int k = 1; ok && k <= n; ++k) ok = (static_cast<unsigned char>(s[i + k]) >> 6) == 2;
    if (!ok || n == 0) {
      out += static_cast<char32_t>(c);
      ++i;
      continue;
    }
    char32_t cp = c & (0x3f >> n);
    for (int k = 1; k <= n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
    out += cp;
    i += n + 1;
  }
  return out;
}

std::string from_u32(const std::u32string& s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t cp : s) text::utf8::append(out, cp);
  return out;
}

size_t utf8_length(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c >> 6) != 2;
  return n;
}

bool py_isspace(char32_t c) { return text::utf8::is_python_space(c); }

std::string py_strip(const std::string& s, const Value* chars, bool left, bool right) {
  std::u32string u = to_u32(s);
  std::u32string set;
  bool ws = !chars || chars->is_none() || chars->is_undefined();
  if (!ws) {
    if (!chars->is_string()) fail("strip arg must be None or str");
    set = to_u32(chars->as_string());
  }
  auto strip = [&](char32_t c) { return ws ? py_isspace(c) : set.find(c) != std::u32string::npos; };
  size_t b = 0, e = u.size();
  if (left)
    while (b < e && strip(u[b])) ++b;
  if (right)
    while (e > b && strip(u[e - 1])) --e;
  return from_u32(u.substr(b, e - b));
}

static std::string map_case(const std::string& s, bool upper) {
  bool ascii = std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; });
  if (ascii) {
    std::string out = s;
    for (char& c : out) c = upper ? static_cast<char>(std::toupper(c)) : static_cast<char>(std::tolower(c));
    return out;
  }
  std::u32string u = to_u32(s);
  for (char32_t& c : u) c = static_cast<char32_t>(upper ? utf8proc_toupper(c) : utf8proc_tolower(c));
  return from_u32(u);
}

std::string py_lower(const std::string& s) { return map_case(s, false); }
std::string py_upper(const std::string& s) { return map_case(s, true); }

// ---- access ----

void fail_undefined(const Value& v) { fail(v.undefined_hint()); }

static std::string object_name(const Value& v) {
  if (v.is_none()) return "None";
  return v.type_name() + " object";
}

static Value missing_attr(const Value& obj, const std::string& name) {
  return Value::undefined("'" + object_name(obj) + "' has no attribute '" + name + "'");
}

Value get_attr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) fail_undefined(obj);
  bool found = false;
  Value method = bound_method(obj, name, found);
  if (found) return method;
  if (obj.is_dict()) {
    if (const Value* v = obj.dict_data().find(name)) return *v;
  }
  return missing_attr(obj, name);
}

static bool index_of(const Value& key, int64_t size, int64_t& index) {
  if (!key.is_int() && !key.is_bool()) return false;
  int64_t i = key.is_bool() ? key.as_bool() : key.as_int();
  if (i < 0) i += size;
  if (i < 0 || i >= size) return false;
  index = i;
  return true;
}

Value get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) fail_undefined(obj);
  if (obj.is_dict() && key.is_string()) {
    if (const Value* v = obj.dict_data().find(key.as_string())) return *v;
  } else if (obj.is_list()) {
    int64_t i;
    if (index_of(key, static_cast<int64_t>(obj.items().size()), i)) return obj.items()[i];
  } else if (obj.is_string() && (key.is_int() || key.is_bool())) {
    std::u32string u = to_u32(obj.as_string());
    int64_t i;
    if (index_of(key, static_cast<int64_t>(u.size()), i)) return Value(from_u32(u.substr(i, 1)));
  }
  if (key.is_string()) {
    bool found = false;
    Value method = bound_method(obj, key.as_string(), found);
    if (found) return method;
    return missing_attr(obj, key.as_string());
  }
  return Value::undefined("'" + object_name(obj) + "' has no element " + key.repr());
}

// Python slice indices for a sequence of `size` items.
static std::vector<int64_t> slice_indices(int64_t size, const Value& start, const Value& stop, const Value& step) {
  auto as_index = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_none() || v.is_undefined()) return std::nullopt;
    if (v.is_int()) return v.as_int();
    if (v.is_bool()) return v.as_bool() ? 1 : 0;
    fail(std::string("slice ") + what + " must be an integer or None");
  };
  int64_t st = as_index(step, "step").value_or(1);
  if (st == 0) fail("slice step cannot be zero");
  auto clamp = [&](std::optional<int64_t> v, int64_t def) {
    if (!v) return def;
    int64_t x = *v;
    if (x < 0) x += size;
    if (st > 0) return std::clamp<int64_t>(x, 0, size);
    return std::clamp<int64_t>(x, -1, size - 1);
  };
  int64_t b = clamp(as_index(start, "start"), st > 0 ? 0 : size - 1);
  int64_t e = clamp(as_index(stop, "stop"), st > 0 ? size : -1);
  std::vector<int64_t> out;
  if (st > 0)
    for (int64_t i = b; i < e; i += st) out.push_back(i);
  else
    for (int64_t i = b; i > e; i += st) out.push_back(i);
  return out;
}

Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  if (obj.is_undefined()) fail_undefined(obj);
  if (obj.is_string()) {
    const std::string& s = obj.as_string();
    bool ascii = std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; });
    if (ascii) {
      std::string out;
      for (int64_t i : slice_indices(static_cast<int64_t>(s.size()), start, stop, step)) out += s[i];
      return Value(std::move(out));
    }
    std::u32string u = to_u32(s), out;
    for (int64_t i : slice_indices(static_cast<int64_t>(u.size()), start, stop, step)) out += u[i];
    return Value(from_u32(out));
  }
  if (obj.is_list()) {
    std::vector<Value> out;
    for (int64_t i : slice_indices(static_cast<int64_t>(obj.items().size()), start, stop, step))
      out.push_back(obj.items()[i]);
    return obj.is_tuple() ? Value::tuple(std::move(out)) : Value::list(std::move(out));
  }
  fail("'" + obj.type_name() + "' object is not subscriptable");
}

std::vector<Value> iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined: return {};
    case Value::Kind::List: return v.items();
    case Value::Kind::Dict: {
      if (v.is_namespace()) break;
      std::vector<Value> keys;
      for (const auto& [k, _] : v.dict_data().items) keys.emplace_back(k);
      return keys;
    }
    case Value::Kind::String: {
      std::vector<Value> out;
      for (char32_t c : to_u32(v.as_string())) out.emplace_back(from_u32(std::u32string(1, c)));
      return out;
    }
    default: break;
  }
  fail("'" + v.type_name() + "' object is not iterable");
}

// ---- operators ----

static int64_t int_of(const Value& v) { return v.is_bool() ? v.as_bool() : v.as_int(); }
static bool is_intlike(const Value& v) { return v.is_int() || v.is_bool(); }

[[noreturn]] static void bad_operands(const std::string& op, const Value& a, const Value& b) {
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  fail("unsupported operand type(s) for " + op + ": '" + a.type_name() + "' and '" + b.type_name() + "'");
}

// seq * n. The size is checked by division, never by a product that could wrap, and an empty
// sequence is returned as it is: repeating it 10^10 times would loop for seconds building nothing.
static Value repeat(const Value& seq, int64_t n) {
  const bool empty = seq.is_string() ? seq.as_string().empty() : seq.items().empty();
  if (n <= 0 || empty) return seq.is_string() ? Value("") : seq.is_tuple() ? Value::tuple({}) : Value::list();
  if (seq.is_string()) {
    const std::string& s = seq.as_string();
    if (static_cast<uint64_t>(n) > kMaxBuiltSize / s.size()) fail("string repetition result too large");
    std::string out;
    out.reserve(s.size() * n);
    for (int64_t i = 0; i < n; ++i) out += s;
    return Value(std::move(out));
  }
  const auto& items = seq.items();
  if (static_cast<uint64_t>(n) > kMaxBuiltSize / 16 / items.size()) fail("list repetition result too large");
  std::vector<Value> out;
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), items.begin(), items.end());
  return seq.is_tuple() ? Value::tuple(std::move(out)) : Value::list(std::move(out));
}

Value binary_op(const std::string& op, const Value& a, const Value& b) {
  if (op == "~") {
    std::string s = a.str() + b.str();
    return Value(std::move(s));
  }
  if (a.is_number() && b.is_number()) {
    bool ints = is_intlike(a) && is_intlike(b);
    if (ints && op != "/" && op != "**") {
      int64_t x = int_of(a), y = int_of(b), r = 0;
      if (op == "+") {
        if (__builtin_add_overflow(x, y, &r)) fail("integer overflow");
      } else if (op == "-") {
        if (__builtin_sub_overflow(x, y, &r)) fail("integer overflow");
      } else if (op == "*") {
        if (__builtin_mul_overflow(x, y, &r)) fail("integer overflow");
      } else if (op == "//" || op == "%") {
        if (y == 0) fail(op == "//" ? "integer division or modulo by zero" : "integer modulo by zero");
        int64_t q = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) {
          --q;
          m += y;
        }
        r = op == "//" ? q : m;
      }
      return Value(r);
    }
    if (ints && op == "**" && int_of(b) >= 0) {
      // By squaring: one multiplication per bit of the exponent, so `1 ** 33333333333` takes 35
      // steps, not a loop of that many. A square that overflows while exponent bits remain
      // means the result would overflow too.
      int64_t base = int_of(a), e = int_of(b), r = 1;
      while (e > 0) {
        if ((e & 1) && __builtin_mul_overflow(r, base, &r)) fail("integer overflow");
        e >>= 1;
        if (e > 0 && __builtin_mul_overflow(base, base, &base)) fail("integer overflow");
      }
      return Value(r);
    }
    double x = a.to_double(), y = b.to_double();
    if (op == "+") return Value(x + y);
    if (op == "-") return Value(x - y);
    if (op == "*") return Value(x * y);
    if (op == "/") {
      if (y == 0) fail("division by zero");
      return Value(x / y);
    }
    if (op == "//" || op == "%") {
      if (y == 0) fail("float divmod()");
      double m = std::fmod(x, y);
      if (m != 0 && ((m < 0) != (y < 0))) m += y;
      return Value(op == "%" ? m : std::floor(x / y));
    }
    if (op == "**") return Value(std::pow(x, y));
  }
  if (op == "+") {
    if (a.is_string() && b.is_string()) return Value(a.as_string() + b.as_string());
    if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
      std::vector<Value> out = a.items();
      out.insert(out.end(), b.items().begin(), b.items().end());
      return a.is_tuple() ? Value::tuple(std::move(out)) : Value::list(std::move(out));
    }
  }
  if (op == "*") {
    if ((a.is_string() || a.is_list()) && is_intlike(b)) return repeat(a, int_of(b));
    if ((b.is_string() || b.is_list()) && is_intlike(a)) return repeat(b, int_of(a));
  }
  if (op == "%" && a.is_string()) return Value(percent_format(a.as_string(), b));
  bad_operands(op, a, b);
}

Value unary_op(const std::string& op, const Value& a) {
  if (op == "not") return Value(!a.truthy());
  if (a.is_int() || a.is_bool()) {
    if (op == "+") return Value(int_of(a));
    if (int_of(a) == std::numeric_limits<int64_t>::min()) fail("integer overflow");
    return Value(-int_of(a));
  }
  if (a.is_float()) return Value(op == "-" ? -a.as_float() : a.as_float());
  if (a.is_undefined()) fail_undefined(a);
  fail("bad operand type for unary " + op + ": '" + a.type_name() + "'");
}

int order(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (is_intlike(a) && is_intlike(b)) return int_of(a) < int_of(b) ? -1 : int_of(a) > int_of(b);
    double x = a.to_double(), y = b.to_double();
    return x < y ? -1 : x > y;
  }
  if (a.is_string() && b.is_string()) {
    int c = a.as_string().compare(b.as_string());
    return c < 0 ? -1 : c > 0;
  }
  if (a.is_list() && b.is_list()) {
    const auto &x = a.items(), &y = b.items();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (equals(x[i], y[i])) continue;
      return order(x[i], y[i]);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size();
  }
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  fail("'<' not supported between instances of '" + a.type_name() + "' and '" + b.type_name() + "'");
}

bool compare(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return equals(a, b);
  if (op == "!=") return !equals(a, b);
  if (op == "in" || op == "notin") {
    bool found = false;
    if (b.is_string()) {
      if (!a.is_string()) {
        if (a.is_undefined()) fail_undefined(a);
        fail("'in <string>' requires string as left operand, not " + a.type_name());
      }
      found = b.as_string().find(a.as_string()) != std::string::npos;
    } else if (b.is_dict() && !b.is_namespace()) {
      found = a.is_string() && b.dict_data().find(a.as_string()) != nullptr;
    } else if (b.is_list()) {
      for (const Value& x : b.items())
        if (equals(a, x)) {
          found = true;
          break;
        }
    } else if (!b.is_undefined()) {
      fail("argument of type '" + b.type_name() + "' is not iterable");
    }
    return op == "in" ? found : !found;
  }
  int c = order(a, b);
  if (op == "<") return c < 0;
  if (op == ">") return c > 0;
  if (op == "<=") return c <= 0;
  return c >= 0;
}

// ---- printf-style formatting ----

std::string percent_format(const std::string& fmt, const Value& args) {
  std::vector<Value> list = args.is_tuple() ? args.items() : std::vector<Value>{args};
  const DictData* mapping = args.is_dict() ? &args.dict_data() : nullptr;
  size_t next = 0;
  std::string out;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    if (++i >= fmt.size()) fail("incomplete format");
    if (fmt[i] == '%') {
      out += '%';
      continue;
    }
    const Value* arg = nullptr;
    Value holder;
    if (fmt[i] == '(' && mapping) {
      size_t close = fmt.find(')', i);
      if (close == std::string::npos) fail("incomplete format key");
      const Value* v = mapping->find(fmt.substr(i + 1, close - i - 1));
      if (!v) fail("format key not found: " + fmt.substr(i + 1, close - i - 1));
      arg = v;
      i = close + 1;
    }
    std::string spec = "%";
    bool left = false;
    while (i < fmt.size() && std::string_view("-+ 0#").find(fmt[i]) != std::string_view::npos) {
      left |= fmt[i] == '-';
      spec += fmt[i++];
    }
    size_t width = 0;
    while (i < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[i]))) {
      width = std::min<size_t>(width * 10 + (fmt[i] - '0'), 4096);
      spec += fmt[i++];
    }
    if (i < fmt.size() && fmt[i] == '.') {
      spec += fmt[i++];
      size_t precision = 0;
      while (i < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[i]))) {
        precision = std::min<size_t>(precision * 10 + (fmt[i] - '0'), 400);
        ++i;
      }
      spec += std::to_string(precision);
    }
    if (i >= fmt.size()) fail("incomplete format");
    char conv = fmt[i];
    if (!arg) {
      if (mapping && list.size() == 1) {
        holder = args;
        arg = &holder;
      } else {
        if (next >= list.size()) fail("not enough arguments for format string");
        arg = &list[next++];
      }
    }
    char buf[8192];
    switch (conv) {
      case 's': case 'r': case 'a': {
        std::string s = conv == 's' ? arg->str() : arg->repr();
        size_t len = utf8_length(s);
        if (len < width) s = left ? s + std::string(width - len, ' ') : std::string(width - len, ' ') + s;
        out += s;
        break;
      }
      case 'd': case 'i': case 'x': case 'X': case 'o': {
        if (!arg->is_number()) fail("%" + std::string(1, conv) + " format: a real number is required, not " + arg->type_name());
        long long v = arg->is_float() ? static_cast<long long>(arg->as_float()) : int_of(*arg);
        std::snprintf(buf, sizeof buf, (spec + "ll" + (conv == 'i' ? 'd' : conv)).c_str(), v);
        out += buf;
        break;
      }
      case 'f': case 'F': case 'e': case 'E': case 'g': case 'G': {
        if (!arg->is_number()) fail("must be real number, not " + arg->type_name());
        std::snprintf(buf, sizeof buf, (spec + conv).c_str(), arg->to_double());
        out += buf;
        break;
      }
      default: fail(std::string("unsupported format character '") + conv + "'");
    }
  }
  if (!mapping && next < list.size()) fail("not all arguments converted during string formatting");
  return out;
}

}  // namespace glms::jinja
