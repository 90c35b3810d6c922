// Structured outputs, the regex form (vLLM's structured_outputs.regex / guided_regex): the whole
// output matches a regular expression. The expression is compiled to a byte-level Thompson NFA;
// the constraint keeps the set of NFA states the output so far reaches, and a token may come
// next when its text leaves that set non-empty, EOS when the set holds the accepting state.
// Syntax: literals, `.` (any byte but newline), classes `[a-z0-9_]` and `[^...]`, escapes
// `\d \w \s \D \W \S \n \t \r` and escaped punctuation, groups `(...)` and `(?:...)`, `|`, and
// the quantifiers `* + ? {m} {m,} {m,n}` (m, n <= 64); `^` and `$` at the ends are accepted.
#pragma once

#include <memory>
#include <string>

#include "engine/request.h"
#include "structured/choice.h"

namespace glms::structured {

// Throws glms::Error naming the position and what is wrong for an expression outside the syntax.
std::shared_ptr<engine::TokenConstraint> make_regex_constraint(const std::string& pattern, TokenTexts texts);

}  // namespace glms::structured
