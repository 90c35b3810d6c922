// The HTTP/1.1 transport (Boost.Beast, C++20 coroutines; the only file that includes Beast):
// keep-alive connections, chunked SSE streaming, body and header size limits, and disconnect
// detection while a response is pending (the client's close cancels its engine requests).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace glms::server {

class ApiService;

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 8000;          // 0 = any free port (see HttpServer::port())
  int threads = 2;               // I/O threads
  size_t max_body_bytes = 8u << 20;   // larger bodies get 413
  size_t max_header_bytes = 64u << 10;
  double idle_timeout_seconds = 300;  // between requests on a keep-alive connection
  // From a request's first byte to the end of its headers, and then to the end of its body: a
  // slow or stalled client is disconnected instead of holding its connection.
  double header_timeout_seconds = 10;
  double body_timeout_seconds = 60;
  // Open connections at most; one more gets a 503 and is closed.
  int max_connections = 1024;
};

class HttpServer {
 public:
  HttpServer(ApiService& service, HttpServerOptions options);
  ~HttpServer();  // stop()s

  // Binds and listens, then serves on the I/O threads. Throws glms::Error when the address
  // cannot be bound.
  void start();
  uint16_t port() const;
  // Closes the listening socket; open connections keep being served.
  void stop_accepting();
  // Waits until no response is in progress, at most `timeout_seconds`; true when idle.
  bool wait_idle(double timeout_seconds);
  // Stops the I/O threads and closes every connection.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace glms::server
