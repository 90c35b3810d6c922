// Jinja syntax tree (internal to src/text/jinja*.cpp). Produced by parse() from the lexer's
// tokens, walked by the evaluator. Every node records the line/column it starts at so runtime
// errors can name the template line.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "text/jinja_lexer.h"
#include "text/jinja_value.h"

namespace glms::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    Literal,    // value
    Name,       // name
    Attr,       // args[0].name
    Item,       // args[0][args[1]]
    Slice,      // args[0][args[1]:args[2]:args[3]] (null children = omitted)
    Call,       // args[0](args[1..], kwargs)
    Filter,     // args[0] | name(args[1..], kwargs)   (args[0] null inside {% filter %})
    Test,       // args[0] is [not] name(args[1..])     (negate)
    Unary,      // op args[0]: "-", "+", "not"
    Binary,     // args[0] op args[1]: + - * / // % ** ~
    And, Or,    // args[0] and/or args[1]
    Compare,    // args[0] ops[0] args[1] ops[1] args[2] ...: == != < > <= >= in notin
    Cond,       // args[0] if args[1] else args[2] (args[2] may be null -> undefined)
    List, Tuple,  // args
    Dict,       // kwargs-like pairs of (key expr, value expr) in pairs
  };
  Kind kind;
  int line = 0, col = 0;
  Value value;
  std::string name;
  bool negate = false;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;
  std::vector<std::pair<ExprPtr, ExprPtr>> pairs;
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

// An assignment target: a name, `name.attr` (namespace attribute), or a tuple of names.
struct Target {
  std::string name;
  std::string attr;               // set for `ns.attr`
  std::vector<Target> elements;   // non-empty for tuple unpacking
};

struct Stmt {
  enum class Kind {
    Text,         // text
    Output,       // {{ expr }}
    If,           // branches: (cond, body)...; else_body
    For,          // target in expr [if filter] body [else else_body]
    Set,          // target = expr
    SetBlock,     // {% set target %}body{% endset %} (optional filter expr with null input)
    Macro,        // name(params) body
    CallBlock,    // {% call(params) expr %}body{% endcall %}
    FilterBlock,  // {% filter f %}body{% endfilter %}
    Break, Continue,
    Block,        // plain body ({% generation %} and the like)
  };
  Kind kind;
  int line = 0, col = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr filter;  // For: loop filter; SetBlock/FilterBlock: filter chain
  Target target;
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body, else_body;
  std::string name;
  std::vector<std::pair<std::string, ExprPtr>> params;  // Macro/CallBlock: (name, default|null)
  bool body_uses_loop = true;  // For: the body names `loop` (else no loop object is made)
};

struct Program {
  Body body;
};

// Parses a template. Throws glms::Error "template syntax error at LINE:COL: ...".
std::shared_ptr<const Program> parse(const std::vector<Token>& tokens);

}  // namespace glms::jinja
