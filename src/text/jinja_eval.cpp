// Jinja evaluator: walks the Program produced by parse() (jinja_ast.h) and writes the output.
// Scoping follows jinja2: `for` bodies and macro bodies get a fresh scope (per iteration);
// `if` shares its enclosing scope; namespace() objects are the way to carry state out of
// loops. See jinja.h for the error and limit contracts.
#include <unordered_map>

#include "text/jinja.h"
#include "text/jinja_ast.h"
#include "text/jinja_builtins.h"

namespace glms::jinja {
namespace {

// Steps a loop iteration counts (see exec_for): with and without a `loop` object.
constexpr int64_t kLoopObjectSteps = 24;
constexpr int64_t kIterationSteps = 4;
// Operations that walk a string or a container (indexing and slicing a string by code point,
// methods, filters, concatenation, comparison) cost in proportion to its size: a step per this
// many bytes or items, so that the step limit bounds them too (fuzzing found indexing a 16 MB
// string in a loop: 50 ms an evaluation step).
constexpr size_t kStringBytesPerStep = 16;
constexpr size_t kItemsPerStep = 8;

struct Scope {
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Scope> parent;
};
using ScopePtr = std::shared_ptr<Scope>;

// An error that already names its template line.
struct LocatedError : Error {
  using Error::Error;
};

enum class Flow { Normal, Break, Continue };

class Evaluator {
 public:
  Evaluator(const RenderLimits& limits, std::string* out) : limits_(limits), out_(out) {}

  Flow exec(const Body& body, const ScopePtr& scope) {
    for (const auto& s : body) {
      Flow f = exec_stmt(*s, scope);
      if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
  }

  Value eval(const Expr& e, const ScopePtr& scope);

 private:
  const RenderLimits& limits_;
  std::string* out_;
  int64_t steps_ = 0;
  int depth_ = 0;

  void step() { steps(1); }
  // Steps for an operation that may walk all of `v` (see kStringBytesPerStep).
  const Value& charged(const Value& v) {
    if (v.is_string()) steps(static_cast<int64_t>(v.as_string().size() / kStringBytesPerStep));
    else if (v.is_list()) steps(static_cast<int64_t>(v.items().size() / kItemsPerStep));
    else if (v.is_dict()) steps(static_cast<int64_t>(v.dict_data().items.size() / kItemsPerStep));
    return v;
  }
  void steps(int64_t count) {
    steps_ += count;
    if (steps_ > limits_.max_steps)
      fail("template exceeded the step limit (" + std::to_string(limits_.max_steps) +
           " evaluation steps)");
  }

  void write(const std::string& s) {
    out_->append(s);
    if (out_->size() > limits_.max_output_bytes)
      fail("template output exceeds " + std::to_string(limits_.max_output_bytes) + " bytes");
  }

  static Value lookup(const ScopePtr& scope, const std::string& name) {
    for (const Scope* s = scope.get(); s; s = s->parent.get()) {
      auto it = s->vars.find(name);
      if (it != s->vars.end()) return it->second;
    }
    return Value::undefined("'" + name + "' is undefined");
  }

  Flow exec_stmt(const Stmt& s, const ScopePtr& scope) {
    try {
      return exec_stmt_impl(s, scope);
    } catch (const LocatedError&) {
      throw;
    } catch (const RaisedError&) {
      throw;
    } catch (const Error& e) {
      throw LocatedError("template error at line " + std::to_string(s.line) + ": " + e.what());
    }
  }

  // Renders `body` into a string (for macros, set blocks, filter blocks, caller()).
  std::string capture(const Body& body, const ScopePtr& scope) {
    std::string buffer;
    std::string* saved = out_;
    out_ = &buffer;
    try {
      exec(body, scope);
    } catch (...) {
      out_ = saved;
      throw;
    }
    out_ = saved;
    return buffer;
  }

  void assign(const Target& t, const Value& v, const ScopePtr& scope) {
    if (!t.elements.empty()) {
      std::vector<Value> items = iterate(v);
      if (items.size() != t.elements.size())
        fail(std::string(items.size() > t.elements.size() ? "too many" : "not enough") +
             " values to unpack (expected " + std::to_string(t.elements.size()) + ", got " +
             std::to_string(items.size()) + ")");
      for (size_t i = 0; i < items.size(); ++i) assign(t.elements[i], items[i], scope);
      return;
    }
    if (!t.attr.empty()) {
      Value ns = lookup(scope, t.name);
      if (!ns.is_namespace()) fail("cannot assign attribute on non-namespace object");
      ns.dict_data().set(t.attr, v);
      return;
    }
    scope->vars[t.name] = v;
  }

  Flow exec_stmt_impl(const Stmt& s, const ScopePtr& scope) {
    step();
    switch (s.kind) {
      case Stmt::Kind::Text: write(s.text); return Flow::Normal;
      case Stmt::Kind::Output: write(eval(*s.expr, scope).str()); return Flow::Normal;
      case Stmt::Kind::If:
        for (const auto& [cond, body] : s.branches)
          if (eval(*cond, scope).truthy()) return exec(body, scope);
        return exec(s.else_body, scope);
      case Stmt::Kind::For: return exec_for(s, scope);
      case Stmt::Kind::Set: assign(s.target, eval(*s.expr, scope), scope); return Flow::Normal;
      case Stmt::Kind::SetBlock: {
        Value v(capture(s.body, scope));
        if (s.filter) v = eval_filters(*s.filter, v, scope);
        assign(s.target, v, scope);
        return Flow::Normal;
      }
      case Stmt::Kind::FilterBlock:
        write(eval_filters(*s.filter, Value(capture(s.body, scope)), scope).str());
        return Flow::Normal;
      case Stmt::Kind::Macro: scope->vars[s.name] = make_macro(s, scope, s.name); return Flow::Normal;
      case Stmt::Kind::CallBlock: {
        // The body becomes a macro passed to the callee as its `caller` keyword argument.
        Value fn = eval(*s.expr->args[0], scope);
        if (fn.is_undefined()) fail_undefined(fn);
        if (!fn.is_callable()) fail("'" + fn.type_name() + "' object is not callable");
        CallArgs a = eval_args(*s.expr, 1, scope);
        a.keyword.emplace_back("caller", make_macro(s, scope, "caller"));
        write(fn.callable().fn(a).str());
        return Flow::Normal;
      }
      case Stmt::Kind::Break: return Flow::Break;
      case Stmt::Kind::Continue: return Flow::Continue;
      case Stmt::Kind::Block: return exec(s.body, scope);
    }
    return Flow::Normal;
  }

  Flow exec_for(const Stmt& s, const ScopePtr& scope) {
    std::vector<Value> items = iterate(eval(*s.expr, scope));
    if (s.filter) {
      std::vector<Value> kept;
      for (const Value& item : items) {
        auto tmp = std::make_shared<Scope>();
        tmp->parent = scope;
        assign(s.target, item, tmp);
        if (eval(*s.filter, tmp).truthy()) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) return exec(s.else_body, scope);
    const int64_t n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      // An iteration's scope costs what a few expression nodes do, its `loop` object (a dict of
      // a dozen entries and a function) what about twenty do: steps in proportion, so that the
      // step limit bounds the time of empty loops nested deep too.
      steps(s.body_uses_loop ? kLoopObjectSteps : kIterationSteps);
      auto iter_scope = std::make_shared<Scope>();
      iter_scope->parent = scope;
      if (s.body_uses_loop) iter_scope->vars["loop"] = make_loop_object(items, i);
      assign(s.target, items[i], iter_scope);
      if (exec(s.body, iter_scope) == Flow::Break) break;
    }
    return Flow::Normal;
  }

  // Jinja's `loop` of iteration i over items.
  static Value make_loop_object(const std::vector<Value>& items, int64_t i) {
    const int64_t n = static_cast<int64_t>(items.size());
    Value loop = Value::dict();
    DictData& d = loop.dict_data();
    d.set("index", Value(i + 1));
    d.set("index0", Value(i));
    d.set("revindex", Value(n - i));
    d.set("revindex0", Value(n - i - 1));
    d.set("first", Value(i == 0));
    d.set("last", Value(i == n - 1));
    d.set("length", Value(n));
    d.set("depth", Value(1));
    d.set("depth0", Value(0));
    if (i > 0) d.set("previtem", items[i - 1]);
    if (i + 1 < n) d.set("nextitem", items[i + 1]);
    d.set("cycle", Value::function("loop.cycle", [i](const CallArgs& a) -> Value {
      if (a.positional.empty()) fail("no items for cycling given");
      return a.positional[static_cast<size_t>(i) % a.positional.size()];
    }));
    return loop;
  }

  Value make_macro(const Stmt& s, const ScopePtr& def_scope, const std::string& name) {
    const Stmt* stmt = &s;
    Evaluator* self = this;
    // Weak: the defining scope owns the macro value, a strong reference would be a cycle.
    std::weak_ptr<Scope> captured = def_scope;
    return Value::function(name, [self, stmt, captured, name](const CallArgs& a) -> Value {
      if (self->depth_ >= self->limits_.max_call_depth)
        fail("maximum macro call depth (" + std::to_string(self->limits_.max_call_depth) + ") exceeded");
      auto scope = std::make_shared<Scope>();
      scope->parent = captured.lock();
      if (!scope->parent) fail("macro '" + name + "' called after its scope ended");
      const auto& params = stmt->params;
      std::vector<Value> extra;
      for (size_t i = 0; i < a.positional.size(); ++i) {
        if (i < params.size()) scope->vars[params[i].first] = a.positional[i];
        else extra.push_back(a.positional[i]);
      }
      Value kwargs = Value::dict();
      for (const auto& [k, v] : a.keyword) {
        if (k == "caller") {
          scope->vars["caller"] = v;
          continue;
        }
        bool is_param = false;
        for (const auto& p : params) is_param |= p.first == k;
        if (is_param) scope->vars[k] = v;
        else kwargs.dict_data().set(k, v);
      }
      for (const auto& [pname, def] : params) {
        if (scope->vars.count(pname)) continue;
        scope->vars[pname] = def ? self->eval(*def, scope) : Value::undefined("'" + pname + "' is undefined");
      }
      scope->vars["varargs"] = Value::tuple(std::move(extra));
      scope->vars["kwargs"] = kwargs;
      ++self->depth_;
      std::string text;
      try {
        text = self->capture(stmt->body, scope);
      } catch (...) {
        --self->depth_;
        throw;
      }
      --self->depth_;
      return Value(std::move(text));
    });
  }

  CallArgs eval_args(const Expr& e, size_t first, const ScopePtr& scope) {
    CallArgs a;
    for (size_t i = first; i < e.args.size(); ++i) a.positional.push_back(eval(*e.args[i], scope));
    for (const auto& [k, v] : e.kwargs) a.keyword.emplace_back(k, eval(*v, scope));
    return a;
  }

  // Applies a filter chain whose innermost input is null (filter/set blocks) to `input`.
  Value eval_filters(const Expr& f, const Value& input, const ScopePtr& scope) {
    Value in = f.args[0] ? eval_filters(*f.args[0], input, scope) : input;
    return apply_filter(f.name, in, eval_args(f, 1, scope));
  }
};

Value Evaluator::eval(const Expr& e, const ScopePtr& scope) {
  step();
  switch (e.kind) {
    case Expr::Kind::Literal: return e.value;
    case Expr::Kind::Name: return lookup(scope, e.name);
    case Expr::Kind::Attr: return get_attr(charged(eval(*e.args[0], scope)), e.name);
    case Expr::Kind::Item: {
      Value obj = eval(*e.args[0], scope);
      if (obj.is_string()) charged(obj);  // by code point; lists and dicts index directly
      return get_item(obj, eval(*e.args[1], scope));
    }
    case Expr::Kind::Slice: {
      Value obj = charged(eval(*e.args[0], scope));
      auto part = [&](size_t i) { return e.args[i] ? eval(*e.args[i], scope) : Value(nullptr); };
      return get_slice(obj, part(1), part(2), part(3));
    }
    case Expr::Kind::Call: {
      Value fn = eval(*e.args[0], scope);
      if (fn.is_undefined()) fail_undefined(fn);
      if (!fn.is_callable()) fail("'" + fn.type_name() + "' object is not callable");
      CallArgs a = eval_args(e, 1, scope);
      return fn.callable().fn(a);
    }
    case Expr::Kind::Filter: {
      Value input = charged(eval(*e.args[0], scope));
      if (!has_filter(e.name))
        syntax_error(e.line, e.col, "no filter named '" + e.name + "'");
      CallArgs args = eval_args(e, 1, scope);
      for (const Value& arg : args.positional) charged(arg);
      return apply_filter(e.name, input, args);
    }
    case Expr::Kind::Test: {
      Value v = charged(eval(*e.args[0], scope));
      if (!has_test(e.name)) syntax_error(e.line, e.col, "no test named '" + e.name + "'");
      bool r = apply_test(e.name, v, eval_args(e, 1, scope));
      return Value(e.negate ? !r : r);
    }
    case Expr::Kind::Unary: return unary_op(e.name, eval(*e.args[0], scope));
    case Expr::Kind::Binary: {
      Value a = charged(eval(*e.args[0], scope));
      Value b = charged(eval(*e.args[1], scope));
      Value r = binary_op(e.name, a, b);
      if (r.is_string() && r.as_string().size() > kMaxBuiltSize) fail("string result too large");
      return r;
    }
    case Expr::Kind::And: {
      Value a = eval(*e.args[0], scope);
      return a.truthy() ? eval(*e.args[1], scope) : a;
    }
    case Expr::Kind::Or: {
      Value a = eval(*e.args[0], scope);
      return a.truthy() ? a : eval(*e.args[1], scope);
    }
    case Expr::Kind::Compare: {
      Value left = charged(eval(*e.args[0], scope));
      for (size_t i = 0; i < e.ops.size(); ++i) {
        Value right = charged(eval(*e.args[i + 1], scope));
        if (!compare(e.ops[i], left, right)) return Value(false);
        left = std::move(right);
      }
      return Value(true);
    }
    case Expr::Kind::Cond:
      if (eval(*e.args[1], scope).truthy()) return eval(*e.args[0], scope);
      if (e.args[2]) return eval(*e.args[2], scope);
      return Value::undefined("the inline if-expression evaluated to false and no else section was defined.");
    case Expr::Kind::List: case Expr::Kind::Tuple: {
      std::vector<Value> items;
      for (const auto& x : e.args) items.push_back(eval(*x, scope));
      return e.kind == Expr::Kind::Tuple ? Value::tuple(std::move(items)) : Value::list(std::move(items));
    }
    case Expr::Kind::Dict: {
      Value d = Value::dict();
      for (const auto& [k, v] : e.pairs) {
        Value key = eval(*k, scope);
        if (!key.is_string()) fail("dict keys must be strings in this interpreter, got " + key.type_name());
        d.dict_data().set(key.as_string(), eval(*v, scope));
      }
      return d;
    }
  }
  return Value();
}

}  // namespace

Template Template::parse(std::string_view source) {
  Template t;
  t.program_ = glms::jinja::parse(lex(source));
  return t;
}

std::string Template::render(const Value& context, const RenderLimits& limits) const {
  auto globals = std::make_shared<Scope>();
  DictData builtins;
  add_globals(builtins);
  for (auto& [k, v] : builtins.items) globals->vars[k] = v;
  auto top = std::make_shared<Scope>();
  top->parent = globals;
  if (context.is_dict())
    for (const auto& [k, v] : context.dict_data().items) top->vars[k] = v;
  std::string out;
  Evaluator ev(limits, &out);
  ev.exec(program_->body, top);
  return out;
}

}  // namespace glms::jinja
