// Random JSON schemas of the subset json_schema.h takes, every output of which is bounded in
// length (strings, arrays and nesting are bounded): the structured tests' and the e2e tests' inputs.
#pragma once

#include <nlohmann/json.hpp>
#include <random>
#include <string>

namespace glms::testing {

class SchemaGenerator {
 public:
  explicit SchemaGenerator(uint32_t seed) : rng_(seed) {}
  nlohmann::ordered_json schema(int depth) {
    const int kind = static_cast<int>(rng_() % (depth > 2 ? 6 : 9));
    switch (kind) {
      case 0: return string_schema();
      case 1: {
        nlohmann::ordered_json s{{"type", "integer"}};
        if (rng_() % 2) s["minimum"] = static_cast<int>(rng_() % 200) - 100;
        if (rng_() % 2) s["maximum"] = s.value("minimum", -100) + static_cast<int>(rng_() % 300);
        return s;
      }
      case 2: {
        nlohmann::ordered_json s{{"type", "number"}};
        const int bounds = static_cast<int>(rng_() % 4);
        if (bounds == 1) s["minimum"] = 0;
        if (bounds == 2) {
          s["minimum"] = (static_cast<int>(rng_() % 400) - 200) / 8.0;
          s["maximum"] = s["minimum"].get<double>() + static_cast<int>(rng_() % 100) / 4.0;
        }
        if (bounds == 3) {
          s["exclusiveMinimum"] = -static_cast<int>(rng_() % 50) / 10.0;
          s["exclusiveMaximum"] = static_cast<int>(rng_() % 50 + 1) / 100.0;
        }
        return s;
      }
      case 3: return nlohmann::ordered_json{{"type", "boolean"}};
      case 4: return nlohmann::ordered_json{{"enum", {"red", 7, nullptr, nlohmann::ordered_json{{"a", 1}}}}};
      case 5: return nlohmann::ordered_json{{"type", {"string", "null"}}, {"maxLength", 4}};
      case 6: return object_schema(depth);
      case 7: {
        nlohmann::ordered_json s{{"type", "array"}, {"items", schema(depth + 1)}};
        const int min = static_cast<int>(rng_() % 3);
        s["minItems"] = min;
        s["maxItems"] = min + static_cast<int>(rng_() % 3);
        return s;
      }
      default:
        return nlohmann::ordered_json{{"anyOf", {schema(depth + 1), schema(depth + 1)}}, {"description", "either"}};
    }
  }
  nlohmann::ordered_json string_schema() {
    switch (rng_() % 4) {
      case 0: return {{"type", "string"}, {"maxLength", rng_() % 9}};
      case 1: return {{"type", "string"}, {"format", rng_() % 2 ? "date" : "uuid"}};
      case 2: return {{"type", "string"}, {"pattern", "^[a-z]{2,5}(-[0-9])?$"}};
      default: return {{"type", "string"}, {"minLength", 1}, {"maxLength", 3}};
    }
  }
  nlohmann::ordered_json object_schema(int depth) {
    nlohmann::ordered_json s{{"type", "object"}, {"properties", nlohmann::ordered_json::object()}, {"required", nlohmann::ordered_json::array()}};
    const int n = 1 + static_cast<int>(rng_() % 4);
    for (int i = 0; i < n; ++i) {
      const std::string key = std::string(1, static_cast<char>('z' - i)) + std::to_string(rng_() % 10);
      if (s["properties"].contains(key)) continue;
      s["properties"][key] = schema(depth + 1);
      if (rng_() % 2) s["required"].push_back(key);
    }
    if (rng_() % 2) s["additionalProperties"] = false;
    return s;
  }

 private:
  std::mt19937 rng_;
};

}  // namespace glms::testing
