// Processes started by mpirun, one rank each (as one process per node would host its node's
// ranks): `glmserve generate` under TP2, DP2+EP2 and TP2 x DP2 gives the one-process tokens, and
// `glmserve serve` under DP2+EP2 answers over HTTP as the one-process server does and stops
// cleanly on SIGTERM to rank 0. Skipped where mpirun is missing or glmserve was built without MPI.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "e2e_client.h"

using namespace glms::e2e;
using nlohmann::json;

namespace {

const std::string kBinary = GLMS_BINARY_DIR "/glmserve";
const std::string kModel = GLMS_SOURCE_DIR "/models/glm5-tiny-code";

// stdout of `command` (stderr dropped), and its exit status.
std::pair<std::string, int> run(const std::string& command) {
  std::string out;
  FILE* pipe = popen((command + " 2>/dev/null").c_str(), "r");
  if (!pipe) return {"", -1};
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, pipe)) out.append(buf, n);
  const int status = pclose(pipe);
  return {out, WIFEXITED(status) ? WEXITSTATUS(status) : -1};
}

class MultiProcess : public ::testing::Test {
 protected:
  void SetUp() override {
    if (run("command -v mpirun").first.empty()) GTEST_SKIP() << "mpirun not found (Debian: openmpi-bin)";
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);  // CI runs as root
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    const auto [probe, status] = run(mpirun(1) + " " + kBinary + " generate --model " + kModel +
                                     " --input-ids 5 --max-tokens 1 --json");
    if (status != 0) GTEST_SKIP() << "glmserve under mpirun failed (built without MPI?)";
  }
  static std::string mpirun(int processes) {
    return "mpirun --oversubscribe --mca btl self,tcp --mca oob_tcp_if_include lo -np " + std::to_string(processes);
  }
  static std::vector<int> greedy(const std::string& prefix, const std::string& layout) {
    const auto [out, status] = run(prefix + " " + kBinary + " generate --model " + kModel +
                                   " --prompt 'import os' --max-tokens 16 --temperature 0 --json " + layout);
    EXPECT_EQ(status, 0) << layout;
    const size_t line = out.find('{');
    if (line == std::string::npos) return {};
    return json::parse(out.substr(line))["output_ids"].get<std::vector<int>>();
  }
};

}  // namespace

TEST_F(MultiProcess, GenerateUnderEveryLayoutGivesTheOneProcessTokens) {
  const std::vector<int> one = greedy("", "");
  ASSERT_EQ(one.size(), 16u);
  EXPECT_EQ(greedy(mpirun(2), "-tp 2"), one);
  EXPECT_EQ(greedy(mpirun(2), "-dp 2 --enable-expert-parallel"), one);
  EXPECT_EQ(greedy(mpirun(4), "-tp 2 -dp 2 --enable-expert-parallel"), one);
}

TEST_F(MultiProcess, ALayoutThatDoesNotMatchTheProcessesIsRefused) {
  const auto [out, status] = run(mpirun(3) + " " + kBinary + " generate --model " + kModel +
                                 " --input-ids 5 --max-tokens 1 -dp 2 --enable-expert-parallel");
  EXPECT_NE(status, 0);
}

TEST_F(MultiProcess, ServeAnswersLikeOneProcessAndStopsOnSigtermToRankZero) {
  const json body = {{"prompt", "def main():\n"}, {"temperature", 0}, {"max_tokens", 10}, {"ignore_eos", true}};
  std::string expected;
  {
    ServerProcess one(kBinary, {"serve", "--model", kModel, "--port", "0", "--max-model-len", "512"});
    expected = json::parse(http(one.port(), "POST", "/v1/completions", body.dump()).body)["choices"][0]["text"];
  }
  // mpirun's child processes: rank 0 serves, rank 1 only runs its rank.
  std::vector<std::string> args = {"--oversubscribe", "--mca", "btl", "self,tcp", "--mca", "oob_tcp_if_include", "lo",
                                   "-np", "2", kBinary, "serve", "--model", kModel, "--port", "0", "--max-model-len",
                                   "512", "-dp", "2", "--enable-expert-parallel"};
  std::string mpirun_path = run("command -v mpirun").first;
  mpirun_path = mpirun_path.substr(0, mpirun_path.find('\n'));
  ServerProcess server(mpirun_path, args);
  EXPECT_NE(server.output().find("TP1 x DP2"), std::string::npos) << server.output();
  const Response r = http(server.port(), "POST", "/v1/completions", body.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["choices"][0]["text"], expected);
  // Rank 0 drains and tells rank 1 to stop: every process ends, and mpirun with them (cleanly:
  // a SIGTERM to mpirun itself would make it exit 1 after forwarding it).
  const size_t at = server.output().find("glmserve: pid ");
  ASSERT_NE(at, std::string::npos) << server.output();
  kill(std::stoi(server.output().substr(at + 14)), SIGTERM);
  EXPECT_EQ(server.stop(0, 60.0), 0);
}

// A rank that fails mid-step (the test-only fault injection: rank 1 at its 3rd step) leaves its
// peer in another process waiting inside a collective: every process of the run ends, non-zero,
// instead of hanging; the failing one says why.
TEST_F(MultiProcess, ARankFailingMidStepEndsTheRunInsteadOfHanging) {
  const auto start = std::chrono::steady_clock::now();
  const auto [out, status] = run("{ GLMS_TEST_FAULT_RANK=1:3 timeout 60 " + mpirun(2) + " -x GLMS_TEST_FAULT_RANK " +
                                 kBinary + " generate --model " + kModel +
                                 " --prompt 'import os' --max-tokens 16 --temperature 0 -dp 2 --enable-expert-parallel"
                                 " 2>&1; }");
  EXPECT_NE(status, 0) << out;
  EXPECT_NE(status, 124) << "timed out: the run hung";
  EXPECT_NE(out.find("process 1 of 2: a step failed (rank 1: injected fault"), std::string::npos) << out;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 50.0);
}
