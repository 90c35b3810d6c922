// Grammars for structured outputs: every form (choice, regex, JSON schema, json_object, GBNF
// text, tool calls) is lowered to one context-free grammar over bytes, which a pushdown
// recogniser (recognizer.h) follows token by token.
//
// Building: make expressions (bytes, literal, sequence, choice, repeat, rule), give each named
// rule one expression with GrammarBuilder, then build(root). build() flattens each rule into
// alternatives of elements, desugars repetition into right-recursive helper rules, and refuses
// grammars the recogniser cannot follow: undefined rules and left recursion (a rule that can
// reach itself without consuming a byte, which includes repeating something that can be empty).
#pragma once

#include <bitset>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace glms::structured {

using ByteSet = std::bitset<256>;

// How deep a request's grammar may nest: groups in GBNF and regexes, subschemas in a JSON
// schema. The parsers and the builder recurse over the nesting, so a bound keeps a request's
// grammar (up to the body limit) from overflowing the stack; deeper ones are refused by name.
inline constexpr int kMaxGrammarNesting = 128;

// The bytes ordinary text is made of: every byte but the reserved markup bytes (vocabulary.h).
// Negated classes (`[^"]`, `.`) are taken within this set.
ByteSet text_bytes();

struct Expr {
  enum class Kind : uint8_t { kBytes, kSequence, kChoice, kRepeat, kRule };
  Kind kind = Kind::kSequence;  // an empty sequence matches the empty string
  ByteSet bytes;                // kBytes: one byte of this set
  std::vector<Expr> items;      // kSequence, kChoice; kRepeat: the one repeated item
  int min = 0, max = -1;        // kRepeat: count bounds, max -1 = unbounded
  int rule = -1;                // kRule: the rule's id in its builder
};

Expr bytes(const ByteSet& set);
Expr literal(std::string_view text);  // the bytes of `text` in order
Expr sequence(std::vector<Expr> items);
Expr choice(std::vector<Expr> items);  // one of the items (an empty list matches nothing)
Expr repeat(Expr item, int min, int max);
Expr optional(Expr item);

// The compiled form the recogniser walks. Each alternative is a run of elements ending in kEnd;
// a rule element is a call, the element after it the return point.
struct Grammar {
  struct Element {
    enum class Kind : uint8_t { kEnd, kBytes, kRule };
    Kind kind;
    int32_t value;  // kBytes: index into sets; kRule: rule index
  };
  std::vector<Element> elements;
  std::vector<ByteSet> sets;
  std::vector<std::vector<int32_t>> alternatives;  // [rule] the element index each alternative starts at
  std::vector<std::string> names;                   // [rule] for messages
  int32_t root = 0;
};

class GrammarBuilder {
 public:
  // The id of rule `name`, declared now if it is new (rules may be used before they are defined).
  int rule(const std::string& name);
  Expr ref(const std::string& name) { Expr e; e.kind = Expr::Kind::kRule; e.rule = rule(name); return e; }
  // Gives rule `name` its expression; throws glms::Error when it already has one.
  void define(const std::string& name, Expr expr);
  bool defined(const std::string& name) const;
  // Throws glms::Error (starting with `what`) naming an undefined or left-recursive rule.
  std::shared_ptr<const Grammar> build(const std::string& root, const std::string& what = "grammar") const;

 private:
  std::vector<std::string> names_;  // [rule]
  std::unordered_map<std::string, int> ids_;  // name -> rule
  std::vector<Expr> exprs_;
  std::vector<bool> defined_;
};

// Parses a grammar in GBNF, the form llama.cpp and vLLM's structured_outputs.grammar take:
//   root ::= "yes" | "no" ws item*
//   item ::= [a-z0-9_]+ ("," | ";")?   # comments run to the end of the line
// Rules `name ::= alternatives`, string literals with escapes (\n \t \r \\ \" \xHH), classes
// `[...]` and `[^...]` (ASCII; ranges, escapes), `.` (any text byte), groups, `* + ?` and
// `{m}`, `{m,}`, `{m,n}`. The start rule is `root`. Throws glms::Error naming the line and what
// is wrong.
std::shared_ptr<const Grammar> parse_gbnf(std::string_view text);

}  // namespace glms::structured
