// Structured outputs, the JSON forms: response_format json_schema (OpenAI), structured_outputs.json
// and guided_json (vLLM) take a JSON schema; json_object takes any object. The schema is
// compiled to a grammar (grammar.h) whose every complete output is JSON valid against it.
//
// Supported (the subset OpenAI's strict mode and vLLM's guided decoding accept, and more):
// type (one or a list), enum, const, anyOf / oneOf (oneOf's exclusivity is not enforced), allOf
// of one schema, $ref to any local JSON pointer ($defs, definitions, "#": recursion works),
// objects (properties in declared order, required, additionalProperties false, true or a schema
// for objects without properties), arrays (items, prefixItems, minItems, maxItems), strings
// (minLength, maxLength in characters, pattern as a whole-string match, format date, time,
// date-time, uuid, email, ipv4), integers (minimum, maximum, exclusive bounds), numbers
// (minimum 0 only), boolean, null. Annotations (title, description, default, examples,
// $schema, $id, $comment, unknown formats) are ignored. Any other keyword is refused with an
// error naming it and where it is: nothing is silently dropped.
//
// Choices glmserve makes where JSON allows freedom: optional properties may be left out but keep
// the declared order; an object with properties gets no others; whitespace between tokens runs
// to at most 16 characters; integers have at most 16 digits, fractions 16, exponents 2 (so that
// every number fits a double).
#pragma once

#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "engine/request.h"
#include "structured/grammar.h"
#include "structured/vocabulary.h"

namespace glms::structured {

// Compiles schemas into rules of one builder. `document` is the schema $refs resolve against.
class SchemaCompiler {
 public:
  // `prefix` starts the names of the rules it makes, for several compilers on one builder.
  SchemaCompiler(GrammarBuilder& builder, const nlohmann::ordered_json& document, std::string prefix = "");
  ~SchemaCompiler();

  // JSON text valid against `schema`; `path` (a JSON pointer such as "#/properties/a") names
  // where it is in messages. Throws glms::Error for what is not supported.
  Expr value(const nlohmann::ordered_json& schema, const std::string& path);
  // The characters of a string valid against `schema` written raw, not as JSON (GLM's string
  // arguments).
  Expr raw_string(const nlohmann::ordered_json& schema, const std::string& path);
  Expr whitespace();
  // Members in declared order, the required ones always present: [member sep member ...].
  Expr members(const std::vector<std::pair<Expr, bool>>& members, const Expr& separator, const std::string& name);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

std::shared_ptr<const Grammar> json_schema_grammar(const nlohmann::ordered_json& schema);
std::shared_ptr<engine::TokenConstraint> make_json_schema_constraint(const nlohmann::ordered_json& schema, TokenTexts texts);
// Any JSON object (response_format json_object).
std::shared_ptr<engine::TokenConstraint> make_json_object_constraint(TokenTexts texts);

}  // namespace glms::structured
