#include "fake_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <string>

namespace glms::bench::testing {

namespace {

bool send_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

std::string chunk(const std::string& data) {
  char head[32];
  std::snprintf(head, sizeof head, "%zx\r\n", data.size());
  return head + data + "\r\n";
}

}  // namespace

FakeServer::FakeServer(FakeServerOptions options) : opt_(options) {
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  ::listen(listen_fd_, 1024);
  socklen_t len = sizeof addr;
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  acceptor_ = std::thread([this] { accept_loop(); });
}

FakeServer::~FakeServer() {
  stop_ = true;
  ::shutdown(listen_fd_, SHUT_RDWR);
  ::close(listen_fd_);
  acceptor_.join();
  {
    std::lock_guard lock(mu_);
    for (int fd : fds_) ::shutdown(fd, SHUT_RDWR);
  }
  for (auto& t : workers_) t.join();
}

void FakeServer::accept_loop() {
  while (!stop_) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    const int fd = ::accept(listen_fd_, nullptr, nullptr);
    if (fd < 0) continue;
    ++connections_;
    std::lock_guard lock(mu_);
    fds_.push_back(fd);
    workers_.emplace_back([this, fd] {
      serve(fd);
      std::lock_guard done(mu_);
      std::erase(fds_, fd);
      ::close(fd);
    });
  }
}

void FakeServer::serve(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  std::string in;
  char buf[8192];
  while (!stop_) {
    size_t head_end;
    while ((head_end = in.find("\r\n\r\n")) == std::string::npos) {
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) return;
      in.append(buf, static_cast<size_t>(n));
    }
    const std::string head = in.substr(0, head_end);
    size_t content_length = 0;
    if (auto p = head.find("Content-Length: "); p != std::string::npos) content_length = std::stoul(head.substr(p + 16));
    else if (auto q = head.find("content-length: "); q != std::string::npos) content_length = std::stoul(head.substr(q + 16));
    while (in.size() < head_end + 4 + content_length) {
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) return;
      in.append(buf, static_cast<size_t>(n));
    }
    const std::string body = in.substr(head_end + 4, content_length);
    in.erase(0, head_end + 4 + content_length);

    if (head.rfind("GET /metrics", 0) == 0) {
      const long long t = tokens_.load();
      const std::string text = "# TYPE glmserve:spec_decode_num_accepted_tokens_total counter\n"
                               "glmserve:spec_decode_num_accepted_tokens_total " + std::to_string(t / 2) + "\n"
                               "glmserve:spec_decode_num_draft_tokens_total " + std::to_string(t) + "\n";
      send_all(fd, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: " + std::to_string(text.size()) +
                       "\r\n\r\n" + text);
      continue;
    }
    if (head.rfind("POST /flush_cache", 0) == 0 || head.rfind("POST /reset_prefix_cache", 0) == 0) {
      const bool served = opt_.serves_flush_cache && head.rfind("POST /flush_cache", 0) == 0;
      if (served) {
        ++flushes_;
        std::lock_guard lock(mu_);
        post_log_.push_back("flush");
      }
      const std::string text = served ? R"({"freed_blocks":3})" : R"({"error":{"message":"Not Found"}})";
      send_all(fd, std::string(served ? "HTTP/1.1 200 OK" : "HTTP/1.1 404 Not Found") +
                       "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(text.size()) +
                       "\r\n\r\n" + text);
      continue;
    }
    {
      std::lock_guard lock(mu_);
      post_log_.push_back("request");
      if (auto p = head.find("X-Request-Id: "); p != std::string::npos)
        request_ids_.push_back(head.substr(p + 14, head.find("\r\n", p) - p - 14));
    }
    const int count = ++posts_;
    if (opt_.fail_every > 0 && count % opt_.fail_every == 0) {
      const std::string err = R"({"error":{"message":"injected failure","type":"server_error"}})";
      send_all(fd, "HTTP/1.1 " + std::to_string(opt_.fail_status) +
                       " Error\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(err.size()) +
                       "\r\n\r\n" + err);
      continue;
    }
    const auto req = nlohmann::json::parse(body, nullptr, false);
    int n = 16, prompt_tokens = 10;
    if (req.is_object()) {
      n = req.value("max_tokens", req.value("max_completion_tokens", 16));
      if (req.contains("prompt") && req["prompt"].is_array()) prompt_tokens = static_cast<int>(req["prompt"].size());
    }
    const int now = ++active_;
    for (int m = max_active_.load(); now > m && !max_active_.compare_exchange_weak(m, now);) {
    }
    bool ok = send_all(fd, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n");
    for (int i = 0; ok && i < n; ++i) {
      if (opt_.token_delay_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(opt_.token_delay_us));
      ok = send_all(fd, chunk("data: {\"choices\":[{\"index\":0,\"text\":\"t" + std::to_string(i) + " \"}]}\n\n"));
      ++tokens_;
    }
    if (ok && opt_.send_usage)
      ok = send_all(fd, chunk("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":" + std::to_string(prompt_tokens) +
                              ",\"completion_tokens\":" + std::to_string(n) +
                              ",\"prompt_tokens_details\":{\"cached_tokens\":" + std::to_string(prompt_tokens / 2) +
                              "}}}\n\n"));
    if (ok) ok = send_all(fd, chunk("data: [DONE]\n\n") + "0\r\n\r\n");
    --active_;
    if (!ok) return;
  }
}

}  // namespace glms::bench::testing
