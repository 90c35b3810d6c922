// Structured outputs, the regex form (vLLM's structured_outputs.regex / guided_regex): the whole
// output matches a regular expression. The expression becomes a grammar (grammar.h) that the
// recogniser follows byte by byte.
// Syntax: literals, `.` (any byte but newline), classes `[a-z0-9_]` and `[^...]`, escapes
// `\d \w \s \D \W \S \n \t \r` and escaped punctuation, groups `(...)` and `(?:...)`, `|`, and
// the quantifiers `* + ? {m} {m,} {m,n}` (m, n <= 256); `^` and `$` at the ends are accepted.
#pragma once

#include <memory>
#include <string>

#include "engine/request.h"
#include "structured/grammar.h"
#include "structured/vocabulary.h"

namespace glms::structured {

// The expression as a grammar expression (for JSON schema patterns too). Throws glms::Error
// naming the position and what is wrong for an expression outside the syntax.
Expr regex_expr(const std::string& pattern);

std::shared_ptr<const Grammar> regex_grammar(const std::string& pattern);
std::shared_ptr<engine::TokenConstraint> make_regex_constraint(const std::string& pattern, TokenTexts texts);

}  // namespace glms::structured
