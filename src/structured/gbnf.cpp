// The GBNF reader (grammar.h: parse_gbnf).
#include <cctype>

#include "core/error.h"
#include "structured/grammar.h"

namespace glms::structured {

namespace {

class GbnfReader {
 public:
  explicit GbnfReader(std::string_view text) : t_(text) {}

  std::shared_ptr<const Grammar> read() {
    skip_space();
    if (at_ >= t_.size()) error("the grammar is empty");
    while (at_ < t_.size()) {
      const std::string name = identifier();
      skip_space();
      if (t_.compare(at_, 3, "::=") != 0) error("expected '::=' after rule name '" + name + "'");
      at_ += 3;
      builder_.define(name, alternatives());
      skip_space();
    }
    return builder_.build("root", "grammar");
  }

 private:
  [[noreturn]] void error(const std::string& what) const {
    int line = 1;
    for (size_t i = 0; i < at_ && i < t_.size(); ++i) line += t_[i] == '\n';
    fail("grammar: line " + std::to_string(line) + ": " + what);
  }
  bool name_char(char c) const { return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_'; }
  void skip_space() {
    while (at_ < t_.size()) {
      if (std::isspace(static_cast<unsigned char>(t_[at_]))) ++at_;
      else if (t_[at_] == '#') while (at_ < t_.size() && t_[at_] != '\n') ++at_;
      else break;
    }
  }
  std::string identifier() {
    const size_t start = at_;
    while (at_ < t_.size() && name_char(t_[at_])) ++at_;
    if (at_ == start) error(at_ < t_.size() ? "unexpected '" + std::string(1, t_[at_]) + "'" : "a rule name is missing");
    return std::string(t_.substr(start, at_ - start));
  }
  // Whether a new rule starts here: a name followed by '::='.
  bool at_rule_start() const {
    size_t i = at_;
    while (i < t_.size() && name_char(t_[i])) ++i;
    if (i == at_) return false;
    while (i < t_.size() && (t_[i] == ' ' || t_[i] == '\t' || t_[i] == '\n' || t_[i] == '\r')) ++i;
    return t_.compare(i, 3, "::=") == 0;
  }

  Expr alternatives() {
    std::vector<Expr> options{sequence_of()};
    while (at_ < t_.size() && t_[at_] == '|') {
      ++at_;
      options.push_back(sequence_of());
    }
    return choice(std::move(options));
  }
  Expr sequence_of() {
    std::vector<Expr> items;
    for (;;) {
      skip_space();
      if (at_ >= t_.size() || t_[at_] == '|' || t_[at_] == ')' || at_rule_start()) break;
      items.push_back(postfix(primary()));
    }
    return sequence(std::move(items));
  }
  int number() {
    skip_space();
    int n = 0;
    if (at_ >= t_.size() || !std::isdigit(static_cast<unsigned char>(t_[at_]))) error("expected a number in {}");
    while (at_ < t_.size() && std::isdigit(static_cast<unsigned char>(t_[at_]))) {
      n = n * 10 + (t_[at_++] - '0');
      if (n > 4096) error("a repetition count above 4096");
    }
    skip_space();
    return n;
  }
  Expr postfix(Expr e) {
    for (;;) {
      if (at_ >= t_.size()) return e;
      const char c = t_[at_];
      if (c == '*' || c == '+' || c == '?') {
        ++at_;
        e = repeat(std::move(e), c == '+' ? 1 : 0, c == '?' ? 1 : -1);
      } else if (c == '{') {
        ++at_;
        const int lo = number();
        int hi = lo;
        if (at_ < t_.size() && t_[at_] == ',') {
          ++at_;
          skip_space();
          hi = at_ < t_.size() && t_[at_] == '}' ? -1 : number();
        }
        if (at_ >= t_.size() || t_[at_] != '}') error("expected '}'");
        ++at_;
        if (hi >= 0 && hi < lo) error("{m,n} with n < m");
        e = repeat(std::move(e), lo, hi);
      } else {
        return e;
      }
    }
  }
  unsigned char escaped() {  // after a backslash
    if (at_ >= t_.size()) error("a dangling backslash");
    const char c = t_[at_++];
    switch (c) {
      case 'n': return '\n';
      case 't': return '\t';
      case 'r': return '\r';
      case 'x': {
        if (at_ + 2 > t_.size() || !std::isxdigit(static_cast<unsigned char>(t_[at_])) ||
            !std::isxdigit(static_cast<unsigned char>(t_[at_ + 1])))
          error("\\x needs two hex digits");
        const int v = std::stoi(std::string(t_.substr(at_, 2)), nullptr, 16);
        at_ += 2;
        if (v >= 0xF8) error("bytes 0xF8-0xFF are reserved");
        return static_cast<unsigned char>(v);
      }
      default: return static_cast<unsigned char>(c);
    }
  }
  Expr primary() {
    const char c = t_[at_];
    if (c == '"') {
      ++at_;
      std::string text;
      while (at_ < t_.size() && t_[at_] != '"') {
        if (t_[at_] == '\n') error("a string literal runs past the end of the line");
        text += t_[at_] == '\\' ? static_cast<char>((++at_, escaped())) : t_[at_++];
      }
      if (at_ >= t_.size()) error("an unclosed string literal");
      ++at_;
      return literal(text);
    }
    if (c == '[') return bytes(char_class());
    if (c == '.') {
      ++at_;
      ByteSet any = text_bytes();
      any.reset('\n');
      return bytes(any);
    }
    if (c == '(') {
      ++at_;
      if (++depth_ > kMaxGrammarNesting)
        error("groups nest deeper than " + std::to_string(kMaxGrammarNesting) + " levels");
      Expr inner = alternatives();
      --depth_;
      if (at_ >= t_.size() || t_[at_] != ')') error("an unclosed '('");
      ++at_;
      return inner;
    }
    if (name_char(c)) return builder_.ref(identifier());
    error("unexpected '" + std::string(1, c) + "'");
  }
  ByteSet char_class() {  // at '['
    ++at_;
    ByteSet set;
    const bool negate = at_ < t_.size() && t_[at_] == '^';
    if (negate) ++at_;
    auto one = [&]() -> unsigned char {
      if (at_ >= t_.size()) error("an unclosed '['");
      const unsigned char ch = static_cast<unsigned char>(t_[at_++]);
      if (ch >= 0x80) error("character classes take ASCII only (write other characters as string literals)");
      return ch == '\\' ? escaped() : ch;
    };
    while (at_ < t_.size() && t_[at_] != ']') {
      const unsigned char lo = one();
      unsigned char hi = lo;
      if (at_ + 1 < t_.size() && t_[at_] == '-' && t_[at_ + 1] != ']') {
        ++at_;
        hi = one();
        if (hi < lo) error("a class range out of order");
      }
      for (int x = lo; x <= hi; ++x) set.set(static_cast<size_t>(x));
    }
    if (at_ >= t_.size()) error("an unclosed '['");
    ++at_;
    return negate ? ~set & text_bytes() : set;
  }

  std::string_view t_;
  size_t at_ = 0;
  int depth_ = 0;  // groups open at at_
  GrammarBuilder builder_;
};

}  // namespace

std::shared_ptr<const Grammar> parse_gbnf(std::string_view text) { return GbnfReader(text).read(); }

}  // namespace glms::structured
