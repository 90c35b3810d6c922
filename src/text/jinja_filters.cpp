// Built-in filters and tests, following jinja2 3.1 (plus Hugging Face's tojson). See
// jinja_builtins.h and docs/chat_templates.md for the list.
#include <algorithm>
#include <cmath>
#include <functional>
#include <unordered_map>

#include <utf8proc.h>

#include "text/jinja_builtins.h"

namespace glms::jinja {
namespace {

using FilterFn = std::function<Value(const Value&, const CallArgs&)>;
using TestFn = std::function<bool(const Value&, const CallArgs&)>;

// Python's regex \w for non-ASCII code points: letters and numbers.
bool is_word_char(char32_t c) {
  auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
         (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO);
}

Value arg_or(const CallArgs& a, const char* name, int pos, Value def) {
  const Value* v = a.get(name, pos);
  return v ? *v : def;
}

std::string need_string(const Value& v, const char* filter) {
  if (v.is_undefined()) return "";
  if (v.is_string()) return v.as_string();
  (void)filter;
  return v.str();
}

// Attribute path getter as jinja2's make_attrgetter: "a.b.0" -> item lookups.
Value lookup_path(const Value& v, const Value& attribute) {
  if (!attribute.is_string()) return get_item(v, attribute);
  Value cur = v;
  const std::string& path = attribute.as_string();
  size_t start = 0;
  while (true) {
    size_t dot = path.find('.', start);
    std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
    cur = digits ? get_item(cur, Value(static_cast<int64_t>(std::stoll(part)))) : get_item(cur, Value(part));
    if (dot == std::string::npos) return cur;
    start = dot + 1;
  }
}

Value sort_key(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value(py_lower(v.as_string()));
  return v;
}

std::vector<Value> as_list(const Value& v) { return iterate(v); }

CallArgs shift_args(const CallArgs& a, size_t from) {
  CallArgs out;
  if (from < a.positional.size()) out.positional.assign(a.positional.begin() + from, a.positional.end());
  out.keyword = a.keyword;
  return out;
}

Value select_impl(const Value& seq, const CallArgs& a, bool attr, bool select) {
  std::vector<Value> out;
  size_t name_pos = attr ? 1 : 0;
  Value attribute = attr ? arg_or(a, "attribute", 0, Value()) : Value();
  const Value* test = a.positional.size() > name_pos ? &a.positional[name_pos] : nullptr;
  CallArgs test_args = shift_args(a, name_pos + 1);
  test_args.keyword.clear();
  for (const Value& item : as_list(seq)) {
    Value subject = attr ? lookup_path(item, attribute) : item;
    bool ok = test ? apply_test(test->str(), subject, test_args) : subject.truthy();
    if (ok == select) out.push_back(item);
  }
  return Value::list(std::move(out));
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> lines;
  std::string cur;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (c == '\n' || c == '\r' || c == '\v' || c == '\f' || (c >= 0x1c && c <= 0x1e)) {
      if (c == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
      lines.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) lines.push_back(cur);
  return lines;
}

Value to_int(const Value& v, const Value& def, int base) {
  if (v.is_int()) return v;
  if (v.is_bool()) return Value(static_cast<int64_t>(v.as_bool()));
  if (v.is_float()) {
    double f = v.as_float();
    if (!std::isfinite(f) || std::fabs(f) > 9.2e18) return def;
    return Value(static_cast<int64_t>(f));
  }
  if (v.is_string()) {
    std::string s = py_strip(v.as_string(), nullptr, true, true);
    std::string digits;
    for (char c : s)
      if (c != '_') digits += c;
    if (digits.empty()) return def;
    char* end = nullptr;
    errno = 0;
    long long r = std::strtoll(digits.c_str(), &end, base);
    if (*end == 0 && errno == 0) return Value(static_cast<int64_t>(r));
    end = nullptr;
    double f = std::strtod(digits.c_str(), &end);
    if (*end == 0 && std::isfinite(f) && std::fabs(f) < 9.2e18) return Value(static_cast<int64_t>(f));
  }
  return def;
}

Value to_float(const Value& v, const Value& def) {
  if (v.is_number()) return Value(v.to_double());
  if (v.is_string()) {
    std::string s = py_strip(v.as_string(), nullptr, true, true);
    if (s.empty()) return def;
    char* end = nullptr;
    double f = std::strtod(s.c_str(), &end);
    if (*end == 0) return Value(f);
  }
  return def;
}

Value tojson(const Value& v, const CallArgs& a) {
  bool ensure_ascii = arg_or(a, "ensure_ascii", 0, Value(false)).truthy();
  Value indent = arg_or(a, "indent", 1, Value(nullptr));
  Value separators = arg_or(a, "separators", 2, Value(nullptr));
  bool sort_keys = arg_or(a, "sort_keys", 3, Value(false)).truthy();
  int ind = -1;
  if (indent.is_int()) ind = static_cast<int>(std::clamp<int64_t>(indent.as_int(), 0, 64));
  std::optional<std::pair<std::string, std::string>> seps;
  if (separators.is_list() && separators.items().size() == 2)
    seps.emplace(separators.items()[0].str(), separators.items()[1].str());
  else if (!separators.is_none())
    fail("tojson: separators must be a pair of strings");
  return Value(v.to_json(ensure_ascii, ind, seps, sort_keys));
}

Value title(const std::string& s) {
  std::u32string u = to_u32(s), out;
  bool word_start = true;
  for (char32_t c : u) {
    bool sep = py_isspace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
    std::string one = from_u32(std::u32string(1, c));
    out += to_u32(sep ? one : word_start ? py_upper(one) : py_lower(one));
    word_start = sep;
  }
  return Value(from_u32(out));
}

// Filters over strings: conversion, trimming, length, case, replacing.
void add_text_filters(std::unordered_map<std::string, FilterFn>& f) {
  f["safe"] = [](const Value& v, const CallArgs&) { return v; };
  f["string"] = [](const Value& v, const CallArgs&) { return Value(v.str()); };
  f["tojson"] = tojson;
  f["trim"] = [](const Value& v, const CallArgs& a) {
    return Value(py_strip(need_string(v, "trim"), a.get("chars", 0), true, true));
  };
  f["length"] = [](const Value& v, const CallArgs&) -> Value {
    if (v.is_string()) return Value(static_cast<int64_t>(utf8_length(v.as_string())));
    if (v.is_list()) return Value(static_cast<int64_t>(v.items().size()));
    if (v.is_dict() && !v.is_namespace()) return Value(static_cast<int64_t>(v.dict_data().items.size()));
    if (v.is_undefined()) return Value(0);
    fail("object of type '" + v.type_name() + "' has no len()");
  };
  f["count"] = f["length"];
  f["lower"] = [](const Value& v, const CallArgs&) { return Value(py_lower(need_string(v, "lower"))); };
  f["upper"] = [](const Value& v, const CallArgs&) { return Value(py_upper(need_string(v, "upper"))); };
  f["capitalize"] = [](const Value& v, const CallArgs&) {
    std::u32string u = to_u32(need_string(v, "capitalize"));
    if (u.empty()) return Value("");
    return Value(py_upper(from_u32(u.substr(0, 1))) + py_lower(from_u32(u.substr(1))));
  };
  f["title"] = [](const Value& v, const CallArgs&) { return title(need_string(v, "title")); };
  f["replace"] = [](const Value& v, const CallArgs& a) {
    std::string s = need_string(v, "replace");
    Value old_v = arg_or(a, "old", 0, Value("")), new_v = arg_or(a, "new", 1, Value(""));
    Value count = arg_or(a, "count", 2, Value(nullptr));
    std::string from = old_v.str(), to = new_v.str();
    int64_t limit = count.is_int() ? count.as_int() : -1;
    std::string out;
    size_t pos = 0;
    int64_t done = 0;
    if (from.empty()) {  // Python inserts `to` between characters
      std::u32string u = to_u32(s);
      for (size_t i = 0; i <= u.size(); ++i) {
        if (limit < 0 || done < limit) { out += to; ++done; }
        if (i < u.size()) out += from_u32(u.substr(i, 1));
      }
      return Value(std::move(out));
    }
    while (limit < 0 || done < limit) {
      size_t hit = s.find(from, pos);
      if (hit == std::string::npos) break;
      out.append(s, pos, hit - pos);
      out += to;
      pos = hit + from.size();
      ++done;
    }
    out.append(s, pos);
    return Value(std::move(out));
  };
}

// Filters of HTML and text layout: escaping, indenting, centring, counting words, formatting.
void add_layout_filters(std::unordered_map<std::string, FilterFn>& f) {
  f["escape"] = [](const Value& v, const CallArgs&) { return Value(html_escape(v.str())); };
  f["e"] = f["escape"];
  f["forceescape"] = f["escape"];
  f["indent"] = [](const Value& v, const CallArgs& a) {
    Value width = arg_or(a, "width", 0, Value(4));
    bool first = arg_or(a, "first", 1, Value(false)).truthy();
    bool blank = arg_or(a, "blank", 2, Value(false)).truthy();
    std::string ind = width.is_string() ? width.as_string() : std::string(static_cast<size_t>(std::clamp<int64_t>(width.is_int() ? width.as_int() : 4, 0, 1024)), ' ');
    std::vector<std::string> lines = split_lines(need_string(v, "indent") + "\n");
    std::string rv;
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i) rv += "\n";
      if (i && (blank || !lines[i].empty())) rv += ind;
      rv += lines[i];
    }
    if (first) rv = ind + rv;
    return Value(std::move(rv));
  };
  f["center"] = [](const Value& v, const CallArgs& a) {
    std::string s = need_string(v, "center");
    int64_t width = arg_or(a, "width", 0, Value(80)).is_int() ? arg_or(a, "width", 0, Value(80)).as_int() : 80;
    int64_t len = static_cast<int64_t>(utf8_length(s));
    if (width <= len) return Value(s);
    width = std::min<int64_t>(width, 1 << 20);
    int64_t marg = width - len, left = marg / 2 + (marg & width & 1);
    return Value(std::string(left, ' ') + s + std::string(marg - left, ' '));
  };
  f["wordcount"] = [](const Value& v, const CallArgs&) {
    int64_t n = 0;
    bool in_word = false;
    for (char32_t c : to_u32(need_string(v, "wordcount"))) {
      bool w = c == '_' || (c < 0x80 ? std::isalnum(static_cast<int>(c)) != 0 : is_word_char(c));
      if (w && !in_word) ++n;
      in_word = w;
    }
    return Value(n);
  };
  f["striptags"] = [](const Value& v, const CallArgs&) {
    std::string s = need_string(v, "striptags"), out;
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i] == '<') {
        size_t close = s.find('>', i);
        if (close != std::string::npos) { i = close; continue; }
      }
      out += s[i];
    }
    std::string collapsed;
    for (char32_t c : to_u32(out)) {
      if (py_isspace(c)) {
        if (!collapsed.empty() && collapsed.back() != ' ') collapsed += ' ';
      } else {
        collapsed += from_u32(std::u32string(1, c));
      }
    }
    while (!collapsed.empty() && collapsed.back() == ' ') collapsed.pop_back();
    return Value(std::move(collapsed));
  };
  f["format"] = [](const Value& v, const CallArgs& a) {
    return Value(percent_format(need_string(v, "format"), Value::tuple(a.positional)));
  };
  f["truncate"] = [](const Value& v, const CallArgs& a) {
    std::string s = need_string(v, "truncate");
    int64_t length = arg_or(a, "length", 0, Value(255)).as_int();
    bool killwords = arg_or(a, "killwords", 1, Value(false)).truthy();
    std::string end = arg_or(a, "end", 2, Value("...")).str();
    Value leeway_v = arg_or(a, "leeway", 3, Value(5));
    int64_t leeway = leeway_v.is_int() ? leeway_v.as_int() : 5;
    std::u32string u = to_u32(s), e = to_u32(end);
    if (static_cast<int64_t>(u.size()) <= length + leeway) return Value(s);
    int64_t keep = std::max<int64_t>(0, length - static_cast<int64_t>(e.size()));
    std::u32string head = u.substr(0, keep);
    if (!killwords) {
      size_t sp = head.rfind(U' ');
      if (sp != std::u32string::npos) head = head.substr(0, sp);
    }
    return Value(from_u32(head) + end);
  };
}

// Filters that make or round numbers, and default values.
void add_number_filters(std::unordered_map<std::string, FilterFn>& f) {
  f["int"] = [](const Value& v, const CallArgs& a) {
    Value base = arg_or(a, "base", 1, Value(10));
    return to_int(v, arg_or(a, "default", 0, Value(0)), base.is_int() ? static_cast<int>(base.as_int()) : 10);
  };
  f["float"] = [](const Value& v, const CallArgs& a) { return to_float(v, arg_or(a, "default", 0, Value(0.0))); };
  f["default"] = [](const Value& v, const CallArgs& a) {
    Value def = arg_or(a, "default_value", 0, Value(""));
    bool boolean = arg_or(a, "boolean", 1, Value(false)).truthy();
    if (v.is_undefined() || (boolean && !v.truthy())) return def;
    return v;
  };
  f["d"] = f["default"];
  f["abs"] = [](const Value& v, const CallArgs&) -> Value {
    if (v.is_float()) return Value(std::fabs(v.as_float()));
    if (v.is_int() || v.is_bool()) return unary_op(v.is_int() && v.as_int() < 0 ? "-" : "+", v);
    fail("bad operand type for abs(): '" + v.type_name() + "'");
  };
  f["round"] = [](const Value& v, const CallArgs& a) -> Value {
    int64_t precision = arg_or(a, "precision", 0, Value(0)).is_int() ? arg_or(a, "precision", 0, Value(0)).as_int() : 0;
    std::string method = arg_or(a, "method", 1, Value("common")).str();
    if (!v.is_number()) fail("round filter needs a number");
    double x = v.to_double(), scale = std::pow(10.0, static_cast<double>(precision));
    double r = method == "ceil" ? std::ceil(x * scale) / scale
               : method == "floor" ? std::floor(x * scale) / scale
                                   : std::nearbyint(x * scale) / scale;
    if (method == "common" && !v.is_float()) return Value(static_cast<int64_t>(r));
    return Value(r);
  };
}

// Filters over lists and dicts: joining, picking, converting, mapping, selecting.
void add_sequence_filters(std::unordered_map<std::string, FilterFn>& f) {
  f["join"] = [](const Value& v, const CallArgs& a) {
    std::string sep = arg_or(a, "d", 0, Value("")).str();
    Value attribute = arg_or(a, "attribute", 1, Value());
    std::string out;
    bool first = true;
    for (const Value& item : as_list(v)) {
      if (!first) out += sep;
      first = false;
      out += (attribute.is_undefined() ? item : lookup_path(item, attribute)).str();
      if (out.size() > kMaxBuiltSize) fail("join result too large");
    }
    return Value(std::move(out));
  };
  f["first"] = [](const Value& v, const CallArgs&) {
    auto items = as_list(v);
    return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
  };
  f["last"] = [](const Value& v, const CallArgs&) {
    auto items = as_list(v);
    return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
  };
  f["list"] = [](const Value& v, const CallArgs&) { return Value::list(as_list(v)); };
  f["items"] = [](const Value& v, const CallArgs&) {
    std::vector<Value> out;
    if (v.is_undefined()) return Value::list();
    if (!v.is_dict() || v.is_namespace()) fail("Can only get item pairs from a mapping.");
    for (const auto& [k, x] : v.dict_data().items) out.push_back(Value::tuple({Value(k), x}));
    return Value::list(std::move(out));
  };
  f["dictsort"] = [](const Value& v, const CallArgs& a) {
    if (!v.is_dict()) fail("dictsort filter needs a mapping");
    bool cs = arg_or(a, "case_sensitive", 0, Value(false)).truthy();
    bool by_value = arg_or(a, "by", 1, Value("key")).str() == "value";
    bool reverse = arg_or(a, "reverse", 2, Value(false)).truthy();
    std::vector<Value> out;
    for (const auto& [k, x] : v.dict_data().items) out.push_back(Value::tuple({Value(k), x}));
    std::stable_sort(out.begin(), out.end(), [&](const Value& p, const Value& q) {
      int c = order(sort_key(p.items()[by_value], cs), sort_key(q.items()[by_value], cs));
      return reverse ? c > 0 : c < 0;
    });
    return Value::list(std::move(out));
  };
  f["map"] = [](const Value& v, const CallArgs& a) {
    std::vector<Value> out;
    const Value* attribute = a.get("attribute");
    for (const Value& item : as_list(v)) {
      if (attribute) {
        Value r = lookup_path(item, *attribute);
        if (r.is_undefined()) {
          if (const Value* def = a.get("default")) r = *def;
        }
        out.push_back(r);
      } else {
        if (a.positional.empty()) fail("map requires a filter argument");
        out.push_back(apply_filter(a.positional[0].str(), item, shift_args(a, 1)));
      }
    }
    return Value::list(std::move(out));
  };
  f["select"] = [](const Value& v, const CallArgs& a) { return select_impl(v, a, false, true); };
  f["reject"] = [](const Value& v, const CallArgs& a) { return select_impl(v, a, false, false); };
  f["selectattr"] = [](const Value& v, const CallArgs& a) { return select_impl(v, a, true, true); };
  f["rejectattr"] = [](const Value& v, const CallArgs& a) { return select_impl(v, a, true, false); };
}

// Filters that order, reduce and regroup lists: unique, sort, reverse, sum, max, min, batch, attr.
void add_ordering_filters(std::unordered_map<std::string, FilterFn>& f) {
  f["unique"] = [](const Value& v, const CallArgs& a) {
    bool cs = arg_or(a, "case_sensitive", 0, Value(false)).truthy();
    Value attribute = arg_or(a, "attribute", 1, Value());
    std::vector<Value> out, seen;
    for (const Value& item : as_list(v)) {
      Value key = sort_key(attribute.is_undefined() ? item : lookup_path(item, attribute), cs);
      if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, key); })) {
        seen.push_back(key);
        out.push_back(item);
      }
    }
    return Value::list(std::move(out));
  };
  f["sort"] = [](const Value& v, const CallArgs& a) {
    bool reverse = arg_or(a, "reverse", 0, Value(false)).truthy();
    bool cs = arg_or(a, "case_sensitive", 1, Value(false)).truthy();
    Value attribute = arg_or(a, "attribute", 2, Value());
    std::vector<Value> items = as_list(v);
    std::stable_sort(items.begin(), items.end(), [&](const Value& p, const Value& q) {
      Value kp = sort_key(attribute.is_undefined() ? p : lookup_path(p, attribute), cs);
      Value kq = sort_key(attribute.is_undefined() ? q : lookup_path(q, attribute), cs);
      return reverse ? order(kq, kp) < 0 : order(kp, kq) < 0;
    });
    return Value::list(std::move(items));
  };
  f["reverse"] = [](const Value& v, const CallArgs&) {
    if (v.is_string()) {
      std::u32string u = to_u32(v.as_string());
      std::reverse(u.begin(), u.end());
      return Value(from_u32(u));
    }
    std::vector<Value> items = as_list(v);
    std::reverse(items.begin(), items.end());
    return Value::list(std::move(items));
  };
  f["sum"] = [](const Value& v, const CallArgs& a) {
    Value attribute = arg_or(a, "attribute", 0, Value());
    Value total = arg_or(a, "start", 1, Value(0));
    for (const Value& item : as_list(v))
      total = binary_op("+", total, attribute.is_undefined() ? item : lookup_path(item, attribute));
    return total;
  };
  auto minmax = [](bool want_max) {
    return [want_max](const Value& v, const CallArgs& a) {
      bool cs = arg_or(a, "case_sensitive", 0, Value(false)).truthy();
      Value attribute = arg_or(a, "attribute", 1, Value());
      std::vector<Value> items = as_list(v);
      if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
      size_t best = 0;
      auto key = [&](size_t i) { return sort_key(attribute.is_undefined() ? items[i] : lookup_path(items[i], attribute), cs); };
      for (size_t i = 1; i < items.size(); ++i) {
        int c = order(key(i), key(best));
        if (want_max ? c > 0 : c < 0) best = i;
      }
      return items[best];
    };
  };
  f["max"] = minmax(true);
  f["min"] = minmax(false);
  f["batch"] = [](const Value& v, const CallArgs& a) {
    Value n = arg_or(a, "linecount", 0, Value(1));
    const Value* fill = a.get("fill_with", 1);
    if (!n.is_int() || n.as_int() <= 0) fail("batch size must be a positive integer");
    std::vector<Value> out, cur;
    for (const Value& item : as_list(v)) {
      cur.push_back(item);
      if (static_cast<int64_t>(cur.size()) == n.as_int()) {
        out.push_back(Value::list(std::move(cur)));
        cur.clear();
      }
    }
    if (!cur.empty()) {
      if (fill && !fill->is_none())
        while (static_cast<int64_t>(cur.size()) < n.as_int()) cur.push_back(*fill);
      out.push_back(Value::list(std::move(cur)));
    }
    return Value::list(std::move(out));
  };
  f["attr"] = [](const Value& v, const CallArgs& a) {
    std::string name = arg_or(a, "name", 0, Value("")).str();
    bool found = false;
    Value m = bound_method(v, name, found);
    if (found) return m;
    if (v.is_namespace())
      if (const Value* x = v.dict_data().find(name)) return *x;
    return Value::undefined("'" + v.type_name() + " object' has no attribute '" + name + "'");
  };
}

const std::unordered_map<std::string, FilterFn>& filters() {
  static const std::unordered_map<std::string, FilterFn> table = [] {
    std::unordered_map<std::string, FilterFn> f;
    add_text_filters(f);
    add_layout_filters(f);
    add_number_filters(f);
    add_sequence_filters(f);
    add_ordering_filters(f);
    return f;
  }();
  return table;
}

bool test_sameas(const Value& v, const Value& other) {
  if (v.kind() != other.kind()) return false;
  if (v.is_list() || v.is_dict()) return &v.items() == &other.items() || (v.is_dict() && &v.dict_data() == &other.dict_data());
  return equals(v, other);
}

const std::unordered_map<std::string, TestFn>& tests() {
  static const std::unordered_map<std::string, TestFn> table = [] {
    std::unordered_map<std::string, TestFn> t;
    auto arg0 = [](const CallArgs& a) -> Value {
      if (a.positional.empty() && a.keyword.empty()) fail("test needs an argument");
      return a.positional.empty() ? a.keyword[0].second : a.positional[0];
    };
    t["defined"] = [](const Value& v, const CallArgs&) { return !v.is_undefined(); };
    t["undefined"] = [](const Value& v, const CallArgs&) { return v.is_undefined(); };
    t["none"] = [](const Value& v, const CallArgs&) { return v.is_none(); };
    t["boolean"] = [](const Value& v, const CallArgs&) { return v.is_bool(); };
    t["true"] = [](const Value& v, const CallArgs&) { return v.is_bool() && v.as_bool(); };
    t["false"] = [](const Value& v, const CallArgs&) { return v.is_bool() && !v.as_bool(); };
    t["integer"] = [](const Value& v, const CallArgs&) { return v.is_int(); };
    t["float"] = [](const Value& v, const CallArgs&) { return v.is_float(); };
    t["number"] = [](const Value& v, const CallArgs&) { return v.is_number(); };
    t["string"] = [](const Value& v, const CallArgs&) { return v.is_string(); };
    t["mapping"] = [](const Value& v, const CallArgs&) { return v.is_dict() && !v.is_namespace(); };
    t["iterable"] = [](const Value& v, const CallArgs&) {
      return v.is_string() || v.is_list() || (v.is_dict() && !v.is_namespace()) || v.is_undefined();
    };
    t["sequence"] = t["iterable"];
    t["callable"] = [](const Value& v, const CallArgs&) { return v.is_callable(); };
    t["odd"] = [](const Value& v, const CallArgs&) {
      if (!v.is_int() && !v.is_bool()) fail("odd test needs an integer");
      return (v.is_int() ? v.as_int() : v.as_bool()) % 2 != 0;
    };
    t["even"] = [](const Value& v, const CallArgs&) {
      if (!v.is_int() && !v.is_bool()) fail("even test needs an integer");
      return (v.is_int() ? v.as_int() : v.as_bool()) % 2 == 0;
    };
    t["divisibleby"] = [arg0](const Value& v, const CallArgs& a) {
      Value n = arg0(a);
      Value r = binary_op("%", v, n);
      return equals(r, Value(0));
    };
    t["sameas"] = [arg0](const Value& v, const CallArgs& a) { return test_sameas(v, arg0(a)); };
    for (const char* name : {"eq", "equalto", "=="})
      t[name] = [arg0](const Value& v, const CallArgs& a) { return equals(v, arg0(a)); };
    for (const char* name : {"ne", "!="})
      t[name] = [arg0](const Value& v, const CallArgs& a) { return !equals(v, arg0(a)); };
    for (const char* name : {"lt", "lessthan", "<"})
      t[name] = [arg0](const Value& v, const CallArgs& a) { return compare("<", v, arg0(a)); };
    for (const char* name : {"le", "<="})
      t[name] = [arg0](const Value& v, const CallArgs& a) { return compare("<=", v, arg0(a)); };
    for (const char* name : {"gt", "greaterthan", ">"})
      t[name] = [arg0](const Value& v, const CallArgs& a) { return compare(">", v, arg0(a)); };
    for (const char* name : {"ge", ">="})
      t[name] = [arg0](const Value& v, const CallArgs& a) { return compare(">=", v, arg0(a)); };
    t["in"] = [arg0](const Value& v, const CallArgs& a) { return compare("in", v, arg0(a)); };
    t["lower"] = [](const Value& v, const CallArgs&) {
      return v.is_string() && py_lower(v.as_string()) == v.as_string() && py_upper(v.as_string()) != v.as_string();
    };
    t["upper"] = [](const Value& v, const CallArgs&) {
      return v.is_string() && py_upper(v.as_string()) == v.as_string() && py_lower(v.as_string()) != v.as_string();
    };
    t["escaped"] = [](const Value&, const CallArgs&) { return false; };
    t["filter"] = [](const Value& v, const CallArgs&) { return v.is_string() && has_filter(v.as_string()); };
    t["test"] = [](const Value& v, const CallArgs&) { return v.is_string() && has_test(v.as_string()); };
    return t;
  }();
  return table;
}

}  // namespace

bool has_filter(const std::string& name) { return filters().count(name) != 0; }

Value apply_filter(const std::string& name, const Value& input, const CallArgs& args) {
  auto it = filters().find(name);
  if (it == filters().end()) fail("no filter named '" + name + "'");
  return it->second(input, args);
}

bool has_test(const std::string& name) { return tests().count(name) != 0; }

bool apply_test(const std::string& name, const Value& value, const CallArgs& args) {
  auto it = tests().find(name);
  if (it == tests().end()) fail("no test named '" + name + "'");
  return it->second(value, args);
}

}  // namespace glms::jinja
