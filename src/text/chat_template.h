// Chat templates: turns an OpenAI-style conversation into the prompt text a model expects,
// by rendering the model's Jinja chat template the way Hugging Face transformers does
// (apply_chat_template with tokenize=False). The server tokenizes the result WITHOUT adding
// special tokens: the template writes them.
//
// Contracts:
// - load(model_dir) reads <model_dir>/chat_template.jinja if it exists, else the
//   "chat_template" entry of <model_dir>/tokenizer_config.json: a string, or a list of
//   {"name", "template"} (the "default" one is used, and "tool_use" when tools are given and
//   the model has it). Special tokens bos_token, eos_token, pad_token and unk_token (strings or
//   {"content": ...} objects; null ones are left undefined) and additional_special_tokens
//   become template variables, as in transformers' special_tokens_map.
//   Throws glms::Error if there is no template or it does not parse (message says which file).
// - render() is const and thread-safe. Template variables: messages, tools (None when
//   tools_json is empty), add_generation_prompt, the special tokens, and every key of
//   kwargs_json (chat_template_kwargs: enable_thinking, reasoning_effort, ...). Message JSON
//   is passed through as given (content string or list of parts, reasoning_content,
//   tool_calls, tool_call_id, name...), except that tool_calls[].function.arguments given as a
//   JSON string that parses to an object is replaced by that object (as vLLM does, since
//   templates iterate arguments.items()). Throws glms::Error for invalid JSON, for template
//   runtime errors ("template error at line N: ...") and with the exact message of the
//   template's raise_exception().
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "text/jinja.h"

namespace glms {

class ChatTemplate {
 public:
  // The model folder's template (chat_template.jinja, or tokenizer_config.json's), or
  // `override_source` instead (serve --chat-template) with the folder's special tokens.
  static ChatTemplate load(const std::string& model_dir, const std::string& override_source = "");
  // A template from source text (tests, or a --chat-template override).
  static ChatTemplate from_source(const std::string& source, const std::string& bos_token = "",
                                  const std::string& eos_token = "");

  // messages_json: JSON array of messages. tools_json: JSON array of OpenAI tool objects, or
  // "" or "null" for none. kwargs_json: JSON object of extra template variables, or "" or
  // "null" for none. `limits` bounds the evaluation (jinja.h: steps, macro depth, output).
  std::string render(const std::string& messages_json, const std::string& tools_json,
                     bool add_generation_prompt, const std::string& kwargs_json = "",
                     const jinja::RenderLimits& limits = {}) const;

  // The source of the template used when no tools are given.
  const std::string& source() const;
  bool has_tool_use_template() const { return tool_use_ != nullptr; }

 private:
  struct Variant {
    std::string source;
    std::shared_ptr<const jinja::Template> tmpl;
  };
  std::shared_ptr<const Variant> default_, tool_use_;
  std::map<std::string, std::string> special_tokens_;  // name -> text (only non-null ones)
  std::vector<std::string> additional_special_tokens_;   // tokenizer_config.json, if listed
  bool has_additional_ = false;
};

}  // namespace glms
