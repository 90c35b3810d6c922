// A Jinja2 interpreter for chat templates (the subset real chat templates use; see
// docs/chat_templates.md). Semantics follow jinja2 3.x as Hugging Face configures it:
// ImmutableSandboxedEnvironment, trim_blocks=True, lstrip_blocks=True, loopcontrols, default
// Undefined, no autoescaping, HF's tojson (ensure_ascii=False by default), and the globals
// raise_exception(msg) and strftime_now(fmt) besides range, dict and namespace.
//
// Contracts:
// - Template::parse throws glms::Error "template syntax error at LINE:COL: expected X, got Y"
//   for invalid templates.
// - render() throws glms::Error "template error at line N: <jinja2's message>" for runtime
//   errors, and exactly the message given for raise_exception(message). It never crashes on
//   any template or input: loops, recursion and output size are bounded by RenderLimits.
// - A Template is immutable after parse and may be rendered from several threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "core/error.h"
#include "text/jinja_value.h"

namespace glms::jinja {

// What the template's raise_exception(message) throws: what() is exactly the message (the
// server reports it to the client as a bad request, as HF's TemplateError).
struct RaisedError : Error {
  using Error::Error;
};

struct Program;

struct RenderLimits {
  int64_t max_steps = 4'000'000;         // statements + expression nodes evaluated (about 0.2 s)
  int max_call_depth = 200;              // nested macro calls
  size_t max_output_bytes = 16u << 20;   // rendered text (20x a 202k-token context at 4 bytes a token)
};

class Template {
 public:
  static Template parse(std::string_view source);

  // `context` is a dict Value whose entries become the template's variables.
  std::string render(const Value& context, const RenderLimits& limits = {}) const;

 private:
  std::shared_ptr<const Program> program_;
};

}  // namespace glms::jinja
