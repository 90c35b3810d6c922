// Structured outputs, the choice form (vLLM's structured_outputs.choice / guided_choice): the
// output is exactly one of a list of strings. The choices' prefix trie is the automaton; a token
// may come next when its text keeps the output a prefix of some choice, EOS when the output is a
// whole choice. The mask is made over every token's text each step (a walk of its bytes down
// the trie: about a millisecond for GLM-5's 154880 tokens).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/request.h"

namespace glms::structured {

// Each token's text (empty for special tokens, which are never allowed): one copy shared by
// every constraint made from it.
using TokenTexts = std::shared_ptr<const std::vector<std::string>>;

// Throws glms::Error when `choices` is empty or holds an empty string.
std::shared_ptr<engine::TokenConstraint> make_choice_constraint(const std::vector<std::string>& choices,
                                                                TokenTexts texts);

}  // namespace glms::structured
