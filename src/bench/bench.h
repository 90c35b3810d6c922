// `glmserve bench`: the whole run. Builds the prompts of every level up front (exact lengths
// through the model's tokenizer; each level gets fresh prompts so one level's requests never
// hit the prefix cache filled by another), then for each level: warm-up requests (not counted),
// a /metrics snapshot, the measured requests, a second snapshot; then prints the tables and
// detail blocks and writes the files of --output-dir.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench/dataset.h"
#include "bench/metrics.h"
#include "bench/resilience.h"
#include "bench/workload.h"

namespace glms::bench {

struct BenchConfig {
  std::string base_url = "http://127.0.0.1:8000";
  std::string model;           // sent as "model"
  std::string tokenizer;       // tokenizer.json or its folder (the served model's own)
  std::string endpoint = "/v1/completions";  // or /v1/chat/completions
  std::string api_key;
  std::string request_id_prefix;  // X-Request-Id of each request: this and its number (empty: none)
  bool flush_cache = false;       // empty the server's prefix cache in each level, after its warm-up
  std::string preset;          // informational (already applied by the caller)
  WorkloadSpec workload;       // the random dataset's prompts
  DatasetSpec dataset;         // name empty: the random dataset; else prompts read from its file
  bool token_id_prompts = false;  // send prompt ids (completions only) instead of text
  std::string extra_body;      // JSON object merged into every request body
  std::vector<double> request_rates;  // open-loop levels, in order
  std::vector<int> concurrencies;     // closed-loop levels, after the rate levels
  int rate_max_concurrency = 0;       // cap for open-loop levels (0: none)
  double burstiness = 1;
  int num_prompts = 0;       // per level; 0: automatic: rate r: max(16, ceil(60 r)); concurrency c: max(16, 4 c)
  double duration_s = 0;     // > 0: run each level for this long instead of a request count
  int warmup = -1;           // per level; -1: automatic: 1 per rate level, c per concurrency level
  uint64_t seed = 0;
  SloSpec slo;
  CostSpec cost;
  RetryPolicy retry;
  std::string circuit_breaker;  // "K:T" or empty (off)
  double timeout_s = 3600;
  bool scrape_metrics = true;
  std::string metrics_path = "/metrics";
  std::string output_dir;   // empty: no files
  std::string result_filename = "bench.json";  // the run's JSON record in output_dir
  bool progress = true;     // live line on stderr
  std::string command_line; // recorded in the JSON
};

struct BenchOutcome {
  std::vector<LevelMetrics> levels;
  size_t scheduled = 0, completed = 0, failed = 0;
  double mean_input_len = 0, mean_output_len = 0;  // over every prompt of the run (warm-ups too)
  std::string report;  // what was printed on stdout
  std::vector<std::string> files;  // written into output_dir
};

// Throws glms::Error for bad configurations and unusable tokenizers; request failures are
// reported, not thrown. Prints the report to stdout and progress to stderr.
BenchOutcome run_bench(const BenchConfig& config);

// "0.5,1,inf" -> {0.5, 1, inf}; "1,4,16" -> ints. Throw glms::Error naming `flag`.
std::vector<double> parse_double_list(const std::string& s, const std::string& flag);
std::vector<int> parse_int_list(const std::string& s, const std::string& flag);

}  // namespace glms::bench
