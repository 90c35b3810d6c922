// Structured outputs, the json_object form (OpenAI's response_format {"type": "json_object"},
// vLLM's structured_outputs.json_object): the output is one JSON object. An incremental JSON
// recogniser over bytes (a stack of open objects and arrays, and where in a value it is) is the
// automaton; a token may come next when its text keeps the output a prefix of a valid object, EOS
// once the object is closed. Nesting is bounded (32) and runs of whitespace outside strings (8),
// so that a model cannot wander forever inside the constraint.
#pragma once

#include <memory>

#include "engine/request.h"
#include "structured/choice.h"

namespace glms::structured {

std::shared_ptr<engine::TokenConstraint> make_json_object_constraint(TokenTexts texts);

}  // namespace glms::structured
