// Value decoding for GLM tool calls: json.loads, then a Python-literal subset of
// ast.literal_eval, then the raw string; serialization as json.dumps(ensure_ascii=False).
#include "text/glm_arg_values.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>

#include <nlohmann/json.hpp>

namespace glms::text::detail {
namespace {

using ojson = nlohmann::ordered_json;

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

bool is_ident_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         static_cast<unsigned char>(c) >= 0x80;
}

int digit_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return 99;
}

// A subset of ast.literal_eval: str (with r/u prefixes, escapes, triple quotes, implicit
// concatenation), int (decimal, 0x/0o/0b, underscores), float, one unary sign on numbers,
// True/False/None, list, tuple (-> array) and dict (keys str, or numbers/bools/None converted
// as json.dumps converts them). Sets, bytes, complex numbers, comments and integers beyond 64
// bits are refused (the caller then keeps the text as a string).
class PyLiteral {
 public:
  explicit PyLiteral(std::string_view s) : s_(s) {}

  bool parse(ojson& out) {
    skip_ws();
    if (!value(out)) return false;
    skip_ws();
    if (eat(',')) {  // a bare tuple: "1, 2" or "1,"
      ojson items = ojson::array();
      items.push_back(std::move(out));
      skip_ws();
      while (!at_end()) {
        ojson v;
        if (!value(v)) return false;
        items.push_back(std::move(v));
        skip_ws();
        if (!eat(',')) break;
        skip_ws();
      }
      out = std::move(items);
    }
    skip_ws();
    return at_end();
  }

 private:
  bool at_end() const { return pos_ >= s_.size(); }
  char peek(size_t ahead = 0) const { return pos_ + ahead < s_.size() ? s_[pos_ + ahead] : '\0'; }
  bool eat(char c) {
    if (peek() != c || at_end()) return false;
    ++pos_;
    return true;
  }
  // Outside brackets a line break ends a Python expression; inside them it is whitespace.
  void skip_ws() {
    while (!at_end()) {
      char c = s_[pos_];
      if (c == ' ' || c == '\t' || c == '\f' || (depth_ > 0 && (c == '\n' || c == '\r'))) {
        ++pos_;
      } else {
        break;
      }
    }
  }

  bool value(ojson& out) {
    if (at_end()) return false;
    char c = peek();
    if (c == '[' || c == '(' || c == '{') {
      if (depth_ >= 256) return false;
      ++pos_;
      ++depth_;
      bool ok = c == '[' ? list(out, ']') : c == '(' ? tuple(out) : dict(out);
      --depth_;
      return ok;
    }
    if (c == '\'' || c == '"') return strings(out, false);
    if (c == '+' || c == '-') {
      ++pos_;
      skip_ws();
      if (!number(out)) return false;
      if (c == '-') {
        if (out.is_number_float()) {
          out = -out.get<double>();
        } else if (out.is_number_unsigned()) {
          uint64_t m = out.get<uint64_t>();
          if (m > uint64_t{1} << 63) return false;
          out = m == uint64_t{1} << 63 ? std::numeric_limits<int64_t>::min() : -static_cast<int64_t>(m);
        } else {
          out = -out.get<int64_t>();
        }
      }
      return true;
    }
    if ((c >= '0' && c <= '9') || (c == '.' && peek(1) >= '0' && peek(1) <= '9')) return number(out);
    size_t start = pos_;
    while (!at_end() && is_ident_char(peek())) ++pos_;
    std::string_view word = s_.substr(start, pos_ - start);
    if (peek() == '\'' || peek() == '"') {
      if (word == "r" || word == "R") return strings(out, true);
      if (word == "u" || word == "U") return strings(out, false);
      return false;  // bytes, f-strings
    }
    if (word == "True") out = true;
    else if (word == "False") out = false;
    else if (word == "None") out = nullptr;
    else return false;
    return true;
  }

  bool list(ojson& out, char close) {
    out = ojson::array();
    skip_ws();
    while (!eat(close)) {
      ojson v;
      if (!value(v)) return false;
      out.push_back(std::move(v));
      skip_ws();
      if (!eat(',')) {
        if (!eat(close)) return false;
        return true;
      }
      skip_ws();
    }
    return true;
  }

  bool tuple(ojson& out) {
    skip_ws();
    if (eat(')')) {
      out = ojson::array();
      return true;
    }
    ojson first;
    if (!value(first)) return false;
    skip_ws();
    if (eat(')')) {  // parenthesized expression
      out = std::move(first);
      return true;
    }
    if (!eat(',')) return false;
    ojson rest;
    if (!list(rest, ')')) return false;
    out = ojson::array();
    out.push_back(std::move(first));
    for (auto& v : rest) out.push_back(std::move(v));
    return true;
  }

  bool dict(ojson& out) {
    out = ojson::object();
    skip_ws();
    while (!eat('}')) {
      ojson key;
      if (!value(key)) return false;
      std::string name;
      if (key.is_string()) name = key.get<std::string>();
      else if (key.is_boolean()) name = key.get<bool>() ? "true" : "false";
      else if (key.is_null()) name = "null";
      else if (key.is_number_float()) name = py_float_repr(key.get<double>());
      else if (key.is_number()) name = key.dump();
      else return false;  // unhashable or not serializable as a key
      skip_ws();
      if (!eat(':')) return false;  // a set, or a syntax error
      skip_ws();
      ojson v;
      if (!value(v)) return false;
      out[name] = std::move(v);
      skip_ws();
      if (!eat(',')) return eat('}');
      skip_ws();
    }
    return true;
  }

  // One or more adjacent string literals, concatenated.
  bool strings(ojson& out, bool raw) {
    std::string text;
    for (;;) {
      if (!string_literal(text, raw)) return false;
      size_t save = pos_;
      skip_ws();
      size_t start = pos_;
      while (!at_end() && is_ident_char(peek())) ++pos_;
      std::string_view prefix = s_.substr(start, pos_ - start);
      if ((peek() == '\'' || peek() == '"') &&
          (prefix.empty() || prefix == "r" || prefix == "R" || prefix == "u" || prefix == "U")) {
        raw = prefix == "r" || prefix == "R";
        continue;
      }
      pos_ = save;
      break;
    }
    out = std::move(text);
    return true;
  }

  bool string_literal(std::string& text, bool raw) {
    char q = peek();
    bool triple = peek(1) == q && peek(2) == q;
    pos_ += triple ? 3 : 1;
    for (;;) {
      if (at_end()) return false;
      char c = s_[pos_];
      if (c == q && (!triple || (peek(1) == q && peek(2) == q))) {
        pos_ += triple ? 3 : 1;
        return true;
      }
      if (!triple && (c == '\n' || c == '\r')) return false;
      ++pos_;
      if (c != '\\') {
        text += c;
        continue;
      }
      if (at_end()) return false;
      char e = s_[pos_++];
      if (raw) {
        text += '\\';
        text += e;
        continue;
      }
      if (!escape(e, text)) return false;
    }
  }

  bool hex_code(size_t digits, uint32_t& cp) {
    cp = 0;
    for (size_t i = 0; i < digits; ++i) {
      int d = digit_value(peek());
      if (d > 15) return false;
      cp = cp * 16 + static_cast<uint32_t>(d);
      ++pos_;
    }
    return true;
  }

  bool escape(char e, std::string& text) {
    uint32_t cp = 0;
    switch (e) {
      case '\n': return true;  // line continuation
      case '\\': case '\'': case '"': text += e; return true;
      case 'a': text += '\a'; return true;
      case 'b': text += '\b'; return true;
      case 'f': text += '\f'; return true;
      case 'n': text += '\n'; return true;
      case 'r': text += '\r'; return true;
      case 't': text += '\t'; return true;
      case 'v': text += '\v'; return true;
      case 'x': if (!hex_code(2, cp)) return false; break;
      case 'u': if (!hex_code(4, cp)) return false; break;
      case 'U': if (!hex_code(8, cp)) return false; break;
      case 'N': return false;  // named characters: not supported
      default:
        if (e >= '0' && e <= '7') {
          cp = static_cast<uint32_t>(e - '0');
          for (int i = 0; i < 2 && peek() >= '0' && peek() <= '7'; ++i) cp = cp * 8 + (s_[pos_++] - '0');
          break;
        }
        text += '\\';  // unknown escapes stay as written
        text += e;
        return true;
    }
    if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    append_utf8(text, cp);
    return true;
  }

  // Digits of `base` with single underscores between them; appends them without underscores.
  bool digit_part(int base, std::string& digits, bool allow_leading_underscore = false) {
    size_t start = digits.size();
    bool underscore = allow_leading_underscore && eat('_');
    while (!at_end()) {
      char c = peek();
      if (c == '_') {
        if (underscore || digits.size() == start) return false;
        underscore = true;
        ++pos_;
        continue;
      }
      if (digit_value(c) >= base) break;
      digits += c;
      underscore = false;
      ++pos_;
    }
    return !underscore && digits.size() > start;
  }

  bool number(ojson& out) {
    std::string digits;
    int base = 10;
    if (peek() == '0' && (peek(1) == 'x' || peek(1) == 'X' || peek(1) == 'o' || peek(1) == 'O' ||
                          peek(1) == 'b' || peek(1) == 'B')) {
      char p = static_cast<char>(peek(1) | 0x20);
      base = p == 'x' ? 16 : p == 'o' ? 8 : 2;
      pos_ += 2;
      if (!digit_part(base, digits, true)) return false;
    } else {
      bool is_float = false;
      if (peek() != '.' && !digit_part(10, digits)) return false;
      size_t int_digits = digits.size();
      if (peek() == '.') {
        is_float = true;
        digits += '.';
        ++pos_;
        if (peek() >= '0' && peek() <= '9' && !digit_part(10, digits)) return false;
        if (digits.size() == 1) return false;  // a lone "."
      }
      if (peek() == 'e' || peek() == 'E') {
        is_float = true;
        digits += 'e';
        ++pos_;
        if (peek() == '+' || peek() == '-') digits += s_[pos_++];
        if (!digit_part(10, digits)) return false;
      }
      if (!is_float && int_digits > 1 && digits[0] == '0' && digits.find_first_not_of('0') != std::string::npos)
        return false;  // leading zeros are a syntax error in Python 3
      if (is_float) {
        if (peek() == 'j' || peek() == 'J' || is_ident_char(peek())) return false;
        double d = 0;
        auto r = std::from_chars(digits.data(), digits.data() + digits.size(), d);
        if (r.ec == std::errc::result_out_of_range) {
          d = digits.find("e-") != std::string::npos ? 0.0 : std::numeric_limits<double>::infinity();
        } else if (r.ec != std::errc() || r.ptr != digits.data() + digits.size()) {
          return false;
        }
        out = d;
        return true;
      }
    }
    if (peek() == 'j' || peek() == 'J' || is_ident_char(peek()) || peek() == '.') return false;
    uint64_t v = 0;
    auto r = std::from_chars(digits.data(), digits.data() + digits.size(), v, base);
    if (r.ec != std::errc() || r.ptr != digits.data() + digits.size()) return false;  // > 64 bits
    if (v <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) out = static_cast<int64_t>(v);
    else out = v;
    return true;
  }

  std::string_view s_;
  size_t pos_ = 0;
  int depth_ = 0;
};

// Whether JSON text nests brackets deeper than `limit` (outside strings).
bool nests_deeper_than(std::string_view text, int limit) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

// Whether `j` holds an infinite or NaN number, which JSON cannot write.
bool has_non_finite(const ojson& j) {
  if (j.is_number_float()) return !std::isfinite(j.get<double>());
  if (j.is_structured())
    for (const auto& v : j)
      if (has_non_finite(v)) return true;
  return false;
}

ojson decode_value(std::string_view value) {
  // Model output is untrusted: a value nested deeper than any real argument stays a string, so
  // nothing downstream (dump, the client's parser) recurses through it.
  constexpr int kMaxValueDepth = 64;
  if (nests_deeper_than(value, kMaxValueDepth)) return ojson(std::string(value));
  ojson j = ojson::parse(value.begin(), value.end(), nullptr, /*allow_exceptions=*/false);
  if (!j.is_discarded()) return j;
  ojson lit;
  // A literal with inf or nan (1e999) stays a string: vLLM would write Infinity, which is not
  // JSON and breaks the client's parse of `arguments`.
  if (PyLiteral(value).parse(lit) && !has_non_finite(lit)) return lit;
  return ojson(std::string(value));
}

// json.dumps(value, ensure_ascii=False) with its default separators.
void dump_py(const ojson& j, std::string& out) {
  switch (j.type()) {
    case ojson::value_t::object: {
      out += '{';
      bool first = true;
      for (auto it = j.begin(); it != j.end(); ++it) {
        if (!first) out += ", ";
        first = false;
        out += ojson(it.key()).dump(-1, ' ', false, ojson::error_handler_t::replace);
        out += ": ";
        dump_py(it.value(), out);
      }
      out += '}';
      return;
    }
    case ojson::value_t::array: {
      out += '[';
      bool first = true;
      for (const auto& v : j) {
        if (!first) out += ", ";
        first = false;
        dump_py(v, out);
      }
      out += ']';
      return;
    }
    case ojson::value_t::number_float:
      out += py_float_repr(j.get<double>());
      return;
    default:
      out += j.dump(-1, ' ', false, ojson::error_handler_t::replace);
      return;
  }
}

}  // namespace

bool py_space_at(std::string_view s, size_t pos, size_t& len) {
  if (pos >= s.size()) return false;
  auto b = [&](size_t i) { return pos + i < s.size() ? static_cast<unsigned char>(s[pos + i]) : 0u; };
  unsigned c = b(0);
  if ((c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20)) {
    len = 1;
    return true;
  }
  if (c == 0xC2 && (b(1) == 0x85 || b(1) == 0xA0)) {
    len = 2;
    return true;
  }
  unsigned c1 = b(1), c2 = b(2);
  bool three = (c == 0xE1 && c1 == 0x9A && c2 == 0x80) ||                              // U+1680
               (c == 0xE2 && c1 == 0x80 && ((c2 >= 0x80 && c2 <= 0x8A) ||            // U+2000-200A
                                            c2 == 0xA8 || c2 == 0xA9 || c2 == 0xAF)) ||  // 2028/9, 202F
               (c == 0xE2 && c1 == 0x81 && c2 == 0x9F) ||                              // U+205F
               (c == 0xE3 && c1 == 0x80 && c2 == 0x80);                                // U+3000
  if (three) {
    len = 3;
    return true;
  }
  return false;
}

std::string_view py_strip(std::string_view s) {
  size_t len = 0;
  while (py_space_at(s, 0, len)) s.remove_prefix(len);
  for (bool again = true; again && !s.empty();) {
    again = false;
    for (size_t n = 1; n <= 3 && n <= s.size(); ++n) {
      if (py_space_at(s, s.size() - n, len) && len == n) {
        s.remove_suffix(n);
        again = true;
        break;
      }
    }
  }
  return s;
}

std::string py_float_repr(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value < 0 ? "-Infinity" : "Infinity";
  if (value == 0) return std::signbit(value) ? "-0.0" : "0.0";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, value, std::chars_format::scientific);
  std::string_view sci(buf, static_cast<size_t>(r.ptr - buf));  // [-]d[.ddd]e(+|-)XX
  std::string out;
  if (sci.front() == '-') {
    out += '-';
    sci.remove_prefix(1);
  }
  size_t e = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, e)) {
    if (c != '.') digits += c;
  }
  int exponent = 0;
  std::from_chars(sci.data() + e + (sci[e + 1] == '+' ? 2 : 1), sci.data() + sci.size(), exponent);
  int decpt = exponent + 1;
  int n = static_cast<int>(digits.size());
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out += "0." + std::string(static_cast<size_t>(-decpt), '0') + digits;
    } else if (decpt >= n) {
      out += digits + std::string(static_cast<size_t>(decpt - n), '0') + ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(decpt)) + "." + digits.substr(static_cast<size_t>(decpt));
    }
    return out;
  }
  out += digits[0];
  if (n > 1) out += "." + digits.substr(1);
  out += exponent < 0 ? "e-" : "e+";
  int a = exponent < 0 ? -exponent : exponent;
  if (a < 10) out += '0';
  out += std::to_string(a);
  return out;
}

std::string decode_value_json(std::string_view value) {
  std::string out;
  dump_py(decode_value(value), out);
  return out;
}

std::string arguments_json(const std::vector<Argument>& args) {
  ojson object = ojson::object();
  for (const Argument& a : args) object[a.key] = a.as_string ? ojson(a.value) : decode_value(a.value);
  std::string out;
  dump_py(object, out);
  return out;
}

}  // namespace glms::text::detail
