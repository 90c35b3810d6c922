// Jinja lexer: template source -> flat token stream, with Hugging Face's settings
// (trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False).
//
// Contracts:
// - Newlines (\r\n, \r, \n) are normalised to \n and one trailing newline of the source is
//   dropped, as jinja2 does.
// - Whitespace control is resolved here: Text tokens already have `{%-`/`-%}`/`{{-`/`-}}`,
//   lstrip_blocks (whitespace before `{%`/`{#` at the start of a line, unless `{%+`) and
//   trim_blocks (one newline after `%}`/`#}`, unless `+%}`) applied. Comments produce no
//   tokens; `{% raw %}...{% endraw %}` produces one Text token.
// - Inside `{{ }}` and `{% %}` the lexer emits Name, String (escapes decoded), Int, Float and
//   Op tokens; an end delimiter only counts outside brackets, so `{{ {'a': {}} }}` works.
// - Errors are glms::Error "template syntax error at LINE:COL: ...".
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace glms::jinja {

enum class Tok { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, Eof };

struct Token {
  Tok kind;
  std::string text;  // Text/Name/Op spelling, decoded String value
  int64_t int_value = 0;
  double float_value = 0;
  int line = 1, col = 1;
};

std::vector<Token> lex(std::string_view source);

[[noreturn]] void syntax_error(int line, int col, const std::string& what);

}  // namespace glms::jinja
