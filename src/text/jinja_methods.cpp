// Methods of str, dict and list values and the global functions templates may call. Methods
// that mutate a list or dict are refused, as in jinja2's ImmutableSandboxedEnvironment (which
// is what Hugging Face uses). See jinja_builtins.h.
#include <algorithm>
#include <cmath>
#include <ctime>
#include <set>

#include <utf8proc.h>

#include "text/jinja_builtins.h"

namespace glms::jinja {
namespace {

Value arg(const CallArgs& a, const char* name, int pos, Value def) {
  const Value* v = a.get(name, pos);
  return v ? *v : def;
}

std::string str_arg(const CallArgs& a, const char* name, int pos, const char* method) {
  const Value* v = a.get(name, pos);
  if (!v || !v->is_string()) fail(std::string(method) + "() argument must be str");
  return v->as_string();
}

bool affix_match(const std::string& s, const Value& affix, bool prefix, const char* method) {
  auto one = [&](const Value& x) {
    if (!x.is_string()) fail(std::string(method) + " first arg must be str or a tuple of str");
    const std::string& p = x.as_string();
    if (p.size() > s.size()) return false;
    return prefix ? s.compare(0, p.size(), p) == 0 : s.compare(s.size() - p.size(), p.size(), p) == 0;
  };
  if (affix.is_list()) {
    for (const Value& x : affix.items())
      if (one(x)) return true;
    return false;
  }
  return one(affix);
}

std::vector<Value> split(const std::string& s, const Value& sep_v, int64_t maxsplit, bool from_right) {
  std::vector<std::string> parts;
  if (sep_v.is_none() || sep_v.is_undefined()) {
    std::u32string u = to_u32(s);
    std::vector<std::u32string> words;
    if (!from_right) {
      size_t i = 0;
      while (true) {
        while (i < u.size() && py_isspace(u[i])) ++i;
        if (i >= u.size()) break;
        if (maxsplit >= 0 && static_cast<int64_t>(words.size()) == maxsplit) {
          words.push_back(u.substr(i));  // Python keeps the remainder's trailing space
          break;
        }
        size_t j = i;
        while (j < u.size() && !py_isspace(u[j])) ++j;
        words.push_back(u.substr(i, j - i));
        i = j;
      }
    } else {
      size_t e = u.size();
      while (true) {
        while (e > 0 && py_isspace(u[e - 1])) --e;
        if (e == 0) break;
        if (maxsplit >= 0 && static_cast<int64_t>(words.size()) == maxsplit) {
          words.push_back(u.substr(0, e));  // and the leading space of rsplit's remainder
          break;
        }
        size_t b = e;
        while (b > 0 && !py_isspace(u[b - 1])) --b;
        words.push_back(u.substr(b, e - b));
        e = b;
      }
      std::reverse(words.begin(), words.end());
    }
    for (auto& w : words) parts.push_back(from_u32(w));
  } else {
    if (!sep_v.is_string()) fail("must be str or None, not " + sep_v.type_name());
    const std::string& sep = sep_v.as_string();
    if (sep.empty()) fail("empty separator");
    if (!from_right) {
      size_t pos = 0;
      while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
        size_t hit = s.find(sep, pos);
        if (hit == std::string::npos) break;
        parts.push_back(s.substr(pos, hit - pos));
        pos = hit + sep.size();
      }
      parts.push_back(s.substr(pos));
    } else {
      size_t end = s.size();
      std::vector<std::string> rev;
      while (maxsplit < 0 || static_cast<int64_t>(rev.size()) < maxsplit) {
        if (end < sep.size()) break;
        size_t hit = s.rfind(sep, end - sep.size());
        if (hit == std::string::npos) break;
        rev.push_back(s.substr(hit + sep.size(), end - hit - sep.size()));
        end = hit;
      }
      rev.push_back(s.substr(0, end));
      parts.assign(rev.rbegin(), rev.rend());
    }
  }
  std::vector<Value> out;
  for (auto& p : parts) out.emplace_back(std::move(p));
  return out;
}

bool is_cased_letter(char32_t c) {
  if (c < 0x80) return std::isalpha(static_cast<int>(c)) != 0;
  auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
}

std::string py_title(const std::string& s) {
  std::string out;
  bool prev_cased = false;
  for (char32_t c : to_u32(s)) {
    std::string one = from_u32(std::u32string(1, c));
    bool cased = is_cased_letter(c);
    out += cased ? (prev_cased ? py_lower(one) : py_upper(one)) : one;
    prev_cased = cased;
  }
  return out;
}

// str.format with {} / {0} / {name} fields, {{ }} escapes and !s / !r conversions.
std::string str_format(const std::string& fmt, const CallArgs& a) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    char c = fmt[i];
    if (c == '}' ) {
      if (i + 1 < fmt.size() && fmt[i + 1] == '}') { out += '}'; ++i; continue; }
      fail("Single '}' encountered in format string");
    }
    if (c != '{') { out += c; continue; }
    if (i + 1 < fmt.size() && fmt[i + 1] == '{') { out += '{'; ++i; continue; }
    size_t close = fmt.find('}', i);
    if (close == std::string::npos) fail("Single '{' encountered in format string");
    std::string field = fmt.substr(i + 1, close - i - 1);
    i = close;
    char conv = 0;
    size_t bang = field.find('!');
    if (bang != std::string::npos) {
      conv = bang + 1 < field.size() ? field[bang + 1] : 0;
      field = field.substr(0, bang);
    }
    if (field.find(':') != std::string::npos) fail("format specs in str.format are not supported");
    const Value* v = nullptr;
    if (field.empty()) {
      v = auto_index < a.positional.size() ? &a.positional[auto_index] : nullptr;
      ++auto_index;
    } else if (std::all_of(field.begin(), field.end(), [](char d) { return std::isdigit(static_cast<unsigned char>(d)); })) {
      size_t k = std::stoul(field);
      v = k < a.positional.size() ? &a.positional[k] : nullptr;
    } else {
      v = a.get(field);
    }
    if (!v) fail("Replacement index " + field + " out of range for positional args tuple");
    out += conv == 'r' ? v->repr() : v->str();
  }
  return out;
}

Value string_method(const Value& self, const std::string& name, bool& found) {
  static const std::set<std::string> names = {
      "startswith", "endswith", "strip", "lstrip", "rstrip", "split", "rsplit", "splitlines",
      "replace", "lower", "upper", "title", "capitalize", "find", "rfind", "index", "count",
      "join", "format", "isdigit", "isalpha", "isalnum", "isspace", "islower", "isupper"};
  if (!names.count(name)) return Value();
  found = true;
  const std::string s = self.as_string();
  return Value::function("str." + name, [s, name](const CallArgs& a) -> Value {
    if (name == "startswith" || name == "endswith") {
      const Value* affix = a.get("prefix", 0);
      if (!affix) fail(name + "() takes at least 1 argument (0 given)");
      return Value(affix_match(s, *affix, name == "startswith", name.c_str()));
    }
    if (name == "strip" || name == "lstrip" || name == "rstrip")
      return Value(py_strip(s, a.get("chars", 0), name != "rstrip", name != "lstrip"));
    if (name == "split" || name == "rsplit") {
      Value maxsplit = arg(a, "maxsplit", 1, Value(-1));
      return Value::list(split(s, arg(a, "sep", 0, Value(nullptr)), maxsplit.is_int() ? maxsplit.as_int() : -1, name == "rsplit"));
    }
    if (name == "splitlines") {
      std::vector<Value> out;
      std::string cur;
      for (size_t i = 0; i < s.size(); ++i) {
        if (s[i] == '\n' || s[i] == '\r') {
          if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
          out.emplace_back(cur);
          cur.clear();
        } else {
          cur += s[i];
        }
      }
      if (!cur.empty()) out.emplace_back(cur);
      return Value::list(std::move(out));
    }
    if (name == "replace") {
      CallArgs fa;
      fa.positional = {arg(a, "old", 0, Value("")), arg(a, "new", 1, Value(""))};
      Value count = arg(a, "count", 2, Value(-1));
      if (count.is_int() && count.as_int() >= 0) fa.positional.push_back(count);
      return apply_filter("replace", Value(s), fa);
    }
    if (name == "lower") return Value(py_lower(s));
    if (name == "upper") return Value(py_upper(s));
    if (name == "title") return Value(py_title(s));
    if (name == "capitalize") return apply_filter("capitalize", Value(s), {});
    if (name == "find" || name == "rfind" || name == "index") {
      std::string sub = str_arg(a, "sub", 0, name.c_str());
      size_t hit = name == "rfind" ? s.rfind(sub) : s.find(sub);
      if (hit == std::string::npos) {
        if (name == "index") fail("substring not found");
        return Value(-1);
      }
      return Value(static_cast<int64_t>(utf8_length(s.substr(0, hit))));
    }
    if (name == "count") {
      std::string sub = str_arg(a, "sub", 0, "count");
      if (sub.empty()) return Value(static_cast<int64_t>(utf8_length(s) + 1));
      int64_t n = 0;
      for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
      return Value(n);
    }
    if (name == "join") {
      const Value* items = a.get("iterable", 0);
      if (!items) fail("join() takes exactly one argument (0 given)");
      std::string out;
      bool first = true;
      for (const Value& x : iterate(*items)) {
        if (!x.is_string()) fail("sequence item: expected str instance, " + x.type_name() + " found");
        if (!first) out += s;
        first = false;
        out += x.as_string();
      }
      return Value(std::move(out));
    }
    if (name == "format") return Value(str_format(s, a));
    std::u32string u = to_u32(s);
    if (u.empty()) return Value(false);
    auto all = [&](auto pred) { return Value(std::all_of(u.begin(), u.end(), pred)); };
    if (name == "isdigit") return all([](char32_t c) { return c >= '0' && c <= '9'; });
    if (name == "isalpha") return all([](char32_t c) { return is_cased_letter(c) || (c >= 0x80 && !py_isspace(c)); });
    if (name == "isalnum") return all([](char32_t c) { return (c >= '0' && c <= '9') || is_cased_letter(c) || (c >= 0x80 && !py_isspace(c)); });
    if (name == "isspace") return all(py_isspace);
    if (name == "islower") return Value(py_lower(s) == s && py_upper(s) != s);
    return Value(py_upper(s) == s && py_lower(s) != s);  // isupper
  });
}

Value unsafe(const Value& self, const std::string& name) {
  return Value::undefined("access to attribute '" + name + "' of '" + self.type_name() +
                          "' object is unsafe.");
}

}  // namespace

Value bound_method(const Value& obj, const std::string& name, bool& found) {
  found = false;
  if (obj.is_string()) return string_method(obj, name, found);
  if (obj.is_dict() && !obj.is_namespace()) {
    static const std::set<std::string> mutating = {"pop", "popitem", "setdefault", "update", "clear"};
    if (mutating.count(name)) {
      found = true;
      return unsafe(obj, name);
    }
    if (name != "items" && name != "keys" && name != "values" && name != "get" && name != "copy") return Value();
    found = true;
    Value self = obj;
    return Value::function("dict." + name, [self, name](const CallArgs& a) -> Value {
      const auto& d = self.dict_data();
      if (name == "get") {
        const Value* key = a.get("key", 0);
        if (!key) fail("get expected at least 1 argument, got 0");
        const Value* v = key->is_string() ? d.find(key->as_string()) : nullptr;
        return v ? *v : arg(a, "default", 1, Value(nullptr));
      }
      if (name == "copy") {
        Value c = Value::dict();
        for (const auto& [k, v] : d.items) c.dict_data().set(k, v);
        return c;
      }
      std::vector<Value> out;
      for (const auto& [k, v] : d.items) {
        if (name == "items") out.push_back(Value::tuple({Value(k), v}));
        else if (name == "keys") out.emplace_back(k);
        else out.push_back(v);
      }
      return Value::list(std::move(out));
    });
  }
  if (obj.is_list()) {
    static const std::set<std::string> mutating = {"append", "extend", "insert", "pop",
                                                   "remove", "reverse", "sort", "clear"};
    if (mutating.count(name) && !obj.is_tuple()) {
      found = true;
      return unsafe(obj, name);
    }
    if (name != "index" && name != "count") return Value();
    found = true;
    Value self = obj;
    return Value::function("list." + name, [self, name](const CallArgs& a) -> Value {
      const Value* x = a.get("value", 0);
      if (!x) fail(name + "() takes exactly one argument (0 given)");
      int64_t n = 0;
      const auto& items = self.items();
      for (size_t i = 0; i < items.size(); ++i) {
        if (!equals(items[i], *x)) continue;
        if (name == "index") return Value(static_cast<int64_t>(i));
        ++n;
      }
      if (name == "index") fail(x->repr() + " is not in list");
      return Value(n);
    });
  }
  if (obj.is_namespace()) {
    if (const Value* v = obj.dict_data().find(name)) {
      found = true;
      return *v;
    }
  }
  return Value();
}

void add_globals(DictData& g) {
  g.set("range", Value::function("range", [](const CallArgs& a) -> Value {
    std::vector<int64_t> n;
    for (const Value& v : a.positional) {
      if (!v.is_int() && !v.is_bool()) fail("'" + v.type_name() + "' object cannot be interpreted as an integer");
      n.push_back(v.is_int() ? v.as_int() : v.as_bool());
    }
    if (n.empty() || n.size() > 3) fail("range expected 1 to 3 arguments, got " + std::to_string(n.size()));
    int64_t start = n.size() == 1 ? 0 : n[0], stop = n.size() == 1 ? n[0] : n[1], step = n.size() == 3 ? n[2] : 1;
    if (step == 0) fail("range() arg 3 must not be zero");
    double count = std::ceil((static_cast<double>(stop) - static_cast<double>(start)) / static_cast<double>(step));
    if (count > 100000)
      fail("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    std::vector<Value> out;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.emplace_back(i);
    return Value::list(std::move(out));
  }));
  auto make_mapping = [](Value target, const CallArgs& a) {
    for (const Value& p : a.positional) {
      if (!p.is_dict()) fail("argument must be a mapping");
      for (const auto& [k, v] : p.dict_data().items) target.dict_data().set(k, v);
    }
    for (const auto& [k, v] : a.keyword) target.dict_data().set(k, v);
    return target;
  };
  g.set("dict", Value::function("dict", [make_mapping](const CallArgs& a) { return make_mapping(Value::dict(), a); }));
  g.set("namespace", Value::function("namespace", [make_mapping](const CallArgs& a) {
    return make_mapping(Value::make_namespace(), a);
  }));
  g.set("raise_exception", Value::function("raise_exception", [](const CallArgs& a) -> Value {
    const Value* msg = a.get("message", 0);
    throw RaisedError(msg ? msg->str() : "");
  }));
  g.set("strftime_now", Value::function("strftime_now", [](const CallArgs& a) -> Value {
    const Value* fmt = a.get("format", 0);
    if (!fmt || !fmt->is_string()) fail("strftime_now() needs a format string");
    std::time_t now = std::time(nullptr);
    std::tm tm{};
    localtime_r(&now, &tm);
    char buf[512];
    size_t n = std::strftime(buf, sizeof buf, fmt->as_string().c_str(), &tm);
    return Value(std::string(buf, n));
  }));
}

}  // namespace glms::jinja
