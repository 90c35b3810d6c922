// Per-level figures of a bench run, computed from the request records (and the server's
// /metrics counters), with the definitions vllm bench serve / sglang.bench_serving use:
//   duration      level start to the end of its last request
//   throughput    successful requests, their prompt tokens, their output tokens, and the sum of
//                 both, each divided by the duration
//   TTFT          first token-bearing SSE event minus the first send of the request
//   TPOT          (E2E - TTFT) / (output tokens - 1), per request with more than one output token
//   ITL           gaps between successive token-bearing events, pooled over requests
//   E2E           last byte minus the first send
//   goodput       successful requests meeting every SLO bound, per second of duration
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <string>

#include "bench/loadgen.h"
#include "bench/prom.h"
#include "bench/stats.h"

namespace glms::bench {

// SLO bounds in milliseconds; an empty one is not checked.
struct SloSpec {
  std::optional<double> ttft_ms, tpot_ms, itl_ms, e2el_ms;
  bool empty() const { return !ttft_ms && !tpot_ms && !itl_ms && !e2el_ms; }
};
// "ttft:2000,tpot:50" (keys ttft, tpot, itl, e2el; values in ms). Throws glms::Error.
SloSpec parse_slo(const std::string& spec);

struct CostSpec {
  int num_gpus = 1;
  double gpu_hour_price = 0;  // $ per GPU-hour; 0: no $ figures
  double power_watts = 0;     // per GPU; 0: no per-MW figures
};

struct CostFigures {
  double total_tok_s_per_gpu = 0, output_tok_s_per_gpu = 0;
  double tok_s_per_user = 0;           // 1000 / median TPOT (ms); 0 without TPOT
  std::optional<double> usd_per_million_output, usd_per_million_total;
  std::optional<double> output_tok_s_per_mw, total_tok_s_per_mw;
};
// The cost formulas on their own (tested directly):
//   $/M tokens = num_gpus * gpu_hour_price / 3600 / (tok/s) * 1e6
//   tok/s per MW = tok/s / (num_gpus * power_watts / 1e6)
CostFigures cost_figures(const CostSpec& cost, double output_tok_s, double total_tok_s, double median_tpot_ms);

struct LevelMetrics {
  std::string label;          // "rate 2.4" / "concurrency 64"
  double request_rate = 0;    // target; infinity for closed-loop levels
  int max_concurrency = 0;    // 0: unlimited
  size_t scheduled = 0, completed = 0, failed = 0, not_sent = 0;  // completed + failed == scheduled
  size_t retried = 0;         // requests that needed more than one attempt
  size_t short_outputs = 0;   // successes with fewer output tokens than asked (ignore_eos ignored?)
  double duration_s = 0;
  long long input_tokens = 0, output_tokens = 0;
  double request_throughput = 0, input_throughput = 0, output_throughput = 0, total_throughput = 0;
  double success_rate = 0;    // completed / scheduled
  size_t good = 0;
  double goodput = 0;         // req/s meeting the SLO; equals request_throughput without an SLO
  Summary ttft_ms, tpot_ms, itl_ms, e2el_ms;
  std::optional<double> cached_share;  // usage cached_tokens / prompt tokens, over successes reporting it
  std::optional<double> server_prefix_hit_rate;  // server prefix_cache hits / queries
  std::optional<double> accept_length, accept_rate;
  std::string accept_length_source;  // "drafts counter", "gauge", "estimate from output tokens"
  CostFigures cost;
  std::map<std::string, size_t> errors;  // message -> count
  int breaker_opened = 0;
};

// `result` records must have completion_tokens/prompt_tokens filled (from usage, or counted by
// the caller when the server sent no usage). `counters`: the server's /metrics difference over
// the level, when it could be read.
LevelMetrics compute_metrics(const LevelResult& result, const std::optional<ServerCounters>& counters,
                             const SloSpec& slo, const CostSpec& cost);

}  // namespace glms::bench
