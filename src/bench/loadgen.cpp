// Boost 1.74 + C++20: asio/awaitable.hpp uses std::exchange without including <utility>.
#include <utility>

#include "bench/loadgen.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cmath>
#include <deque>
#include <limits>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>

#include "bench/arrivals.h"
#include "bench/sse.h"
#include "core/error.h"

namespace glms::bench {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using asio::awaitable;
using asio::redirect_error;
using asio::use_awaitable;

Endpoint parse_base_url(const std::string& url) {
  const std::string scheme = "http://";
  if (url.rfind("https://", 0) == 0)
    fail("--base-url: https is not supported by glmserve bench; use http:// (e.g. through an SSH tunnel)");
  if (url.rfind(scheme, 0) != 0) fail("--base-url: expected http://host[:port][/prefix], got '" + url + "'");
  std::string rest = url.substr(scheme.size());
  Endpoint ep;
  const size_t slash = rest.find('/');
  if (slash != std::string::npos) {
    ep.base_path = rest.substr(slash);
    rest = rest.substr(0, slash);
    while (!ep.base_path.empty() && ep.base_path.back() == '/') ep.base_path.pop_back();
  }
  if (!rest.empty() && rest.front() == '[') {  // [ipv6]:port
    const size_t close = rest.find(']');
    if (close == std::string::npos) fail("--base-url: unterminated [ipv6] host in '" + url + "'");
    ep.host = rest.substr(1, close - 1);
    if (close + 1 < rest.size() && rest[close + 1] == ':') ep.port = rest.substr(close + 2);
  } else {
    const size_t colon = rest.rfind(':');
    ep.host = rest.substr(0, colon);
    if (colon != std::string::npos) ep.port = rest.substr(colon + 1);
  }
  if (ep.host.empty() || ep.port.empty() || ep.port.find_first_not_of("0123456789") != std::string::npos)
    fail("--base-url: expected http://host[:port][/prefix], got '" + url + "'");
  return ep;
}

std::string error_message_from_body(const std::string& body) {
  auto doc = nlohmann::json::parse(body, nullptr, false);
  if (doc.is_object()) {
    if (auto e = doc.find("error"); e != doc.end()) {
      if (e->is_object() && e->contains("message") && (*e)["message"].is_string())
        return (*e)["message"].get<std::string>();
      if (e->is_string()) return e->get<std::string>();
    }
    if (auto m = doc.find("message"); m != doc.end() && m->is_string()) return m->get<std::string>();
  }
  return body.substr(0, 300);
}

namespace {

bool retryable_status(int status) { return status == 408 || status == 429 || status >= 500; }

// Shared by every coroutine of one level; all of them run on one thread, so no locks.
struct Level {
  Level(const ClientOptions& c, const LoadSpec& l, const std::vector<RequestTemplate>& t, CircuitBreaker& b)
      : client(c), load(l), templates(t), breaker(b), slot_timer(ioc), done_timer(ioc) {}

  const ClientOptions& client;
  const LoadSpec& load;
  const std::vector<RequestTemplate>& templates;
  CircuitBreaker& breaker;
  asio::io_context ioc;
  tcp::resolver::results_type endpoints;
  std::string target;
  Clock::time_point t0;
  std::deque<RequestRecord> records;
  std::vector<std::unique_ptr<beast::tcp_stream>> idle;  // keep-alive connections
  asio::steady_timer slot_timer;  // wakes the launcher when a request finishes
  asio::steady_timer done_timer;  // wakes the progress loop when everything is done
  bool launching = true;
  Progress progress;

  double now() const { return std::chrono::duration<double>(Clock::now() - t0).count(); }
  Clock::time_point at(double s) const {
    return t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  }
};

enum class Outcome { ok, retryable, fatal };

// The request a template sends: a streamed POST of its body, keep-alive.
http::request<http::string_body> make_request(const Level& lv, const RequestRecord& rec, const RequestTemplate& tpl) {
  http::request<http::string_body> req{http::verb::post, lv.target, 11};
  req.set(http::field::host, lv.client.endpoint.host);
  req.set(http::field::user_agent, "glmserve-bench");
  req.set(http::field::content_type, "application/json");
  req.set(http::field::accept, "text/event-stream");
  if (!lv.client.api_key.empty()) req.set(http::field::authorization, "Bearer " + lv.client.api_key);
  if (!rec.request_id.empty()) req.set("X-Request-Id", rec.request_id);
  req.keep_alive(true);
  req.body() = tpl.body;
  req.prepare_payload();
  return req;
}

// What a response's stream has said so far.
struct StreamState {
  bool done = false;          // [DONE] seen
  bool error = false;         // an error event seen (rec.error says which)
  std::string finish_reason;  // the last one given
  double last_token_s = -1;   // when the last token event arrived
};

// The SSE events of one read (arrived at t, the request sent at send_s) into the record: tokens
// (TTFT, inter-token gaps, text), finish reason, usage, [DONE] and errors.
void take_events(Level& lv, RequestRecord& rec, const std::vector<std::string>& events, double t, double send_s,
                 StreamState& st) {
  for (const std::string& data : events) {
    StreamEvent ev = interpret_event(data);
    if (ev.done) {
      st.done = true;
      continue;
    }
    if (!ev.error.empty()) {
      rec.error = "stream error: " + ev.error;
      st.error = true;
      continue;
    }
    if (ev.token) {
      if (rec.token_events == 0) rec.ttft_s = t - send_s;
      else rec.itl_s.push_back(t - st.last_token_s);
      st.last_token_s = t;
      ++rec.token_events;
      ++lv.progress.output_tokens;
      rec.text += ev.text;
    }
    if (!ev.finish_reason.empty()) st.finish_reason = ev.finish_reason;
    if (ev.has_usage) {
      rec.has_usage = true;
      rec.prompt_tokens = ev.prompt_tokens;
      rec.completion_tokens = ev.completion_tokens;
      rec.cached_tokens = ev.cached_tokens;
    }
  }
}

// How a read response ended (`clean`: read to its end without error; `ec`: the read's last
// error), rec.error set for anything but ok: an HTTP error (retryable by status), an error event,
// a broken stream (retryable before its first token, unless timed out), no [DONE] and no
// finish reason, or no tokens.
Outcome judge_response(RequestRecord& rec, const std::string& error_body, const StreamState& st, bool clean,
                       const beast::error_code& ec) {
  if (rec.http_status != 200) {
    rec.error = "HTTP " + std::to_string(rec.http_status) + ": " + error_message_from_body(error_body);
    return retryable_status(rec.http_status) ? Outcome::retryable : Outcome::fatal;
  }
  if (st.error) return Outcome::fatal;
  if (!clean && !st.done) {
    rec.error = (ec == beast::error::timeout ? "timeout after " : "stream broken after ") +
                std::to_string(rec.token_events) + " token events: " + (ec ? ec.message() : "incomplete response");
    return rec.token_events == 0 && ec != beast::error::timeout ? Outcome::retryable : Outcome::fatal;
  }
  if (!st.done && st.finish_reason.empty()) {
    rec.error = "stream ended without [DONE] or a finish_reason";
    return Outcome::fatal;
  }
  if (rec.token_events == 0 && !(rec.has_usage && rec.completion_tokens > 0)) {
    rec.error = "no tokens generated";
    return Outcome::fatal;
  }
  rec.error.clear();
  return Outcome::ok;
}

// One attempt on one connection. Fills the record's stream fields; returns how it ended.
awaitable<Outcome> attempt(Level& lv, RequestRecord& rec, const RequestTemplate& tpl, double send_s) {
  beast::error_code ec;
  std::unique_ptr<beast::tcp_stream> stream;
  bool reused = false;
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(lv.client.timeout_s));
  http::request<http::string_body> req = make_request(lv, rec, tpl);
  std::optional<http::response_parser<http::buffer_body>> parser_slot;
  beast::flat_buffer buf;
  // A pooled connection may have been closed by the server while idle: then send once more
  // on a fresh connection (not counted as an attempt, since the server saw nothing).
  for (int tries = 0; tries < 2; ++tries) {
    if (!lv.idle.empty() && tries == 0) {
      stream = std::move(lv.idle.back());
      lv.idle.pop_back();
      reused = true;
    } else {
      stream = std::make_unique<beast::tcp_stream>(lv.ioc);
      reused = false;
      stream->expires_at(deadline);
      co_await stream->async_connect(lv.endpoints, redirect_error(use_awaitable, ec));
      if (ec) {
        rec.error = "connect: " + ec.message();
        co_return Outcome::retryable;
      }
      stream->socket().set_option(tcp::no_delay(true), ec);
    }
    stream->expires_at(deadline);
    parser_slot.emplace();
    parser_slot->body_limit(std::numeric_limits<std::uint64_t>::max());
    buf.clear();
    co_await http::async_write(*stream, req, redirect_error(use_awaitable, ec));
    if (!ec) co_await http::async_read_header(*stream, buf, *parser_slot, redirect_error(use_awaitable, ec));
    if (!ec) break;
    if (!reused) {
      rec.error = (ec == beast::error::timeout ? "timeout: " : "send/receive headers: ") + ec.message();
      co_return ec == beast::error::timeout ? Outcome::fatal : Outcome::retryable;
    }
    ec = {};
  }
  auto& parser = *parser_slot;

  rec.http_status = static_cast<int>(parser.get().result_int());
  const bool ok_status = rec.http_status == 200;
  std::string error_body;
  SseParser sse;
  std::vector<std::string> events;
  StreamState st;
  char chunk[16384];
  while (!parser.is_done()) {
    parser.get().body().data = chunk;
    parser.get().body().size = sizeof chunk;
    co_await http::async_read_some(*stream, buf, parser, redirect_error(use_awaitable, ec));
    if (ec == http::error::need_buffer) ec = {};
    const size_t n = sizeof chunk - parser.get().body().size;
    const double t = lv.now();
    if (!ok_status) {
      if (error_body.size() < 65536) error_body.append(chunk, n);
    } else if (n > 0) {
      events.clear();
      sse.feed(std::string_view(chunk, n), events);
      take_events(lv, rec, events, t, send_s, st);
    }
    if (ec) break;
  }
  rec.end_s = lv.now();
  const bool clean = !ec && parser.is_done();
  if (clean && parser.keep_alive()) {
    lv.idle.push_back(std::move(stream));
  } else if (stream) {
    beast::error_code ignored;
    stream->socket().close(ignored);
  }
  co_return judge_response(rec, error_body, st, clean, ec);
}

awaitable<void> run_request(Level& lv, RequestRecord& rec) {
  const RequestTemplate& tpl = lv.templates[rec.template_index];
  rec.start_s = lv.now();
  for (int a = 0;; ++a) {
    if (a > 0) {
      asio::steady_timer backoff(lv.ioc);
      backoff.expires_after(std::chrono::duration_cast<Clock::duration>(
          std::chrono::duration<double>(lv.client.retry.delay(a))));
      beast::error_code ec;
      co_await backoff.async_wait(redirect_error(use_awaitable, ec));
    }
    if (!lv.breaker.allow(lv.now())) {
      rec.error = rec.attempts == 0 ? "circuit breaker open: not sent"
                                    : "circuit breaker open: no retry (last error: " + rec.error + ")";
      rec.end_s = lv.now();
      break;
    }
    ++rec.attempts;
    rec.ttft_s = 0;
    rec.itl_s.clear();
    rec.token_events = 0;
    rec.text.clear();
    rec.has_usage = false;
    const double send_s = lv.now();
    Outcome o = Outcome::fatal;
    try {
      o = co_await attempt(lv, rec, tpl, send_s);
    } catch (const std::exception& e) {
      rec.error = std::string("client error: ") + e.what();
    }
    lv.breaker.record(o == Outcome::ok, lv.now());
    if (o == Outcome::ok) {
      rec.success = true;
      // TTFT counts from the first attempt: what a user waiting through retries sees.
      rec.ttft_s += send_s - rec.start_s;
      break;
    }
    if (o == Outcome::fatal || a >= lv.client.retry.retries) break;
  }
  --lv.progress.in_flight;
  ++lv.progress.finished;
  if (!rec.success) ++lv.progress.failed;
  lv.slot_timer.cancel();
  if (!lv.launching && lv.progress.in_flight == 0) lv.done_timer.cancel();
}

awaitable<void> launcher(Level& lv) {
  const LoadSpec& ld = lv.load;
  const bool paced = ld.request_rate > 0 && !std::isinf(ld.request_rate);
  std::vector<double> times;
  if (paced) {
    ArrivalSpec spec{ld.request_rate, ld.burstiness, ld.seed};
    times = ld.duration_s > 0 ? arrival_times_for(spec, ld.duration_s, 10'000'000) : arrival_times(spec, ld.num_requests);
  }
  beast::error_code ec;
  asio::steady_timer pace(lv.ioc);
  for (size_t i = 0;; ++i) {
    if (ld.duration_s > 0 ? (paced ? i >= times.size() : lv.now() >= ld.duration_s) : i >= ld.num_requests) break;
    const double when = paced ? times[i] : 0.0;
    if (when > lv.now()) {
      pace.expires_at(lv.at(when));
      co_await pace.async_wait(redirect_error(use_awaitable, ec));
    }
    while (ld.max_concurrency > 0 && lv.progress.in_flight >= static_cast<size_t>(ld.max_concurrency)) {
      lv.slot_timer.expires_at(Clock::time_point::max());
      co_await lv.slot_timer.async_wait(redirect_error(use_awaitable, ec));
    }
    if (ld.duration_s > 0 && !paced && lv.now() >= ld.duration_s) break;
    RequestRecord& rec = lv.records.emplace_back();
    rec.template_index = i % lv.templates.size();
    rec.scheduled_s = when;
    rec.expected_prompt_tokens = lv.templates[rec.template_index].prompt_tokens;
    rec.expected_output_tokens = lv.templates[rec.template_index].output_tokens;
    if (!lv.client.request_id_prefix.empty())
      rec.request_id = lv.client.request_id_prefix + std::to_string(lv.client.requests_sent->fetch_add(1));
    ++lv.progress.started;
    ++lv.progress.in_flight;
    asio::co_spawn(lv.ioc, run_request(lv, rec), asio::detached);
  }
  lv.launching = false;
  if (lv.progress.in_flight == 0) lv.done_timer.cancel();
}

awaitable<void> progress_loop(Level& lv, const std::function<void(const Progress&)>& cb, double interval_s) {
  beast::error_code ec;
  while (lv.launching || lv.progress.in_flight > 0) {
    lv.done_timer.expires_after(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(interval_s)));
    co_await lv.done_timer.async_wait(redirect_error(use_awaitable, ec));
    lv.progress.elapsed_s = lv.now();
    if (cb && (lv.launching || lv.progress.in_flight > 0)) cb(lv.progress);
  }
}

}  // namespace

LevelResult run_level(const ClientOptions& client, const LoadSpec& load, const std::vector<RequestTemplate>& templates,
                      CircuitBreaker& breaker, const std::function<void(const Progress&)>& on_progress,
                      double progress_interval_s) {
  if (templates.empty()) fail("bench: no requests to send");
  Level lv(client, load, templates, breaker);
  beast::error_code ec;
  tcp::resolver resolver(lv.ioc);
  lv.endpoints = resolver.resolve(client.endpoint.host, client.endpoint.port, ec);
  if (ec) fail("bench: cannot resolve " + client.endpoint.host + ":" + client.endpoint.port + ": " + ec.message());
  lv.target = client.endpoint.base_path + client.path;
  lv.progress.planned = load.duration_s > 0 ? 0 : load.num_requests;
  lv.progress.duration_s = load.duration_s;
  lv.t0 = Clock::now();
  asio::co_spawn(lv.ioc, launcher(lv), asio::detached);
  asio::co_spawn(lv.ioc, progress_loop(lv, on_progress, progress_interval_s), asio::detached);
  lv.ioc.run();
  LevelResult result;
  result.duration_s = 0;
  for (RequestRecord& r : lv.records) result.duration_s = std::max(result.duration_s, r.end_s);
  result.records.assign(std::make_move_iterator(lv.records.begin()), std::make_move_iterator(lv.records.end()));
  result.breaker_opened = breaker.times_opened();
  lv.progress.elapsed_s = lv.now();
  if (on_progress) on_progress(lv.progress);
  return result;
}

HttpReply http_call(const ClientOptions& client, bool post, const std::string& path, double timeout_s) {
  asio::io_context ioc;
  HttpReply reply;
  std::string error;
  auto call = [&]() -> awaitable<void> {
    beast::error_code ec;
    tcp::resolver resolver(ioc);
    auto endpoints = co_await resolver.async_resolve(client.endpoint.host, client.endpoint.port,
                                                     redirect_error(use_awaitable, ec));
    if (ec) {
      error = "resolve: " + ec.message();
      co_return;
    }
    beast::tcp_stream stream(ioc);
    stream.expires_after(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s)));
    co_await stream.async_connect(endpoints, redirect_error(use_awaitable, ec));
    if (ec) {
      error = "connect: " + ec.message();
      co_return;
    }
    http::request<http::string_body> req{post ? http::verb::post : http::verb::get, client.endpoint.base_path + path, 11};
    req.set(http::field::host, client.endpoint.host);
    req.set(http::field::user_agent, "glmserve-bench");
    if (!client.api_key.empty()) req.set(http::field::authorization, "Bearer " + client.api_key);
    req.keep_alive(false);
    req.prepare_payload();
    co_await http::async_write(stream, req, redirect_error(use_awaitable, ec));
    beast::flat_buffer buf;
    http::response_parser<http::string_body> parser;
    parser.body_limit(64u << 20);
    if (!ec) co_await http::async_read(stream, buf, parser, redirect_error(use_awaitable, ec));
    if (ec) {
      error = ec.message();
      co_return;
    }
    reply.status = static_cast<int>(parser.get().result_int());
    reply.body = std::move(parser.get().body());
    stream.socket().shutdown(tcp::socket::shutdown_both, ec);
  };
  asio::co_spawn(ioc, call(), asio::detached);
  ioc.run();
  const std::string url = "http://" + client.endpoint.host + ":" + client.endpoint.port + client.endpoint.base_path + path;
  if (!error.empty()) fail(std::string(post ? "POST " : "GET ") + url + ": " + error);
  return reply;
}

std::string http_get(const ClientOptions& client, const std::string& path, double timeout_s) {
  HttpReply reply = http_call(client, false, path, timeout_s);
  if (reply.status != 200) {
    const std::string url = "http://" + client.endpoint.host + ":" + client.endpoint.port + client.endpoint.base_path + path;
    fail("GET " + url + ": HTTP " + std::to_string(reply.status) + ": " + error_message_from_body(reply.body));
  }
  return std::move(reply.body);
}

}  // namespace glms::bench
