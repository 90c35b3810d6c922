// Structured outputs, the choice form (vLLM's structured_outputs.choice / guided_choice): the
// output is exactly one of a list of strings (a grammar of literal alternatives).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/request.h"
#include "structured/grammar.h"
#include "structured/vocabulary.h"

namespace glms::structured {

// Throws glms::Error when `choices` is empty or holds an empty string.
std::shared_ptr<const Grammar> choice_grammar(const std::vector<std::string>& choices);
std::shared_ptr<engine::TokenConstraint> make_choice_constraint(const std::vector<std::string>& choices,
                                                                TokenTexts texts);

}  // namespace glms::structured
