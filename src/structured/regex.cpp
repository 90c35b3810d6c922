#include "structured/regex.h"

#include <cctype>
#include <vector>

#include "core/error.h"
#include "structured/recognizer.h"

namespace glms::structured {

namespace {

class Parser {
 public:
  explicit Parser(const std::string& pattern) : p_(pattern) {}

  Expr parse() {
    if (peek('^')) ++at_;
    Expr f = alternation();
    if (at_ < p_.size() && p_[at_] == '$' && at_ + 1 == p_.size()) ++at_;
    if (at_ != p_.size()) error("unexpected '" + std::string(1, p_[at_]) + "'");
    return f;
  }

 private:
  [[noreturn]] void error(const std::string& what) const {
    fail("regex: " + what + " at position " + std::to_string(at_) + " of '" + p_ + "'");
  }
  bool peek(char c) const { return at_ < p_.size() && p_[at_] == c; }

  Expr alternation() {
    std::vector<Expr> options{sequence_expr()};
    while (peek('|')) {
      ++at_;
      options.push_back(sequence_expr());
    }
    return choice(std::move(options));
  }

  Expr sequence_expr() {
    std::vector<Expr> items;
    while (at_ < p_.size() && !peek('|') && !peek(')') && !(peek('$') && at_ + 1 == p_.size()))
      items.push_back(repeated());
    return sequence(std::move(items));
  }

  int number() {
    int n = 0;
    if (at_ >= p_.size() || !std::isdigit(static_cast<unsigned char>(p_[at_]))) error("expected a number");
    while (at_ < p_.size() && std::isdigit(static_cast<unsigned char>(p_[at_]))) {
      n = n * 10 + (p_[at_++] - '0');
      if (n > 256) error("a repeat count above 256");  // checked per digit: no overflow (fuzz_structured)
    }
    return n;
  }

  Expr repeated() {
    Expr e = atom();
    for (;;) {
      if (peek('*') || peek('+') || peek('?')) {
        const char q = p_[at_++];
        e = repeat(std::move(e), q == '+' ? 1 : 0, q == '?' ? 1 : -1);
      } else if (peek('{')) {
        ++at_;
        const int low = number();
        int high = low;
        if (peek(',')) {
          ++at_;
          high = peek('}') ? -1 : number();
        }
        if (!peek('}')) error("expected '}'");
        ++at_;
        if (high >= 0 && high < low) error("{m,n} with n < m");
        e = repeat(std::move(e), low, high);
      } else {
        return e;
      }
    }
  }

  ByteSet escape_class(char c) {
    ByteSet set;
    auto add_range = [&](int a, int b) {
      for (int x = a; x <= b; ++x) set.set(x);
    };
    switch (c) {
      case 'd': case 'D': add_range('0', '9'); break;
      case 'w': case 'W': add_range('a', 'z'); add_range('A', 'Z'); add_range('0', '9'); set.set('_'); break;
      case 's': case 'S': for (char s : std::string(" \t\n\r\f\v")) set.set(static_cast<unsigned char>(s)); break;
      case 'n': set.set('\n'); return set;
      case 't': set.set('\t'); return set;
      case 'r': set.set('\r'); return set;
      default:
        if (std::isalnum(static_cast<unsigned char>(c))) error(std::string("unknown escape \\") + c);
        set.set(static_cast<unsigned char>(c));
        return set;
    }
    return std::isupper(static_cast<unsigned char>(c)) ? ~set & text_bytes() : set;
  }

  ByteSet bracket() {  // after '['
    ByteSet set;
    const bool negate = peek('^');
    if (negate) ++at_;
    bool first = true;
    while (at_ < p_.size() && (first || !peek(']'))) {
      first = false;
      int lo;
      if (peek('\\')) {
        ++at_;
        if (at_ >= p_.size()) error("a dangling backslash");
        const ByteSet e = escape_class(p_[at_++]);
        if (e.count() != 1) {
          set |= e;
          continue;
        }
        lo = static_cast<int>(e._Find_first());
      } else {
        lo = static_cast<unsigned char>(p_[at_++]);
      }
      int hi = lo;
      if (peek('-') && at_ + 1 < p_.size() && p_[at_ + 1] != ']') {
        ++at_;
        hi = static_cast<unsigned char>(p_[at_++]);
        if (hi < lo) error("a class range out of order");
      }
      for (int x = lo; x <= hi; ++x) set.set(x);
    }
    if (!peek(']')) error("an unclosed '['");
    ++at_;
    return negate ? ~set & text_bytes() : set;
  }

  Expr atom() {
    if (at_ >= p_.size()) error("an expression ends early");
    const char c = p_[at_++];
    switch (c) {
      case '(': {
        if (p_.compare(at_, 2, "?:") == 0) at_ += 2;
        if (++depth_ > kMaxGrammarNesting)
          error("groups nest deeper than " + std::to_string(kMaxGrammarNesting) + " levels");
        Expr inner = alternation();
        --depth_;
        if (!peek(')')) error("an unclosed '('");
        ++at_;
        return inner;
      }
      case '.': {
        ByteSet any = text_bytes();
        any.reset('\n');
        return bytes(any);
      }
      case '[': return bytes(bracket());
      case '\\':
        if (at_ >= p_.size()) error("a dangling backslash");
        return bytes(escape_class(p_[at_++]));
      case '*': case '+': case '?': case '{': case ')': --at_; error(std::string("nothing to repeat or close before '") + c + "'");
      default: {
        ByteSet one;
        one.set(static_cast<unsigned char>(c));
        return bytes(one);
      }
    }
  }

  const std::string& p_;
  size_t at_ = 0;
  int depth_ = 0;  // groups open at at_
};

}  // namespace

Expr regex_expr(const std::string& pattern) { return Parser(pattern).parse(); }

std::shared_ptr<const Grammar> regex_grammar(const std::string& pattern) {
  GrammarBuilder builder;
  builder.define("root", regex_expr(pattern));
  return builder.build("root", "regex");
}

std::shared_ptr<engine::TokenConstraint> make_regex_constraint(const std::string& pattern, TokenTexts texts) {
  return make_grammar_constraint(regex_grammar(pattern), std::move(texts));
}

}  // namespace glms::structured
