// Jinja parser: tokens -> Program. Recursive descent with jinja2's operator precedence
// (conditional < or < and < not < comparisons < + - < ~ < * / // % < ** < unary < filters,
// tests and postfix). See jinja_ast.h.
#include <set>

#include "core/error.h"
#include "text/jinja_ast.h"
#include "text/jinja_builtins.h"

namespace glms::jinja {
namespace {

std::string describe(const Token& t) {
  switch (t.kind) {
    case Tok::Eof: return "end of template";
    case Tok::Text: return "template text";
    case Tok::VarBegin: return "'{{'";
    case Tok::VarEnd: return "'}}'";
    case Tok::BlockBegin: return "'{%'";
    case Tok::BlockEnd: return "'%}'";
    case Tok::String: return "string literal";
    case Tok::Int: case Tok::Float: return "number '" + t.text + "'";
    default: return "'" + t.text + "'";
  }
}

std::string join_names(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i) out += i + 1 == names.size() ? " or " : ", ";
    out += "'" + names[i] + "'";
  }
  return out;
}

class Parser {
 public:
  explicit Parser(const std::vector<Token>& tokens) : t_(tokens) {}

  std::shared_ptr<const Program> run() {
    auto program = std::make_shared<Program>();
    std::string end;
    program->body = parse_body({}, end);
    return program;
  }

 private:
  const std::vector<Token>& t_;
  size_t i_ = 0;
  int depth_ = 0;  // nesting of statements and expressions, bounded to protect the stack
  int64_t loop_mentions_ = 0;  // Name expressions `loop` parsed so far

  struct DepthGuard {
    Parser& p;
    explicit DepthGuard(Parser& parser) : p(parser) {
      if (++p.depth_ > 100) p.error("template nested too deeply (more than 100 levels)");
    }
    ~DepthGuard() { --p.depth_; }
  };

  const Token& cur() const { return t_[i_]; }
  const Token& peek(size_t k = 1) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  void advance() {
    if (i_ + 1 < t_.size()) ++i_;
  }
  [[noreturn]] void error(const std::string& what) const { syntax_error(cur().line, cur().col, what); }
  [[noreturn]] void expected(const std::string& what) const {
    error("expected " + what + ", got " + describe(cur()));
  }
  bool is_op(const char* op) const { return cur().kind == Tok::Op && cur().text == op; }
  bool is_name(const char* name) const { return cur().kind == Tok::Name && cur().text == name; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    advance();
    return true;
  }
  bool skip_name(const char* name) {
    if (!is_name(name)) return false;
    advance();
    return true;
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) expected(std::string("'") + op + "'");
  }
  std::string expect_name(const char* what = "a name") {
    if (cur().kind != Tok::Name) expected(what);
    std::string n = cur().text;
    advance();
    return n;
  }
  void expect_block_end() {
    if (cur().kind != Tok::BlockEnd) expected("'%}'");
    advance();
  }

  ExprPtr node(Expr::Kind kind, const Token& at) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = at.line;
    e->col = at.col;
    return e;
  }
  StmtPtr stmt(Stmt::Kind kind, const Token& at) {
    auto s = std::make_unique<Stmt>();
    s->kind = kind;
    s->line = at.line;
    s->col = at.col;
    return s;
  }

  // Parses statements until `{% <one of ends> ...`; leaves the tokens after the end tag's
  // name to the caller (which reads its arguments and the '%}'). `end` receives the name.
  Body parse_body(const std::vector<std::string>& ends, std::string& end) {
    Body body;
    while (true) {
      const Token& tok = cur();
      if (tok.kind == Tok::Eof) {
        if (ends.empty()) return body;
        expected(join_names(ends));
      }
      if (tok.kind == Tok::Text) {
        auto s = stmt(Stmt::Kind::Text, tok);
        s->text = tok.text;
        body.push_back(std::move(s));
        advance();
      } else if (tok.kind == Tok::VarBegin) {
        advance();
        auto s = stmt(Stmt::Kind::Output, tok);
        s->expr = parse_tuple(true, false);
        if (cur().kind != Tok::VarEnd) expected("'}}'");
        advance();
        body.push_back(std::move(s));
      } else if (tok.kind == Tok::BlockBegin) {
        advance();
        if (cur().kind != Tok::Name) expected("a statement name");
        const std::string& name = cur().text;
        for (const auto& e : ends)
          if (name == e) {
            end = name;
            advance();
            return body;
          }
        body.push_back(parse_statement());
      } else {
        expected("template text or a tag");
      }
    }
  }

  StmtPtr parse_statement() {
    DepthGuard guard(*this);
    const Token& tok = cur();
    const std::string name = tok.text;
    advance();
    if (name == "if") return parse_if(tok);
    if (name == "for") return parse_for(tok);
    if (name == "set") return parse_set(tok);
    if (name == "macro") return parse_macro(tok);
    if (name == "call") return parse_call_block(tok);
    if (name == "filter") return parse_filter_block(tok);
    if (name == "break" || name == "continue") {
      auto s = stmt(name == "break" ? Stmt::Kind::Break : Stmt::Kind::Continue, tok);
      expect_block_end();
      return s;
    }
    if (name == "generation") {
      auto s = stmt(Stmt::Kind::Block, tok);
      expect_block_end();
      std::string end;
      s->body = parse_body({"endgeneration"}, end);
      expect_block_end();
      return s;
    }
    static const std::set<std::string> unsupported = {"include", "import", "from", "extends",
                                                      "block", "with", "autoescape", "do"};
    if (unsupported.count(name))
      syntax_error(tok.line, tok.col, "the '" + name + "' tag is not supported");
    syntax_error(tok.line, tok.col, "unknown tag '" + name + "'");
  }

  StmtPtr parse_if(const Token& tok) {
    auto s = stmt(Stmt::Kind::If, tok);
    ExprPtr cond = parse_tuple(false, false);
    while (true) {
      expect_block_end();
      std::string end;
      Body body = parse_body({"elif", "else", "endif"}, end);
      s->branches.emplace_back(std::move(cond), std::move(body));
      if (end == "elif") {
        cond = parse_tuple(false, false);
        continue;
      }
      if (end == "else") {
        expect_block_end();
        s->else_body = parse_body({"endif"}, end);
      }
      expect_block_end();
      return s;
    }
  }

  Target parse_target(bool allow_attr) {
    Target target;
    const Token& first = cur();
    auto one = [&]() {
      Target t;
      t.name = expect_name("an assignment target");
      if (allow_attr && skip_op(".")) t.attr = expect_name("an attribute name");
      return t;
    };
    if (skip_op("(")) {
      target.elements.push_back(parse_target(false));
      while (skip_op(",")) {
        if (is_op(")")) break;
        target.elements.push_back(parse_target(false));
      }
      expect_op(")");
      return target;
    }
    Target t = one();
    if (!is_op(",")) return t;
    (void)first;
    target.elements.push_back(std::move(t));
    while (skip_op(",")) {
      if (cur().kind != Tok::Name || is_name("in")) break;
      target.elements.push_back(one());
    }
    return target;
  }

  StmtPtr parse_for(const Token& tok) {
    auto s = stmt(Stmt::Kind::For, tok);
    s->target = parse_target(false);
    if (!skip_name("in")) expected("'in'");
    s->expr = parse_tuple(false, false, /*stop_at_if=*/true);
    if (skip_name("if")) s->filter = parse_expression();
    if (is_name("recursive")) error("recursive loops are not supported");
    expect_block_end();
    std::string end;
    const int64_t mentions_before = loop_mentions_;
    s->body = parse_body({"endfor", "else"}, end);
    s->body_uses_loop = loop_mentions_ != mentions_before;
    if (end == "else") {
      expect_block_end();
      s->else_body = parse_body({"endfor"}, end);
    }
    expect_block_end();
    return s;
  }

  StmtPtr parse_set(const Token& tok) {
    auto s = stmt(Stmt::Kind::Set, tok);
    s->target = parse_target(true);
    if (skip_op("=")) {
      s->expr = parse_tuple(true, false);
      expect_block_end();
      return s;
    }
    s->kind = Stmt::Kind::SetBlock;
    if (!s->target.elements.empty()) error("a {% set %} block needs a single name");
    if (is_op("|")) s->filter = parse_filters(nullptr);
    expect_block_end();
    std::string end;
    s->body = parse_body({"endset"}, end);
    expect_block_end();
    return s;
  }

  void parse_signature(Stmt& s) {
    expect_op("(");
    while (!is_op(")")) {
      if (!s.params.empty()) expect_op(",");
      if (is_op(")")) break;
      std::string pname = expect_name("a parameter name");
      ExprPtr def;
      if (skip_op("=")) def = parse_expression();
      s.params.emplace_back(std::move(pname), std::move(def));
    }
    advance();
  }

  StmtPtr parse_macro(const Token& tok) {
    auto s = stmt(Stmt::Kind::Macro, tok);
    s->name = expect_name("a macro name");
    parse_signature(*s);
    expect_block_end();
    std::string end;
    s->body = parse_body({"endmacro"}, end);
    if (cur().kind == Tok::Name) advance();  // {% endmacro name %}
    expect_block_end();
    return s;
  }

  StmtPtr parse_call_block(const Token& tok) {
    auto s = stmt(Stmt::Kind::CallBlock, tok);
    if (is_op("(")) parse_signature(*s);
    s->expr = parse_expression();
    if (s->expr->kind != Expr::Kind::Call) error("{% call %} needs a macro call");
    expect_block_end();
    std::string end;
    s->body = parse_body({"endcall"}, end);
    expect_block_end();
    return s;
  }

  StmtPtr parse_filter_block(const Token& tok) {
    auto s = stmt(Stmt::Kind::FilterBlock, tok);
    s->filter = parse_filters(nullptr, /*first_without_bar=*/true);
    expect_block_end();
    std::string end;
    s->body = parse_body({"endfilter"}, end);
    expect_block_end();
    return s;
  }

  // ---- expressions ----

  // A comma separated list of expressions: one expression, or a Tuple if there are commas.
  ExprPtr parse_tuple(bool with_condexpr, bool explicit_parens, bool stop_at_if = false) {
    const Token& start = cur();
    std::vector<ExprPtr> items;
    bool comma = false;
    while (true) {
      if (!items.empty()) {
        if (!skip_op(",")) break;
        comma = true;
      }
      if (cur().kind == Tok::VarEnd || cur().kind == Tok::BlockEnd || is_op(")") ||
          (stop_at_if && is_name("if")))
        break;
      items.push_back(with_condexpr ? parse_expression() : parse_or());
    }
    if (items.empty() && !explicit_parens) expected("an expression");
    if (items.size() == 1 && !comma) return std::move(items[0]);
    auto e = node(Expr::Kind::Tuple, start);
    e->args = std::move(items);
    return e;
  }

  ExprPtr parse_expression() {
    ExprPtr e = parse_or();
    while (is_name("if")) {
      const Token& tok = cur();
      advance();
      auto c = node(Expr::Kind::Cond, tok);
      ExprPtr cond = parse_or();
      ExprPtr other;
      if (skip_name("else")) other = parse_expression();
      c->args.push_back(std::move(e));
      c->args.push_back(std::move(cond));
      c->args.push_back(std::move(other));
      e = std::move(c);
    }
    return e;
  }

  ExprPtr binary(Expr::Kind kind, const Token& tok, ExprPtr a, ExprPtr b, std::string op = "") {
    auto e = node(kind, tok);
    e->name = std::move(op);
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
      const Token& tok = cur();
      advance();
      e = binary(Expr::Kind::Or, tok, std::move(e), parse_and());
    }
    return e;
  }

  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
      const Token& tok = cur();
      advance();
      e = binary(Expr::Kind::And, tok, std::move(e), parse_not());
    }
    return e;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      const Token& tok = cur();
      advance();
      auto e = node(Expr::Kind::Unary, tok);
      e->name = "not";
      e->args.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const Token& start = cur();
    ExprPtr first = parse_math1();
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (cur().kind == Tok::Op && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                    cur().text == ">" || cur().text == "<=" || cur().text == ">=")) {
        op = cur().text;
        advance();
      } else if (is_name("in")) {
        op = "in";
        advance();
      } else if (is_name("not") && peek().kind == Tok::Name && peek().text == "in") {
        op = "notin";
        advance();
        advance();
      } else {
        break;
      }
      if (!cmp) {
        cmp = node(Expr::Kind::Compare, start);
        cmp->args.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->args.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(first);
  }

  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& tok = cur();
      advance();
      e = binary(Expr::Kind::Binary, tok, std::move(e), parse_concat(), tok.text);
    }
    return e;
  }

  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (is_op("~")) {
      const Token& tok = cur();
      advance();
      e = binary(Expr::Kind::Binary, tok, std::move(e), parse_math2(), "~");
    }
    return e;
  }

  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& tok = cur();
      advance();
      e = binary(Expr::Kind::Binary, tok, std::move(e), parse_pow(), tok.text);
    }
    return e;
  }

  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (is_op("**")) {
      const Token& tok = cur();
      advance();
      e = binary(Expr::Kind::Binary, tok, std::move(e), parse_unary(true), "**");
    }
    return e;
  }

  ExprPtr parse_unary(bool with_filter) {
    DepthGuard guard(*this);
    const Token& tok = cur();
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      advance();
      e = node(Expr::Kind::Unary, tok);
      e->name = tok.text;
      e->args.push_back(parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    const Token& tok = cur();
    switch (tok.kind) {
      case Tok::Name: {
        advance();
        auto e = node(Expr::Kind::Literal, tok);
        if (tok.text == "true" || tok.text == "True") e->value = Value(true);
        else if (tok.text == "false" || tok.text == "False") e->value = Value(false);
        else if (tok.text == "none" || tok.text == "None") e->value = Value(nullptr);
        else {
          e->kind = Expr::Kind::Name;
          e->name = tok.text;
          if (e->name == "loop") ++loop_mentions_;
        }
        return e;
      }
      case Tok::String: {
        std::string s;
        while (cur().kind == Tok::String) {  // adjacent literals concatenate
          s += cur().text;
          advance();
        }
        auto e = node(Expr::Kind::Literal, tok);
        e->value = Value(std::move(s));
        return e;
      }
      case Tok::Int: case Tok::Float: {
        advance();
        auto e = node(Expr::Kind::Literal, tok);
        e->value = tok.kind == Tok::Int ? Value(tok.int_value) : Value(tok.float_value);
        return e;
      }
      case Tok::Op:
        if (tok.text == "(") {
          advance();
          ExprPtr e = parse_tuple(true, true);
          expect_op(")");
          return e;
        }
        if (tok.text == "[") {
          advance();
          auto e = node(Expr::Kind::List, tok);
          while (!is_op("]")) {
            if (!e->args.empty()) expect_op(",");
            if (is_op("]")) break;
            e->args.push_back(parse_expression());
          }
          advance();
          return e;
        }
        if (tok.text == "{") {
          advance();
          auto e = node(Expr::Kind::Dict, tok);
          while (!is_op("}")) {
            if (!e->pairs.empty()) expect_op(",");
            if (is_op("}")) break;
            ExprPtr key = parse_expression();
            expect_op(":");
            e->pairs.emplace_back(std::move(key), parse_expression());
          }
          advance();
          return e;
        }
        break;
      default: break;
    }
    expected("an expression");
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      const Token& tok = cur();
      if (is_op(".")) {
        advance();
        auto a = node(Expr::Kind::Attr, tok);
        if (cur().kind == Tok::Int) {
          a->kind = Expr::Kind::Item;
          a->args.push_back(std::move(e));
          auto idx = node(Expr::Kind::Literal, cur());
          idx->value = Value(cur().int_value);
          a->args.push_back(std::move(idx));
          advance();
        } else {
          a->name = expect_name("an attribute name");
          a->args.push_back(std::move(e));
        }
        e = std::move(a);
      } else if (is_op("[")) {
        advance();
        e = parse_subscript(std::move(e), tok);
        expect_op("]");
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr target, const Token& tok) {
    ExprPtr parts[3];
    bool is_slice = false;
    if (!is_op(":")) parts[0] = parse_expression();
    if (skip_op(":")) {
      is_slice = true;
      if (!is_op("]") && !is_op(":")) parts[1] = parse_expression();
      if (skip_op(":") && !is_op("]")) parts[2] = parse_expression();
    }
    if (!is_slice && is_op(",")) error("tuple subscripts are not supported");
    auto e = node(is_slice ? Expr::Kind::Slice : Expr::Kind::Item, tok);
    e->args.push_back(std::move(target));
    e->args.push_back(std::move(parts[0]));
    if (is_slice) {
      e->args.push_back(std::move(parts[1]));
      e->args.push_back(std::move(parts[2]));
    }
    return e;
  }

  void parse_args(Expr& e) {
    expect_op("(");
    bool any = false;
    while (!is_op(")")) {
      if (any) expect_op(",");
      if (is_op(")")) break;
      any = true;
      if (cur().kind == Tok::Name && peek().kind == Tok::Op && peek().text == "=") {
        std::string key = cur().text;
        advance();
        advance();
        e.kwargs.emplace_back(std::move(key), parse_expression());
      } else {
        if (!e.kwargs.empty()) error("positional argument after keyword argument");
        e.args.push_back(parse_expression());
      }
    }
    advance();
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto e = node(Expr::Kind::Call, cur());
    e->args.push_back(std::move(callee));
    parse_args(*e);
    return e;
  }

  // `| name(args) | name2 ...`; input may be null (filter blocks, set blocks).
  ExprPtr parse_filters(ExprPtr input, bool first_without_bar = false) {
    bool first = true;
    while (first && first_without_bar ? true : is_op("|")) {
      if (!(first && first_without_bar)) advance();
      first = false;
      const Token& tok = cur();
      auto f = node(Expr::Kind::Filter, tok);
      f->name = expect_name("a filter name");
      while (is_op(".")) {  // dotted filter names
        advance();
        f->name += "." + expect_name("a filter name");
      }
      if (!has_filter(f->name)) syntax_error(tok.line, tok.col, "no filter named '" + f->name + "'");
      f->args.push_back(std::move(input));
      if (is_op("(")) parse_args(*f);
      input = std::move(f);
    }
    return input;
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    while (true) {
      if (is_op("|")) {
        e = parse_filters(std::move(e));
      } else if (is_name("is")) {
        const Token& tok = cur();
        advance();
        auto t = node(Expr::Kind::Test, tok);
        t->negate = skip_name("not");
        const Token& name_tok = cur();
        t->name = expect_name("a test name");
        if (!has_test(t->name)) syntax_error(name_tok.line, name_tok.col, "no test named '" + t->name + "'");
        t->args.push_back(std::move(e));
        if (is_op("(")) {
          parse_args(*t);
        } else if ((cur().kind == Tok::Name || cur().kind == Tok::String || cur().kind == Tok::Int ||
                    cur().kind == Tok::Float || is_op("[") || is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and") && !is_name("if") &&
                   !is_name("in") && !is_name("not")) {
          // Note: jinja2 does not stop at 'if'/'in'/'not' here, but they can never start a
          // valid test argument in a chat template.
          t->args.push_back(parse_postfix(parse_primary()));
        }
        e = std::move(t);
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }
};

}  // namespace

std::shared_ptr<const Program> parse(const std::vector<Token>& tokens) {
  return Parser(tokens).run();
}

}  // namespace glms::jinja
