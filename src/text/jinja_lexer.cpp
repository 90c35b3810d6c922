// Jinja lexer. See jinja_lexer.h for the contract.
#include "text/jinja_lexer.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>

#include "core/error.h"
#include "text/utf8.h"

namespace glms::jinja {

void syntax_error(int line, int col, const std::string& what) {
  fail("template syntax error at " + std::to_string(line) + ":" + std::to_string(col) + ": " +
       what);
}

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

class Lexer {
 public:
  explicit Lexer(std::string_view source) {
    // Normalise newlines and drop one trailing newline (keep_trailing_newline=False).
    src_.reserve(source.size());
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        src_ += '\n';
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      } else {
        src_ += source[i];
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i)
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
  }

  std::vector<Token> run() {
    size_t pos = 0;
    bool strip_leading = false;  // previous tag ended with '-'
    while (pos <= src_.size()) {
      size_t start = find_tag(pos);
      std::string text = src_.substr(pos, start - pos);
      size_t text_pos = pos;
      if (strip_leading) {
        size_t k = 0;
        while (k < text.size() && is_space(text[k])) ++k;
        text.erase(0, k);
        text_pos += k;
        strip_leading = false;
      }
      if (start >= src_.size()) {
        emit_text(text, text_pos);
        break;
      }
      char type = src_[start + 1];
      char mod = start + 2 < src_.size() ? src_[start + 2] : 0;
      if (mod == '-') {
        while (!text.empty() && is_space(text.back())) text.pop_back();
      } else if (type != '{' && mod != '+') {
        lstrip_block(text, start);
      }
      emit_text(text, text_pos);
      size_t inner = start + 2 + ((mod == '-' || mod == '+') ? 1 : 0);
      if (type == '#') {
        size_t end = src_.find("#}", inner);
        if (end == std::string::npos) error_at(start, "unclosed comment: expected '#}'");
        bool minus = end > inner && src_[end - 1] == '-';
        bool plus = end > inner && src_[end - 1] == '+';
        pos = end + 2;
        if (minus) strip_leading = true;
        else if (!plus) pos = trim_newline(pos);
        continue;
      }
      if (type == '%' && is_raw_begin(inner)) {
        pos = lex_raw(start, inner, strip_leading);
        continue;
      }
      push(type == '{' ? Tok::VarBegin : Tok::BlockBegin, type == '{' ? "{{" : "{%", start);
      pos = lex_inside(inner, type == '{', strip_leading);
    }
    push(Tok::Eof, "", src_.size());
    return std::move(tokens_);
  }

 private:
  std::string src_;
  std::vector<size_t> line_starts_;
  std::vector<Token> tokens_;

  void line_col(size_t offset, int& line, int& col) const {
    auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    size_t index = static_cast<size_t>(it - line_starts_.begin()) - 1;
    line = static_cast<int>(index) + 1;
    col = static_cast<int>(offset - line_starts_[index]) + 1;
  }

  [[noreturn]] void error_at(size_t offset, const std::string& what) const {
    int line, col;
    line_col(offset, line, col);
    syntax_error(line, col, what);
  }

  Token& push(Tok kind, std::string text, size_t offset) {
    Token t;
    t.kind = kind;
    t.text = std::move(text);
    line_col(offset, t.line, t.col);
    tokens_.push_back(std::move(t));
    return tokens_.back();
  }

  void emit_text(const std::string& text, size_t offset) {
    if (!text.empty()) push(Tok::Text, text, offset);
  }

  size_t find_tag(size_t pos) const {
    while (true) {
      size_t p = src_.find('{', pos);
      if (p == std::string::npos || p + 1 >= src_.size()) return src_.size();
      char c = src_[p + 1];
      if (c == '{' || c == '%' || c == '#') return p;
      pos = p + 1;
    }
  }

  // lstrip_blocks: drop spaces/tabs between the start of the line and a block/comment tag.
  void lstrip_block(std::string& text, size_t tag_start) const {
    size_t nl = text.rfind('\n');
    size_t from = nl == std::string::npos ? 0 : nl + 1;
    if (nl == std::string::npos) {
      size_t text_start = tag_start - text.size();
      bool line_starting = text_start == 0 || src_[text_start - 1] == '\n';
      if (!line_starting) return;
    }
    for (size_t k = from; k < text.size(); ++k)
      if (text[k] != ' ' && text[k] != '\t') return;
    text.erase(from);
  }

  size_t trim_newline(size_t pos) const {
    return pos < src_.size() && src_[pos] == '\n' ? pos + 1 : pos;
  }

  size_t skip_ws(size_t p) const {
    while (p < src_.size() && is_space(src_[p])) ++p;
    return p;
  }

  bool word_at(size_t p, std::string_view word) const {
    if (src_.compare(p, word.size(), word) != 0) return false;
    size_t e = p + word.size();
    return e >= src_.size() || !(std::isalnum(static_cast<unsigned char>(src_[e])) || src_[e] == '_');
  }

  bool is_raw_begin(size_t inner) const {
    size_t p = skip_ws(inner);
    if (!word_at(p, "raw")) return false;
    p = skip_ws(p + 3);
    if (p < src_.size() && src_[p] == '-') ++p;
    return src_.compare(p, 2, "%}") == 0;
  }

  size_t lex_raw(size_t start, size_t inner, bool& strip_leading) {
    size_t p = skip_ws(skip_ws(inner) + 3);
    bool minus = src_[p] == '-';
    size_t body = p + (minus ? 3 : 2);
    if (minus) body = skip_ws(body);
    size_t search = body;
    while (true) {
      size_t tag = src_.find("{%", search);
      if (tag == std::string::npos) error_at(start, "missing '{% endraw %}' for '{% raw %}'");
      size_t q = tag + 2;
      char mod = q < src_.size() ? src_[q] : 0;
      if (mod == '-' || mod == '+') ++q;
      q = skip_ws(q);
      if (!word_at(q, "endraw")) {
        search = tag + 2;
        continue;
      }
      q = skip_ws(q + 6);
      char end_mod = q < src_.size() ? src_[q] : 0;
      if (end_mod == '-' || end_mod == '+') ++q;
      if (src_.compare(q, 2, "%}") != 0) error_at(q, "expected '%}' after 'endraw'");
      std::string text = src_.substr(body, tag - body);
      if (mod == '-') {
        while (!text.empty() && is_space(text.back())) text.pop_back();
      } else if (mod != '+') {
        lstrip_block(text, tag);
      }
      emit_text(text, body);
      size_t pos = q + 2;
      if (end_mod == '-') strip_leading = true;
      else if (end_mod != '+') pos = trim_newline(pos);
      return pos;
    }
  }

  // Lexes the inside of {{ }} or {% %} starting at p; returns the offset after the end tag.
  size_t lex_inside(size_t p, bool variable, bool& strip_leading) {
    std::vector<char> brackets;
    const std::string_view end = variable ? "}}" : "%}";
    while (true) {
      p = skip_ws(p);
      if (p >= src_.size())
        error_at(p, std::string("unexpected end of template, expected '") + std::string(end) + "'");
      if (brackets.empty()) {
        bool ws_mod = (src_[p] == '-' || src_[p] == '+');
        size_t q = ws_mod ? p + 1 : p;
        if (src_.compare(q, end.size(), end) == 0 && (!ws_mod || src_[p] == '-' || !variable)) {
          push(variable ? Tok::VarEnd : Tok::BlockEnd, std::string(end), p);
          size_t after = q + end.size();
          if (ws_mod && src_[p] == '-') strip_leading = true;
          else if (!variable && !ws_mod) after = trim_newline(after);
          return after;
        }
      }
      char c = src_[p];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t e = p;
        while (e < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
        push(Tok::Name, src_.substr(p, e - p), p);
        p = e;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        p = lex_number(p);
      } else if (c == '\'' || c == '"') {
        p = lex_string(p);
      } else {
        static const char* const two[] = {"//", "**", "==", "!=", "<=", ">="};
        std::string op;
        for (const char* t : two)
          if (src_.compare(p, 2, t) == 0) op = t;
        if (op.empty()) {
          if (std::string_view("+-*/%~<>=()[]{},.:|").find(c) == std::string_view::npos)
            error_at(p, std::string("unexpected character '") + c + "'");
          op = std::string(1, c);
        }
        if (op == "(" || op == "[" || op == "{") brackets.push_back(op[0]);
        if (op == ")" || op == "]" || op == "}") {
          char open = op == ")" ? '(' : op == "]" ? '[' : '{';
          if (brackets.empty() || brackets.back() != open)
            error_at(p, "unexpected '" + op + "'");
          brackets.pop_back();
        }
        push(Tok::Op, op, p);
        p += op.size();
      }
    }
  }

  size_t lex_number(size_t p) {
    size_t e = p;
    auto digits = [&] {
      while (e < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
    };
    digits();
    bool is_float = false;
    if (e + 1 < src_.size() && src_[e] == '.' && std::isdigit(static_cast<unsigned char>(src_[e + 1]))) {
      is_float = true;
      ++e;
      digits();
    }
    if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
      size_t f = e + 1;
      if (f < src_.size() && (src_[f] == '+' || src_[f] == '-')) ++f;
      if (f < src_.size() && std::isdigit(static_cast<unsigned char>(src_[f]))) {
        is_float = true;
        e = f;
        digits();
      }
    }
    std::string text;
    for (size_t k = p; k < e; ++k)
      if (src_[k] != '_') text += src_[k];
    Token& t = push(is_float ? Tok::Float : Tok::Int, text, p);
    errno = 0;
    if (is_float) {
      t.float_value = std::strtod(text.c_str(), nullptr);
    } else {
      t.int_value = std::strtoll(text.c_str(), nullptr, 10);
      if (errno == ERANGE) error_at(p, "integer literal too large");
    }
    return e;
  }

  size_t lex_string(size_t p) {
    char quote = src_[p];
    std::string value;
    size_t e = p + 1;
    while (true) {
      if (e >= src_.size()) error_at(p, "unterminated string literal");
      char c = src_[e];
      if (c == quote) break;
      if (c != '\\') {
        value += c;
        ++e;
        continue;
      }
      if (e + 1 >= src_.size()) error_at(p, "unterminated string literal");
      char n = src_[e + 1];
      e += 2;
      auto hex = [&](int count) {
        uint32_t v = 0;
        for (int k = 0; k < count; ++k, ++e) {
          if (e >= src_.size() || !std::isxdigit(static_cast<unsigned char>(src_[e])))
            error_at(e, "invalid escape sequence in string literal");
          char h = src_[e];
          v = v * 16 + (std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (std::tolower(h) - 'a' + 10));
        }
        return v;
      };
      switch (n) {
        case 'n': value += '\n'; break;
        case 't': value += '\t'; break;
        case 'r': value += '\r'; break;
        case '\\': value += '\\'; break;
        case '\'': value += '\''; break;
        case '"': value += '"'; break;
        case 'a': value += '\a'; break;
        case 'b': value += '\b'; break;
        case 'f': value += '\f'; break;
        case 'v': value += '\v'; break;
        case '\n': break;  // line continuation
        case 'x': text::utf8::append(value, hex(2)); break;
        case 'u': text::utf8::append(value, hex(4)); break;
        case 'U': text::utf8::append(value, hex(8)); break;
        default:
          if (n >= '0' && n <= '7') {
            uint32_t v = n - '0';
            for (int k = 0; k < 2 && e < src_.size() && src_[e] >= '0' && src_[e] <= '7'; ++k, ++e)
              v = v * 8 + (src_[e] - '0');
            text::utf8::append(value, v);
          } else {
            value += '\\';
            value += n;
          }
      }
    }
    Token& t = push(Tok::String, value, p);
    (void)t;
    return e + 1;
  }
};

}  // namespace

std::vector<Token> lex(std::string_view source) { return Lexer(source).run(); }

}  // namespace glms::jinja
