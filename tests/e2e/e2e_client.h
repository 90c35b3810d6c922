// A minimal blocking HTTP/1.1 client for the end-to-end tests (loopback only): one connection
// per request, Connection: close, chunked bodies decoded. Also starts and stops the server.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace glms::e2e {

struct Response {
  int status = 0;
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;                            // de-chunked
};

inline int connect_to(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

inline void send_all(int fd, const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n = ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return;
    sent += static_cast<size_t>(n);
  }
}

inline std::string request_text(const std::string& method, const std::string& path, const std::string& body,
                                 const std::map<std::string, std::string>& headers) {
  std::string req = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n";
  for (const auto& [k, v] : headers) req += k + ": " + v + "\r\n";
  if (!body.empty() || method == "POST") {
    if (!headers.count("Content-Type")) req += "Content-Type: application/json\r\n";
    req += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  }
  return req + "\r\n" + body;
}

inline Response parse_response(const std::string& raw) {
  Response r;
  const size_t head_end = raw.find("\r\n\r\n");
  if (head_end == std::string::npos || raw.size() < 12) return r;
  r.status = std::stoi(raw.substr(9, 3));
  size_t pos = raw.find("\r\n") + 2;
  while (pos < head_end) {
    const size_t eol = raw.find("\r\n", pos);
    const std::string line = raw.substr(pos, eol - pos);
    const size_t colon = line.find(':');
    std::string name = line.substr(0, colon);
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    r.headers[name] = line.substr(line.find_first_not_of(' ', colon + 1));
    pos = eol + 2;
  }
  std::string body = raw.substr(head_end + 4);
  if (r.headers["transfer-encoding"] == "chunked") {
    size_t p = 0;
    while (p < body.size()) {
      const size_t eol = body.find("\r\n", p);
      if (eol == std::string::npos) break;
      const size_t n = std::stoul(body.substr(p, eol - p), nullptr, 16);
      if (n == 0) break;
      r.body += body.substr(eol + 2, n);
      p = eol + 2 + n + 2;
    }
  } else {
    r.body = body;
  }
  return r;
}

inline Response http(int port, const std::string& method, const std::string& path, const std::string& body = "",
                     const std::map<std::string, std::string>& headers = {}) {
  const int fd = connect_to(port);
  if (fd < 0) return {};
  send_all(fd, request_text(method, path, body, headers));
  std::string raw;
  char buf[65536];
  ssize_t n;
  while ((n = recv(fd, buf, sizeof buf, 0)) > 0) raw.append(buf, static_cast<size_t>(n));
  close(fd);
  return parse_response(raw);
}

// Payloads of the "data: " lines of an SSE body.
inline std::vector<std::string> sse_payloads(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < body.size()) {
    const size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) break;
    const std::string event = body.substr(pos, end - pos);
    if (event.rfind("data: ", 0) == 0) out.push_back(event.substr(6));
    pos = end + 2;
  }
  return out;
}

// A `glmserve serve` child process on a free port.
class ServerProcess {
 public:
  ServerProcess(const std::string& binary, std::vector<std::string> args) {
    int out[2];
    if (pipe(out) != 0) throw std::runtime_error("pipe");
    pid_ = fork();
    if (pid_ == 0) {
      dup2(out[1], STDOUT_FILENO);
      close(out[0]);
      close(out[1]);
      std::vector<char*> argv;
      argv.push_back(const_cast<char*>(binary.c_str()));
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(binary.c_str(), argv.data());
      _exit(127);
    }
    close(out[1]);
    stdout_fd_ = out[0];
    // Read stdout until "glmserve: ready", collecting the port.
    std::string seen;
    char buf[4096];
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (std::chrono::steady_clock::now() < deadline) {
      const ssize_t n = read(stdout_fd_, buf, sizeof buf);
      if (n <= 0) break;
      seen.append(buf, static_cast<size_t>(n));
      const size_t at = seen.find("listening on http://127.0.0.1:");
      if (at != std::string::npos && port_ == 0) port_ = std::stoi(seen.substr(at + 30));
      if (seen.find("glmserve: ready\n") != std::string::npos) break;
    }
    output_ = seen;
    if (port_ == 0 || seen.find("glmserve: ready") == std::string::npos)
      throw std::runtime_error("server did not become ready; output:\n" + seen);
  }
  ~ServerProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (stdout_fd_ >= 0) close(stdout_fd_);
  }
  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  // What the server printed up to "glmserve: ready".
  const std::string& output() const { return output_; }
  // Sends `sig` (0: none) and waits for the exit; returns the exit status (or -1 on a crash or
  // timeout).
  int stop(int sig, double timeout_seconds) {
    if (sig != 0) kill(pid_, sig);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds);
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return -1;
  }

 private:
  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  int port_ = 0;
  std::string output_;
};

}  // namespace glms::e2e
