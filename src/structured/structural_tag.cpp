#include "structured/structural_tag.h"

#include <array>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "structured/json_schema.h"
#include "structured/vocabulary.h"

namespace glms::structured {

namespace {

using ordered_json = nlohmann::ordered_json;

// Bounds on what a request may ask: the automaton has a state per trigger byte (256 next states
// each), the grammar a rule per state and the structures' schemas.
constexpr size_t kMaxTriggers = 64, kMaxTriggerBytes = 1024, kMaxStructures = 64;

// `text` with each markup tag (vocabulary.h) replaced by its reserved byte, as the constraint
// sees the tokens.
std::string with_markup_bytes(std::string text) {
  for (const std::string_view tag : kMarkupTokens)
    for (size_t at = text.find(tag); at != std::string::npos; at = text.find(tag, at + 1))
      text.replace(at, tag.size(), 1, markup_byte(tag));
  return text;
}

std::string string_field(const ordered_json& object, const char* key, const std::string& where) {
  if (!object.contains(key) || !object[key].is_string())
    fail("structural_tag: " + where + "." + key + " must be a string");
  return object[key].get<std::string>();
}

struct Structure {
  std::string begin, end;  // reserved bytes for markup
  const ordered_json* schema = nullptr;
  std::string path;        // where it is, for messages
};

struct Spec {
  std::vector<std::string> triggers;  // reserved bytes for markup
  std::vector<Structure> structures;
};

Spec read_spec(const ordered_json& spec) {
  if (!spec.is_object()) fail("structural_tag: expected an object with structures and triggers");
  if (spec.contains("format"))
    fail("structural_tag: the format form is not supported; give structures and triggers");
  if (!spec.contains("triggers") || !spec["triggers"].is_array() || spec["triggers"].empty())
    fail("structural_tag: triggers must be a non-empty array of strings");
  if (!spec.contains("structures") || !spec["structures"].is_array() || spec["structures"].empty())
    fail("structural_tag: structures must be a non-empty array of {begin, schema, end}");
  if (spec["triggers"].size() > kMaxTriggers || spec["structures"].size() > kMaxStructures)
    fail("structural_tag: at most " + std::to_string(kMaxTriggers) + " triggers and " + std::to_string(kMaxStructures) +
         " structures");
  Spec out;
  size_t trigger_bytes = 0;
  for (const ordered_json& t : spec["triggers"]) {
    if (!t.is_string() || t.get<std::string>().empty()) fail("structural_tag: each trigger must be a non-empty string");
    out.triggers.push_back(with_markup_bytes(t.get<std::string>()));
    trigger_bytes += out.triggers.back().size();
  }
  if (trigger_bytes > kMaxTriggerBytes)
    fail("structural_tag: the triggers hold " + std::to_string(trigger_bytes) + " bytes together, more than " +
         std::to_string(kMaxTriggerBytes));
  for (size_t i = 0; i < spec["structures"].size(); ++i) {
    const ordered_json& s = spec["structures"][i];
    const std::string where = "structures[" + std::to_string(i) + "]";
    if (!s.is_object()) fail("structural_tag: " + where + " must be an object with begin, schema and end");
    Structure structure{with_markup_bytes(string_field(s, "begin", where)),
                        with_markup_bytes(string_field(s, "end", where)), nullptr, where};
    // A structure without a schema (vLLM's default, None) takes any JSON value.
    static const ordered_json kAnyValue = ordered_json::object();
    structure.schema = s.contains("schema") && !s["schema"].is_null() ? &s["schema"] : &kAnyValue;
    out.structures.push_back(std::move(structure));
  }
  return out;
}

// The trigger each structure's begin starts with; refuses triggers inside one another, triggers
// no begin starts with and begins no trigger starts.
std::vector<size_t> triggers_of_structures(const Spec& spec, const ordered_json& raw) {
  const ordered_json& triggers = raw["triggers"];
  for (size_t a = 0; a < spec.triggers.size(); ++a)
    for (size_t b = 0; b < spec.triggers.size(); ++b)
      if (a != b && spec.triggers[a].find(spec.triggers[b]) != std::string::npos)
        fail("structural_tag: trigger '" + triggers[b].get<std::string>() + "' is inside trigger '" +
             triggers[a].get<std::string>() + "': the free text could not tell which one began");
  std::vector<size_t> trigger_of(spec.structures.size());
  std::vector<bool> used(spec.triggers.size(), false);
  for (size_t s = 0; s < spec.structures.size(); ++s) {
    bool found = false;
    for (size_t t = 0; t < spec.triggers.size() && !found; ++t)
      if (spec.structures[s].begin.rfind(spec.triggers[t], 0) == 0) trigger_of[s] = t, used[t] = found = true;
    if (!found)
      fail("structural_tag: " + spec.structures[s].path + ".begin starts with none of the triggers");
  }
  for (size_t t = 0; t < spec.triggers.size(); ++t)
    if (!used[t]) fail("structural_tag: no structure's begin starts with trigger '" + triggers[t].get<std::string>() + "'");
  return trigger_of;
}

// The triggers' prefixes as the states of the free text: Aho-Corasick's goto function over
// bytes, built breadth first from each state's failure state (the longest proper suffix of its
// prefix that is a prefix too). State 0 is the empty prefix; `full[q]` is the trigger state q
// completes, or -1.
struct TriggerAutomaton {
  std::vector<int> full;
  std::vector<std::array<int, 256>> next;
  size_t size() const { return full.size(); }
};

TriggerAutomaton trigger_automaton(const std::vector<std::string>& triggers) {
  TriggerAutomaton a;
  std::vector<std::array<int, 256>> child;  // the trie: -1 where no prefix continues
  auto add_state = [&] {
    child.emplace_back();
    child.back().fill(-1);
    a.full.push_back(-1);
    return static_cast<int>(a.full.size()) - 1;
  };
  add_state();
  for (size_t t = 0; t < triggers.size(); ++t) {
    int q = 0;
    for (const unsigned char c : triggers[t]) {
      if (child[static_cast<size_t>(q)][c] < 0) {
        const int fresh = add_state();
        child[static_cast<size_t>(q)][c] = fresh;
      }
      q = child[static_cast<size_t>(q)][c];
    }
    a.full[static_cast<size_t>(q)] = static_cast<int>(t);
  }
  a.next.assign(a.size(), {});
  std::vector<int> fail(a.size(), 0), order = {0};
  for (size_t i = 0; i < order.size(); ++i) {
    const size_t q = static_cast<size_t>(order[i]);
    for (int b = 0; b < 256; ++b) {
      const int c = child[q][static_cast<size_t>(b)];
      const int via_fail = q == 0 ? 0 : a.next[static_cast<size_t>(fail[q])][static_cast<size_t>(b)];
      if (c < 0) {
        a.next[q][static_cast<size_t>(b)] = via_fail;
        continue;
      }
      a.next[q][static_cast<size_t>(b)] = c;
      fail[static_cast<size_t>(c)] = via_fail;
      order.push_back(c);
    }
  }
  return a;
}

}  // namespace

std::shared_ptr<const Grammar> structural_tag_grammar(const ordered_json& raw, bool opens_reasoning) {
  const Spec spec = read_spec(raw);
  const std::vector<size_t> trigger_of = triggers_of_structures(spec, raw);
  const TriggerAutomaton automaton = trigger_automaton(spec.triggers);

  GrammarBuilder builder;
  auto free_rule = [](size_t q) { return "free_" + std::to_string(q); };
  auto trigger_rule = [](size_t t) { return "trigger_" + std::to_string(t); };
  // Free text may hold any text byte, and the markup bytes the triggers hold.
  ByteSet allowed = text_bytes();
  for (const std::string& t : spec.triggers)
    for (const unsigned char c : t) allowed.set(c);
  for (size_t q = 0; q < automaton.size(); ++q) {
    if (automaton.full[q] >= 0) continue;
    std::map<int, ByteSet> by_target;
    for (int b = 0; b < 256; ++b)
      if (allowed.test(static_cast<size_t>(b))) by_target[automaton.next[q][static_cast<size_t>(b)]].set(static_cast<size_t>(b));
    std::vector<Expr> alternatives = {Expr{}};  // the output may end in free text
    for (const auto& [target, set] : by_target) {
      const int trigger = automaton.full[static_cast<size_t>(target)];
      alternatives.push_back(sequence({bytes(set), builder.ref(trigger >= 0 ? trigger_rule(static_cast<size_t>(trigger))
                                                                             : free_rule(static_cast<size_t>(target)))}));
    }
    builder.define(free_rule(q), choice(std::move(alternatives)));
  }
  for (size_t t = 0; t < spec.triggers.size(); ++t) {
    std::vector<Expr> structures;
    for (size_t s = 0; s < spec.structures.size(); ++s) {
      if (trigger_of[s] != t) continue;
      const Structure& st = spec.structures[s];
      SchemaCompiler compiler(builder, *st.schema, "s" + std::to_string(s) + "_");
      // Whitespace may surround the JSON (a newline after the begin, as models write it).
      structures.push_back(sequence({literal(st.begin.substr(spec.triggers[t].size())), compiler.whitespace(),
                                     compiler.value(*st.schema, "structural_tag." + st.path + ".schema"),
                                     compiler.whitespace(), literal(st.end)}));
    }
    builder.define(trigger_rule(t), sequence({choice(std::move(structures)), builder.ref(free_rule(0))}));
  }
  if (!opens_reasoning) return builder.build(free_rule(0), "structural_tag");
  ByteSet reasoning = text_bytes();
  reasoning.reset(0);
  builder.define("root", sequence({repeat(bytes(reasoning), 0, -1), literal(std::string(1, markup_byte("</think>"))),
                                   builder.ref(free_rule(0))}));
  return builder.build("root", "structural_tag");
}

}  // namespace glms::structured
