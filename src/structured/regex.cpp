#include "structured/regex.h"

#include <algorithm>
#include <bitset>
#include <limits>
#include <vector>

#include "core/error.h"

namespace glms::structured {

namespace {

using ByteSet = std::bitset<256>;

// A Thompson NFA: each state has byte edges (a set and a target) and epsilon edges.
struct Nfa {
  struct State {
    std::vector<std::pair<ByteSet, int>> edges;
    std::vector<int> epsilon;
  };
  std::vector<State> states;
  int start = 0, accept = 0;
  int add() {
    states.emplace_back();
    return static_cast<int>(states.size()) - 1;
  }
};

// A fragment of the NFA under construction: its entry and exit states.
struct Fragment {
  int in = -1, out = -1;
};

class Parser {
 public:
  Parser(const std::string& pattern, Nfa& nfa) : p_(pattern), nfa_(nfa) {}

  Fragment parse() {
    if (peek('^')) ++at_;
    const Fragment f = alternation();
    if (at_ < p_.size() && p_[at_] == '$' && at_ + 1 == p_.size()) ++at_;
    if (at_ != p_.size()) error("unexpected '" + std::string(1, p_[at_]) + "'");
    return f;
  }

 private:
  [[noreturn]] void error(const std::string& what) const {
    fail("regex: " + what + " at position " + std::to_string(at_) + " of '" + p_ + "'");
  }
  bool peek(char c) const { return at_ < p_.size() && p_[at_] == c; }

  Fragment empty() {
    const int s = nfa_.add();
    return {s, s};
  }
  Fragment bytes(const ByteSet& set) {
    const int a = nfa_.add(), b = nfa_.add();
    nfa_.states[a].edges.push_back({set, b});
    return {a, b};
  }
  // A copy of the states of `f` (for counted repeats), returning the copy's ends.
  Fragment copy(const Fragment& f, int first_state, int end_state) {
    const int offset = static_cast<int>(nfa_.states.size()) - first_state;
    for (int s = first_state; s < end_state; ++s) {
      Nfa::State st = nfa_.states[s];
      for (auto& e : st.edges) e.second += offset;
      for (int& e : st.epsilon) e += offset;
      nfa_.states.push_back(std::move(st));
    }
    return {f.in + offset, f.out + offset};
  }
  Fragment concat(Fragment a, Fragment b) {
    nfa_.states[a.out].epsilon.push_back(b.in);
    return {a.in, b.out};
  }

  Fragment alternation() {
    Fragment left = sequence();
    while (peek('|')) {
      ++at_;
      const Fragment right = sequence();
      const int in = nfa_.add(), out = nfa_.add();
      nfa_.states[in].epsilon = {left.in, right.in};
      nfa_.states[left.out].epsilon.push_back(out);
      nfa_.states[right.out].epsilon.push_back(out);
      left = {in, out};
    }
    return left;
  }

  Fragment sequence() {
    Fragment f = empty();
    while (at_ < p_.size() && !peek('|') && !peek(')') && !(peek('$') && at_ + 1 == p_.size()))
      f = concat(f, repeated());
    return f;
  }

  int number() {
    int n = 0;
    if (at_ >= p_.size() || !std::isdigit(static_cast<unsigned char>(p_[at_]))) error("expected a number");
    while (at_ < p_.size() && std::isdigit(static_cast<unsigned char>(p_[at_]))) n = n * 10 + (p_[at_++] - '0');
    if (n > 64) error("a repeat count above 64");
    return n;
  }

  Fragment repeated() {
    const int first_state = static_cast<int>(nfa_.states.size());
    Fragment atom_fragment = atom();
    // The states the fragment may use: [first_state, end_state) (a counted repeat copies them).
    int end_state = static_cast<int>(nfa_.states.size());
    for (;; end_state = static_cast<int>(nfa_.states.size())) {
      if (peek('*') || peek('+') || peek('?')) {
        const char q = p_[at_++];
        const int in = nfa_.add(), out = nfa_.add();
        nfa_.states[in].epsilon.push_back(atom_fragment.in);
        nfa_.states[atom_fragment.out].epsilon.push_back(out);
        if (q != '+') nfa_.states[in].epsilon.push_back(out);
        if (q != '?') nfa_.states[atom_fragment.out].epsilon.push_back(atom_fragment.in);
        atom_fragment = {in, out};
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
        // low copies, then (high - low) optional ones, or a starred one for {m,}.
        Fragment result = empty();
        for (int i = 0; i < low; ++i) result = concat(result, copy(atom_fragment, first_state, end_state));
        if (high < 0) {
          const Fragment more = copy(atom_fragment, first_state, end_state);
          const int in = nfa_.add(), out = nfa_.add();
          nfa_.states[in].epsilon = {more.in, out};
          nfa_.states[more.out].epsilon = {more.in, out};
          result = concat(result, {in, out});
        } else {
          for (int i = low; i < high; ++i) {
            const Fragment more = copy(atom_fragment, first_state, end_state);
            const int in = nfa_.add(), out = nfa_.add();
            nfa_.states[in].epsilon = {more.in, out};
            nfa_.states[more.out].epsilon.push_back(out);
            result = concat(result, {in, out});
          }
        }
        atom_fragment = result;
      } else {
        return atom_fragment;
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
    return std::isupper(static_cast<unsigned char>(c)) ? ~set : set;
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
    return negate ? ~set : set;
  }

  Fragment atom() {
    if (at_ >= p_.size()) error("an expression ends early");
    const char c = p_[at_++];
    switch (c) {
      case '(': {
        if (p_.compare(at_, 2, "?:") == 0) at_ += 2;
        const Fragment inner = alternation();
        if (!peek(')')) error("an unclosed '('");
        ++at_;
        return inner;
      }
      case '.': {
        ByteSet any;
        any.set();
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
  Nfa& nfa_;
  size_t at_ = 0;
};

class RegexConstraint final : public engine::TokenConstraint {
 public:
  RegexConstraint(std::shared_ptr<const Nfa> nfa, TokenTexts texts) : nfa_(std::move(nfa)), texts_(std::move(texts)) {
    current_ = closure({nfa_->start});
  }

  void mask(float* logits, int vocab) const override {
    constexpr float kNever = -std::numeric_limits<float>::infinity();
    const std::vector<std::string>& texts = *texts_;
    int allowed_count = 0;
    for (int t = 0; t < vocab; ++t) {
      const bool allowed = t < static_cast<int>(texts.size()) && !texts[t].empty() && !walk(current_, texts[t]).empty();
      if (!allowed) logits[t] = kNever;
      allowed_count += allowed;
    }
    stuck_ = allowed_count == 0;  // as for choices: end here rather than draw from nothing
  }
  bool may_end() const override {
    return stuck_ || std::find(current_.begin(), current_.end(), nfa_->accept) != current_.end();
  }
  void accept(int32_t token) override {
    const std::vector<std::string>& texts = *texts_;
    current_ = token >= 0 && token < static_cast<int32_t>(texts.size()) && !texts[token].empty()
                   ? walk(current_, texts[token])
                   : std::vector<int>{};
  }

 private:
  // The epsilon closure of `states`, sorted.
  std::vector<int> closure(std::vector<int> states) const {
    std::vector<char> seen(nfa_->states.size(), 0);
    std::vector<int> stack = states, out;
    while (!stack.empty()) {
      const int s = stack.back();
      stack.pop_back();
      if (seen[s]) continue;
      seen[s] = 1;
      out.push_back(s);
      for (int e : nfa_->states[s].epsilon) stack.push_back(e);
    }
    std::sort(out.begin(), out.end());
    return out;
  }
  std::vector<int> walk(std::vector<int> states, const std::string& text) const {
    for (const unsigned char c : text) {
      std::vector<int> next;
      for (int s : states)
        for (const auto& [set, target] : nfa_->states[s].edges)
          if (set.test(c)) next.push_back(target);
      if (next.empty()) return {};
      states = closure(std::move(next));
    }
    return states;
  }

  std::shared_ptr<const Nfa> nfa_;
  TokenTexts texts_;
  std::vector<int> current_;
  mutable bool stuck_ = false;
};

}  // namespace

std::shared_ptr<engine::TokenConstraint> make_regex_constraint(const std::string& pattern, TokenTexts texts) {
  auto nfa = std::make_shared<Nfa>();
  Parser parser(pattern, *nfa);
  const Fragment f = parser.parse();
  nfa->start = f.in;
  nfa->accept = f.out;
  return std::make_shared<RegexConstraint>(std::move(nfa), std::move(texts));
}

}  // namespace glms::structured
