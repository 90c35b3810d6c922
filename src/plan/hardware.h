// The GPU catalogue of `glmserve plan`: memory, bandwidth, dense peak rates, power, link
// bandwidth and an indicative price per GPU-hour, from public datasheets (docs/planning.md
// lists the sources). Rows may also carry figures measured on this project's machines; the
// planner prefers a measured figure over the datasheet one and says which it used.
#pragma once

#include <string>
#include <vector>

namespace glms::plan {

struct GpuSpec {
  std::string name;             // catalogue key: "mi355x", "h200", ...
  std::string description;      // "AMD Instinct MI355X (OAM)"
  double memory_bytes = 0;      // HBM capacity, decimal bytes (288 GB = 288e9)
  double bandwidth = 0;         // HBM bytes/s, datasheet
  double bf16_flops = 0;        // dense (no sparsity) FLOP/s
  double fp8_flops = 0;
  double fp6_flops = 0;         // 0: no FP6 units
  double fp4_flops = 0;         // 0: no FP4 units
  double power_watts = 0;       // board power (TBP / TDP)
  double link_bandwidth = 0;    // GPU-to-GPU bytes/s per direction, all links together
  double usd_per_gpu_hour = 0;  // indicative rental price
  // Measured here (0 when not measured). Bandwidth is a copy test's bytes read + written.
  double measured_bandwidth = 0;
  double measured_bf16_flops = 0;
  double measured_fp8_flops = 0;
};

const std::vector<GpuSpec>& gpu_catalogue();
// The row named `name` (case-insensitive); throws glms::Error listing the known names.
const GpuSpec& find_gpu(const std::string& name);

// A figure and where it came from ("measured" or "datasheet").
struct Rate {
  double value = 0;
  std::string source;
  std::string precision;  // for compute rates: "bf16", "fp8", "fp6", "fp4"
};

Rate effective_bandwidth(const GpuSpec& gpu);
// The GEMM rate for weights in `format` (bf16, fp8, mxfp6, mxfp4): the format's own units when
// the GPU has them, else the next wider precision the weights are converted to on the fly
// (MX weights on a GPU without FP4/FP6 units run as W4A8/W6A8 at the FP8 rate).
Rate effective_gemm_rate(const GpuSpec& gpu, const std::string& format);

}  // namespace glms::plan
