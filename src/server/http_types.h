// Transport-neutral HTTP request/response types. The Beast transport (http_server.cpp) fills an
// HttpRequest and implements Responder; the API logic (api_service.h) never sees a socket, so the
// unit tests drive it with a recording Responder.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace glms::server {

struct HttpRequest {
  std::string method;                          // "GET", "POST", ...
  std::string target;                          // path plus optional "?query"
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
  std::string client;                          // peer address, for per-client rate limits

  std::string header(const std::string& lower_name) const {
    auto it = headers.find(lower_name);
    return it == headers.end() ? std::string() : it->second;
  }
  std::string path() const { return target.substr(0, target.find('?')); }
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // extra headers (Retry-After, ...)
};

// How a handler answers. Thread-safe: any method may be called from any thread (the engine's
// output callback runs on the engine thread). Exactly one of reply() or begin_stream() is
// called; after begin_stream(), write() any number of times and then end_stream() once.
class Responder {
 public:
  virtual ~Responder() = default;
  virtual void reply(HttpResponse response) = 0;
  // Starts a response whose body is sent as it is written (SSE); `head.body` is ignored.
  virtual void begin_stream(HttpResponse head) = 0;
  virtual void write(std::string data) = 0;
  virtual void end_stream() = 0;
  // Registers what to do when the client goes away before the response is complete (called at
  // most once, on a transport thread; called at once if the client is already gone).
  virtual void on_disconnect(std::function<void()> callback) = 0;
};

// A Responder that hands everything to `inner`: wrappers (CORS headers, an adapter's rewriting,
// a probe's empty answer) override only what they change.
class ForwardingResponder : public Responder {
 public:
  explicit ForwardingResponder(std::shared_ptr<Responder> inner) : inner_(std::move(inner)) {}
  void reply(HttpResponse response) override { inner_->reply(std::move(response)); }
  void begin_stream(HttpResponse head) override { inner_->begin_stream(std::move(head)); }
  void write(std::string data) override { inner_->write(std::move(data)); }
  void end_stream() override { inner_->end_stream(); }
  void on_disconnect(std::function<void()> callback) override { inner_->on_disconnect(std::move(callback)); }

 private:
  std::shared_ptr<Responder> inner_;
};

// Adds headers to whatever `inner` answers, whole or streamed (CORS, X-Request-Id).
class HeaderAddingResponder : public ForwardingResponder {
 public:
  HeaderAddingResponder(std::shared_ptr<Responder> inner, std::vector<std::pair<std::string, std::string>> headers)
      : ForwardingResponder(std::move(inner)), headers_(std::move(headers)) {}
  void reply(HttpResponse response) override { ForwardingResponder::reply(with_headers(std::move(response))); }
  void begin_stream(HttpResponse head) override { ForwardingResponder::begin_stream(with_headers(std::move(head))); }

 private:
  HttpResponse with_headers(HttpResponse response) const {
    response.headers.insert(response.headers.end(), headers_.begin(), headers_.end());
    return response;
  }
  std::vector<std::pair<std::string, std::string>> headers_;
};

// Server-Sent Events framing: one event per JSON payload, "data: <payload>\n\n". Payloads are
// single-line JSON, so no line splitting is needed; any '\n' in `payload` still starts a new
// "data:" line, as the SSE grammar requires.
std::string sse_event(const std::string& payload);
inline std::string sse_done() { return "data: [DONE]\n\n"; }

}  // namespace glms::server
