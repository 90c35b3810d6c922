#include "structured/json_object.h"

#include <cctype>
#include <limits>
#include <string>
#include <vector>

namespace glms::structured {

namespace {

constexpr size_t kMaxDepth = 32;
constexpr int kMaxWhitespace = 8;

// Where the recogniser is. After a value completes, `after_value()` decides from the stack.
enum class Mode : uint8_t {
  kStart,            // before the top-level object: whitespace, then '{'
  kKeyOrEnd,         // just after '{': '"' or '}'
  kKey,              // after ',' in an object: '"'
  kColon,            // after a key: ':'
  kValue,            // a value is due
  kValueOrEnd,       // just after '[': a value or ']'
  kCommaOrEnd,       // after a value inside a container: ',' or its closer
  kString,           // inside a string
  kEscape,           // after a backslash in a string
  kUnicode,          // in the 4 hex digits of \u (count in `pending`)
  kNumber,           // inside a number (its part in `number`)
  kLiteral,          // inside true / false / null (the rest in `literal`)
  kDone,             // the object is closed: whitespace only
};

struct Machine {
  std::vector<char> stack;  // '{' or '['
  Mode mode = Mode::kStart;
  bool key = false;          // the string being read is a key
  int pending = 0;           // hex digits left in \u
  int number = 0;            // 0 after '-', 1 int digits (leading 0: 5), 2 after '.', 3 frac digits, 4 after e/E, 6 after exponent sign, 7 exp digits
  const char* literal = "";  // what a literal still needs
  int whitespace = 0;

  bool feed(unsigned char c) {
    const bool space = c == ' ' || c == '\n' || c == '\t' || c == '\r';
    switch (mode) {
      case Mode::kString:
        if (c == '"') return end_string();
        if (c == '\\') mode = Mode::kEscape;
        else if (c < 0x20) return false;
        return true;
      case Mode::kEscape:
        if (c == 'u') {
          mode = Mode::kUnicode;
          pending = 4;
          return true;
        }
        if (std::string("\"\\/bfnrt").find(static_cast<char>(c)) == std::string::npos) return false;
        mode = Mode::kString;
        return true;
      case Mode::kUnicode:
        if (!std::isxdigit(c)) return false;
        if (--pending == 0) mode = Mode::kString;
        return true;
      case Mode::kLiteral:
        if (c != static_cast<unsigned char>(*literal)) return false;
        if (*++literal == '\0') after_value();
        return true;
      case Mode::kNumber:
        if (number_char(c)) return true;
        if (!(number == 1 || number == 5 || number == 3 || number == 7)) return false;  // incomplete number
        after_value();
        return feed(c);
      default:
        break;
    }
    if (space) return ++whitespace <= kMaxWhitespace;
    whitespace = 0;
    switch (mode) {
      case Mode::kStart:
        return c == '{' && open('{');
      case Mode::kKeyOrEnd:
        if (c == '}') return close('{');
        [[fallthrough]];
      case Mode::kKey:
        if (c != '"') return false;
        mode = Mode::kString;
        key = true;
        return true;
      case Mode::kColon:
        if (c != ':') return false;
        mode = Mode::kValue;
        return true;
      case Mode::kValueOrEnd:
        if (c == ']') return close('[');
        [[fallthrough]];
      case Mode::kValue:
        return start_value(c);
      case Mode::kCommaOrEnd:
        if (c == ',') {
          mode = stack.back() == '{' ? Mode::kKey : Mode::kValue;
          return true;
        }
        return close(c == '}' ? '{' : c == ']' ? '[' : 0);
      default:
        return false;  // kDone: nothing but whitespace
    }
  }

 private:
  bool open(char container) {
    if (stack.size() >= kMaxDepth) return false;
    stack.push_back(container);
    mode = container == '{' ? Mode::kKeyOrEnd : Mode::kValueOrEnd;
    return true;
  }
  bool close(char container) {
    if (container == 0 || stack.empty() || stack.back() != container) return false;
    stack.pop_back();
    after_value();
    return true;
  }
  void after_value() { mode = stack.empty() ? Mode::kDone : Mode::kCommaOrEnd; }
  bool end_string() {
    if (key) {
      key = false;
      mode = Mode::kColon;
    } else {
      after_value();
    }
    return true;
  }
  bool start_value(unsigned char c) {
    if (c == '{' || c == '[') return open(static_cast<char>(c));
    if (c == '"') {
      mode = Mode::kString;
      key = false;
      return true;
    }
    if (c == 't' || c == 'f' || c == 'n') {
      literal = c == 't' ? "rue" : c == 'f' ? "alse" : "ull";
      mode = Mode::kLiteral;
      return true;
    }
    if (c == '-' || std::isdigit(c)) {
      mode = Mode::kNumber;
      number = c == '-' ? 0 : c == '0' ? 5 : 1;
      return true;
    }
    return false;
  }
  bool number_char(unsigned char c) {
    const bool digit = std::isdigit(c) != 0;
    switch (number) {
      case 0: if (digit) { number = c == '0' ? 5 : 1; return true; } return false;
      case 1: if (digit) return true; [[fallthrough]];
      case 5:
        if (c == '.') { number = 2; return true; }
        if (c == 'e' || c == 'E') { number = 4; return true; }
        return false;
      case 2: if (digit) { number = 3; return true; } return false;
      case 3:
        if (digit) return true;
        if (c == 'e' || c == 'E') { number = 4; return true; }
        return false;
      case 4:
        if (c == '+' || c == '-') { number = 6; return true; }
        [[fallthrough]];
      case 6: if (digit) { number = 7; return true; } return false;
      case 7: return digit;
      default: return false;
    }
  }
};

class JsonObjectConstraint final : public engine::TokenConstraint {
 public:
  explicit JsonObjectConstraint(TokenTexts texts) : texts_(std::move(texts)) {}

  void mask(float* logits, int vocab) const override {
    constexpr float kNever = -std::numeric_limits<float>::infinity();
    const std::vector<std::string>& texts = *texts_;
    int allowed_count = 0;
    for (int t = 0; t < vocab; ++t) {
      const bool allowed = alive_ && t < static_cast<int>(texts.size()) && !texts[t].empty() && accepts(texts[t]);
      if (!allowed) logits[t] = kNever;
      allowed_count += allowed;
    }
    stuck_ = allowed_count == 0;
  }
  bool may_end() const override { return stuck_ || (alive_ && machine_.mode == Mode::kDone); }
  void accept(int32_t token) override {
    const std::vector<std::string>& texts = *texts_;
    if (!alive_ || token < 0 || token >= static_cast<int32_t>(texts.size()) || texts[token].empty()) {
      alive_ = false;
      return;
    }
    for (const unsigned char c : texts[token]) alive_ = alive_ && machine_.feed(c);
  }

 private:
  bool accepts(const std::string& text) const {
    Machine m = machine_;
    for (const unsigned char c : text)
      if (!m.feed(c)) return false;
    return true;
  }
  TokenTexts texts_;
  Machine machine_;
  bool alive_ = true;
  mutable bool stuck_ = false;
};

}  // namespace

std::shared_ptr<engine::TokenConstraint> make_json_object_constraint(TokenTexts texts) {
  return std::make_shared<JsonObjectConstraint>(std::move(texts));
}

}  // namespace glms::structured
