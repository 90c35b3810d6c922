// The chained-launch contract of ops/cuda (src/ops/cuda/launch.cuh), checked on the sources so
// that it holds on machines without a GPU too: no kernel is launched with <<<>>> or a launch call
// of its own, and every kernel waits for the previous grid (chained_grid_prologue() first, or
// wait_for_previous_grid() in its body or in a device function of its file that it calls). A
// kernel launched chained that never waits would race with its predecessor only now and then.
#include <gtest/gtest.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The text between the brace at `open` and its match (exclusive), or "" when unbalanced.
std::string braced_body(const std::string& text, size_t open) {
  int depth = 0;
  for (size_t i = open; i < text.size(); ++i) {
    if (text[i] == '{') ++depth;
    if (text[i] == '}' && --depth == 0) return text.substr(open + 1, i - open - 1);
  }
  return "";
}

std::string first_statement(const std::string& body) {
  size_t begin = body.find_first_not_of(" \t\n");
  while (begin != std::string::npos && body.compare(begin, 2, "//") == 0)
    begin = body.find_first_not_of(" \t\n", body.find('\n', begin));
  if (begin == std::string::npos) return "";
  return body.substr(begin, body.find(';', begin) - begin + 1);
}

// Names of the __device__ functions of `text` whose bodies wait for the previous grid.
std::vector<std::string> waiting_device_functions(const std::string& text) {
  std::vector<std::string> names;
  for (size_t at = text.find("__device__"); at != std::string::npos; at = text.find("__device__", at + 1)) {
    const size_t open = text.find('{', at), paren = text.find('(', at);
    if (open == std::string::npos || paren == std::string::npos || text.find(';', at) < open) continue;
    if (braced_body(text, open).find("wait_for_previous_grid();") == std::string::npos) continue;
    size_t end = paren;
    while (end > at && text[end - 1] == ' ') --end;
    size_t begin = end;
    while (begin > at && (std::isalnum(static_cast<unsigned char>(text[begin - 1])) || text[begin - 1] == '_')) --begin;
    names.push_back(text.substr(begin, end - begin));
  }
  return names;
}

// The kernels of one source file that break the contract, by name (with the file's name first).
std::vector<std::string> kernels_without_wait(const std::string& file, const std::string& text) {
  std::vector<std::string> broken;
  const std::vector<std::string> waiting = waiting_device_functions(text);
  for (size_t at = text.find("__global__"); at != std::string::npos; at = text.find("__global__", at + 1)) {
    const size_t open = text.find('{', at);
    if (open == std::string::npos || text.find(';', at) < open) continue;  // a declaration
    const std::string body = braced_body(text, open);
    bool waits = first_statement(body) == "chained_grid_prologue();" ||
                 body.find("wait_for_previous_grid();") != std::string::npos;
    for (const std::string& name : waiting)
      if (body.find(name + "<") != std::string::npos || body.find(name + "(") != std::string::npos) waits = true;
    if (!waits) broken.push_back(file + ": " + text.substr(at, open - at));
  }
  return broken;
}

std::vector<std::filesystem::path> cuda_sources() {
  std::vector<std::filesystem::path> paths;
  for (const auto& entry : std::filesystem::directory_iterator(std::filesystem::path(GLMS_SOURCE_DIR) / "src/ops/cuda")) {
    const std::string ext = entry.path().extension().string();
    if (ext == ".cu" || ext == ".cuh") paths.push_back(entry.path());
  }
  return paths;
}

TEST(CudaSources, EveryKernelWaitsForThePreviousGrid) {
  const auto paths = cuda_sources();
  ASSERT_GT(paths.size(), 10u);
  int kernels = 0;
  for (const auto& path : paths) {
    const std::string text = read_text(path);
    for (size_t at = text.find("__global__"); at != std::string::npos; at = text.find("__global__", at + 1)) ++kernels;
    for (const std::string& kernel : kernels_without_wait(path.filename().string(), text))
      ADD_FAILURE() << "no chained_grid_prologue() or wait_for_previous_grid(): " << kernel;
  }
  EXPECT_GT(kernels, 50);
}

TEST(CudaSources, KernelsAreLaunchedOnlyThroughLaunchChained) {
  for (const auto& path : cuda_sources()) {
    const std::string text = read_text(path);
    EXPECT_EQ(text.find("<<<"), std::string::npos) << path.filename() << " launches a kernel with <<<>>>";
    if (path.filename() != "launch.cuh") {
      EXPECT_EQ(text.find("cudaLaunchKernelEx"), std::string::npos) << path.filename() << " launches on its own";
    }
  }
}

TEST(CudaSources, TheCheckFindsAKernelThatDoesNotWait) {
  const std::string good =
      "__device__ void helper(int* x) {\n  wait_for_previous_grid();\n  *x = 1;\n}\n"
      "__global__ void a_kernel(int* x) {\n  chained_grid_prologue();\n  *x = 2;\n}\n"
      "__global__ void b_kernel(int* x) { helper(x); }\n";
  EXPECT_TRUE(kernels_without_wait("good.cu", good).empty());
  const std::string bad =
      "__global__ void late_kernel(int* x) {\n  *x = 2;\n  chained_grid_prologue();\n}\n"
      "__global__ void plain_kernel(int* x) { *x = 3; }\n";
  const auto broken = kernels_without_wait("bad.cu", bad);
  ASSERT_EQ(broken.size(), 2u);
  EXPECT_NE(broken[0].find("late_kernel"), std::string::npos);
  EXPECT_NE(broken[1].find("plain_kernel"), std::string::npos);
}

}  // namespace
