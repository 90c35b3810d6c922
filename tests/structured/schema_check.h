// An independent check that a JSON value satisfies a schema of the subset json_schema.h takes
// (the structured tests' oracle): written from the JSON Schema rules, not from the grammar.
#pragma once

#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string>

namespace glms::testing {

using ordered_json = nlohmann::ordered_json;

inline size_t code_points(const std::string& s) {
  size_t n = 0;
  for (const unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

inline const ordered_json& resolve_ref(const ordered_json& root, const std::string& ref) {
  const ordered_json* at = &root;
  size_t pos = 1;
  while (pos < ref.size()) {
    const size_t end = std::min(ref.find('/', pos + 1), ref.size());
    at = &(*at)[ref.substr(pos + 1, end - pos - 1)];
    pos = end;
  }
  return *at;
}

// Empty when `v` satisfies `schema`; else what fails, with the path.
inline std::string schema_violation(const ordered_json& v, const ordered_json& schema, const ordered_json& root,
                                    const std::string& path = "$") {
  if (schema.is_boolean()) return schema.get<bool>() ? "" : path + ": false schema";
  if (schema.contains("$ref")) return schema_violation(v, resolve_ref(root, schema["$ref"]), root, path);
  if (schema.contains("const") && v != schema["const"]) return path + ": not the const";
  if (schema.contains("enum")) {
    bool found = false;
    for (const auto& e : schema["enum"]) found = found || e == v;
    if (!found) return path + ": not in the enum";
  }
  for (const char* key : {"anyOf", "oneOf"})
    if (schema.contains(key)) {
      bool any = false;
      for (const auto& s : schema[key]) any = any || schema_violation(v, s, root, path).empty();
      if (!any) return path + ": matches none of " + key;
    }
  if (schema.contains("allOf"))
    for (const auto& s : schema["allOf"])
      if (auto why = schema_violation(v, s, root, path); !why.empty()) return why;
  if (schema.contains("type")) {
    std::set<std::string> types;
    if (schema["type"].is_string()) types.insert(schema["type"].get<std::string>());
    else for (const auto& t : schema["type"]) types.insert(t.get<std::string>());
    const bool ok = (types.count("object") && v.is_object()) || (types.count("array") && v.is_array()) ||
                    (types.count("string") && v.is_string()) || (types.count("integer") && v.is_number_integer()) ||
                    (types.count("number") && v.is_number()) || (types.count("boolean") && v.is_boolean()) ||
                    (types.count("null") && v.is_null());
    if (!ok) return path + ": wrong type " + v.dump();
  }
  if (v.is_object()) {
    const ordered_json props = schema.value("properties", ordered_json::object());
    for (const auto& r : schema.value("required", ordered_json::array()))
      if (!v.contains(r.get<std::string>())) return path + ": missing " + r.get<std::string>();
    for (const auto& [key, value] : v.items()) {
      if (props.contains(key)) {
        if (auto why = schema_violation(value, props[key], root, path + "." + key); !why.empty()) return why;
      } else if (schema.contains("additionalProperties")) {
        if (auto why = schema_violation(value, schema["additionalProperties"], root, path + "." + key); !why.empty())
          return why;
      }
    }
  }
  if (v.is_array()) {
    const size_t prefix = schema.contains("prefixItems") ? schema["prefixItems"].size() : 0;
    for (size_t i = 0; i < v.size(); ++i) {
      const std::string at = path + "[" + std::to_string(i) + "]";
      if (i < prefix) {
        if (auto why = schema_violation(v[i], schema["prefixItems"][i], root, at); !why.empty()) return why;
      } else if (schema.contains("items")) {
        if (auto why = schema_violation(v[i], schema["items"], root, at); !why.empty()) return why;
      }
    }
    if (schema.contains("minItems") && v.size() < schema["minItems"].get<size_t>()) return path + ": too few items";
    if (schema.contains("maxItems") && v.size() > schema["maxItems"].get<size_t>()) return path + ": too many items";
  }
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (schema.contains("minLength") && code_points(s) < schema["minLength"].get<size_t>()) return path + ": too short";
    if (schema.contains("maxLength") && code_points(s) > schema["maxLength"].get<size_t>()) return path + ": too long";
    if (schema.contains("pattern") && !std::regex_search(s, std::regex(schema["pattern"].get<std::string>())))
      return path + ": does not match the pattern";
    const std::string format = schema.value("format", "");
    if (format == "date" && !std::regex_match(s, std::regex("\\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\\d|3[01])")))
      return path + ": not a date";
    if (format == "uuid" && !std::regex_match(s, std::regex("[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}")))
      return path + ": not a uuid";
  }
  if (v.is_number()) {
    const double x = v.get<double>();
    if (schema.contains("minimum") && x < schema["minimum"].get<double>()) return path + ": below minimum";
    if (schema.contains("maximum") && x > schema["maximum"].get<double>()) return path + ": above maximum";
    if (schema.contains("exclusiveMinimum") && x <= schema["exclusiveMinimum"].get<double>()) return path + ": <= exclusiveMinimum";
    if (schema.contains("exclusiveMaximum") && x >= schema["exclusiveMaximum"].get<double>()) return path + ": >= exclusiveMaximum";
  }
  return "";
}

}  // namespace glms::testing
