// The text pipeline and response assembly of one request (see generation.h).
#include "server/generation.h"

#include <chrono>
#include <fmt/format.h>
#include <cmath>
#include <mutex>
#include <nlohmann/json.hpp>
#include <unordered_set>

#include "core/error.h"
#include "log/log.h"
#include "engine/engine.h"
#include "server/api_error.h"
#include "text/detokenizer.h"

namespace glms::server {

// Insertion order kept: completions top_logprobs list the likeliest token first, as vLLM and OpenAI do.
using json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double clamp_logprob(float lp) { return std::isfinite(lp) ? lp : -9999.0; }

// A completions top_logprobs entry: the `n` likeliest tokens, likeliest first, then the chosen
// token where it is not among them (OpenAI's "up to logprobs + 1 elements", as vLLM does; with
// logprobs 0 the chosen token alone).
template <class TextOf>
json completion_top_logprobs(const engine::GeneratedToken& g, int n, const TextOf& text_of) {
  json top = json::object();
  bool chosen_listed = false;
  for (size_t k = 0; k < g.top_logprobs.size() && k < static_cast<size_t>(n); ++k) {
    top[text_of(g.top_logprobs[k].token)] = clamp_logprob(g.top_logprobs[k].logprob);
    chosen_listed = chosen_listed || g.top_logprobs[k].token == g.token;
  }
  if (!chosen_listed) top[text_of(g.token)] = clamp_logprob(g.logprob);
  return top;
}

json utf8_bytes(const std::string& s) {
  json out = json::array();
  for (unsigned char c : s) out.push_back(static_cast<int>(c));
  return out;
}

}  // namespace

struct Generation::Choice {
  size_t index = 0;
  size_t prompt = 0;
  uint64_t request_id = 0;
  bool submitted = false;
  bool engine_finished = false;  // the engine sent its final output (nothing to cancel)
  bool done = false;             // our response for this choice is complete
  bool final_sent = false;
  bool timed_out = false;        // the engine ended it at --request-timeout (API: "length")
  std::string finish_reason;
  json stop_reason = nullptr;
  std::string error;
  int error_status = 500;  // 400 where the request caused it (RequestOutput::request_error)
  std::unique_ptr<text::IncrementalDetokenizer> detok;
  std::unique_ptr<StopMatcher> stop;
  std::unique_ptr<OutputParser> parser;
  // Accumulated output (non-streaming) and the not yet sent delta (streaming).
  std::string text, reasoning, content;
  std::vector<ToolCall> calls;
  ParsedDelta delta;
  std::string delta_text;  // completions
  json logprobs_all;       // the whole request's logprobs object (non-streaming)
  json logprobs_delta;     // this chunk's
  json prompt_logprobs = nullptr;  // vLLM's prompt_logprobs: [null, {id: {logprob, rank, decoded_token}}, ...]
  bool prompt_scored = false;      // the prompt's logprobs were taken (from the first output)
  size_t text_offset = 0;
  std::vector<int32_t> token_ids;        // return_token_ids, whole answers: the ids generated
  std::vector<int32_t> token_ids_delta;  // return_token_ids, streams: the ids not yet sent
  bool prompt_ids_sent = false;          // streamed completions: the first chunk had them
  int prompt_tokens = 0;
  int cached_tokens = 0;
  int completion_tokens = 0;
  Clock::time_point submitted_at, last_token_at;
  bool has_token = false;
};

struct Generation::State {
  std::mutex mu;
  std::vector<Choice> choices;
  bool started = false;
  bool failed = false;  // start() failed: ignore stray outputs
  bool completed = false;
  size_t done_count = 0;
  std::unordered_set<int32_t> chat_specials;
  std::unordered_set<int32_t> stop_ids;
};

Generation::Generation(GenerationSpec spec, text::Tokenizer tokenizer, Backend& backend, ServerMetrics& metrics,
                       std::shared_ptr<Responder> responder)
    : spec_(std::move(spec)),
      tokenizer_(std::move(tokenizer)),
      backend_(backend),
      metrics_(metrics),
      responder_(std::move(responder)),
      state_(std::make_unique<State>()) {
  state_->chat_specials.insert(spec_.chat_text_special_ids.begin(), spec_.chat_text_special_ids.end());
  state_->stop_ids.insert(spec_.sampling.stop_token_ids.begin(), spec_.sampling.stop_token_ids.end());
  const size_t n = spec_.params.size();
  state_->choices.resize(n);
  for (size_t i = 0; i < n; ++i) {
    Choice& c = state_->choices[i];
    c.index = i;
    c.prompt = spec_.sampling.n > 0 ? i / spec_.sampling.n : 0;
    c.detok = std::make_unique<text::IncrementalDetokenizer>(tokenizer_, text::IncrementalDetokenizer::Options{false});
    c.stop = std::make_unique<StopMatcher>(spec_.sampling.stop, spec_.sampling.include_stop_str_in_output);
    if (spec_.chat) c.parser = spec_.parser_factory ? spec_.parser_factory(spec_.parser_options) : make_plain_parser();
    c.prompt_tokens = static_cast<int>(spec_.prompts[c.prompt].ids.size());
    if (spec_.sampling.logprobs >= 0) {
      c.logprobs_all = spec_.chat ? json{{"content", json::array()}}
                                  : json{{"text_offset", json::array()}, {"token_logprobs", json::array()},
                                         {"tokens", json::array()}, {"top_logprobs", json::array()}};
    }
    c.content = spec_.chat_echo;  // streams send it in the role chunk
    if (!spec_.chat && spec_.echo) {
      c.text = spec_.prompts[c.prompt].text;
      c.delta_text = c.text;
      c.text_offset = c.text.size();
    }
  }
}

Generation::~Generation() = default;

// The prompt's logprobs arrive with the first token: as vLLM's prompt_logprobs list, and for
// completions with echo and logprobs at the head of the logprobs object (the first prompt
// token has nothing before it: null).
void Generation::take_prompt_logprobs(Choice& c, const engine::RequestOutput& out) {
  c.prompt_scored = true;
  const bool echo_logprobs = !spec_.chat && spec_.echo && spec_.sampling.logprobs >= 0;
  if (spec_.sampling.prompt_logprobs < 0 && !echo_logprobs) return;
  auto text_of = [&](int32_t id) { return tokenizer_.decode(std::vector<int32_t>{id}, false); };
  if (spec_.sampling.prompt_logprobs >= 0) {
    json list = json::array({nullptr});
    for (const engine::GeneratedToken& g : out.prompt_logprobs) {
      json entry = json::object();
      auto add = [&](int32_t id, float logprob, int rank) {
        if (!entry.contains(std::to_string(id)))
          entry[std::to_string(id)] = {{"logprob", clamp_logprob(logprob)}, {"rank", rank}, {"decoded_token", text_of(id)}};
      };
      add(g.token, g.logprob, g.rank);
      for (size_t k = 0; k < g.top_logprobs.size() && k < static_cast<size_t>(spec_.sampling.prompt_logprobs); ++k)
        add(g.top_logprobs[k].token, g.top_logprobs[k].logprob, static_cast<int>(k) + 1);
      list.push_back(std::move(entry));
    }
    c.prompt_logprobs = std::move(list);
  }
  if (!echo_logprobs) return;
  const std::vector<int32_t>& ids = spec_.prompts[c.prompt].ids;
  json head = {{"text_offset", json::array()}, {"token_logprobs", json::array()}, {"tokens", json::array()},
               {"top_logprobs", json::array()}};
  size_t offset = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    head["text_offset"].push_back(offset);
    offset += text_of(ids[i]).size();
    head["tokens"].push_back(token_name(ids[i]));
    if (i == 0 || i - 1 >= out.prompt_logprobs.size()) {
      head["token_logprobs"].push_back(nullptr);
      head["top_logprobs"].push_back(nullptr);
      continue;
    }
    const engine::GeneratedToken& g = out.prompt_logprobs[i - 1];
    head["token_logprobs"].push_back(clamp_logprob(g.logprob));
    head["top_logprobs"].push_back(
        completion_top_logprobs(g, spec_.sampling.logprobs, [&](int32_t id) { return token_name(id); }));
  }
  c.logprobs_all = std::move(head);
}

void Generation::start() {
  std::vector<uint64_t> to_cancel;
  std::optional<ApiException> failure;
  {
    std::unique_lock lock(state_->mu);
    for (size_t i = 0; i < state_->choices.size(); ++i) {
      Choice& c = state_->choices[i];
      // The engine keeps the callback (and so this generation) alive until its last output.
      std::shared_ptr<Generation> self = shared_from_this();
      c.submitted_at = Clock::now();
      try {
        c.request_id = backend_.submit(spec_.params[i], [self, i](const engine::RequestOutput& out) {
          self->on_output(i, out);
        });
        c.submitted = true;
      } catch (const engine::QueueFull&) {
        ApiError e{429, "The server is busy: the request queue is full. Retry later.", "", 1.0};
        failure = ApiException{e};
      } catch (const Error& e) {
        failure = ApiException{ApiError{400, e.what(), "", 0.0}};
      }
      if (failure) break;
    }
    if (failure) {
      state_->failed = true;
      for (Choice& c : state_->choices)
        if (c.submitted) to_cancel.push_back(c.request_id);
    } else {
      state_->started = true;
      if (spec_.sampling.stream) {
        HttpResponse head;
        head.content_type = "text/event-stream";
        head.headers = {{"Cache-Control", "no-cache"}, {"X-Accel-Buffering", "no"}};
        responder_->begin_stream(std::move(head));
        if (spec_.chat) {
          for (Choice& c : state_->choices) {
            json chunk = {{"id", spec_.id}, {"object", "chat.completion.chunk"}, {"created", spec_.created},
                          {"model", spec_.model},
                          {"choices", json::array({{{"index", c.index},
                                                    {"delta", {{"role", "assistant"}, {"content", spec_.chat_echo}}},
                                                    {"logprobs", nullptr},
                                                    {"finish_reason", nullptr}}})}};
            if (spec_.sampling.return_token_ids) chunk["prompt_token_ids"] = spec_.prompts[0].ids;
            // Usage on every chunk: the prompt's tokens are known before its prefill.
            if (spec_.sampling.continuous_usage_stats && spec_.sampling.include_usage) {
              const int prompt = static_cast<int>(spec_.params[c.index].prompt_ids.size());
              chunk["usage"] = {{"prompt_tokens", prompt}, {"total_tokens", prompt}, {"completion_tokens", 0},
                                {"prompt_tokens_details", {{"cached_tokens", 0}}}};
            }
            responder_->write(sse_event(chunk.dump(-1, ' ', false, json::error_handler_t::replace)));
          }
        }
      }
    }
  }
  for (uint64_t id : to_cancel) backend_.cancel(id);
  if (failure) throw *failure;
}

void Generation::abort() {
  std::vector<uint64_t> to_cancel;
  {
    std::lock_guard lock(state_->mu);
    if (state_->failed) return;
    for (Choice& c : state_->choices) {
      if (c.submitted && !c.engine_finished) to_cancel.push_back(c.request_id);
      if (!c.done) finish_choice(c, "abort");
    }
    state_->completed = true;  // nobody is listening any more
  }
  for (uint64_t id : to_cancel) backend_.cancel(id);
  if (!spec_.access_log.empty()) {
    std::lock_guard lock(state_->mu);
    log::info(access_line_locked(499) + " (the client went away)");
  }
}

void Generation::finish_choice(Choice& c, const std::string& reason) {
  c.done = true;
  c.finish_reason = reason;
  ++state_->done_count;
  const auto now = Clock::now();
  metrics_.e2e_request_latency.observe(seconds_between(c.submitted_at, now));
  metrics_.request_prompt_tokens.observe(c.prompt_tokens);
  metrics_.request_generation_tokens.observe(c.completion_tokens);
  metrics_.count_finished(c.timed_out ? "timeout" : reason == "tool_calls" ? "stop" : reason);
}

// How logprobs name a token: its text, or "token_id:N" (vLLM's return_tokens_as_token_ids).
std::string Generation::token_name(int32_t id) const {
  if (spec_.sampling.tokens_as_ids.value_or(false)) return "token_id:" + std::to_string(id);
  return tokenizer_.decode(std::vector<int32_t>{id}, false);
}

// Token g's logprobs into the choice's whole list and its next delta: the chat form (content
// entries with bytes and top_logprobs) or the completions form (parallel arrays, the token's
// offset in the text `text_offset`).
void Generation::record_logprobs(Choice& c, const engine::GeneratedToken& g, size_t text_offset) {
  const std::string tok = token_name(g.token);
  if (spec_.chat) {
    json top = json::array();
    for (const auto& t : g.top_logprobs) {
      const std::string s = token_name(t.token);
      top.push_back({{"token", s}, {"logprob", clamp_logprob(t.logprob)}, {"bytes", utf8_bytes(s)}});
    }
    json entry = {{"token", tok}, {"logprob", clamp_logprob(g.logprob)}, {"bytes", utf8_bytes(tok)},
                  {"top_logprobs", std::move(top)}};
    c.logprobs_all["content"].push_back(entry);
    if (c.logprobs_delta.is_null()) c.logprobs_delta = {{"content", json::array()}};
    c.logprobs_delta["content"].push_back(std::move(entry));
    return;
  }
  const json top = completion_top_logprobs(g, spec_.sampling.logprobs, [&](int32_t id) { return token_name(id); });
  if (c.logprobs_delta.is_null())
    c.logprobs_delta = {{"text_offset", json::array()}, {"token_logprobs", json::array()},
                        {"tokens", json::array()}, {"top_logprobs", json::array()}};
  for (json* target : {&c.logprobs_all, &c.logprobs_delta}) {
    (*target)["text_offset"].push_back(text_offset);
    (*target)["token_logprobs"].push_back(clamp_logprob(g.logprob));
    (*target)["tokens"].push_back(tok);
    (*target)["top_logprobs"].push_back(top);
  }
}

// Text the stop matcher released: through the chat parser (reasoning, content, tool calls; a
// choice with a tool call finishes with "tool_calls", as vLLM's do) or onto the completion's text.
void Generation::route_released(Choice& c, const std::string& released, std::string& final_reason) {
  if (!spec_.chat) {
    c.text += released;
    c.delta_text += released;
    return;
  }
  auto take = [&](ParsedDelta d) {
    if (!spec_.sampling.include_reasoning) d.reasoning.clear();
    c.reasoning += d.reasoning;
    c.content += d.content;
    c.delta.reasoning += d.reasoning;
    c.delta.content += d.content;
    for (ToolCall& call : d.tool_calls) {
      c.calls.push_back(call);
      c.delta.tool_calls.push_back(std::move(call));
    }
  };
  if (!released.empty()) take(c.parser->feed(released));
  if (!final_reason.empty()) take(c.parser->finish());
  if ((final_reason == "stop" || final_reason == "length") && !c.calls.empty()) final_reason = "tool_calls";
}

// After choice `index` moved: streaming, its chunk (and, once every choice is done, the usage
// chunk and [DONE]: `end`); otherwise, once every choice is done, the whole response or the
// first choice's error (`reply`).
void Generation::respond_locked(size_t index, bool choice_done, std::vector<std::string>& writes,
                                std::optional<HttpResponse>& reply, bool& end) {
  if (state_->completed) return;
  if (spec_.sampling.stream) {
    emit_locked(writes, index, choice_done);
    if (state_->done_count != state_->choices.size()) return;
    if (spec_.sampling.include_usage) {
      json chunk = {{"id", spec_.id},
                    {"object", spec_.chat ? "chat.completion.chunk" : "text_completion"},
                    {"created", spec_.created},
                    {"model", spec_.model},
                    {"choices", json::array()},
                    {"usage", json::parse(usage_json_locked())}};
      writes.push_back(sse_event(chunk.dump(-1, ' ', false, json::error_handler_t::replace)));
    }
    writes.push_back(sse_done());
    state_->completed = true;
    end = true;
    return;
  }
  if (state_->done_count != state_->choices.size()) return;
  state_->completed = true;
  HttpResponse r;
  std::string error;
  int status = 500;
  for (const Choice& ch : state_->choices)
    if (!ch.error.empty()) error = ch.error, status = ch.error_status;
  if (!error.empty()) {
    r.status = status;
    r.body = error_body(ApiError{status, error, "", 0.0});
  } else {
    r.body = final_body_locked();
  }
  reply = std::move(r);
}

void Generation::on_output(size_t index, const engine::RequestOutput& out) {
  std::vector<std::string> writes;
  std::optional<HttpResponse> reply;
  bool end = false;
  bool cancel_now = false;
  uint64_t cancel_id = 0;
  {
    std::lock_guard lock(state_->mu);
    if (state_->failed || index >= state_->choices.size()) return;
    Choice& c = state_->choices[index];
    if (out.finished) {
      c.engine_finished = true;
      metrics_.observe_request_phases(out);
    }
    if (c.done) return;
    if (out.prompt_tokens > 0) c.prompt_tokens = out.prompt_tokens;
    c.cached_tokens = out.cached_prompt_tokens;
    if (!c.prompt_scored && !out.new_tokens.empty()) take_prompt_logprobs(c, out);
    const auto now = Clock::now();
    const size_t k = out.new_tokens.size();
    if (k > 0) {
      if (!c.has_token) metrics_.time_to_first_token.observe(seconds_between(c.submitted_at, now));
      else for (size_t j = 0; j < k; ++j) metrics_.inter_token_latency.observe(seconds_between(c.last_token_at, now) / k);
      c.has_token = true;
      c.last_token_at = now;
    }
    std::string released;
    bool stopped = false;
    // As vLLM does, the text of the first min_tokens tokens is not searched for stop strings.
    auto push_text = [&](const std::string& piece) {
      if (stopped) return;
      StopMatcher::Result r = c.stop->push(piece, c.completion_tokens > spec_.sampling.min_tokens);
      released += r.released;
      if (r.matched) {
        stopped = true;
        c.stop_reason = r.stop;
      }
    };
    for (size_t j = 0; j < k && !stopped; ++j) {
      const engine::GeneratedToken& g = out.new_tokens[j];
      ++c.completion_tokens;
      if (spec_.sampling.return_token_ids) (spec_.sampling.stream ? c.token_ids_delta : c.token_ids).push_back(g.token);
      const bool last = j + 1 == k;
      const bool ending_id = last && out.finished && out.finish_reason == "stop" &&
                             (state_->stop_ids.count(g.token) || tokenizer_.is_special(g.token));
      if (ending_id && state_->stop_ids.count(g.token)) c.stop_reason = g.token;
      const bool special = tokenizer_.is_special(g.token);
      const bool feed = !ending_id && (spec_.chat ? (!special || state_->chat_specials.count(g.token))
                                                  : (!special || !spec_.sampling.skip_special_tokens));
      const size_t before = c.text.size() + released.size();
      if (feed) push_text(c.detok->feed(g.token));
      if (spec_.sampling.logprobs >= 0) record_logprobs(c, g, before);
    }
    std::string final_reason;
    if (stopped) {
      final_reason = "stop";
      if (!c.engine_finished && c.submitted) {
        cancel_now = true;
        cancel_id = c.request_id;
      }
    } else if (out.finished) {
      push_text(c.detok->flush());
      if (!stopped) released += c.stop->finish();
      // OpenAI clients know stop / length / tool_calls: a request cut by --request-timeout is
      // reported as truncated ("length"); the metrics keep the engine's "timeout".
      final_reason = stopped ? "stop" : out.finish_reason == "timeout" ? "length" : out.finish_reason;
      c.timed_out = !stopped && out.finish_reason == "timeout";
      if (out.finish_reason == "error") {
        c.error = out.error.empty() ? "generation failed" : out.error;
        c.error_status = out.request_error ? 400 : 500;
      }
    }
    route_released(c, released, final_reason);
    if (!final_reason.empty()) finish_choice(c, final_reason);

    respond_locked(index, c.done, writes, reply, end);
  }
  if (cancel_now) backend_.cancel(cancel_id);
  for (std::string& w : writes) responder_->write(std::move(w));
  if ((end || reply) && !spec_.access_log.empty()) {
    std::lock_guard lock(state_->mu);
    log::info(access_line_locked(reply ? reply->status : 200));
  }
  if (end) responder_->end_stream();
  if (reply) responder_->reply(std::move(*reply));
}

std::string Generation::access_line_locked(int status) const {
  int prompt = 0, completion = 0, cached = 0;
  std::string reasons;
  for (const Choice& c : state_->choices) {
    completion += c.completion_tokens;
    if (c.index % spec_.sampling.n == 0) {
      prompt += c.prompt_tokens;
      cached += c.cached_tokens;
    }
    const std::string reason = c.finish_reason.empty() ? "-" : c.finish_reason;
    if (reasons.find(reason) == std::string::npos) reasons += (reasons.empty() ? "" : ",") + reason;
  }
  const double seconds =
      state_->choices.empty() ? 0.0 : seconds_between(state_->choices.front().submitted_at, Clock::now());
  return fmt::format("{} {} {:.3f} s prompt {} cached {} completion {} finish {} id {}", spec_.access_log, status,
                     seconds, prompt, cached, completion, reasons, spec_.id);
}

void Generation::emit_locked(std::vector<std::string>& writes, size_t index, bool final) {
  Choice& c = state_->choices[index];
  if (c.final_sent) return;
  if (!c.error.empty()) {
    writes.push_back(sse_event(error_body(ApiError{c.error_status, c.error, "", 0.0})));
    c.final_sent = true;
    return;
  }
  json choice = {{"index", c.index}};
  if (spec_.chat) {
    json delta = json::object();
    if (!c.delta.reasoning.empty()) delta["reasoning"] = delta["reasoning_content"] = c.delta.reasoning;
    if (!c.delta.content.empty()) delta["content"] = c.delta.content;
    if (!c.delta.tool_calls.empty()) {
      json calls = json::array();
      size_t base = c.calls.size() - c.delta.tool_calls.size();
      for (size_t j = 0; j < c.delta.tool_calls.size(); ++j) {
        const ToolCall& t = c.delta.tool_calls[j];
        calls.push_back({{"index", base + j}, {"id", t.id}, {"type", "function"},
                         {"function", {{"name", t.name}, {"arguments", t.arguments}}}});
      }
      delta["tool_calls"] = std::move(calls);
    }
    if (delta.empty() && !final && c.logprobs_delta.is_null()) return;
    choice["delta"] = std::move(delta);
    c.delta = ParsedDelta{};
  } else {
    if (c.delta_text.empty() && !final && c.logprobs_delta.is_null()) return;
    choice["text"] = c.delta_text;
    c.delta_text.clear();
  }
  choice["logprobs"] = c.logprobs_delta;
  c.logprobs_delta = nullptr;
  if (spec_.sampling.return_token_ids) {  // vLLM's: the prompt's ids in a choice's first completions chunk
    if (!spec_.chat && !c.prompt_ids_sent) choice["prompt_token_ids"] = spec_.prompts[c.prompt].ids;
    c.prompt_ids_sent = true;
    choice["token_ids"] = std::move(c.token_ids_delta);
    c.token_ids_delta.clear();
  }
  choice["finish_reason"] = final ? json(c.finish_reason) : json(nullptr);
  if (final) {
    choice["stop_reason"] = c.stop_reason;
    c.final_sent = true;
  }
  json chunk = {{"id", spec_.id},
                {"object", spec_.chat ? "chat.completion.chunk" : "text_completion"},
                {"created", spec_.created},
                {"model", spec_.model},
                {"choices", json::array({std::move(choice)})}};
  if (spec_.sampling.continuous_usage_stats && spec_.sampling.include_usage) chunk["usage"] = json::parse(usage_json_locked());
  writes.push_back(sse_event(chunk.dump(-1, ' ', false, json::error_handler_t::replace)));
}

std::string Generation::usage_json_locked() const {
  int prompt = 0, completion = 0, cached = 0;
  for (const Choice& c : state_->choices) {
    completion += c.completion_tokens;
    if (c.index % spec_.sampling.n == 0) {
      prompt += c.prompt_tokens;
      cached += c.cached_tokens;
    }
  }
  json usage = {{"prompt_tokens", prompt}, {"total_tokens", prompt + completion}, {"completion_tokens", completion},
                {"prompt_tokens_details", {{"cached_tokens", cached}}}};
  return usage.dump();
}

std::string Generation::final_body_locked() const {
  json choices = json::array();
  for (const Choice& c : state_->choices) {
    json choice = {{"index", c.index}};
    if (spec_.chat) {
      json message = {{"role", "assistant"}};
      message["content"] = blank(c.content) && !c.calls.empty() ? json(nullptr) : json(c.content);
      // vLLM's `reasoning`, and `reasoning_content`, which it still fills for older clients.
      message["reasoning"] = message["reasoning_content"] = c.reasoning.empty() ? json(nullptr) : json(c.reasoning);
      json calls = json::array();
      for (const ToolCall& t : c.calls)
        calls.push_back({{"id", t.id}, {"type", "function"}, {"function", {{"name", t.name}, {"arguments", t.arguments}}}});
      message["tool_calls"] = std::move(calls);
      choice["message"] = std::move(message);
    } else {
      choice["text"] = c.text;
    }
    choice["logprobs"] = spec_.sampling.logprobs >= 0 ? c.logprobs_all : json(nullptr);
    if (spec_.sampling.prompt_logprobs >= 0) choice["prompt_logprobs"] = c.prompt_logprobs;
    choice["finish_reason"] = c.finish_reason;
    choice["stop_reason"] = c.stop_reason;
    if (spec_.sampling.return_token_ids) {
      if (!spec_.chat) choice["prompt_token_ids"] = spec_.prompts[c.prompt].ids;
      choice["token_ids"] = c.token_ids;
    }
    choices.push_back(std::move(choice));
  }
  json body = {{"id", spec_.id},
               {"object", spec_.chat ? "chat.completion" : "text_completion"},
               {"created", spec_.created},
               {"model", spec_.model},
               {"choices", std::move(choices)},
               {"usage", json::parse(usage_json_locked())}};
  if (spec_.chat && spec_.sampling.return_token_ids) body["prompt_token_ids"] = spec_.prompts[0].ids;
  return body.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace glms::server
