// Bench reports: the write-ups' tables (Markdown pipes, pasteable into docs), a detail block
// per level in the layout of `vllm bench serve`, and the files of --output-dir: JSON, CSV,
// per-request CSV and SVG charts.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/loadgen.h"
#include "bench/metrics.h"

namespace glms::bench {

// Open-loop levels: Sustained RPS | Aggregate tok/s | TTFT p50 / p95 | Success | Measured req/s.
// Aggregate tok/s is output tokens per second (the write-ups' "throughput").
std::string rate_table(const std::vector<LevelMetrics>& levels);
// Closed-loop levels: Concurrency | tok/s/GPU | tok/s/user | Output tok/s | TTFT p50 / p95 |
// E2E p50 | Success. tok/s/GPU is total (input + output) tok/s over --num-gpus, as InferenceX.
std::string sweep_table(const std::vector<LevelMetrics>& levels);
// Cost lines ($/M tokens, tok/s per MW) when a price or power was given; empty otherwise.
std::string cost_table(const std::vector<LevelMetrics>& levels, const CostSpec& cost);
// The vllm-bench-serve-style block for one level.
std::string detail_block(const LevelMetrics& m, const SloSpec& slo);

nlohmann::json level_json(const LevelMetrics& m);
// Header plus one row per level.
std::string levels_csv(const std::vector<LevelMetrics>& levels);
// One row per request of every level: nothing sent is missing from it.
std::string requests_csv(const std::vector<std::pair<std::string, const LevelResult*>>& levels);
std::string csv_field(const std::string& s);

// Charts: total tok/s/GPU against tok/s/user (every level), and TTFT p50/p95 against the
// request rate (open-loop levels) or the concurrency (closed-loop levels).
std::string throughput_interactivity_svg(const std::vector<LevelMetrics>& levels);
std::string ttft_svg(const std::vector<LevelMetrics>& levels, bool by_rate);

}  // namespace glms::bench
