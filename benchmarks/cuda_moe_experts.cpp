// The routed-expert kernels of one MoE layer at GLM-5.2's shapes (hidden 6144, inter 2048,
// top-8 of 256) on one expert-parallel rank holding `--local-experts` MXFP4 experts, timed
// with CUDA events (median of --reps) for every path that takes the batch: the mma.sync
// kernels (moe_experts_mma), the W4A16 wgmma grouped GEMMs and the streamed kernels in each
// shape. Each line gives the time, the bytes of the experts the step touches over it, and that
// rate against the copy bandwidth --bandwidth; each path's output against the mma path's
// (relative L2), so a wrong kernel shows. Usage:
//   cuda_moe_experts [--tokens 8,64,128,512,1024] [--local-experts 32] [--reps 20] [--json FILE]
// --tokens are the step's tokens over every data-parallel rank (gathered), as the rank sees them.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <numeric>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "micro_options.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/moe.h"

namespace cuda = glms::ops::cuda;

namespace {

constexpr int64_t kHidden = 6144, kInter = 2048;
constexpr int kTopK = 8, kModelExperts = 256;

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> token_counts = {8, 64, 128, 256, 512, 1024};
  int local_experts = 32, reps = 20;
  double bandwidth = 4.29e12;
  std::string json_path;
  if (!glms::benchmarks::parse_options(
          argc, argv,
          {{"--tokens", [&](const char* v) { token_counts = glms::benchmarks::parse_int_list(v); }},
           {"--local-experts", [&](const char* v) { local_experts = std::atoi(v); }},
           {"--reps", [&](const char* v) { reps = std::atoi(v); }},
           {"--bandwidth", [&](const char* v) { bandwidth = std::atof(v); }},
           {"--json", [&](const char* v) { json_path = v; }}}))
    return 2;
  if (cuda::device_count() == 0) {
    std::fprintf(stderr, "no CUDA device\n");
    return 77;
  }
  const int E = local_experts;
  const int max_tokens = *std::max_element(token_counts.begin(), token_counts.end());
  const int64_t max_pairs = int64_t{max_tokens} * kTopK;
  // Weights: random codes (every E2M1 value alike), E8M0 scales 2^-7, tiled layout.
  const int64_t gate_up_codes = int64_t{E} * 2 * kInter * kHidden / 2, down_codes = int64_t{E} * kHidden * kInter / 2;
  cuda::DeviceBuffer gate_up(gate_up_codes), gate_up_scales(gate_up_codes / 16), down(down_codes),
      down_scales(down_codes / 16);
  cuda::fill_random_bytes(gate_up.as<uint8_t>(), gate_up_codes, 1, nullptr);
  cuda::fill_random_bytes(down.as<uint8_t>(), down_codes, 2, nullptr);
  cuda::fill_bytes(gate_up_scales.as<uint8_t>(), gate_up_codes / 16, 120, nullptr);
  cuda::fill_bytes(down_scales.as<uint8_t>(), down_codes / 16, 120, nullptr);
  const cuda::ExpertWeights experts{glms::ops::WeightFormat::Mxfp4, gate_up.data(), gate_up_scales.data(),
                                    down.data(), down_scales.data(), true};
  const double expert_bytes = double(2 * kInter * kHidden + kHidden * kInter) * (0.5 + 1.0 / 32);

  cuda::DeviceBuffer x(sizeof(uint16_t) * max_tokens * kHidden), ids(sizeof(int32_t) * max_pairs);
  cuda::fill_uniform_bf16(x.as<uint16_t>(), int64_t{max_tokens} * kHidden, 3, 2.0f, nullptr);
  cuda::DeviceBuffer counts(4 * (E + 1)), offsets(4 * (E + 1)), active(4 * E), num_active(4),
      sorted_pairs(4 * max_pairs), pair_slot(4 * max_pairs);
  const cuda::MoePlan plan{counts.as<int32_t>(),       offsets.as<int32_t>(),     active.as<int32_t>(),
                           num_active.as<int32_t>(),   sorted_pairs.as<int32_t>(), pair_slot.as<int32_t>()};
  cuda::DeviceBuffer act(sizeof(uint16_t) * max_pairs * kInter), out(sizeof(float) * max_pairs * kHidden),
      staged(sizeof(uint16_t) * max_pairs * kHidden), unscale(sizeof(float) * max_pairs);
  const cuda::MoeStreamBuffers stream_buffers{staged.as<uint32_t>(), unscale.as<float>()};
  cuda::Stream stream;
  cuda::Event start, stop;

  std::ostringstream json;
  json << "{\"hidden\": " << kHidden << ", \"inter\": " << kInter << ", \"local_experts\": " << E
       << ", \"bandwidth_bytes_per_s\": " << bandwidth << ", \"points\": [";
  std::printf("%7s %6s %6s %8s  %-22s %9s %7s %7s %9s\n", "tokens", "pairs", "active", "pairs/e", "path", "us",
              "TB/s", "x bound", "rel L2");
  bool first_point = true;
  for (const int n : token_counts) {
    // Each token picks 8 distinct experts of 256; this rank holds experts 0 .. E - 1.
    std::mt19937 rng(1000 + n);
    std::vector<int32_t> host_ids;
    std::vector<int32_t> all(kModelExperts);
    std::iota(all.begin(), all.end(), 0);
    for (int t = 0; t < n; ++t) {
      std::shuffle(all.begin(), all.end(), rng);
      host_ids.insert(host_ids.end(), all.begin(), all.begin() + kTopK);
    }
    std::set<int> touched;
    int local_pairs = 0;
    for (int32_t id : host_ids)
      if (id < E) touched.insert(id), ++local_pairs;
    ids.upload(host_ids.data(), host_ids.size() * sizeof(int32_t));
    const int64_t P = int64_t{n} * kTopK;
    cuda::moe_plan(ids.as<int32_t>(), P, E, plan, stream.get(), 0);
    const int max_active = static_cast<int>(std::min<int64_t>(E, P));
    // As the model sizes them: the mma kernels' chunk by this rank's share of the batch, the
    // streamed kernels' by the pairs an expert gets on average.
    const int mma_tokens = static_cast<int>((int64_t{n} * E + kModelExperts - 1) / kModelExperts);
    const int mean_pairs = std::max(1, (n * kTopK + kModelExperts - 1) / kModelExperts);
    const double bound_us = touched.size() * expert_bytes / bandwidth * 1e6;

    struct Path {
      std::string name;
      std::function<void()> run;
    };
    std::vector<Path> paths;
    paths.push_back({"mma", [&] {
                       cuda::moe_experts_mma(x.as<uint16_t>(), kHidden, kInter, experts, plan, E, kTopK, mma_tokens,
                                             max_active, act.as<uint16_t>(), out.as<float>(), stream.get());
                     }});
    paths.push_back({"wgmma", [&] {
                       cuda::moe_experts_wgmma(x.as<uint16_t>(), kHidden, kInter, experts, plan, E, kTopK, P,
                                               act.as<uint16_t>(), out.as<float>(), stream.get(), 64);
                     }});
    paths.push_back({"wgmma t128", [&] {
                       cuda::moe_experts_wgmma(x.as<uint16_t>(), kHidden, kInter, experts, plan, E, kTopK, P,
                                               act.as<uint16_t>(), out.as<float>(), stream.get(), 128);
                     }});
    paths.push_back({"wgmma rs", [&] {
                       cuda::moe_experts_wgmma_rs(x.as<uint16_t>(), kHidden, kInter, experts, plan, E, kTopK, P,
                                                  staged.as<uint32_t>(), act.as<uint16_t>(), out.as<float>(),
                                                  stream.get());
                     }});
    paths.push_back({"specialized", [&] {
                       cuda::moe_experts_specialized(x.as<uint16_t>(), kHidden, kInter, experts, plan, E, kTopK, P,
                                                     act.as<uint16_t>(), out.as<float>(), stream.get());
                     }});
    const std::pair<const char*, cuda::MoeStreamShape> shapes[] = {
        {"stream f1s8", cuda::MoeStreamShape::kFrags1Stages8},
        {"stream f2s6", cuda::MoeStreamShape::kFrags2Stages6},
        {"stream f1s6w8", cuda::MoeStreamShape::kFrags1Stages6Warps8},
        {"stream wgmma s6w8", cuda::MoeStreamShape::kWgmmaStages6Warps8},
        {"stream wgmma x2 s3w8", cuda::MoeStreamShape::kWgmmaPairsStages3Warps8}};
    for (const auto& [name, shape] : shapes)
      for (const int chunk : {mean_pairs, 2 * mean_pairs}) {
        if (chunk > 32 && chunk != mean_pairs) continue;
        const int chunk_tokens = chunk;
        paths.push_back({std::string(name) + " c" + std::to_string(chunk), [&, shape, chunk_tokens] {
                           cuda::moe_experts_stream(x.as<uint16_t>(), kHidden, kInter, experts, plan, E, kTopK,
                                                    std::min<int64_t>(P, max_pairs), chunk_tokens, max_active,
                                                    stream_buffers, act.as<uint16_t>(), out.as<float>(), stream.get(),
                                                    shape);
                         }});
      }
    std::vector<float> reference;
    for (const Path& path : paths) {
      cuda::memset_async(out.data(), 0xff, out.bytes(), stream.get());
      path.run();
      stream.synchronize();
      std::vector<float> result(static_cast<size_t>(local_pairs) * kHidden);
      out.download(result.data(), result.size() * sizeof(float));
      if (reference.empty()) reference = result;
      const double error = glms::benchmarks::relative_l2(result, reference);
      for (int w = 0; w < 3; ++w) path.run();
      std::vector<float> times;
      for (int r = 0; r < reps; ++r) {
        start.record(stream.get());
        path.run();
        stop.record(stream.get());
        stream.synchronize();
        times.push_back(stop.elapsed_ms_since(start) * 1e3f);
      }
      std::sort(times.begin(), times.end());
      const double us = times[times.size() / 2];
      const double rate = touched.size() * expert_bytes / (us * 1e-6) / 1e12;
      std::printf("%7d %6d %6zu %8.2f  %-22s %9.1f %7.2f %7.2f %9.2e\n", n, local_pairs, touched.size(),
                  double(local_pairs) / E, path.name.c_str(), us, rate, us / bound_us, error);
      json << (first_point ? "" : ",") << "\n  {\"tokens\": " << n << ", \"local_pairs\": " << local_pairs
           << ", \"active_experts\": " << touched.size() << ", \"path\": \"" << path.name << "\", \"us\": " << us
           << ", \"bound_us\": " << bound_us << ", \"tb_per_s\": " << rate << ", \"rel_l2_vs_mma\": " << error << "}";
      first_point = false;
    }
  }
  json << "\n]}\n";
  if (!json_path.empty()) std::ofstream(json_path) << json.str();
  return 0;
}
