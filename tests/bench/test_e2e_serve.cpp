// End-to-end: `glmserve serve --model models/glm5-tiny-code` on a free loopback port, then
// `glmserve bench` (the real binary, a scaled-down agentic preset plus a concurrency sweep)
// against it. Every scheduled request must be accounted for (successes + failures = sent) and
// the output files must exist. Skipped when build/glmserve lacks the serve or bench command.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <thread>
#include <vector>

namespace {

const std::string kBinary = GLMS_BINARY_DIR "/glmserve";
const std::string kModel = GLMS_SOURCE_DIR "/models/glm5-tiny-code";

bool has_command(const std::string& name) {
  if (!std::filesystem::exists(kBinary)) return false;
  const std::string cmd = kBinary + " " + name + " --help > /dev/null 2>&1";
  return std::system(cmd.c_str()) == 0;
}

// `glmserve serve` as a child process; the port is read from its "listening on" line.
class Server {
 public:
  Server() {
    int fds[2];
    if (pipe(fds) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(fds[1], STDOUT_FILENO);
      close(fds[0]);
      close(fds[1]);
      execl(kBinary.c_str(), kBinary.c_str(), "serve", "--model", kModel.c_str(), "--port", "0",
            "--served-model-name", "tiny", static_cast<char*>(nullptr));
      _exit(127);
    }
    close(fds[1]);
    out_ = fdopen(fds[0], "r");
    char line[1024];
    const std::regex listening(R"(listening on http://[^:]+:(\d+))");
    while (out_ && std::fgets(line, sizeof line, out_)) {
      std::cmatch m;
      if (std::regex_search(line, m, listening)) port_ = std::stoi(m[1]);
      if (std::string(line).find("glmserve: ready") != std::string::npos) break;
    }
    // Keep draining the server's stdout so it never blocks on a full pipe.
    if (out_) drain_ = std::thread([f = out_] {
      char buf[4096];
      while (std::fread(buf, 1, sizeof buf, f) > 0) {
      }
    });
  }
  ~Server() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      int status = 0;
      for (int i = 0; i < 200 && waitpid(pid_, &status, WNOHANG) == 0; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      if (waitpid(pid_, &status, WNOHANG) == 0) {
        kill(pid_, SIGKILL);
        waitpid(pid_, &status, 0);
      }
    }
    if (drain_.joinable()) drain_.join();
    if (out_) std::fclose(out_);
  }
  int port() const { return port_; }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  FILE* out_ = nullptr;
  std::thread drain_;
};

}  // namespace

TEST(BenchE2E, ScaledDownAgenticAgainstGlmserveServe) {
  if (!has_command("serve") || !has_command("bench"))
    GTEST_SKIP() << kBinary << " missing or without serve/bench: build the glmserve target first";
  Server server;
  ASSERT_GT(server.port(), 0) << "glmserve serve did not report a port";
  const auto dir = std::filesystem::path(GLMS_BINARY_DIR) / "tests" / "bench" / "e2e_serve_out";
  std::filesystem::remove_all(dir);
  const std::string cmd = kBinary + " bench --base-url http://127.0.0.1:" + std::to_string(server.port()) +
                          " --model tiny --tokenizer " + kModel +
                          " --preset agentic --input-len 64 --output-len 8 --request-rate 2,4 --max-concurrency 1,4"
                          " --num-prompts 12 --warmup 1 --slo ttft:2000,tpot:50 --num-gpus 1 --gpu-hour-price 3.41"
                          " --power-watts 1400 --timeout 30 --no-progress --output-dir " + dir.string() + " > " +
                          (dir.string() + ".stdout") + " 2>&1";
  const int rc = std::system(cmd.c_str());
  std::ifstream so(dir.string() + ".stdout");
  const std::string stdout_text((std::istreambuf_iterator<char>(so)), std::istreambuf_iterator<char>());
  ASSERT_EQ(rc, 0) << stdout_text;
  EXPECT_NE(stdout_text.find("| Offered RPS | Sustained req/s | Aggregate tok/s | TTFT p50 / p95"), std::string::npos) << stdout_text;
  EXPECT_NE(stdout_text.find("tok/s/user"), std::string::npos);
  for (const char* f : {"bench.json", "bench.csv", "requests.csv", "report.md", "throughput_vs_interactivity.svg",
                        "ttft_vs_request_rate.svg", "ttft_vs_concurrency.svg"})
    EXPECT_TRUE(std::filesystem::exists(dir / f)) << f;
  std::ifstream in(dir / "bench.json");
  const auto j = nlohmann::json::parse(in);
  ASSERT_EQ(j["levels"].size(), 4u);
  size_t sent = 0;
  for (const auto& level : j["levels"]) {
    EXPECT_EQ(level["scheduled"], 12) << level["label"];
    EXPECT_EQ(level["completed"].get<int>() + level["failed"].get<int>(), level["scheduled"].get<int>())
        << level["label"];
    const int completed = level["completed"].get<int>();
    EXPECT_EQ(level["failed"], 0) << level["label"] << ": " << level["errors"].dump();
    EXPECT_EQ(level["total_output_tokens"], completed * 8) << "ignore_eos: every output is as long as asked";
    EXPECT_EQ(level["total_input_tokens"], completed * 64) << "exact prompt lengths through the tokenizer";
    EXPECT_TRUE(level["cached_token_share"].is_number()) << "usage.prompt_tokens_details.cached_tokens";
    sent += level["scheduled"].get<size_t>();
  }
  EXPECT_EQ(j["totals"]["scheduled"], sent);
  EXPECT_EQ(j["totals"]["completed"].get<size_t>() + j["totals"]["failed"].get<size_t>(), sent);
}

// A run whose requests fail is no measurement: bench exits 1 saying how many failed (unless
// --max-failure-rate allows them) and prints N/A, not zeros, for latencies with no success.
TEST(BenchE2E, FailedRequestsGiveANonZeroExitAndNoLatencies) {
  if (!has_command("bench")) GTEST_SKIP() << kBinary << " missing or without bench";
  const auto out = std::filesystem::path(GLMS_BINARY_DIR) / "tests" / "bench" / "refused.out";
  auto run = [&](const std::string& extra) {
    // Port 1 refuses every connection at once.
    const std::string cmd = kBinary + " bench --base-url http://127.0.0.1:1 --model m --tokenizer " + kModel +
                            " --num-prompts 3 --input-len 8 --output-len 2 --request-rate inf --no-progress"
                            " --no-metrics " + extra + " > " + out.string() + " 2>&1";
    const int status = std::system(cmd.c_str());
    std::ifstream in(out);
    return std::make_pair(WIFEXITED(status) ? WEXITSTATUS(status) : -1,
                          std::string(std::istreambuf_iterator<char>(in), {}));
  };
  const auto [status, text] = run("");
  EXPECT_EQ(status, 1) << text;
  EXPECT_NE(text.find("3 of 3 requests failed (100.0%), more than --max-failure-rate 0"), std::string::npos) << text;
  EXPECT_NE(text.find("Median TTFT (ms):                        N/A"), std::string::npos) << text;
  EXPECT_EQ(text.find("Median TTFT (ms):                        0.00"), std::string::npos) << text;
  const auto [allowed, allowed_text] = run("--max-failure-rate 1");
  EXPECT_EQ(allowed, 0) << allowed_text;
}
