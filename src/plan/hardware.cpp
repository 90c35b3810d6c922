#include "plan/hardware.h"

#include <algorithm>
#include <cctype>

#include "core/error.h"

namespace glms::plan {

namespace {

constexpr double kGB = 1e9, kTB = 1e12, kTF = 1e12, kPF = 1e15;

std::vector<GpuSpec> make_catalogue() {
  std::vector<GpuSpec> rows;
  // Datasheet figures are dense (without 2:4 sparsity). Sources: docs/planning.md.
  GpuSpec mi355x;
  mi355x.name = "mi355x";
  mi355x.description = "AMD Instinct MI355X";
  mi355x.memory_bytes = 288 * kGB;
  mi355x.bandwidth = 8.0 * kTB;
  mi355x.bf16_flops = 2.5 * kPF;
  mi355x.fp8_flops = 5.0 * kPF;
  mi355x.fp6_flops = 10.1 * kPF;
  mi355x.fp4_flops = 10.1 * kPF;
  mi355x.power_watts = 1400;
  mi355x.link_bandwidth = 7 * 76.8 * kGB;  // 7 Infinity Fabric links, 153.6 GB/s both directions
  mi355x.usd_per_gpu_hour = 3.41;           // the write-up: $19,900 per month for 8 GPUs
  rows.push_back(mi355x);

  GpuSpec mi300x;
  mi300x.name = "mi300x";
  mi300x.description = "AMD Instinct MI300X";
  mi300x.memory_bytes = 192 * kGB;
  mi300x.bandwidth = 5.3 * kTB;
  mi300x.bf16_flops = 1307.4 * kTF;
  mi300x.fp8_flops = 2614.9 * kTF;
  mi300x.power_watts = 750;
  mi300x.link_bandwidth = 7 * 64 * kGB;  // 7 Infinity Fabric links, 64 GB/s per direction
  mi300x.usd_per_gpu_hour = 2.00;
  rows.push_back(mi300x);

  GpuSpec b300;
  b300.name = "b300";
  b300.description = "NVIDIA B300 (HGX, Blackwell Ultra)";
  b300.memory_bytes = 288 * kGB;
  b300.bandwidth = 8.0 * kTB;
  b300.bf16_flops = 2.25 * kPF;
  b300.fp8_flops = 4.5 * kPF;
  b300.fp6_flops = 4.5 * kPF;
  b300.fp4_flops = 13.5 * kPF;
  b300.power_watts = 1100;
  b300.link_bandwidth = 900 * kGB;  // NVLink 5: 1.8 TB/s both directions
  b300.usd_per_gpu_hour = 6.00;
  rows.push_back(b300);

  GpuSpec b200;
  b200.name = "b200";
  b200.description = "NVIDIA B200 (HGX)";
  b200.memory_bytes = 180 * kGB;
  b200.bandwidth = 8.0 * kTB;
  b200.bf16_flops = 2.25 * kPF;
  b200.fp8_flops = 4.5 * kPF;
  b200.fp6_flops = 4.5 * kPF;
  b200.fp4_flops = 9.0 * kPF;
  b200.power_watts = 1000;
  b200.link_bandwidth = 900 * kGB;  // NVLink 5: 1.8 TB/s both directions
  b200.usd_per_gpu_hour = 5.00;
  rows.push_back(b200);

  GpuSpec h200;
  h200.name = "h200";
  h200.description = "NVIDIA H200 (SXM)";
  // As cudaMemGetInfo reports it on the H200 here, 139.80 GiB (nvidia-smi: 143771 MiB; the
  // datasheet's "141 GB" are GiB): the total that serve's --gpu-memory-utilization takes a share of.
  h200.memory_bytes = 143155.0 * 1024 * 1024;
  h200.bandwidth = 4.8 * kTB;
  h200.bf16_flops = 989 * kTF;
  h200.fp8_flops = 1979 * kTF;
  h200.power_watts = 700;
  h200.link_bandwidth = 450 * kGB;  // NVLink 4: 900 GB/s both directions
  h200.usd_per_gpu_hour = 3.50;
  // Measured on one H200 (REFERENCE.md, 2026-11-29): copy, bf16 and FP8 GEMM 8192^3.
  h200.measured_bandwidth = 4.24 * kTB;
  h200.measured_bf16_flops = 778 * kTF;
  h200.measured_fp8_flops = 1417 * kTF;
  rows.push_back(h200);

  GpuSpec h100;
  h100.name = "h100";
  h100.description = "NVIDIA H100 (SXM)";
  h100.memory_bytes = 80 * kGB;
  h100.bandwidth = 3.35 * kTB;
  h100.bf16_flops = 989 * kTF;
  h100.fp8_flops = 1979 * kTF;
  h100.power_watts = 700;
  h100.link_bandwidth = 450 * kGB;
  h100.usd_per_gpu_hour = 2.50;
  rows.push_back(h100);
  return rows;
}

Rate pick(double measured, double datasheet, const std::string& precision) {
  if (measured > 0) return {measured, "measured", precision};
  return {datasheet, "datasheet", precision};
}

}  // namespace

const std::vector<GpuSpec>& gpu_catalogue() {
  static const std::vector<GpuSpec> rows = make_catalogue();
  return rows;
}

const GpuSpec& find_gpu(const std::string& name) {
  std::string key = name;
  std::transform(key.begin(), key.end(), key.begin(), [](unsigned char ch) { return std::tolower(ch); });
  std::string known;
  for (const GpuSpec& gpu : gpu_catalogue()) {
    if (gpu.name == key) return gpu;
    known += (known.empty() ? "" : ", ") + gpu.name;
  }
  fail("unknown GPU '" + name + "' (known: " + known + ")");
}

Rate effective_bandwidth(const GpuSpec& gpu) { return pick(gpu.measured_bandwidth, gpu.bandwidth, ""); }

Rate effective_gemm_rate(const GpuSpec& gpu, const std::string& format) {
  if (format == "bf16") return pick(gpu.measured_bf16_flops, gpu.bf16_flops, "bf16");
  if (format == "mxfp4" && gpu.fp4_flops > 0) return {gpu.fp4_flops, "datasheet", "fp4"};
  if (format == "mxfp6" && gpu.fp6_flops > 0) return {gpu.fp6_flops, "datasheet", "fp6"};
  if (format == "fp8" || format == "mxfp4" || format == "mxfp6") {
    if (gpu.fp8_flops > 0) return pick(gpu.measured_fp8_flops, gpu.fp8_flops, "fp8");
    return pick(gpu.measured_bf16_flops, gpu.bf16_flops, "bf16");
  }
  fail("unknown weight format '" + format + "' (bf16, fp8, mxfp6, mxfp4)");
}

}  // namespace glms::plan
