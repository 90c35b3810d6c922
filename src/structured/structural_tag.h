// Structured outputs, vLLM's structural tags (response_format {"type": "structural_tag"} and
// structured_outputs.structural_tag), in their structures-and-triggers form:
//   {"structures": [{"begin": "<function=get_weather>", "schema": {...}, "end": "</function>"}],
//    "triggers": ["<function="]}
// The output is free text until a trigger appears; from there it must go on as the rest of one
// structure's begin, JSON valid against that structure's schema (whitespace around it allowed,
// up to json_schema.h's bound) and its end, and then it is free text again. Ending inside a
// structure is not a complete output.
//
// A structure without a schema takes any JSON value. At most 64 triggers of 1024 bytes together
// and 64 structures.
//
// Lowered to one grammar (grammar.h): the free text is an automaton over the triggers' bytes (a
// state for each trigger prefix, Aho-Corasick's goto function), each trigger's last byte leads to
// its structures. GLM's markup tokens (<tool_call>, <arg_key>, ... in vocabulary.h) written in a
// trigger, begin or end stand for their reserved bytes. Refused with a message naming what is
// wrong: a trigger no begin starts with, a begin no trigger starts, a trigger inside another (the
// free text could not tell which one began), an empty trigger or begin.
#pragma once

#include <memory>
#include <nlohmann/json_fwd.hpp>

#include "structured/grammar.h"

namespace glms::structured {

// `spec`: {"structures": [...], "triggers": [...]} (other keys of a response_format, such as
// "type", are ignored). `opens_reasoning`: the prompt ends in an open <think>, so reasoning text
// and </think> come first, unconstrained (as vLLM constrains only what follows the reasoning).
// Throws glms::Error naming what is wrong.
std::shared_ptr<const Grammar> structural_tag_grammar(const nlohmann::ordered_json& spec, bool opens_reasoning = false);

}  // namespace glms::structured
