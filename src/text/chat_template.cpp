// ChatTemplate: loading from a model folder and rendering. See chat_template.h.
#include "text/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/jinja.h"

namespace glms {
namespace {

using jinja::Value;

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read " + path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::shared_ptr<const jinja::Template> compile(const std::string& source, const std::string& origin) {
  try {
    return std::make_shared<const jinja::Template>(jinja::Template::parse(source));
  } catch (const Error& e) {
    fail("chat template " + origin + ": " + e.what());
  }
}

// tool_calls[].function.arguments: JSON text of an object -> the object (vLLM's behaviour).
void parse_tool_arguments(const Value& messages) {
  if (!messages.is_list()) fail("chat template: messages must be a JSON array");
  for (const Value& m : messages.items()) {
    if (!m.is_dict()) continue;
    const Value* calls = m.dict_data().find("tool_calls");
    if (!calls || !calls->is_list()) continue;
    for (const Value& call : calls->items()) {
      if (!call.is_dict()) continue;
      const Value* fn = call.dict_data().find("function");
      if (!fn || !fn->is_dict()) continue;
      const Value* args = fn->dict_data().find("arguments");
      if (!args || !args->is_string()) continue;
      try {
        Value parsed = Value::from_json(args->as_string());
        if (parsed.is_dict()) fn->dict_data().set("arguments", parsed);
      } catch (const Error&) {
        // Not JSON: the template sees the string as given.
      }
    }
  }
}

}  // namespace

ChatTemplate ChatTemplate::from_source(const std::string& source, const std::string& bos_token,
                                       const std::string& eos_token) {
  ChatTemplate t;
  t.default_ = std::make_shared<const Variant>(Variant{source, compile(source, "(source)")});
  if (!bos_token.empty()) t.special_tokens_["bos_token"] = bos_token;
  if (!eos_token.empty()) t.special_tokens_["eos_token"] = eos_token;
  return t;
}

ChatTemplate ChatTemplate::load(const std::string& model_dir, const std::string& override_source) {
  namespace fs = std::filesystem;
  ChatTemplate t;
  const fs::path dir(model_dir);
  const fs::path jinja_path = dir / "chat_template.jinja";
  const fs::path config_path = dir / "tokenizer_config.json";
  nlohmann::json config;
  if (fs::exists(config_path)) {
    try {
      config = nlohmann::json::parse(read_file(config_path));
    } catch (const nlohmann::json::exception& e) {
      fail(config_path.string() + ": invalid JSON: " + e.what());
    }
    for (const char* name : {"bos_token", "eos_token", "pad_token", "unk_token"}) {
      if (!config.contains(name)) continue;
      const auto& tok = config[name];
      if (tok.is_string()) t.special_tokens_[name] = tok.get<std::string>();
      else if (tok.is_object() && tok.contains("content") && tok["content"].is_string())
        t.special_tokens_[name] = tok["content"].get<std::string>();
    }
    if (config.contains("additional_special_tokens") && config["additional_special_tokens"].is_array()) {
      t.has_additional_ = true;
      for (const auto& tok : config["additional_special_tokens"]) {
        if (tok.is_string()) t.additional_special_tokens_.push_back(tok.get<std::string>());
        else if (tok.is_object() && tok.contains("content") && tok["content"].is_string())
          t.additional_special_tokens_.push_back(tok["content"].get<std::string>());
      }
    }
  }
  if (!override_source.empty()) {
    t.default_ = std::make_shared<const Variant>(Variant{override_source, compile(override_source, "--chat-template")});
    return t;
  }
  if (fs::exists(jinja_path)) {
    std::string source = read_file(jinja_path);
    t.default_ = std::make_shared<const Variant>(Variant{source, compile(source, jinja_path.string())});
  }
  if (config.is_object() && config.contains("chat_template")) {
    const auto& ct = config["chat_template"];
    const std::string origin = config_path.string() + " chat_template";
    if (ct.is_string() && !t.default_) {
      std::string source = ct.get<std::string>();
      t.default_ = std::make_shared<const Variant>(Variant{source, compile(source, origin)});
    } else if (ct.is_array()) {
      for (const auto& entry : ct) {
        if (!entry.is_object() || !entry.contains("name") || !entry.contains("template") ||
            !entry["name"].is_string() || !entry["template"].is_string())
          fail(origin + ": list entries must be {\"name\": ..., \"template\": ...}");
        std::string name = entry["name"].get<std::string>();
        std::string source = entry["template"].get<std::string>();
        if (name == "default" && !t.default_)
          t.default_ = std::make_shared<const Variant>(Variant{source, compile(source, origin + " 'default'")});
        else if (name == "tool_use")
          t.tool_use_ = std::make_shared<const Variant>(Variant{source, compile(source, origin + " 'tool_use'")});
      }
    }
  }
  if (!t.default_) {
    if (t.tool_use_) t.default_ = t.tool_use_;
    else fail("no chat template in " + model_dir + ": expected chat_template.jinja or a \"chat_template\" in tokenizer_config.json");
  }
  return t;
}

const std::string& ChatTemplate::source() const { return default_->source; }

std::string ChatTemplate::render(const std::string& messages_json, const std::string& tools_json,
                                 bool add_generation_prompt, const std::string& kwargs_json,
                                 const jinja::RenderLimits& limits) const {
  Value context = Value::dict();
  auto& vars = context.dict_data();
  for (const auto& [name, text] : special_tokens_) vars.set(name, Value(text));
  if (has_additional_) {
    std::vector<Value> list(additional_special_tokens_.begin(), additional_special_tokens_.end());
    vars.set("additional_special_tokens", Value::list(std::move(list)));
  }
  if (!kwargs_json.empty()) {
    Value kwargs = Value::from_json(kwargs_json);
    if (kwargs.is_none()) kwargs = Value::dict();
    if (!kwargs.is_dict()) fail("chat template kwargs must be a JSON object");
    for (const auto& [k, v] : kwargs.dict_data().items) vars.set(k, v);
  }
  Value messages = Value::from_json(messages_json);
  parse_tool_arguments(messages);
  vars.set("messages", messages);
  Value tools(nullptr);
  if (!tools_json.empty()) {
    tools = Value::from_json(tools_json);
    if (!tools.is_list() && !tools.is_none()) fail("chat template: tools must be a JSON array");
  }
  bool has_tools = tools.is_list() && !tools.items().empty();
  vars.set("tools", tools);
  vars.set("add_generation_prompt", Value(add_generation_prompt));
  const Variant& variant = has_tools && tool_use_ ? *tool_use_ : *default_;
  return variant.tmpl->render(context, limits);
}

}  // namespace glms
