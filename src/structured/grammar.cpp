#include "structured/grammar.h"

#include <functional>
#include <unordered_map>

#include "core/error.h"
#include "structured/vocabulary.h"

namespace glms::structured {

ByteSet text_bytes() {
  ByteSet set;
  set.set();
  for (int b = kFirstMarkupByte; b < 256; ++b) set.reset(static_cast<size_t>(b));
  return set;
}

Expr bytes(const ByteSet& set) {
  Expr e;
  e.kind = Expr::Kind::kBytes;
  e.bytes = set;
  return e;
}

Expr literal(std::string_view text) {
  Expr e;
  e.kind = Expr::Kind::kSequence;
  for (const unsigned char c : text) {
    ByteSet one;
    one.set(c);
    e.items.push_back(bytes(one));
  }
  return e;
}

Expr sequence(std::vector<Expr> items) {
  Expr e;
  e.kind = Expr::Kind::kSequence;
  e.items = std::move(items);
  return e;
}

Expr choice(std::vector<Expr> items) {
  if (items.size() == 1) return std::move(items[0]);
  Expr e;
  e.kind = Expr::Kind::kChoice;
  e.items = std::move(items);
  return e;
}

Expr repeat(Expr item, int min, int max) {
  Expr e;
  e.kind = Expr::Kind::kRepeat;
  e.items.push_back(std::move(item));
  e.min = min;
  e.max = max;
  return e;
}

Expr optional(Expr item) { return repeat(std::move(item), 0, 1); }

int GrammarBuilder::rule(const std::string& name) {
  const auto [it, added] = ids_.emplace(name, static_cast<int>(names_.size()));
  if (!added) return it->second;
  names_.push_back(name);
  exprs_.emplace_back();
  defined_.push_back(false);
  return static_cast<int>(names_.size()) - 1;
}

void GrammarBuilder::define(const std::string& name, Expr expr) {
  const int id = rule(name);
  if (defined_[static_cast<size_t>(id)]) fail("grammar: rule '" + name + "' is defined twice");
  exprs_[static_cast<size_t>(id)] = std::move(expr);
  defined_[static_cast<size_t>(id)] = true;
}

bool GrammarBuilder::defined(const std::string& name) const {
  const auto it = ids_.find(name);
  return it != ids_.end() && defined_[static_cast<size_t>(it->second)];
}

namespace {

using Element = Grammar::Element;
using Alternative = std::vector<Element>;

// Flattens expressions into rules of alternatives; repetitions and nested choices become helper
// rules named after the rule they came from.
class Lowering {
 public:
  explicit Lowering(const std::vector<std::string>& names) : names_(names), alts_(names.size()) {}

  void lower_rule(int rule, const Expr& e) { alts_[static_cast<size_t>(rule)] = alternatives(e, rule); }

  Grammar finish(int root) {
    Grammar g;
    g.sets = std::move(sets_);
    g.names = names_;
    g.root = root;
    g.alternatives.resize(alts_.size());
    for (size_t r = 0; r < alts_.size(); ++r)
      for (const Alternative& alt : alts_[r]) {
        g.alternatives[r].push_back(static_cast<int32_t>(g.elements.size()));
        g.elements.insert(g.elements.end(), alt.begin(), alt.end());
        g.elements.push_back({Element::Kind::kEnd, 0});
      }
    return g;
  }

 private:
  int helper(int owner) {
    names_.push_back(names_[static_cast<size_t>(owner)] + "#" + std::to_string(names_.size()));
    alts_.emplace_back();
    return static_cast<int>(names_.size()) - 1;
  }
  int32_t set_index(const ByteSet& set) {
    const auto [it, added] = set_ids_.emplace(set, static_cast<int32_t>(sets_.size()));
    if (added) sets_.push_back(set);
    return it->second;
  }
  // `e` as one run of elements: itself when it has one alternative, else a call of a helper
  // rule holding its alternatives. Empty optional: `e` matches nothing.
  bool as_run(const Expr& e, int owner, Alternative& run) {
    std::vector<Alternative> alts = alternatives(e, owner);
    if (alts.empty()) return false;
    if (alts.size() == 1) {
      run = std::move(alts[0]);
      return true;
    }
    const int h = helper(owner);
    alts_[static_cast<size_t>(h)] = std::move(alts);
    run = {{Element::Kind::kRule, h}};
    return true;
  }
  std::vector<Alternative> alternatives(const Expr& e, int owner) {
    switch (e.kind) {
      case Expr::Kind::kBytes:
        if (e.bytes.none()) return {};
        return {{{Element::Kind::kBytes, set_index(e.bytes)}}};
      case Expr::Kind::kRule:
        return {{{Element::Kind::kRule, e.rule}}};
      case Expr::Kind::kChoice: {
        std::vector<Alternative> out;
        for (const Expr& item : e.items) {
          std::vector<Alternative> alts = alternatives(item, owner);
          for (Alternative& a : alts) out.push_back(std::move(a));
        }
        return out;
      }
      case Expr::Kind::kSequence: {
        Alternative seq;
        for (const Expr& item : e.items) {
          Alternative run;
          if (!as_run(item, owner, run)) return {};
          seq.insert(seq.end(), run.begin(), run.end());
        }
        return {seq};
      }
      case Expr::Kind::kRepeat:
        return repetition(e, owner);
    }
    return {};
  }
  // item{min,max}: min copies, then a right-recursive helper (unbounded) or a chain of
  // (max - min) nested optional helpers.
  std::vector<Alternative> repetition(const Expr& e, int owner) {
    if (e.max >= 0 && e.max < e.min) fail("grammar: a repetition {" + std::to_string(e.min) + "," + std::to_string(e.max) + "}");
    Alternative item;
    if (!as_run(e.items[0], owner, item)) return e.min == 0 ? std::vector<Alternative>{{}} : std::vector<Alternative>{};
    Alternative seq;
    for (int i = 0; i < e.min; ++i) seq.insert(seq.end(), item.begin(), item.end());
    if (e.max < 0) {
      const int h = helper(owner);
      Alternative again = item;
      again.push_back({Element::Kind::kRule, h});
      alts_[static_cast<size_t>(h)] = {again, {}};
      seq.push_back({Element::Kind::kRule, h});
    } else if (e.max > e.min) {
      int inner = -1;
      for (int k = 0; k < e.max - e.min; ++k) {
        const int h = helper(owner);
        Alternative more = item;
        if (inner >= 0) more.push_back({Element::Kind::kRule, inner});
        alts_[static_cast<size_t>(h)] = {more, {}};
        inner = h;
      }
      seq.push_back({Element::Kind::kRule, inner});
    }
    return {seq};
  }

  std::vector<std::string> names_;
  std::vector<std::vector<Alternative>> alts_;
  std::vector<ByteSet> sets_;
  std::unordered_map<ByteSet, int32_t> set_ids_;
};

// Refuses left recursion: the recogniser expands calls until it reaches a byte, so a rule that
// can call itself before any byte would expand forever.
void check_left_recursion(const Grammar& g, const std::string& what) {
  const size_t n = g.alternatives.size();
  std::vector<bool> nullable(n, false);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < n; ++r) {
      if (nullable[r]) continue;
      for (const int32_t start : g.alternatives[r]) {
        bool all = true;
        for (int32_t at = start; g.elements[static_cast<size_t>(at)].kind != Element::Kind::kEnd; ++at) {
          const Element& el = g.elements[static_cast<size_t>(at)];
          if (el.kind == Element::Kind::kBytes || !nullable[static_cast<size_t>(el.value)]) {
            all = false;
            break;
          }
        }
        if (all) {
          nullable[r] = changed = true;
          break;
        }
      }
    }
  }
  std::vector<std::vector<int32_t>> left_calls(n);
  for (size_t r = 0; r < n; ++r)
    for (const int32_t start : g.alternatives[r])
      for (int32_t at = start; g.elements[static_cast<size_t>(at)].kind == Element::Kind::kRule; ++at) {
        const int32_t callee = g.elements[static_cast<size_t>(at)].value;
        left_calls[r].push_back(callee);
        if (!nullable[static_cast<size_t>(callee)]) break;
      }
  std::vector<uint8_t> color(n, 0);  // 0 new, 1 on the path, 2 done
  std::function<void(size_t)> visit = [&](size_t r) {
    color[r] = 1;
    for (const int32_t c : left_calls[r]) {
      if (color[static_cast<size_t>(c)] == 1)
        fail(what + ": rule '" + g.names[static_cast<size_t>(c)] +
             "' is left-recursive (it can reach itself before matching a byte, perhaps by repeating something "
             "that can be empty); write it with repetition instead");
      if (color[static_cast<size_t>(c)] == 0) visit(static_cast<size_t>(c));
    }
    color[r] = 2;
  };
  for (size_t r = 0; r < n; ++r)
    if (color[r] == 0) visit(r);
}

}  // namespace

std::shared_ptr<const Grammar> GrammarBuilder::build(const std::string& root, const std::string& what) const {
  int root_id = -1;
  for (size_t i = 0; i < names_.size(); ++i) {
    if (names_[i] == root) root_id = static_cast<int>(i);
    if (!defined_[i]) fail(what + ": rule '" + names_[i] + "' is used but not defined");
  }
  if (root_id < 0) fail(what + ": there is no '" + root + "' rule to start from");
  Lowering lowering(names_);
  for (size_t i = 0; i < names_.size(); ++i) lowering.lower_rule(static_cast<int>(i), exprs_[i]);
  auto g = std::make_shared<Grammar>(lowering.finish(root_id));
  check_left_recursion(*g, what);
  return g;
}

}  // namespace glms::structured
