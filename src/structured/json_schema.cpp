#include "structured/json_schema.h"

#include <cmath>
#include <functional>
#include <optional>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "structured/number_range.h"
#include "structured/recognizer.h"
#include "structured/regex.h"

namespace glms::structured {

namespace {

using ordered_json = nlohmann::ordered_json;

constexpr int kMaxWhitespace = 16;
constexpr int kMaxRepeat = 4096;                         // bounds on lengths and item counts

ByteSet byte_range(int lo, int hi) {
  ByteSet s;
  for (int c = lo; c <= hi; ++c) s.set(static_cast<size_t>(c));
  return s;
}
ByteSet byte_list(std::string_view chars) {
  ByteSet s;
  for (const unsigned char c : chars) s.set(c);
  return s;
}
Expr digits(int min, int max) { return repeat(bytes(byte_range('0', '9')), min, max); }

// The JSON pointer `ref` ("#", "#/$defs/a", "#/properties/x~1y") inside `document`.
const ordered_json& resolve(const ordered_json& document, const std::string& ref, const std::string& path) {
  if (ref.empty() || ref[0] != '#') fail(path + ": $ref '" + ref + "' is not local (only '#...' references are supported)");
  const ordered_json* at = &document;
  size_t pos = 1;
  while (pos < ref.size()) {
    if (ref[pos] != '/') fail(path + ": $ref '" + ref + "' is not a JSON pointer");
    const size_t end = std::min(ref.find('/', pos + 1), ref.size());
    std::string key = ref.substr(pos + 1, end - pos - 1);
    for (size_t i = 0; (i = key.find('~', i)) != std::string::npos; ++i)
      key.replace(i, 2, i + 1 < key.size() && key[i + 1] == '1' ? "/" : "~");
    if (at->is_object() && at->contains(key)) at = &(*at)[key];
    else if (at->is_array() && !key.empty() && key.find_first_not_of("0123456789") == std::string::npos &&
             std::stoul(key) < at->size())
      at = &(*at)[std::stoul(key)];
    else fail(path + ": $ref '" + ref + "' points at nothing in the schema");
    pos = end;
  }
  return *at;
}

// The characters of a pattern's string must not need JSON escapes: quotes, backslashes and
// control bytes are taken out of every byte set.
void drop_json_specials(Expr& e) {
  if (e.kind == Expr::Kind::kBytes) e.bytes &= ~(byte_range(0, 0x1f) | byte_list("\"\\"));
  for (Expr& item : e.items) drop_json_specials(item);
}

const std::set<std::string>& annotations() {
  static const std::set<std::string> keys = {"title", "description", "default", "examples", "$schema", "$id",
                                             "$comment", "deprecated", "readOnly", "writeOnly", "$defs", "definitions"};
  return keys;
}
const std::set<std::string>& supported_keywords() {
  static const std::set<std::string> keys = {
      "type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "properties", "required", "additionalProperties",
      "items", "prefixItems", "minItems", "maxItems", "minLength", "maxLength", "pattern", "format", "minimum",
      "maximum", "exclusiveMinimum", "exclusiveMaximum", "uniqueItems"};
  return keys;
}

int bound(const ordered_json& schema, const char* key, int fallback, const std::string& path) {
  if (!schema.contains(key)) return fallback;
  const ordered_json& v = schema[key];
  if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > kMaxRepeat)
    fail(path + ": " + key + " must be an integer from 0 to " + std::to_string(kMaxRepeat));
  return v.get<int>();
}

}  // namespace

struct SchemaCompiler::Impl {
  GrammarBuilder& b;
  const ordered_json& document;
  std::string prefix;  // keeps the rule names of compilers sharing one builder apart
  int counter = 0;
  int depth = 0;  // subschemas open in value()
  std::set<std::string> started_refs;

  std::string fresh(const std::string& what) { return prefix + what + "-" + std::to_string(counter++); }
  Expr named(const std::string& name, const std::function<Expr()>& make) {
    if (!b.defined(name)) b.define(name, make());
    return b.ref(name);
  }

  Expr utf8_multibyte() {
    const Expr cont = bytes(byte_range(0x80, 0xbf));
    return choice({sequence({bytes(byte_range(0xc2, 0xdf)), cont}),
                   sequence({bytes(byte_range(0xe0, 0xef)), repeat(cont, 2, 2)}),
                   sequence({bytes(byte_range(0xf0, 0xf4)), repeat(cont, 3, 3)})});
  }
  // One character of a JSON string: printable ASCII but '"' and '\', an escape, or a UTF-8 one.
  Expr json_char() {
    return named("json-char", [&] {
      ByteSet plain = byte_range(0x20, 0x7e);
      plain.reset('"');
      plain.reset('\\');
      const Expr escape = sequence(
          {literal("\\"), choice({bytes(byte_list("\"\\/bfnrt")),
                                  sequence({literal("u"), repeat(bytes(byte_list("0123456789abcdefABCDEF")), 4, 4)})})});
      return choice({bytes(plain), escape, utf8_multibyte()});
    });
  }
  // One character of raw text (GLM string arguments): any ASCII but NUL, or a UTF-8 one.
  Expr raw_char() { return named("raw-char", [&] { return choice({bytes(byte_range(1, 0x7f)), utf8_multibyte()}); }); }
  Expr ws() { return named("ws", [&] { return repeat(bytes(byte_list(" \t\n\r")), 0, kMaxWhitespace); }); }

  Expr json_string() { return named("json-string", [&] { return sequence({literal("\""), repeat(json_char(), 0, -1), literal("\"")}); }); }
  Expr json_number() {
    const Expr integer = choice({literal("0"), sequence({bytes(byte_range('1', '9')), digits(0, kMaxIntegerDigits - 1)})});
    std::vector<Expr> parts;
    parts.push_back(optional(literal("-")));
    parts.push_back(integer);
    parts.push_back(optional(sequence({literal("."), digits(1, 16)})));
    parts.push_back(optional(sequence({bytes(byte_list("eE")), optional(bytes(byte_list("+-"))), digits(1, 2)})));
    return sequence(std::move(parts));
  }
  Expr any_value() {
    return named("json-value", [&] {
      const Expr member = sequence({json_string(), ws(), literal(":"), ws(), b.ref("json-value"), ws()});
      const Expr object = sequence({literal("{"), ws(), optional(sequence({member, repeat(sequence({literal(","), ws(), member}), 0, -1)})), literal("}")});
      const Expr item = sequence({b.ref("json-value"), ws()});
      const Expr array = sequence({literal("["), ws(), optional(sequence({item, repeat(sequence({literal(","), ws(), item}), 0, -1)})), literal("]")});
      return choice({object, array, json_string(), json_number(), literal("true"), literal("false"), literal("null")});
    });
  }

  // A bound of an integer or number schema: the tighter of `inclusive` and `exclusive` (JSON
  // schema's minimum / exclusiveMinimum, or maximum / exclusiveMaximum; an exclusive one given as
  // true, draft 4's form, excludes the inclusive one's value). `upper`: which is tighter.
  std::optional<std::pair<double, bool>> bound_of(const ordered_json& s, const char* inclusive, const char* exclusive,
                                                   bool upper, const std::string& path) {
    std::optional<std::pair<double, bool>> b;
    if (s.contains(inclusive)) {
      if (!s[inclusive].is_number()) fail(path + ": " + inclusive + " must be a number");
      b = std::make_pair(s[inclusive].get<double>(), false);
    }
    if (!s.contains(exclusive)) return b;
    const ordered_json& e = s[exclusive];
    if (e.is_boolean()) {
      if (!b && e.get<bool>()) fail(path + ": " + exclusive + " true needs " + inclusive);
      if (b) b->second = e.get<bool>();
      return b;
    }
    if (!e.is_number()) fail(path + ": " + exclusive + " must be a number");
    const double v = e.get<double>();
    if (!b || (upper ? v <= b->first : v >= b->first)) b = std::make_pair(v, true);
    return b;
  }
  // The integers within an integer or number schema's bounds; nothing where none is.
  std::optional<Expr> integers_within(const ordered_json& s, const std::string& path) {
    int64_t lo = -kLargestInteger, hi = kLargestInteger;
    if (const auto b = bound_of(s, "minimum", "exclusiveMinimum", false, path))
      lo = static_cast<int64_t>(std::max<double>(static_cast<double>(lo), b->second ? std::floor(b->first) + 1 : std::ceil(b->first)));
    if (const auto b = bound_of(s, "maximum", "exclusiveMaximum", true, path))
      hi = static_cast<int64_t>(std::min<double>(static_cast<double>(hi), b->second ? std::ceil(b->first) - 1 : std::floor(b->first)));
    if (lo > hi) return std::nullopt;
    return integer_range(lo, hi);
  }
  Expr integer(const ordered_json& s, const std::string& path) {
    auto e = integers_within(s, path);
    if (!e) fail(path + ": no integer lies within minimum/maximum");
    return std::move(*e);
  }
  // Unbounded numbers may take an exponent; bounded ones are written in full (number_range.h).
  Expr number(const ordered_json& s, const std::string& path) {
    const auto lo = bound_of(s, "minimum", "exclusiveMinimum", false, path);
    const auto hi = bound_of(s, "maximum", "exclusiveMaximum", true, path);
    if (!lo && !hi) return json_number();
    std::vector<Expr> options;
    auto decimal = [](const std::optional<std::pair<double, bool>>& b) -> std::optional<DecimalBound> {
      if (!b) return std::nullopt;
      return decimal_bound(b->first, b->second);
    };
    if (auto e = decimal_range(decimal(lo), decimal(hi), path)) options.push_back(std::move(*e));
    if (auto e = integers_within(s, path)) options.push_back(std::move(*e));
    if (options.empty()) fail(path + ": no number lies within minimum/maximum");
    return choice(std::move(options));
  }

  // The strings of a known format; nothing for other formats (annotations).
  std::optional<Expr> format(const std::string& f) {
    const auto d = [](int n) { return digits(n, n); };
    const Expr date = sequence({d(4), literal("-"), choice({sequence({literal("0"), bytes(byte_range('1', '9'))}), sequence({literal("1"), bytes(byte_list("012"))})}),
                                literal("-"), choice({sequence({literal("0"), bytes(byte_range('1', '9'))}), sequence({bytes(byte_list("12")), d(1)}), sequence({literal("3"), bytes(byte_list("01"))})})});
    const Expr time = sequence({choice({sequence({bytes(byte_list("01")), d(1)}), sequence({literal("2"), bytes(byte_range('0', '3'))})}), literal(":"),
                                bytes(byte_range('0', '5')), d(1), literal(":"), bytes(byte_range('0', '5')), d(1),
                                optional(sequence({literal("."), digits(1, 6)})),
                                choice({literal("Z"), sequence({bytes(byte_list("+-")), d(2), literal(":"), d(2)})})});
    const Expr hex = bytes(byte_list("0123456789abcdef"));
    if (f == "date") return date;
    if (f == "time") return time;
    if (f == "date-time") return sequence({date, literal("T"), time});
    if (f == "uuid")
      return sequence({repeat(hex, 8, 8), literal("-"), repeat(hex, 4, 4), literal("-"), repeat(hex, 4, 4), literal("-"),
                       repeat(hex, 4, 4), literal("-"), repeat(hex, 12, 12)});
    if (f == "email") {
      const Expr local = repeat(bytes(byte_range('a', 'z') | byte_range('A', 'Z') | byte_range('0', '9') | byte_list("._%+-")), 1, 64);
      const Expr label = repeat(bytes(byte_range('a', 'z') | byte_range('A', 'Z') | byte_range('0', '9') | byte_list("-")), 1, 63);
      return sequence({local, literal("@"), label, repeat(sequence({literal("."), label}), 1, 4)});
    }
    if (f == "ipv4") {
      const Expr octet = natural_range(0, 255);
      return sequence({octet, literal("."), octet, literal("."), octet, literal("."), octet});
    }
    return std::nullopt;
  }

  // The characters of a string (between the quotes, or raw).
  Expr string_body(const ordered_json& s, const std::string& path, bool raw) {
    if (s.contains("format")) {
      if (!s["format"].is_string()) fail(path + ": format must be a string");
      if (std::optional<Expr> f = format(s["format"].get<std::string>())) return *f;
    }
    if (s.contains("pattern")) {
      if (!s["pattern"].is_string()) fail(path + ": pattern must be a string");
      Expr e;
      try {
        e = regex_expr(s["pattern"].get<std::string>());
      } catch (const Error& err) {
        fail(path + "/pattern: " + err.what());
      }
      if (!raw) drop_json_specials(e);
      return e;
    }
    const int min = bound(s, "minLength", 0, path), max = bound(s, "maxLength", -1, path);
    if (max >= 0 && max < min) fail(path + ": maxLength is below minLength");
    return repeat(raw ? raw_char() : json_char(), min, max);
  }

  Expr object(const ordered_json& s, const std::string& path) {
    const ordered_json none = ordered_json::object();
    const ordered_json& props = s.contains("properties") ? s["properties"] : none;
    if (!props.is_object()) fail(path + ": properties must be an object");
    std::set<std::string> required;
    if (s.contains("required")) {
      if (!s["required"].is_array()) fail(path + ": required must be an array of names");
      for (const auto& r : s["required"]) {
        if (!r.is_string()) fail(path + ": required must be an array of names");
        if (!props.contains(r.get<std::string>()))
          fail(path + ": required property '" + r.get<std::string>() + "' is not among the properties");
        required.insert(r.get<std::string>());
      }
    }
    const bool closed = s.contains("additionalProperties") && s["additionalProperties"] == false;
    if (props.empty()) {
      if (closed) return sequence({literal("{"), ws(), literal("}")});
      const Expr v = s.contains("additionalProperties") ? value(s["additionalProperties"], path + "/additionalProperties") : any_value();
      const Expr member = sequence({json_string(), ws(), literal(":"), ws(), v, ws()});
      return sequence({literal("{"), ws(), optional(sequence({member, repeat(sequence({literal(","), ws(), member}), 0, -1)})), literal("}")});
    }
    std::vector<std::pair<Expr, bool>> list;
    for (const auto& [key, sub] : props.items())
      list.push_back({sequence({literal(ordered_json(key).dump()), ws(), literal(":"), ws(),
                                value(sub, path + "/properties/" + key), ws()}),
                      required.count(key) > 0});
    return sequence({literal("{"), ws(), members(list, sequence({literal(","), ws()}), fresh("object")), literal("}")});
  }

  Expr array(const ordered_json& s, const std::string& path) {
    if (s.contains("uniqueItems") && s["uniqueItems"] != false) fail(path + ": uniqueItems is not supported");
    std::vector<Expr> fixed;
    if (s.contains("prefixItems")) {
      if (!s["prefixItems"].is_array()) fail(path + ": prefixItems must be an array of schemas");
      for (size_t i = 0; i < s["prefixItems"].size(); ++i)
        fixed.push_back(value(s["prefixItems"][i], path + "/prefixItems/" + std::to_string(i)));
    }
    const int k = static_cast<int>(fixed.size());
    int min = std::max(0, bound(s, "minItems", 0, path) - k), max = bound(s, "maxItems", -1, path);
    if (max >= 0 && max < k) fail(path + ": maxItems is below the number of prefixItems");
    if (max >= 0) max -= k;
    if (max >= 0 && max < min) fail(path + ": maxItems is below minItems");
    const bool no_more = s.contains("items") && s["items"] == false;
    if (no_more) {
      if (min > 0) fail(path + ": minItems asks for more items than prefixItems allows");
      max = 0;
    }
    const Expr rest = max == 0 ? Expr{} : (s.contains("items") ? value(s["items"], path + "/items") : any_value());
    std::vector<Expr> parts{literal("["), ws()};
    const Expr comma = sequence({literal(","), ws()});
    for (int i = 0; i < k; ++i) parts.push_back(sequence({i ? comma : Expr{}, fixed[static_cast<size_t>(i)], ws()}));
    const Expr more = sequence({comma, rest, ws()});
    if (max != 0) {
      if (k > 0) {
        parts.push_back(repeat(more, min, max));
      } else {
        const Expr first_then_more = sequence({rest, ws(), repeat(more, std::max(0, min - 1), max < 0 ? -1 : max - 1)});
        parts.push_back(min > 0 ? first_then_more : optional(first_then_more));
      }
    }
    parts.push_back(literal("]"));
    return sequence(std::move(parts));
  }

  void check_keywords(const ordered_json& s, const std::string& path) {
    for (const auto& [key, v] : s.items())
      if (!supported_keywords().count(key) && !annotations().count(key))
        fail(path + ": the JSON schema keyword '" + key + "' is not supported by glmserve's structured outputs");
  }

  Expr typed(const ordered_json& s, const std::string& type, const std::string& path) {
    if (type == "object") return object(s, path);
    if (type == "array") return array(s, path);
    if (type == "string") return sequence({literal("\""), string_body(s, path, false), literal("\"")});
    if (type == "integer") return integer(s, path);
    if (type == "number") return number(s, path);
    if (type == "boolean") return choice({literal("true"), literal("false")});
    if (type == "null") return literal("null");
    fail(path + ": unknown type '" + type + "'");
  }

  // A subschema's grammar as a rule of its own, referred to by name: the forms around it use
  // their items more than once (an array's first and later items, an object's members in each
  // of its optional arrangements), and copies of copies would grow exponentially with nesting.
  Expr value(const ordered_json& s, const std::string& path) {
    struct Nesting {
      int& depth;
      explicit Nesting(int& d) : depth(++d) {}
      ~Nesting() { --depth; }
    } nesting(depth);
    if (depth > kMaxGrammarNesting)
      fail(path.substr(0, 200) + "...: subschemas nest deeper than " + std::to_string(kMaxGrammarNesting) + " levels");
    const std::string name = fresh("schema");
    b.define(name, inline_value(s, path));
    return b.ref(name);
  }

  Expr inline_value(const ordered_json& s, const std::string& path) {
    if (s.is_boolean()) {
      if (!s.get<bool>()) fail(path + ": the schema false matches nothing");
      return any_value();
    }
    if (!s.is_object()) fail(path + ": a schema must be an object or a boolean");
    check_keywords(s, path);
    auto only_with_annotations = [&](const char* key) {
      for (const auto& [k, v] : s.items())
        if (k != key && !annotations().count(k))
          fail(path + ": '" + k + "' beside '" + key + "' is not supported (put it inside)");
    };
    if (s.contains("$ref")) {
      only_with_annotations("$ref");
      if (!s["$ref"].is_string()) fail(path + ": $ref must be a string");
      const std::string ref = s["$ref"].get<std::string>();
      const std::string name = prefix + "ref:" + ref;
      // A recursive use, met while the target is being compiled, refers to the rule by name.
      if (!b.defined(name) && started_refs.insert(name).second) b.define(name, value(resolve(document, ref, path), ref));
      return b.ref(name);
    }
    if (s.contains("const")) return literal(s["const"].dump());
    if (s.contains("enum")) {
      if (!s["enum"].is_array() || s["enum"].empty()) fail(path + ": enum must be a non-empty array");
      std::vector<Expr> options;
      for (const auto& v : s["enum"]) options.push_back(literal(v.dump()));
      return choice(std::move(options));
    }
    for (const char* key : {"anyOf", "oneOf", "allOf"}) {
      if (!s.contains(key)) continue;
      only_with_annotations(key);
      const ordered_json& list = s[key];
      if (!list.is_array() || list.empty()) fail(path + ": " + key + " must be a non-empty array of schemas");
      if (std::string(key) == "allOf" && list.size() != 1) fail(path + ": allOf of more than one schema is not supported");
      std::vector<Expr> options;
      for (size_t i = 0; i < list.size(); ++i) options.push_back(value(list[i], path + "/" + key + "/" + std::to_string(i)));
      return choice(std::move(options));
    }
    if (!s.contains("type")) {
      if (s.contains("properties") || s.contains("required") || s.contains("additionalProperties")) return object(s, path);
      if (s.contains("items") || s.contains("prefixItems")) return array(s, path);
      return any_value();
    }
    const ordered_json& type = s["type"];
    if (type.is_string()) return typed(s, type.get<std::string>(), path);
    if (!type.is_array() || type.empty()) fail(path + ": type must be a name or a non-empty array of names");
    std::vector<Expr> options;
    for (const auto& t : type) {
      if (!t.is_string()) fail(path + ": type must be a name or a non-empty array of names");
      options.push_back(typed(s, t.get<std::string>(), path));
    }
    return choice(std::move(options));
  }

  Expr members(const std::vector<std::pair<Expr, bool>>& list, const Expr& sep, const std::string& name) {
    const size_t n = list.size();
    bool all_required = true;
    for (const auto& m : list) all_required = all_required && m.second;
    if (all_required) {
      std::vector<Expr> seq;
      for (size_t i = 0; i < n; ++i) {
        if (i) seq.push_back(sep);
        seq.push_back(list[i].first);
      }
      return sequence(std::move(seq));
    }
    // rest(i): the members from i on, after at least one was written: a separator and the
    // next present member j (no required one skipped), then rest(j + 1); or nothing when no
    // required member is left.
    auto rest_name = [&](size_t i) { return name + "@" + std::to_string(i); };
    auto options_from = [&](size_t i, bool first) {
      std::vector<Expr> options;
      bool required_left = false;
      for (size_t j = i; j < n; ++j) {
        options.push_back(sequence({first ? Expr{} : sep, list[j].first, b.ref(rest_name(j + 1))}));
        if (list[j].second) {
          required_left = true;
          break;
        }
      }
      if (!required_left) options.push_back(Expr{});
      return choice(std::move(options));
    };
    b.define(rest_name(n), Expr{});
    for (size_t i = 0; i < n; ++i) b.define(rest_name(i), options_from(i, false));
    return options_from(0, true);
  }
};

SchemaCompiler::SchemaCompiler(GrammarBuilder& builder, const nlohmann::ordered_json& document, std::string prefix)
    : impl_(std::make_unique<Impl>(Impl{builder, document, std::move(prefix), 0, 0, {}})) {}
SchemaCompiler::~SchemaCompiler() = default;
Expr SchemaCompiler::value(const nlohmann::ordered_json& schema, const std::string& path) { return impl_->value(schema, path); }
Expr SchemaCompiler::raw_string(const nlohmann::ordered_json& schema, const std::string& path) {
  if (schema.is_object() && schema.contains("enum")) {
    std::vector<Expr> options;
    for (const auto& v : schema["enum"]) options.push_back(literal(v.is_string() ? v.get<std::string>() : v.dump()));
    return choice(std::move(options));
  }
  if (!schema.is_object()) return impl_->string_body(ordered_json::object(), path, true);
  return impl_->string_body(schema, path, true);
}
Expr SchemaCompiler::whitespace() { return impl_->ws(); }
Expr SchemaCompiler::members(const std::vector<std::pair<Expr, bool>>& list, const Expr& separator, const std::string& name) {
  return impl_->members(list, separator, impl_->fresh(name));
}

std::shared_ptr<const Grammar> json_schema_grammar(const nlohmann::ordered_json& schema) {
  GrammarBuilder builder;
  SchemaCompiler compiler(builder, schema);
  builder.define("root", sequence({compiler.whitespace(), compiler.value(schema, "#"), compiler.whitespace()}));
  return builder.build("root", "json_schema");
}

std::shared_ptr<engine::TokenConstraint> make_json_schema_constraint(const nlohmann::ordered_json& schema, TokenTexts texts) {
  return make_grammar_constraint(json_schema_grammar(schema), std::move(texts));
}

std::shared_ptr<engine::TokenConstraint> make_json_object_constraint(TokenTexts texts) {
  return make_json_schema_constraint(ordered_json{{"type", "object"}}, std::move(texts));
}

}  // namespace glms::structured
