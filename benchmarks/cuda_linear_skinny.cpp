// The linear layers of a GLM-5.2 decode step at a data-parallel rank's batch (1 to 128 tokens)
// through cuBLAS, the small-batch GEMV (up to 4 tokens) and the tensor-core skinny GEMM
// (ops::cuda::linear_skinny), timed with CUDA events over --reps launches back to back (as a
// graph replays them, each chained to the last): each line gives the weights' bytes over the
// time, against the copy bandwidth --bandwidth, and each path's output against cuBLAS's
// (relative L2). Usage:
//   cuda_linear_skinny [--tokens 1,2,8,32,64] [--reps 20] [--bandwidth 4.29e12] [--json FILE]
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "micro_options.h"
#include "ops/cuda/cuda_ops.h"

namespace cuda = glms::ops::cuda;

namespace {

struct Shape {
  const char* name;
  int64_t cols;
  std::vector<int64_t> rows;  // matrices over the same x
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> token_counts = {1, 2, 8, 32, 64};
  int reps = 20;
  double bandwidth = 4.29e12;
  std::string json_path;
  if (!glms::benchmarks::parse_options(
          argc, argv,
          {{"--tokens", [&](const char* v) { token_counts = glms::benchmarks::parse_int_list(v); }},
           {"--reps", [&](const char* v) { reps = std::atoi(v); }},
           {"--bandwidth", [&](const char* v) { bandwidth = std::atof(v); }},
           {"--json", [&](const char* v) { json_path = v; }}}))
    return 2;
  if (cuda::device_count() == 0) {
    std::fprintf(stderr, "no CUDA device\n");
    return 77;
  }
  const std::vector<Shape> shapes = {
      {"q_a kv_a wk weights_proj", 6144, {2048, 576, 128, 32}},
      {"q_b wq_b", 2048, {16384, 4096}},
      {"o_proj", 16384, {6144}},
      {"shared gate_up", 6144, {4096}},
      {"shared down", 2048, {6144}},
      {"dense gate_up", 6144, {24576}},
      {"dense down", 12288, {6144}},
      {"lm_head", 6144, {154880}},
  };
  int max_tokens = 0;
  for (int n : token_counts) max_tokens = std::max(max_tokens, n);
  cuda::Stream stream;
  cuda::Event start, stop;
  cuda::Gemm cublas, gemv, skinny;
  gemv.set_small_batch_gemv(cuda::kGemvMaxTokens);
  skinny.set_skinny_gemm(cuda::kSkinnyMaxTokens, cuda::kSkinnyMaxTokens);
  std::ostringstream json;
  json << "{\"bandwidth_bytes_per_s\": " << bandwidth << ", \"points\": [";
  bool first_point = true;
  std::printf("%-26s %6s  %-7s %9s %7s %7s %9s\n", "matrices", "tokens", "path", "us", "TB/s", "x bound", "rel L2");
  for (const Shape& shape : shapes) {
    std::vector<cuda::DeviceBuffer> weights, outputs;
    double bytes = 0;
    for (size_t m = 0; m < shape.rows.size(); ++m) {
      weights.emplace_back(sizeof(uint16_t) * shape.rows[m] * shape.cols);
      cuda::fill_uniform_bf16(weights.back().as<uint16_t>(), shape.rows[m] * shape.cols, 10 + m, 0.05f, stream.get());
      outputs.emplace_back(sizeof(float) * shape.rows[m] * max_tokens);
      bytes += 2.0 * shape.rows[m] * shape.cols;
    }
    cuda::DeviceBuffer x(sizeof(uint16_t) * max_tokens * shape.cols);
    cuda::fill_uniform_bf16(x.as<uint16_t>(), max_tokens * shape.cols, 3, 1.0f, stream.get());
    for (const int n : token_counts) {
      std::vector<cuda::GemvOutput> group;
      for (size_t m = 0; m < shape.rows.size(); ++m)
        group.push_back({weights[m].as<uint16_t>(), shape.rows[m], outputs[m].as<float>(), 0});
      std::vector<float> reference;
      for (const char* path : {"cublas", "gemv", "skinny"}) {
        if (!std::strcmp(path, "gemv") && n > cuda::kGemvMaxTokens) continue;
        cuda::Gemm& gemm = !std::strcmp(path, "skinny") ? skinny : !std::strcmp(path, "gemv") ? gemv : cublas;
        auto run = [&] {
          gemm.linear_group(x.as<uint16_t>(), n, shape.cols, group.data(), static_cast<int>(group.size()),
                            stream.get());
        };
        run();
        stream.synchronize();
        std::vector<float> result(static_cast<size_t>(n) * shape.rows[0]);
        outputs[0].download(result.data(), result.size() * sizeof(float));
        if (reference.empty()) reference = result;
        const double error = glms::benchmarks::relative_l2(result, reference);
        for (int w = 0; w < 3; ++w) run();
        start.record(stream.get());
        for (int r = 0; r < reps; ++r) run();
        stop.record(stream.get());
        stream.synchronize();
        const double us = stop.elapsed_ms_since(start) * 1e3 / reps;
        const double rate = bytes / (us * 1e-6) / 1e12, bound_us = bytes / bandwidth * 1e6;
        std::printf("%-26s %6d  %-7s %9.1f %7.2f %7.2f %9.2e\n", shape.name, n, path, us, rate, us / bound_us, error);
        json << (first_point ? "" : ",") << "\n  {\"matrices\": \"" << shape.name << "\", \"tokens\": " << n
             << ", \"path\": \"" << path << "\", \"us\": " << us << ", \"bound_us\": " << bound_us
             << ", \"tb_per_s\": " << rate << ", \"rel_l2_vs_cublas\": " << error << "}";
        first_point = false;
      }
    }
  }
  json << "\n]}\n";
  if (!json_path.empty()) std::ofstream(json_path) << json.str();
  return 0;
}
