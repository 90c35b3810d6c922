#include "server/openai_responses.h"

#include <algorithm>
#include <optional>
#include <nlohmann/json.hpp>

#include "server/api_error.h"
#include "server/chat_adapter.h"
#include "server/responses_store.h"
#include "server/text_stream.h"

namespace glms::server {

using nlohmann::json;
using namespace adapter;

namespace {

// ---- The request: a Responses request as a chat completion request ----

// A message's content (a string or parts) as the text the model reads: input_text and
// output_text parts, a refusal's text, and a placeholder for images, files and audio.
// `field` is the content's path (input.2.content).
std::string content_text(const json& content, const std::string& field) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) bad_request(field + " must be a string or an array of parts", field);
  std::string text;
  for_each_object(content, field + ".", [&](const json& part, const std::string& part_at) {
    const std::string type = string_field(part, "type", part_at);
    if (type == "input_text" || type == "output_text" || type == "text") text += text_of(part, part_at);
    else if (type == "refusal") text += string_field(part, "refusal", part_at);
    else append_part(text, placeholder_of(type.empty() ? "part" : type), "\n");
  });
  return text;
}

// A user message's content as chat content: a string, or text parts (as the chat API takes them).
json user_content(const json& content, const std::string& field) {
  if (content.is_string()) return content;
  if (!content.is_array()) bad_request(field + " must be a string or an array of parts", field);
  json parts = json::array();
  for_each_object(content, field + ".", [&](const json& part, const std::string& part_at) {
    const std::string type = string_field(part, "type", part_at);
    const bool text = type == "input_text" || type == "output_text" || type == "text";
    parts.push_back({{"type", "text"}, {"text", text ? text_of(part, part_at) : placeholder_of(type)}});
  });
  return parts;
}

// A reasoning item's text: its reasoning_text content, else its summary (encrypted_content is
// another server's and is ignored).
std::string reasoning_text(const json& item, const std::string& at) {
  std::string text;
  for (const char* key : {"content", "summary"}) {
    if (!item.contains(key) || !item[key].is_array()) continue;
    for_each_object(item[key], at + key + ".", [&](const json& part, const std::string& part_at) {
      append_part(text, text_of(part, part_at), "\n\n");
    });
    if (!text.empty()) break;
  }
  return text;
}

// The chat messages of a conversation given as items: an assistant turn gathers the reasoning,
// text and function calls that follow one another; a function call's output is a tool message.
class ChatConversation {
 public:
  explicit ChatConversation(json messages = json::array()) : messages_(std::move(messages)) {}
  void add_message(const std::string& role, const json& content) { messages_.push_back({{"role", role}, {"content", content}}); }
  void add_tool_output(const std::string& call_id, const std::string& text) {
    messages_.push_back({{"role", "tool"}, {"tool_call_id", call_id}, {"content", text}});
  }
  void add_reasoning(const std::string& text) {
    json* turn = open_assistant();
    if (!turn || !(*turn)["content"].get<std::string>().empty() || turn->contains("tool_calls") ||
        turn->contains("reasoning_content"))
      turn = new_assistant();
    (*turn)["reasoning_content"] = text;
  }
  void add_assistant_text(const std::string& text) {
    json* turn = open_assistant();
    if (!turn || !(*turn)["content"].get<std::string>().empty() || turn->contains("tool_calls")) turn = new_assistant();
    (*turn)["content"] = text;
  }
  void add_function_call(const json& call) {
    json* turn = open_assistant();
    if (!turn) turn = new_assistant();
    (*turn)["tool_calls"].push_back(call);
  }
  json take() { return std::move(messages_); }

 private:
  json* open_assistant() {
    if (messages_.empty() || messages_.back()["role"] != "assistant") return nullptr;
    return &messages_.back();
  }
  json* new_assistant() {
    messages_.push_back({{"role", "assistant"}, {"content", ""}});
    return &messages_.back();
  }
  json messages_ = json::array();
};

void add_message_item(const json& item, const std::string& at, ChatConversation& chat) {
  const std::string role = string_field(item, "role", at);
  const json& content = required(item, "content", at);
  if (role == "user") chat.add_message("user", user_content(content, at + "content"));
  else if (role == "assistant") chat.add_assistant_text(content_text(content, at + "content"));
  else if (role == "system" || role == "developer") chat.add_message("system", content_text(content, at + "content"));
  else bad_request(at + "role must be user, assistant, system or developer", at + "role");
}

void add_item(const json& item, const std::string& at, ChatConversation& chat) {
  std::string type = string_field(item, "type", at);
  if (type.empty() && item.contains("role")) type = "message";  // the easy input message form
  if (type == "message") {
    add_message_item(item, at, chat);
  } else if (type == "function_call") {
    const std::string call_id = string_field(item, "call_id", at), name = string_field(item, "name", at);
    if (call_id.empty() || name.empty()) {
      const std::string missing = call_id.empty() ? "call_id" : "name";
      bad_request(at + missing + ": Field required", at + missing);
    }
    const std::string arguments = string_field(item, "arguments", at);
    chat.add_function_call({{"id", call_id},
                            {"type", "function"},
                            {"function", {{"name", name}, {"arguments", arguments.empty() ? "{}" : arguments}}}});
  } else if (type == "function_call_output") {
    const std::string call_id = string_field(item, "call_id", at);
    if (call_id.empty()) bad_request(at + "call_id: Field required", at + "call_id");
    chat.add_tool_output(call_id, content_text(required(item, "output", at), at + "output"));
  } else if (type == "reasoning") {
    const std::string text = reasoning_text(item, at);
    if (!text.empty()) chat.add_reasoning(text);
  } else if (type == "item_reference") {
    bad_request(at + "type: glmserve stores no items to refer to; send the item itself", at + "type");
  } else {
    bad_request(at + "type '" + type +
                    "' is not supported: glmserve takes message, function_call, function_call_output and reasoning "
                    "items",
                at + "type");
  }
}

// The conversation before the answer: the previous response's, then input (a string is one user
// message). The instructions are not in it: a later response gives its own.
json conversation_of(const json& doc, json previous) {
  ChatConversation chat(std::move(previous));
  const json& input = required(doc, "input", "");
  if (input.is_string()) {
    chat.add_message("user", input);
  } else if (input.is_array() && !input.empty()) {
    for_each_object(input, "input.", [&](const json& item, const std::string& at) { add_item(item, at, chat); });
  } else {
    bad_request("input must be a string or a non-empty array of items", "input");
  }
  return chat.take();
}

// The instructions as a system message first, then the conversation.
json chat_messages(const json& doc, const json& conversation) {
  json messages = json::array();
  const std::string instructions = string_field(doc, "instructions", "");
  if (!instructions.empty()) messages.push_back({{"role", "system"}, {"content", instructions}});
  messages.insert(messages.end(), conversation.begin(), conversation.end());
  return messages;
}

// The conversation a stored response continues: its input and its answer (the output items read
// as input items are).
json conversation_with_answer(const json& conversation, const json& response) {
  ChatConversation chat(conversation);
  for_each_object(response["output"], "output.", [&](const json& item, const std::string& at) { add_item(item, at, chat); });
  return chat.take();
}

json chat_tools(const json& tools) {
  if (!tools.is_array()) bad_request("tools must be an array", "tools");
  json out = json::array();
  for_each_object(tools, "tools.", [&](const json& tool, const std::string& at) {
    const std::string type = string_field(tool, "type", at);
    if (type != "function")
      bad_request(at + "type: '" + type + "' tools are not supported: glmserve serves function tools, which the client runs",
                  at + "type");
    const std::string name = string_field(tool, "name", at);
    if (name.empty()) bad_request(at + "name: Field required", at + "name");
    json function = {{"name", name}};
    function["parameters"] = tool.contains("parameters") && tool["parameters"].is_object() ? tool["parameters"] : json::object();
    const std::string description = string_field(tool, "description", at);
    if (!description.empty()) function["description"] = description;
    out.push_back({{"type", "function"}, {"function", std::move(function)}});
  });
  return out;
}

// "auto", "none", "required" or {"type": "function", "name": ...}.
json chat_tool_choice(const json& choice) {
  if (choice.is_string()) {
    const std::string mode = choice.get<std::string>();
    if (mode == "auto" || mode == "none" || mode == "required") return mode;
  } else if (choice.is_object()) {
    const std::string type = string_field(choice, "type", "tool_choice.");
    if (type == "function") {
      const std::string name = string_field(choice, "name", "tool_choice.");
      if (name.empty()) bad_request("tool_choice.name: Field required", "tool_choice.name");
      return {{"type", "function"}, {"function", {{"name", name}}}};
    }
    bad_request("tool_choice.type '" + type + "' is not supported: give auto, none, required or a function",
                "tool_choice.type");
  }
  bad_request("tool_choice must be auto, none, required or {\"type\": \"function\", \"name\": ...}", "tool_choice");
}

// text.format: text, json_object or json_schema, as the chat API's response_format.
void set_text_format(const json& text, json& chat) {
  if (!text.is_object()) bad_request("text must be an object", "text");
  if (!text.contains("format") || text["format"].is_null()) return;
  const json& format = text["format"];
  if (!format.is_object()) bad_request("text.format must be an object", "text.format");
  const std::string type = string_field(format, "type", "text.format.");
  if (type == "text") return;
  if (type == "json_object") {
    chat["response_format"] = {{"type", "json_object"}};
  } else if (type == "json_schema") {
    const std::string name = string_field(format, "name", "text.format.");
    json schema = {{"name", name.empty() ? "response" : name}, {"schema", required(format, "schema", "text.format.")}};
    if (format.contains("strict") && format["strict"].is_boolean()) schema["strict"] = format["strict"];
    chat["response_format"] = {{"type", "json_schema"}, {"json_schema", std::move(schema)}};
  } else {
    bad_request("text.format.type must be text, json_object or json_schema", "text.format.type");
  }
}

// reasoning.effort "none" turns GLM's thinking off (enable_thinking false, unless the request's
// chat_template_kwargs say otherwise); the other efforts keep it on: GLM thinks or does not.
void set_reasoning(const json& doc, json& chat) {
  json kwargs = json::object();
  if (doc.contains("chat_template_kwargs") && !doc["chat_template_kwargs"].is_null()) kwargs = doc["chat_template_kwargs"];
  if (doc.contains("reasoning") && !doc["reasoning"].is_null()) {
    const json& reasoning = doc["reasoning"];
    if (!reasoning.is_object()) bad_request("reasoning must be an object", "reasoning");
    const std::string effort = string_field(reasoning, "effort", "reasoning.");
    static const char* const kEfforts[] = {"", "none", "minimal", "low", "medium", "high", "xhigh"};
    if (std::find(std::begin(kEfforts), std::end(kEfforts), effort) == std::end(kEfforts))
      bad_request("reasoning.effort must be none, minimal, low, medium, high or xhigh", "reasoning.effort");
    if (effort == "none" && kwargs.is_object() && !kwargs.contains("enable_thinking")) kwargs["enable_thinking"] = false;
  }
  if (!kwargs.is_object() || !kwargs.empty()) chat["chat_template_kwargs"] = std::move(kwargs);
}

// What only a server that stores conversations, runs tools or queues work can do, refused naming it;
// previous_response_id without a store.
void refuse_unsupported(const json& doc, bool stored) {
  auto given = [&](const char* key) { return doc.contains(key) && !doc[key].is_null(); };
  if (given("previous_response_id") && !stored)
    bad_request("previous_response_id: glmserve stores no responses unless serve has --responses-store N (as vLLM "
                "without its response store); send the whole conversation as input",
                "previous_response_id");
  if (given("conversation"))
    bad_request("conversation: glmserve keeps no conversation objects; send the whole conversation as input, or "
                "previous_response_id with serve --responses-store N",
                "conversation");
  if (bool_field(doc, "background", "")) bad_request("background: responses run in the foreground here", "background");
  if (given("prompt")) bad_request("prompt: stored prompt templates are not supported; send instructions and input", "prompt");
  if (given("max_tool_calls")) bad_request("max_tool_calls: not supported; the client decides which calls to run", "max_tool_calls");
  if (given("truncation") && doc["truncation"] != "disabled")
    bad_request("truncation: only 'disabled' (a prompt past the context is refused)", "truncation");
  const bool logprobs = given("top_logprobs") && doc["top_logprobs"] != 0;
  bool include_logprobs = false;
  if (given("include") && doc["include"].is_array())
    for (const json& what : doc["include"]) include_logprobs |= what == "message.output_text.logprobs";
  if (logprobs || include_logprobs)
    bad_request("top_logprobs: log probabilities are not returned by /v1/responses; /v1/chat/completions returns them",
                "top_logprobs");
}

// The sampling fields, and vLLM's extras the chat API takes under the same names.
void copy_sampling(const json& doc, json& chat) {
  if (doc.contains("max_output_tokens") && !doc["max_output_tokens"].is_null()) {
    if (!doc["max_output_tokens"].is_number_integer())
      bad_request("max_output_tokens must be an integer", "max_output_tokens");
    chat["max_tokens"] = doc["max_output_tokens"];
  }
  for (const char* key : {"temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
                          "frequency_penalty", "seed", "stop", "parallel_tool_calls"})
    if (doc.contains(key) && !doc[key].is_null()) chat[key] = doc[key];
  if (bool_field(doc, "stream", "")) {
    chat["stream"] = true;
    chat["stream_options"] = {{"include_usage", true}, {"continuous_usage_stats", true}};
  }
}

// The request's fields a Response repeats, with the API's defaults where it gave none.
json echo_of(const json& doc, bool stored, const std::string& previous_id) {
  auto given_or_null = [&](const char* key) { return doc.contains(key) ? doc[key] : json(nullptr); };
  json reasoning = {{"effort", nullptr}, {"summary", nullptr}};
  if (doc.contains("reasoning") && doc["reasoning"].is_object())
    for (const char* key : {"effort", "summary"})
      if (doc["reasoning"].contains(key)) reasoning[key] = doc["reasoning"][key];
  json text = {{"format", {{"type", "text"}}}};
  if (doc.contains("text") && doc["text"].is_object() && doc["text"].contains("format") && !doc["text"]["format"].is_null())
    text["format"] = doc["text"]["format"];
  const json tool_choice = doc.contains("tool_choice") && !doc["tool_choice"].is_null() ? doc["tool_choice"] : json("auto");
  return {{"background", false},
          {"instructions", given_or_null("instructions")},
          {"max_output_tokens", given_or_null("max_output_tokens")},
          {"metadata", given_or_null("metadata")},
          {"parallel_tool_calls", bool_field(doc, "parallel_tool_calls", "", true)},
          {"previous_response_id", previous_id.empty() ? json(nullptr) : json(previous_id)},
          {"reasoning", std::move(reasoning)},
          {"store", stored},
          {"temperature", given_or_null("temperature")},
          {"text", std::move(text)},
          {"tool_choice", tool_choice},
          {"tools", doc.contains("tools") && doc["tools"].is_array() ? doc["tools"] : json::array()},
          {"top_p", given_or_null("top_p")},
          {"truncation", "disabled"},
          {"user", given_or_null("user")}};
}

// ---- The answer: a chat completion as a Response ----

// The hex of a chat completion's id (chatcmpl-HEX): the Response's is resp_HEX, its items' are
// msg_HEX_I, rs_HEX_I and fc_HEX_I by output index.
std::string hex_of(const std::string& chat_id) {
  const size_t dash = chat_id.find('-');
  return dash == std::string::npos ? chat_id : chat_id.substr(dash + 1);
}

std::string item_id(const char* prefix, const std::string& hex, size_t index) {
  return std::string(prefix) + hex + "_" + std::to_string(index);
}

json reasoning_item(const std::string& id, const json& content, const char* status) {
  return {{"id", id}, {"type", "reasoning"}, {"summary", json::array()}, {"content", content}, {"status", status}};
}
json reasoning_part(const std::string& text) { return {{"type", "reasoning_text"}, {"text", text}}; }

json message_item(const std::string& id, const json& content, const char* status) {
  return {{"id", id}, {"type", "message"}, {"role", "assistant"}, {"status", status}, {"content", content}};
}
json output_text_part(const std::string& text) {
  return {{"type", "output_text"}, {"text", text}, {"annotations", json::array()}, {"logprobs", json::array()}};
}

json function_call_item(const std::string& id, const json& call_id, const json& name, const std::string& arguments,
                        const char* status) {
  return {{"id", id},       {"type", "function_call"}, {"call_id", call_id}, {"name", name},
          {"arguments", arguments}, {"status", status}};
}

// The Responses API's usage: input_tokens counts the prompt's cached tokens too. GLM's reasoning
// tokens are not told apart from the others here (reasoning_tokens 0).
json usage_of(const json& usage) {
  const int prompt = usage.value("prompt_tokens", 0), completion = usage.value("completion_tokens", 0);
  const json details = usage.value("prompt_tokens_details", json::object());
  const int cached = details.is_object() ? details.value("cached_tokens", 0) : 0;
  return {{"input_tokens", prompt},
          {"input_tokens_details", {{"cached_tokens", cached}}},
          {"output_tokens", completion},
          {"output_tokens_details", {{"reasoning_tokens", 0}}},
          {"total_tokens", prompt + completion}};
}

// The Response object: the request's echo and what this answer adds.
json response_object(const json& echo, const std::string& hex, const json& created, const json& model,
                     const std::string& status, const json& output, const json& usage) {
  json response = echo;
  response["id"] = "resp_" + hex;
  response["object"] = "response";
  response["created_at"] = created;
  response["model"] = model;
  response["status"] = status;
  response["error"] = nullptr;
  response["incomplete_details"] = status == "incomplete" ? json{{"reason", "max_output_tokens"}} : json(nullptr);
  response["output"] = output;
  response["usage"] = usage;
  return response;
}

}  // namespace

ResponsesRequest chat_request_of_response_request(std::string_view body, const ResponsesStore* store) {
  const json doc = parse_body(body);
  refuse_unsupported(doc, store != nullptr);
  json previous = json::array();
  const std::string previous_id = string_field(doc, "previous_response_id", "");
  if (!previous_id.empty()) {
    const std::optional<ResponsesStore::Entry> entry = store->get(previous_id);
    if (!entry)
      throw_api(404, "Previous response with id '" + previous_id + "' not found (the store keeps the newest responses)",
                "previous_response_id");
    previous = json::parse(entry->conversation);
  }
  const json conversation = conversation_of(doc, std::move(previous));
  json chat = {{"messages", chat_messages(doc, conversation)}};
  if (doc.contains("model")) chat["model"] = doc["model"];
  copy_sampling(doc, chat);
  set_reasoning(doc, chat);
  if (doc.contains("text") && !doc["text"].is_null()) set_text_format(doc["text"], chat);
  if (doc.contains("tools") && !doc["tools"].is_null()) {
    chat["tools"] = chat_tools(doc["tools"]);
    if (chat["tools"].empty()) chat.erase("tools");
  }
  if (doc.contains("tool_choice") && !doc["tool_choice"].is_null()) chat["tool_choice"] = chat_tool_choice(doc["tool_choice"]);
  const bool stored = store != nullptr && bool_field(doc, "store", "", true);
  return {dump(chat), dump(echo_of(doc, stored, previous_id)), dump(conversation), stored};
}

std::string response_of_chat_completion(const std::string& chat_completion, const std::string& echo) {
  const json chat = json::parse(chat_completion);
  const json& choice = chat["choices"].at(0);
  const json& message = choice["message"];
  const std::string hex = hex_of(chat.value("id", ""));
  json output = json::array();
  const json reasoning = message.value("reasoning_content", json());
  if (reasoning.is_string() && !reasoning.get<std::string>().empty())
    output.push_back(reasoning_item(item_id("rs_", hex, output.size()), json::array({reasoning_part(reasoning)}), "completed"));
  const json content = message.value("content", json());
  if (content.is_string() && !blank(content.get<std::string>()))
    output.push_back(message_item(item_id("msg_", hex, output.size()), json::array({output_text_part(content)}), "completed"));
  if (message.contains("tool_calls") && message["tool_calls"].is_array())
    for (const json& call : message["tool_calls"])
      output.push_back(function_call_item(item_id("fc_", hex, output.size()), call["id"], call["function"]["name"],
                                          call["function"].value("arguments", "{}"), "completed"));
  const bool incomplete = choice["finish_reason"] == "length";
  if (incomplete && !output.empty()) output.back()["status"] = "incomplete";
  return dump(response_object(json::parse(echo), hex, chat.value("created", json(0)), chat["model"],
                              incomplete ? "incomplete" : "completed", output, usage_of(chat.value("usage", json::object()))));
}

namespace {

// The chat pipeline's stream turned into the Responses API's events: an output item a kind of
// delta (reasoning, the message's text, each function call), opened, fed and closed in turn, each
// event numbered; the whole Response last (response.completed, or response.incomplete at the
// token limit), or response.failed.
class ResponsesStream {
 public:
  explicit ResponsesStream(json echo) : echo_(std::move(echo)) {}

  // The whole Response once the stream has ended with it (null before, and after a failure).
  const json& final_response() const { return final_response_; }

  // The events of one OpenAI SSE payload ("[DONE]" ends the response).
  std::string translate(const std::string& payload) {
    if (finished_) return "";
    if (payload == "[DONE]") return finish();
    const json chunk = json::parse(payload, nullptr, false);
    if (!chunk.is_object()) return "";
    if (chunk.contains("error")) return fail(chunk["error"]);
    if (!started_) {
      hex_ = hex_of(chunk.value("id", ""));
      created_ = chunk.value("created", json(0));
      model_ = chunk.value("model", json(""));
    }
    if (chunk.contains("usage") && chunk["usage"].is_object()) usage_ = usage_of(chunk["usage"]);
    std::string out = start();
    if (!chunk.contains("choices") || !chunk["choices"].is_array() || chunk["choices"].empty()) return out;
    const json& choice = chunk["choices"][0];
    const json delta = choice.value("delta", json::object());
    const json reasoning = delta.value("reasoning_content", json()), content = delta.value("content", json());
    if (reasoning.is_string() && !reasoning.get<std::string>().empty()) out += text_delta(Kind::kReasoning, reasoning);
    if (content.is_string() && !content.get<std::string>().empty()) out += message_delta(content.get<std::string>());
    if (delta.contains("tool_calls") && delta["tool_calls"].is_array())
      for (const json& call : delta["tool_calls"]) out += function_call_delta(call);
    if (!choice.value("finish_reason", json()).is_null()) incomplete_ = choice["finish_reason"] == "length";
    return out;
  }

 private:
  enum class Kind { kNone, kReasoning, kMessage, kFunctionCall };

  std::string event(json data) {
    data["sequence_number"] = sequence_++;
    return "event: " + data["type"].get<std::string>() + "\ndata: " + dump(data) + "\n\n";
  }
  json snapshot(const std::string& status) const {
    return response_object(echo_, hex_, created_, model_, status, output_, usage_);
  }
  std::string start() {
    if (started_) return "";
    started_ = true;
    json response = snapshot("in_progress");
    response["usage"] = nullptr;
    std::string out = event({{"type", "response.created"}, {"response", response}});
    return out + event({{"type", "response.in_progress"}, {"response", response}});
  }
  // Adds `item` (its content still empty) and, for reasoning and the message, its one part.
  std::string open_item(Kind kind, json item) {
    std::string out = close_item("completed");
    open_ = kind;
    item_ = output_.size();
    id_ = item["id"].get<std::string>();
    output_.push_back(item);
    out += event({{"type", "response.output_item.added"}, {"output_index", item_}, {"item", std::move(item)}});
    if (kind == Kind::kFunctionCall) return out;
    const json part = kind == Kind::kReasoning ? reasoning_part("") : output_text_part("");
    return out + event({{"type", "response.content_part.added"}, {"item_id", id_}, {"output_index", item_},
                        {"content_index", 0}, {"part", part}});
  }
  std::string text_delta(Kind kind, const json& text) {
    std::string out;
    if (open_ != kind)
      out += kind == Kind::kReasoning
                 ? open_item(kind, reasoning_item(item_id("rs_", hex_, output_.size()), json::array(), "in_progress"))
                 : open_item(kind, message_item(item_id("msg_", hex_, output_.size()), json::array(), "in_progress"));
    text_ += text.get<std::string>();
    json data = {{"type", kind == Kind::kReasoning ? "response.reasoning_text.delta" : "response.output_text.delta"},
                 {"item_id", id_}, {"output_index", item_}, {"content_index", 0}, {"delta", text}};
    if (kind == Kind::kMessage) data["logprobs"] = json::array();
    return out + event(std::move(data));
  }
  // The message's text: blank text before it is held back until text that is not blank comes (a
  // message of blank text alone has no item).
  std::string message_delta(const std::string& text) {
    if (open_ != Kind::kMessage && blank(held_blank_ + text)) {
      held_blank_ += text;
      return "";
    }
    const std::string all = held_blank_ + text;
    held_blank_.clear();
    return text_delta(Kind::kMessage, all);
  }
  // A tool call's delta: one with an id starts a function_call item; its arguments stream on.
  std::string function_call_delta(const json& call) {
    std::string out;
    const json function = call.value("function", json::object());
    if (call.contains("id") && call["id"].is_string())
      out += open_item(Kind::kFunctionCall, function_call_item(item_id("fc_", hex_, output_.size()), call["id"],
                                                               function.value("name", json("")), "", "in_progress"));
    const json arguments = function.value("arguments", json());
    if (open_ == Kind::kFunctionCall && arguments.is_string() && !arguments.get<std::string>().empty()) {
      text_ += arguments.get<std::string>();
      out += event({{"type", "response.function_call_arguments.delta"}, {"item_id", id_}, {"output_index", item_},
                    {"delta", arguments}});
    }
    return out;
  }
  // The open item's done events, with its whole text, and the item as it ends.
  std::string close_item(const char* status) {
    if (open_ == Kind::kNone) return "";
    json& item = output_[item_];
    std::string out;
    const json where = {{"item_id", id_}, {"output_index", item_}};
    if (open_ == Kind::kFunctionCall) {
      item["arguments"] = text_;
      json done = where;
      done.update({{"type", "response.function_call_arguments.done"}, {"arguments", text_}, {"name", item["name"]}});
      out += event(std::move(done));
    } else {
      const bool reasoning = open_ == Kind::kReasoning;
      const json part = reasoning ? reasoning_part(text_) : output_text_part(text_);
      json done = where;
      done.update({{"type", reasoning ? "response.reasoning_text.done" : "response.output_text.done"},
                   {"content_index", 0}, {"text", text_}});
      if (!reasoning) done["logprobs"] = json::array();
      out += event(std::move(done));
      json part_done = where;
      part_done.update({{"type", "response.content_part.done"}, {"content_index", 0}, {"part", part}});
      out += event(std::move(part_done));
      item["content"] = json::array({part});
    }
    item["status"] = status;
    out += event({{"type", "response.output_item.done"}, {"output_index", item_}, {"item", item}});
    open_ = Kind::kNone;
    text_.clear();
    return out;
  }
  std::string finish() {
    std::string out = start();
    out += close_item(incomplete_ ? "incomplete" : "completed");
    finished_ = true;
    const std::string status = incomplete_ ? "incomplete" : "completed";
    final_response_ = snapshot(status);
    return out + event({{"type", "response." + status}, {"response", final_response_}});
  }
  // An error mid-stream (the engine stopped, a deadline): response.failed ends the stream.
  std::string fail(const json& error) {
    std::string out = start();
    out += close_item("incomplete");
    finished_ = true;
    json response = snapshot("failed");
    response["error"] = {{"code", "server_error"}, {"message", error.is_object() ? error.value("message", "") : ""}};
    return out + event({{"type", "response.failed"}, {"response", response}});
  }

  const json echo_;
  std::string hex_;
  json created_ = 0, model_ = "";
  json output_ = json::array();
  json usage_ = usage_of(json::object());
  bool started_ = false, finished_ = false, incomplete_ = false;
  int64_t sequence_ = 0;
  Kind open_ = Kind::kNone;
  size_t item_ = 0;   // the open item's output index
  std::string id_;    // and its id
  std::string text_;  // its text (or a function call's arguments) so far
  std::string held_blank_;  // blank message text not yet sent
  json final_response_;     // response.completed's or response.incomplete's Response
};

class ResponsesResponder : public ChatAdapterResponder {
 public:
  ResponsesResponder(std::shared_ptr<Responder> inner, ResponsesRequest request, ResponsesStore* store)
      : ChatAdapterResponder(std::move(inner)),
        request_(std::move(request)),
        store_(request_.store ? store : nullptr),
        stream_(json::parse(request_.echo)) {}

 protected:
  // Errors keep OpenAI's shape, which the Responses API shares.
  void rewrite(HttpResponse& response) override {
    if (response.status != 200) return;
    response.body = response_of_chat_completion(response.body, request_.echo);
    keep(json::parse(response.body));
  }
  std::string translate(const std::string& payload) override {
    std::string out = stream_.translate(payload);
    if (!kept_ && !stream_.final_response().is_null()) keep(stream_.final_response());
    return out;
  }

 private:
  // Into the store with its conversation (output items read as input items are). The answer is
  // the pipeline's own, so reading it back cannot fail; if it did, the answer would go unstored
  // rather than end the writing thread.
  void keep(const json& response) {
    kept_ = true;
    if (!store_) return;
    try {
      store_->put(response["id"].get<std::string>(),
                  {dump(response), dump(conversation_with_answer(json::parse(request_.conversation), response))});
    } catch (const ApiException&) {
    }
  }

  const ResponsesRequest request_;
  ResponsesStore* store_;
  ResponsesStream stream_;
  bool kept_ = false;
};

}  // namespace

std::shared_ptr<Responder> responses_responder(std::shared_ptr<Responder> inner, ResponsesRequest request,
                                               ResponsesStore* store) {
  return std::make_shared<ResponsesResponder>(std::move(inner), std::move(request), store);
}

}  // namespace glms::server
