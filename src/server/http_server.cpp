// Boost.Beast transport for ApiService (see http_server.h). Boost 1.74 + C++20: <utility> must
// come before any Asio header (asio/awaitable.hpp uses std::exchange).
#include <utility>

#include <boost/asio.hpp>
#include <boost/asio/co_spawn.hpp>
#include <atomic>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <optional>
#include <variant>

#include "core/error.h"
#include "server/api_error.h"
#include "server/api_service.h"
#include "server/metrics.h"
#include "server/http_server.h"

namespace glms::server {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using Executor = net::any_io_executor;

namespace {

// Responder for one request on one connection. Items are queued from any thread and written by
// the connection's coroutine, which a cancelled timer wakes.
class ConnResponder final : public Responder, public std::enable_shared_from_this<ConnResponder> {
 public:
  struct Begin { HttpResponse head; };
  struct Data { std::string bytes; };
  struct End {};
  using Item = std::variant<HttpResponse, Begin, Data, End>;

  explicit ConnResponder(Executor ex) : ex_(ex), signal_(ex) { signal_.expires_at(net::steady_timer::time_point::max()); }

  void reply(HttpResponse response) override { push(std::move(response)); }
  void begin_stream(HttpResponse head) override { push(Begin{std::move(head)}); }
  void write(std::string data) override { push(Data{std::move(data)}); }
  void end_stream() override { push(End{}); }
  void on_disconnect(std::function<void()> callback) override {
    bool now = false;
    {
      std::lock_guard lock(mu_);
      if (disconnected_) now = true;
      else on_disconnect_ = std::move(callback);
    }
    if (now && callback) callback();
  }

  // Transport side.
  void disconnect() {
    std::function<void()> callback;
    {
      std::lock_guard lock(mu_);
      if (disconnected_) return;
      disconnected_ = true;
      callback = std::move(on_disconnect_);
    }
    if (callback) callback();
    wake();
  }
  bool disconnected() {
    std::lock_guard lock(mu_);
    return disconnected_;
  }
  std::deque<Item> take() {
    std::lock_guard lock(mu_);
    return std::exchange(items_, {});
  }
  // Items queued since the last take(). A wake() posted while the writer was busy writing (not
  // waiting on the signal) cancels nothing, so the writer checks this before it waits.
  bool has_items() {
    std::lock_guard lock(mu_);
    return !items_.empty();
  }
  net::steady_timer& signal() { return signal_; }

 private:
  void push(Item item) {
    {
      std::lock_guard lock(mu_);
      if (disconnected_) return;
      items_.push_back(std::move(item));
    }
    wake();
  }
  void wake() {
    net::post(ex_, [self = shared_from_this()] { self->signal_.cancel(); });
  }

  Executor ex_;
  net::steady_timer signal_;
  std::mutex mu_;
  std::deque<Item> items_;
  bool disconnected_ = false;
  std::function<void()> on_disconnect_;
};

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

struct HttpServer::Impl {
  ApiService& service;
  HttpServerOptions options;
  net::io_context ioc;
  tcp::acceptor acceptor{ioc};
  std::vector<std::thread> threads;
  // Requests are handled (chat template, tokenizer, engine submission) on these threads, not on
  // the I/O threads: an 8 MB prompt takes a quarter second to tokenize and would stall every
  // stream sharing the I/O thread. Answers come back through the thread-safe Responder.
  net::thread_pool workers{2};
  uint16_t bound_port = 0;
  std::mutex mu;
  std::condition_variable idle_cv;
  int active_responses = 0;
  std::atomic<int> open_connections{0};
  bool stopped = false;

  Impl(ApiService& s, HttpServerOptions o) : service(s), options(std::move(o)) {}

  void response_started() {
    std::lock_guard lock(mu);
    ++active_responses;
  }
  void response_done() {
    std::lock_guard lock(mu);
    if (--active_responses == 0) idle_cv.notify_all();
  }

  net::awaitable<void> accept_loop() {
    for (;;) {
      beast::error_code ec;
      tcp::socket socket = co_await acceptor.async_accept(net::make_strand(ioc), net::redirect_error(net::use_awaitable, ec));
      if (ec) {
        if (ec == net::error::operation_aborted || !acceptor.is_open()) co_return;
        continue;  // e.g. EMFILE: keep serving the open connections
      }
      auto ex = socket.get_executor();
      if (open_connections.fetch_add(1) >= options.max_connections) {
        net::co_spawn(ex, refuse(std::move(socket)), net::detached);
        continue;
      }
      net::co_spawn(ex, session(std::move(socket)), net::detached);
    }
  }

  static void reply_now(http::response<http::string_body>& res, const HttpResponse& r, bool keep_alive) {
    res.result(static_cast<http::status>(r.status));
    res.set(http::field::server, "glmserve");
    res.set(http::field::content_type, r.content_type);
    for (const auto& [k, v] : r.headers) res.set(k, v);
    res.body() = r.body;
    res.keep_alive(keep_alive);
    res.prepare_payload();
  }

  net::awaitable<bool> write_plain(beast::tcp_stream& stream, const HttpResponse& r, bool keep_alive, int version) {
    http::response<http::string_body> res;
    res.version(version);
    reply_now(res, r, keep_alive);
    beast::error_code ec;
    stream.expires_after(std::chrono::seconds(60));
    co_await http::async_write(stream, res, net::redirect_error(net::use_awaitable, ec));
    co_return !ec;
  }

  // One connection past max_connections: a 503 saying so, then closed.
  net::awaitable<void> refuse(tcp::socket socket) {
    beast::tcp_stream stream(std::move(socket));
    HttpResponse r;
    r.status = 503;
    r.body = error_body(ApiError{503, "Too many open connections (" + std::to_string(options.max_connections) +
                                          "); retry later.", "", 1.0});
    r.headers.emplace_back("Retry-After", "1");
    service.metrics().count_http(503, "", "");
    co_await write_plain(stream, r, false, 11);
    beast::error_code ec;
    stream.socket().shutdown(tcp::socket::shutdown_both, ec);
    --open_connections;
  }

  static std::chrono::milliseconds millis(double seconds) {
    return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
  }

  // The next request into `parser`: idle until its first bytes (idle_timeout), then its headers
  // (header_timeout, answering "Expect: 100-continue" where the body may come) and its body
  // (body_timeout). The error where it stopped, or none.
  net::awaitable<beast::error_code> read_request(beast::tcp_stream& stream, beast::flat_buffer& buffer,
                                                 http::request_parser<http::string_body>& parser) {
    beast::error_code ec;
    if (buffer.size() == 0) {
      stream.expires_after(millis(options.idle_timeout_seconds));
      const size_t n = co_await stream.async_read_some(buffer.prepare(4096), net::redirect_error(net::use_awaitable, ec));
      buffer.commit(n);
      if (ec) co_return ec;
    }
    stream.expires_after(millis(options.header_timeout_seconds));
    co_await http::async_read_header(stream, buffer, parser, net::redirect_error(net::use_awaitable, ec));
    if (!ec && parser.get()[http::field::expect] == "100-continue" &&
        (!parser.content_length() || *parser.content_length() <= options.max_body_bytes)) {
      http::response<http::empty_body> cont{http::status::continue_, parser.get().version()};
      co_await http::async_write(stream, cont, net::redirect_error(net::use_awaitable, ec));
    }
    if (!ec) {
      stream.expires_after(millis(options.body_timeout_seconds));
      co_await http::async_read(stream, buffer, parser, net::redirect_error(net::use_awaitable, ec));
    }
    co_return ec;
  }

  // Whether a read error is the client going away or going quiet (no answer is owed).
  static bool connection_ended(const beast::error_code& ec) {
    return ec == http::error::end_of_stream || ec == net::error::eof || ec == net::error::connection_reset ||
           ec == beast::error::timeout || ec == net::error::operation_aborted;
  }

  // The answer to a request that could not be read: 413 for a body over the limit, 431 for
  // headers over theirs, 400 otherwise.
  net::awaitable<void> answer_unreadable(beast::tcp_stream& stream, const beast::error_code& ec) {
    ApiError error{400, "Malformed HTTP request: " + ec.message(), "", 0.0};
    if (ec == http::error::body_limit)
      error = ApiError{413, "Request body is too large (limit " + std::to_string(options.max_body_bytes) + " bytes)", "", 0.0};
    else if (ec == http::error::header_limit)
      error = ApiError{431, "Request headers are too large", "", 0.0};
    HttpResponse r;
    r.status = error.status;
    r.body = error_body(error);
    service.metrics().count_http(error.status, "", "");  // answered before the request was read
    co_await write_plain(stream, r, false, 11);
  }

  // The request as the service takes it: method, target, headers (names lower-cased), body and
  // the client's address.
  static HttpRequest service_request(http::request<http::string_body>& req, beast::tcp_stream& stream) {
    HttpRequest request;
    request.method = std::string(req.method_string());
    request.target = std::string(req.target());
    for (const auto& field : req) request.headers[lower(std::string(field.name_string()))] = std::string(field.value());
    request.body = std::move(req.body());
    beast::error_code peer_ec;
    const auto peer = stream.socket().remote_endpoint(peer_ec);
    request.client = peer_ec ? "unknown" : peer.address().to_string();
    return request;
  }

  // Watches for the client going away while the answer is produced (the caller keeps the returned
  // watch alive and sets *watching false to end it). The peek must never block: it runs on the
  // connection's strand, and a blocking receive after a spurious readiness would stall the
  // response writer behind it. A spurious wake re-arms the watch; bytes from the client (a
  // pipelined request) end it.
  static std::shared_ptr<std::function<void()>> watch_for_disconnect(tcp::socket& socket,
                                                                     const std::shared_ptr<ConnResponder>& responder,
                                                                     const std::shared_ptr<bool>& watching) {
    auto watch = std::make_shared<std::function<void()>>();
    *watch = [&sock = socket, responder, watching, again = std::weak_ptr(watch)] {
      sock.async_wait(tcp::socket::wait_read, [&sock, responder, watching, again](beast::error_code wec) {
        if (!*watching || wec == net::error::operation_aborted) return;
        char byte;
        const ssize_t n = ::recv(sock.native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
          if (auto rearm = again.lock()) (*rearm)();
          return;
        }
        if (n <= 0) responder->disconnect();  // orderly close (0) or a socket error
      });
    };
    (*watch)();
    return watch;
  }

  // Writes what the service hands the responder, as it comes: a whole response, or a streamed
  // head, chunks and the last chunk; waits on the responder's signal in between. False where a
  // write failed or the client went away.
  net::awaitable<bool> write_responses(beast::tcp_stream& stream, ConnResponder& responder, bool keep_alive,
                                       int version) {
    beast::error_code ec;
    bool done = false, ok = true, streaming = false;
    std::optional<http::response<http::empty_body>> head;
    std::optional<http::response_serializer<http::empty_body>> serializer;
    while (!done && ok) {
      for (auto& item : responder.take()) {
        if (!ok || done) break;
        if (auto* r = std::get_if<HttpResponse>(&item)) {
          ok = co_await write_plain(stream, *r, keep_alive, version);
          done = true;
        } else if (auto* b = std::get_if<ConnResponder::Begin>(&item)) {
          head.emplace(http::status::ok, version);
          head->result(static_cast<http::status>(b->head.status));
          head->set(http::field::server, "glmserve");
          head->set(http::field::content_type, b->head.content_type);
          for (const auto& [k, v] : b->head.headers) head->set(k, v);
          head->keep_alive(keep_alive);
          head->chunked(true);
          serializer.emplace(*head);
          stream.expires_after(std::chrono::seconds(60));
          co_await http::async_write_header(stream, *serializer, net::redirect_error(net::use_awaitable, ec));
          ok = !ec;
          streaming = true;
        } else if (auto* d = std::get_if<ConnResponder::Data>(&item)) {
          if (!streaming || d->bytes.empty()) continue;
          stream.expires_after(std::chrono::seconds(60));
          co_await net::async_write(stream, http::make_chunk(net::buffer(d->bytes)),
                                    net::redirect_error(net::use_awaitable, ec));
          ok = !ec;
        } else {
          if (streaming) {
            stream.expires_after(std::chrono::seconds(60));
            co_await net::async_write(stream, http::make_chunk_last(), net::redirect_error(net::use_awaitable, ec));
            ok = !ec;
          }
          done = true;
        }
      }
      if (done || !ok) break;
      if (responder.disconnected()) co_return false;
      if (responder.has_items()) continue;  // runs on the strand: no wake can slip in before the wait
      beast::error_code wait_ec;
      responder.signal().expires_at(net::steady_timer::time_point::max());
      co_await responder.signal().async_wait(net::redirect_error(net::use_awaitable, wait_ec));
    }
    co_return ok;
  }

  net::awaitable<void> session(tcp::socket socket) {
    struct Open {  // the connection count, however the session ends
      std::atomic<int>& count;
      ~Open() { --count; }
    } open{open_connections};
    beast::tcp_stream stream(std::move(socket));
    beast::flat_buffer buffer;
    const auto ex = stream.get_executor();
    for (;;) {
      http::request_parser<http::string_body> parser;
      parser.body_limit(options.max_body_bytes);
      parser.header_limit(static_cast<uint32_t>(options.max_header_bytes));
      const beast::error_code ec = co_await read_request(stream, buffer, parser);
      if (ec) {
        if (!connection_ended(ec)) co_await answer_unreadable(stream, ec);
        break;
      }
      http::request<http::string_body> req = parser.release();
      HttpRequest request = service_request(req, stream);
      const bool keep_alive = req.keep_alive();
      const int version = req.version();

      auto responder = std::make_shared<ConnResponder>(ex);
      response_started();
      net::post(workers, [this, request = std::move(request), responder]() mutable {
        service.handle(std::move(request), responder);
      });
      auto watching = std::make_shared<bool>(true);
      const auto watch = watch_for_disconnect(stream.socket(), responder, watching);
      const bool ok = co_await write_responses(stream, *responder, keep_alive, version);
      *watching = false;
      beast::error_code cancel_ec;
      stream.socket().cancel(cancel_ec);
      if (!ok) responder->disconnect();
      response_done();
      if (!ok || !keep_alive) break;
    }
    beast::error_code close_ec;
    stream.socket().shutdown(tcp::socket::shutdown_both, close_ec);
    stream.close();
  }
};

HttpServer::HttpServer(ApiService& service, HttpServerOptions options)
    : impl_(std::make_unique<Impl>(service, std::move(options))) {}

HttpServer::~HttpServer() { stop(); }

void HttpServer::start() {
  beast::error_code ec;
  const auto address = net::ip::make_address(impl_->options.host, ec);
  if (ec) fail("--host '" + impl_->options.host + "' is not an IP address: " + ec.message());
  const tcp::endpoint endpoint(address, impl_->options.port);
  auto& acc = impl_->acceptor;
  acc.open(endpoint.protocol(), ec);
  if (!ec) acc.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) acc.bind(endpoint, ec);
  if (!ec) acc.listen(net::socket_base::max_listen_connections, ec);
  if (ec)
    fail("cannot listen on " + impl_->options.host + ":" + std::to_string(impl_->options.port) + ": " + ec.message());
  impl_->bound_port = acc.local_endpoint().port();
  net::co_spawn(impl_->ioc, impl_->accept_loop(), net::detached);
  const int n = std::max(1, impl_->options.threads);
  for (int i = 0; i < n; ++i) impl_->threads.emplace_back([this] { impl_->ioc.run(); });
}

uint16_t HttpServer::port() const { return impl_->bound_port; }

void HttpServer::stop_accepting() {
  net::post(impl_->ioc, [this] {
    beast::error_code ec;
    impl_->acceptor.close(ec);
  });
}

bool HttpServer::wait_idle(double timeout_seconds) {
  std::unique_lock lock(impl_->mu);
  return impl_->idle_cv.wait_for(lock, std::chrono::duration<double>(timeout_seconds),
                                 [this] { return impl_->active_responses == 0; });
}

void HttpServer::stop() {
  if (impl_->stopped) return;
  impl_->stopped = true;
  impl_->ioc.stop();
  for (std::thread& t : impl_->threads)
    if (t.joinable()) t.join();
  impl_->threads.clear();
  impl_->workers.join();
}

}  // namespace glms::server
