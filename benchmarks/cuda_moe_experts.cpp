// The routed-expert kernels of one MoE layer at GLM-5.2's shapes (hidden 6144, inter 2048,
// top-8 of 256) on one expert-parallel rank holding `--local-experts` MXFP4 experts, timed
// with CUDA events (median of --reps) for every path that takes the batch: the mma.sync
// kernels (moe_experts_mma), the W4A16 wgmma grouped GEMMs and the streamed kernels in each
// shape. Each line gives the time, the bytes of the experts the step touches over it, and that
// rate against the copy bandwidth --bandwidth; each path's output against the mma path's
// (relative L2), so a wrong kernel shows. Usage:
//   cuda_moe_experts [--tokens 8,64,128,512,1024] [--local-experts 32] [--reps 20] [--json FILE]
//                    [--paths NAME,...]
// --tokens are the step's tokens over every data-parallel rank (gathered), as the rank sees them;
// --paths keeps the paths whose names contain one of the given names (the first kept path is
// the reference). "bf16 specialized" is the warp-specialised bf16 GEMMs over the experts widened
// beforehand, "widen + bf16 specialized" the same with the widening of every local expert timed
// (two buffers), "widen each + bf16 specialized" moe_experts_widened (one buffer, gate/up then
// down, as the model runs it).
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

struct Path {
  std::string name;
  std::function<void()> run;
};

// One step's routing as this rank sees it: every token's 8 distinct experts of 256, of which
// this rank holds 0 .. E - 1.
struct StepRouting {
  int tokens = 0;
  int64_t pairs = 0;       // tokens x top-8
  int local_pairs = 0;     // the pairs of this rank's experts
  size_t active = 0;       // this rank's experts the step touches
  int mma_tokens = 0;      // the mma kernels' chunk: this rank's share of the batch
  int mean_pairs = 0;      // the streamed kernels' chunk: the pairs an expert gets on average
};

// A rank's MXFP4 experts (random codes, every E2M1 value alike, E8M0 scales 2^-7, tiled layout),
// the step's buffers for up to max_tokens gathered tokens, and every expert path over them.
class ExpertBench {
 public:
  ExpertBench(int local_experts, int max_tokens)
      : E_(local_experts),
        max_pairs_(int64_t{max_tokens} * kTopK),
        gate_up_(gate_up_code_bytes(local_experts)),
        gate_up_scales_(gate_up_code_bytes(local_experts) / 16),
        down_(down_code_bytes(local_experts)),
        down_scales_(down_code_bytes(local_experts) / 16),
        x_(sizeof(uint16_t) * max_tokens * kHidden),
        ids_(sizeof(int32_t) * max_pairs_),
        counts_(4 * (E_ + 1)), offsets_(4 * (E_ + 1)), active_(4 * E_), num_active_(4),
        sorted_pairs_(4 * max_pairs_), pair_slot_(4 * max_pairs_),
        act_(sizeof(uint16_t) * max_pairs_ * kInter), out_(sizeof(float) * max_pairs_ * kHidden),
        staged_(sizeof(uint16_t) * max_pairs_ * kHidden), unscale_(sizeof(float) * max_pairs_) {
    cuda::fill_random_bytes(gate_up_.as<uint8_t>(), gate_up_.bytes(), 1, nullptr);
    cuda::fill_random_bytes(down_.as<uint8_t>(), down_.bytes(), 2, nullptr);
    cuda::fill_bytes(gate_up_scales_.as<uint8_t>(), gate_up_scales_.bytes(), 120, nullptr);
    cuda::fill_bytes(down_scales_.as<uint8_t>(), down_scales_.bytes(), 120, nullptr);
    cuda::fill_uniform_bf16(x_.as<uint16_t>(), int64_t{max_tokens} * kHidden, 3, 2.0f, nullptr);
    experts_ = {glms::ops::WeightFormat::Mxfp4, gate_up_.data(), gate_up_scales_.data(), down_.data(),
                down_scales_.data(), true};
    plan_ = {counts_.as<int32_t>(),     offsets_.as<int32_t>(),      active_.as<int32_t>(),
             num_active_.as<int32_t>(), sorted_pairs_.as<int32_t>(), pair_slot_.as<int32_t>()};
  }

  // Bytes of one expert's gate/up and down codes and scales.
  static double expert_bytes() { return double(2 * kInter * kHidden + kHidden * kInter) * (0.5 + 1.0 / 32); }

  // Routes n tokens (seeded by n) and plans this rank's pairs on the device.
  StepRouting route(int n) {
    std::mt19937 rng(1000 + n);
    std::vector<int32_t> host_ids, all(kModelExperts);
    std::iota(all.begin(), all.end(), 0);
    for (int t = 0; t < n; ++t) {
      std::shuffle(all.begin(), all.end(), rng);
      host_ids.insert(host_ids.end(), all.begin(), all.begin() + kTopK);
    }
    StepRouting r;
    r.tokens = n;
    r.pairs = int64_t{n} * kTopK;
    std::set<int> touched;
    for (int32_t id : host_ids)
      if (id < E_) touched.insert(id), ++r.local_pairs;
    r.active = touched.size();
    r.mma_tokens = static_cast<int>((int64_t{n} * E_ + kModelExperts - 1) / kModelExperts);
    r.mean_pairs = std::max(1, (n * kTopK + kModelExperts - 1) / kModelExperts);
    ids_.upload(host_ids.data(), host_ids.size() * sizeof(int32_t));
    cuda::moe_plan(ids_.as<int32_t>(), r.pairs, E_, plan_, stream_.get(), 0);
    return r;
  }

  // Every path that takes the step: the mma kernels, the grouped wgmma GEMMs (64- and 128-row
  // tiles, register-widened, warp-specialised; and the bf16 warp-specialised GEMMs over the
  // experts widened first) and the streamed kernels in each shape at the mean pairs an expert and
  // twice that.
  std::vector<Path> paths(const StepRouting& r) {
    const int64_t P = r.pairs;
    const int max_active = static_cast<int>(std::min<int64_t>(E_, P));
    uint16_t* x = x_.as<uint16_t>();
    uint16_t* act = act_.as<uint16_t>();
    float* out = out_.as<float>();
    cudaStream_t s = stream_.get();
    std::vector<Path> paths;
    paths.push_back({"mma", [=, this] {
                       cuda::moe_experts_mma(x, kHidden, kInter, experts_, plan_, E_, kTopK, r.mma_tokens, max_active,
                                             act, out, s);
                     }});
    for (const int rows : {64, 128})
      paths.push_back({rows == 64 ? "wgmma" : "wgmma t128", [=, this] {
                         cuda::moe_experts_wgmma(x, kHidden, kInter, experts_, plan_, E_, kTopK, P, act, out, s, rows);
                       }});
    paths.push_back({"wgmma rs", [=, this] {
                       cuda::moe_experts_wgmma_rs(x, kHidden, kInter, experts_, plan_, E_, kTopK, P,
                                                  staged_.as<uint32_t>(), act, out, s);
                     }});
    paths.push_back({"specialized", [=, this] {
                       cuda::moe_experts_specialized(x, kHidden, kInter, experts_, plan_, E_, kTopK, P, act, out, s);
                     }});
    paths.push_back({"bf16 specialized", [=, this] {
                       cuda::moe_experts_specialized(x, kHidden, kInter, widened(), plan_, E_, kTopK, P, act, out, s);
                     }});
    paths.push_back({"bf16 paired", [=, this] {
                       cuda::moe_experts_specialized(x, kHidden, kInter, widened(), plan_, E_, kTopK, P, act, out, s,
                                                     cuda::SpecializedTiles::kPaired);
                     }});
    paths.push_back({"bf16 persistent", [=, this] {
                       cuda::moe_experts_specialized(x, kHidden, kInter, widened(), plan_, E_, kTopK, P, act, out, s,
                                                     cuda::SpecializedTiles::kPersistent, {unit_counters()});
                     }});
    paths.push_back({"widen + bf16 specialized", [=, this] {
                       const cuda::ExpertWeights bf16 = widened();
                       widen_experts(bf16);
                       cuda::moe_experts_specialized(x, kHidden, kInter, bf16, plan_, E_, kTopK, P, act, out, s);
                     }});
    // The same through one buffer (moe_experts_widened): gate/up widened and multiplied, then down.
    for (const bool paired : {false, true})
      paths.push_back({paired ? "widen each + bf16 paired" : "widen each + bf16 specialized", [=, this] {
                         if (one_buffer_.bytes() == 0)
                           one_buffer_ = cuda::DeviceBuffer(sizeof(uint16_t) * E_ * 2 * kInter * kHidden);
                         cuda::moe_experts_widened(x, kHidden, kInter, experts_, plan_, E_, kTopK, P,
                                                   one_buffer_.as<uint16_t>(), act, out, s,
                                                   paired ? cuda::SpecializedTiles::kPaired
                                                          : cuda::SpecializedTiles::kEvery);
                       }});
    const std::pair<const char*, cuda::MoeStreamShape> shapes[] = {
        {"stream f1s8", cuda::MoeStreamShape::kFrags1Stages8},
        {"stream f2s6", cuda::MoeStreamShape::kFrags2Stages6},
        {"stream f1s6w8", cuda::MoeStreamShape::kFrags1Stages6Warps8},
        {"stream wgmma s6w8", cuda::MoeStreamShape::kWgmmaStages6Warps8},
        {"stream wgmma x2 s3w8", cuda::MoeStreamShape::kWgmmaPairsStages3Warps8}};
    const cuda::MoeStreamBuffers buffers{staged_.as<uint32_t>(), unscale_.as<float>()};
    for (const auto& [name, shape] : shapes)
      for (const int chunk : {r.mean_pairs, 2 * r.mean_pairs}) {
        if (chunk > 32 && chunk != r.mean_pairs) continue;
        paths.push_back({std::string(name) + " c" + std::to_string(chunk), [=, this, shape = shape] {
                           cuda::moe_experts_stream(x, kHidden, kInter, experts_, plan_, E_, kTopK,
                                                    std::min<int64_t>(P, max_pairs_), chunk, max_active, buffers, act,
                                                    out, s, shape);
                         }});
      }
    return paths;
  }

  // The experts as bf16 ([E, 2 inter, hidden] and [E, hidden, inter]), widened once on first use.
  cuda::ExpertWeights widened() {
    if (gate_up_bf16_.bytes() == 0) {
      gate_up_bf16_ = cuda::DeviceBuffer(sizeof(uint16_t) * E_ * 2 * kInter * kHidden);
      down_bf16_ = cuda::DeviceBuffer(sizeof(uint16_t) * E_ * kHidden * kInter);
      widen_experts({glms::ops::WeightFormat::Plain, gate_up_bf16_.data(), nullptr, down_bf16_.data(), nullptr, false});
    }
    return {glms::ops::WeightFormat::Plain, gate_up_bf16_.data(), nullptr, down_bf16_.data(), nullptr, false};
  }

  // Every local expert's MXFP4 weights widened into `bf16`'s buffers.
  void widen_experts(const cuda::ExpertWeights& bf16) {
    cuda::dequantize_experts(experts_, 0, E_, kHidden, kInter, static_cast<uint16_t*>(const_cast<void*>(bf16.gate_up)),
                             static_cast<uint16_t*>(const_cast<void*>(bf16.down)), stream_.get());
  }

  // The path's output rows of this rank's pairs (the buffer poisoned before the run).
  std::vector<float> output_of(const Path& path, int local_pairs) {
    cuda::memset_async(out_.data(), 0xff, out_.bytes(), stream_.get());
    path.run();
    stream_.synchronize();
    std::vector<float> result(static_cast<size_t>(local_pairs) * kHidden);
    out_.download(result.data(), result.size() * sizeof(float));
    return result;
  }

  // The median of `reps` timed runs after three untimed ones, in microseconds.
  double median_us(const Path& path, int reps) {
    for (int w = 0; w < 3; ++w) path.run();
    std::vector<float> times;
    for (int i = 0; i < reps; ++i) {
      start_.record(stream_.get());
      path.run();
      stop_.record(stream_.get());
      stream_.synchronize();
      times.push_back(stop_.elapsed_ms_since(start_) * 1e3f);
    }
    std::sort(times.begin(), times.end());
    return times[times.size() / 2];
  }

 private:
  // The persistent GEMMs' unit counters, zero (made on first use).
  int* unit_counters() {
    if (unit_counters_.bytes() == 0) unit_counters_ = cuda::zeroed_buffer(cuda::kUnitCounterBytes);
    return unit_counters_.as<int>();
  }
  // MXFP4 code bytes of `experts` experts' gate/up ([2 inter, hidden]) and down ([hidden, inter]).
  static int64_t gate_up_code_bytes(int experts) { return int64_t{experts} * 2 * kInter * kHidden / 2; }
  static int64_t down_code_bytes(int experts) { return int64_t{experts} * kHidden * kInter / 2; }

  int E_;
  int64_t max_pairs_;
  cuda::DeviceBuffer gate_up_, gate_up_scales_, down_, down_scales_, x_, ids_;
  cuda::DeviceBuffer counts_, offsets_, active_, num_active_, sorted_pairs_, pair_slot_;
  cuda::DeviceBuffer act_, out_, staged_, unscale_;
  cuda::DeviceBuffer gate_up_bf16_, down_bf16_;  // widened() (empty until a bf16 path runs)
  cuda::DeviceBuffer one_buffer_;                 // moe_experts_widened's (empty until it runs)
  cuda::DeviceBuffer unit_counters_;              // unit_counters()' (empty until it runs)
  cuda::ExpertWeights experts_;
  cuda::MoePlan plan_;
  cuda::Stream stream_;
  cuda::Event start_, stop_;
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> token_counts = {8, 64, 128, 256, 512, 1024};
  int local_experts = 32, reps = 20;
  double bandwidth = 4.29e12;
  std::string json_path;
  std::vector<std::string> path_filter;
  if (!glms::benchmarks::parse_options(
          argc, argv,
          {{"--tokens", [&](const char* v) { token_counts = glms::benchmarks::parse_int_list(v); }},
           {"--local-experts", [&](const char* v) { local_experts = std::atoi(v); }},
           {"--reps", [&](const char* v) { reps = std::atoi(v); }},
           {"--bandwidth", [&](const char* v) { bandwidth = std::atof(v); }},
           {"--json", [&](const char* v) { json_path = v; }},
           {"--paths", [&](const char* v) {
              std::stringstream in(v);
              for (std::string name; std::getline(in, name, ',');) path_filter.push_back(name);
            }}}))
    return 2;
  if (cuda::device_count() == 0) {
    std::fprintf(stderr, "no CUDA device\n");
    return 77;
  }
  const int E = local_experts;
  ExpertBench bench(E, *std::max_element(token_counts.begin(), token_counts.end()));
  std::ostringstream json;
  json << "{\"hidden\": " << kHidden << ", \"inter\": " << kInter << ", \"local_experts\": " << E
       << ", \"bandwidth_bytes_per_s\": " << bandwidth << ", \"points\": [";
  std::printf("%7s %6s %6s %8s  %-22s %9s %7s %7s %9s\n", "tokens", "pairs", "active", "pairs/e", "path", "us",
              "TB/s", "x bound", "rel L2");
  bool first_point = true;
  for (const int n : token_counts) {
    const StepRouting r = bench.route(n);
    const double bound_us = r.active * ExpertBench::expert_bytes() / bandwidth * 1e6;
    std::vector<float> reference;
    for (const Path& path : bench.paths(r)) {
      const bool kept = path_filter.empty() || std::any_of(path_filter.begin(), path_filter.end(), [&](const std::string& f) {
                          return path.name.find(f) != std::string::npos;
                        });
      if (!kept) continue;
      const std::vector<float> result = bench.output_of(path, r.local_pairs);
      if (reference.empty()) reference = result;
      const double error = glms::benchmarks::relative_l2(result, reference);
      const double us = bench.median_us(path, reps);
      const double rate = r.active * ExpertBench::expert_bytes() / (us * 1e-6) / 1e12;
      std::printf("%7d %6d %6zu %8.2f  %-22s %9.1f %7.2f %7.2f %9.2e\n", n, r.local_pairs, r.active,
                  double(r.local_pairs) / E, path.name.c_str(), us, rate, us / bound_us, error);
      json << (first_point ? "" : ",") << "\n  {\"tokens\": " << n << ", \"local_pairs\": " << r.local_pairs
           << ", \"active_experts\": " << r.active << ", \"path\": \"" << path.name << "\", \"us\": " << us
           << ", \"bound_us\": " << bound_us << ", \"tb_per_s\": " << rate << ", \"rel_l2_vs_mma\": " << error << "}";
      first_point = false;
    }
  }
  json << "\n]}\n";
  if (!json_path.empty()) std::ofstream(json_path) << json.str();
  return 0;
}
