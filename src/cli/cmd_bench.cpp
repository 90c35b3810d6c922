// glmserve bench: load-test any OpenAI-compatible server (glmserve, vLLM, SGLang) the way the
// write-ups measure: open-loop request-rate sweeps and closed-loop concurrency sweeps, exact
// prompt lengths through the model's tokenizer, TTFT/TPOT/ITL/E2E percentiles, goodput, cost,
// and tables + JSON + CSV + SVG. A --preset fills in a write-up's run; any explicit flag
// overrides the preset's value (giving --request-rate or --max-concurrency replaces both of the
// preset's level lists). See docs/benchmarks.md.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fmt/format.h>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "bench/bench.h"
#include "bench/workload.h"
#include "cli/commands.h"
#include "cli/peer_flag_table.h"
#include "cli/validators.h"
#include "core/error.h"

namespace glms::cli {

namespace {

// vLLM's bench loads --model's tokenizer: here its folder, or its snapshot where --model is a repo id
// in the Hugging Face hub cache; "" where it is neither (a served name such as "tiny").
std::string tokenizer_of_model_name(const std::string& model) {
  std::string path = model;
  return local_path_or_cached_repo()(path).empty() ? path : "";  // the validator's message: neither
}

struct BenchArgs {
  bench::BenchConfig cfg;
  std::string preset;
  int input_len = 1024, output_len = 128;
  double prefix_hit = 0;
  std::string request_rates, concurrencies, slo;
  int num_prompts = 0, warmup = -1;
  double retry_backoff = 0.5;
  double max_failure_rate = 0;  // the share of failed requests beyond which bench exits non-zero
  bool no_metrics = false, no_progress = false;
  // vLLM's `bench serve` and SGLang's bench_serving flags (docs/benchmarks.md).
  std::string host, dataset_name = "random", backend, served_model_name, result_filename;
  std::vector<std::string> goodput;  // KEY:VALUE in ms, as --slo's items
  std::string output_file;           // SGLang's --output-file
  double range_ratio = 0;            // vLLM's meaning, or SGLang's with --backend sglang
  int port = 0, random_prefix_len = 0;
  std::string dataset_path;
  int sharegpt_output_len = 0, sharegpt_context_len = 0, custom_output_len = 0;
  // vLLM's prefix_repetition dataset: prompts of one of N random prefixes and a random suffix
  int repetition_prefix_len = 256, repetition_suffix_len = 256, repetition_num_prefixes = 10,
      repetition_output_len = 128;
  bool save_result = false;
  // Sampling fields every request carries, by name (vLLM's --temperature, --top-p, ...), as given.
  std::map<std::string, std::string> sampling;
  GivenFlags nothing_to_set;
};

// vLLM's bench flags with nothing to set here (cli/peer_flag_table.h).
constexpr FlagWithNothingToSet kBenchFlagsWithNothingToSet[] = {
    {"--ignore-eos", FlagValues::kNone, false, "output lengths are exact: every request carries ignore_eos and max_tokens"},
    {"--percentile-metrics", FlagValues::kOne, false, "the tables give p50, p90, p95 and p99 of TTFT, TPOT, ITL and E2EL"},
    {"--metric-percentiles", FlagValues::kOne, false, "the tables give p50, p90, p95 and p99 of TTFT, TPOT, ITL and E2EL"},
    {"--tokenizer-mode", FlagValues::kOne, false, "the tokenizer.json is read by glmserve's own tokenizer"},
    {"--trust-remote-code", FlagValues::kNone, false, "no code is run from the tokenizer's folder"},
    {"--label", FlagValues::kOne, false, "bench.json records the command line, git revision, machine and date"},
    {"--metadata", FlagValues::kSeveral, false, "bench.json records the command line, git revision, machine and date"},
    {"--append-result", FlagValues::kNone, false, "each run writes its own files in --result-dir"},
    {"--save-detailed", FlagValues::kNone, false, "requests.csv holds every request's timings"},
    {"--ready-check-timeout-sec", FlagValues::kOne, false, "requests start at once; a server that is not ready fails them"},
    {"--profile", FlagValues::kNone, true, "the server is not profiled through the API: tools/gpu/profile-step runs nsys"},
    {"--use-beam-search", FlagValues::kNone, true, "beam search is not served"},
    {"--custom-skip-chat-template", FlagValues::kNone, false,
     "custom prompts are sent as they are; --backend openai-chat sends them as chat messages"},
    // SGLang's bench_serving.
    {"--disable-stream", FlagValues::kNone, false, "requests stream: their first token's time needs it"},
    {"--return-logprob", FlagValues::kNone, false,
     "no logprobs are asked (--extra-body '{\"logprobs\": 1}' asks them)"},
    {"--apply-chat-template", FlagValues::kNone, false,
     "prompts are sent as they are (random tokens or a dataset's text); --backend openai-chat sends them as chat "
     "messages"},
    {"--output-details", FlagValues::kNone, false, "requests.csv holds every request's timings"},
    {"--pd-separated", FlagValues::kNone, true, "prefill/decode disaggregation is not served"},
    {"--lora-name", FlagValues::kOne, true, "LoRA adapters are not served"},
};

std::string preset_names() {
  std::string s;
  for (const auto& p : bench::presets()) s += (s.empty() ? "" : ", ") + p.name + " (" + p.description + ")";
  return s;
}

// The options whose presence decides between a preset's value and the flag's.
struct ExplicitOptions {
  CLI::Option *preset, *input_len, *output_len, *prefix_hit, *rates, *concurrencies, *num_prompts, *warmup;
};

// Where requests go and as whom.
void add_server_options(CLI::App* cmd, BenchArgs& a) {
  bench::BenchConfig& c = a.cfg;
  cmd->add_option("--base-url", c.base_url, "Server address, http://host:port[/prefix]")->capture_default_str();
  cmd->add_option("--model", c.model, "Model name sent in requests (as the server lists it)")->required();
  cmd->add_option("--tokenizer", c.tokenizer,
                  "The served model's tokenizer.json or its folder, or a Hugging Face repo id in the hub cache "
                  "(default: --model where that is a local folder or a cached repo id)")
      ->transform(local_path_or_cached_repo());
  cmd->add_option("--host", a.host, "Server host, with --port, instead of --base-url (vLLM's and SGLang's form)");
  cmd->add_option("--port", a.port, "Server port, with --host")->check(CLI::Range(1, 65535));
  cmd->add_option("--endpoint", c.endpoint, "/v1/completions or /v1/chat/completions")->capture_default_str();
  cmd->add_option("--api-key", c.api_key, "Sent as Authorization: Bearer KEY");
  cmd->add_option("--request-id-prefix", c.request_id_prefix,
                  "Each request carries an X-Request-Id header: this prefix and its number in the run (vLLM's flag)");
  cmd->add_flag("--flush-cache", c.flush_cache,
                "Empty the server's prefix cache in each level after its warm-up (POST /flush_cache, else "
                "/reset_prefix_cache; SGLang's flag)");
  cmd->add_option("--served-model-name", a.served_model_name,
                  "The model name requests carry, where --model names the tokenizer's folder (vLLM's form)");
}

// The prompts: a preset's or the flags' lengths and shared prefixes.
void add_workload_options(CLI::App* cmd, BenchArgs& a, ExplicitOptions& o) {
  bench::BenchConfig& c = a.cfg;
  o.preset = cmd->add_option("--preset", a.preset, "A write-up's run: " + preset_names() + "; flags override its values");
  o.input_len = cmd->add_option("--input-len,--random-input-len,--random-input", a.input_len, "Prompt tokens (default 1024)")
                    ->check(positive_number());
  o.output_len = cmd->add_option("--output-len,--random-output-len,--random-output", a.output_len,
                                 "Output tokens, sent as max_tokens with ignore_eos (default 128)")
                     ->check(positive_number());
  cmd->add_option("--range-ratio,--random-range-ratio", a.range_ratio,
                  "Lengths uniform in [len*(1-r), len*(1+r)], r below 1 (with --backend sglang, SGLang's "
                  "[len*r, len], r up to 1)")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--dataset-name", a.dataset_name,
                  "random: prompts of random tokens at exact lengths; sharegpt: a ShareGPT JSON file's first turns; "
                  "custom: a JSON-lines file of {\"prompt\": ...}; prefix_repetition: random prompts that share "
                  "one of a few prefixes (vLLM's and SGLang's flag)")
      ->capture_default_str();
  cmd->add_option("--prefix-repetition-prefix-len", a.repetition_prefix_len,
                  "prefix_repetition: tokens of each shared prefix (default 256)")
      ->check(positive_number());
  cmd->add_option("--prefix-repetition-suffix-len", a.repetition_suffix_len,
                  "prefix_repetition: random tokens after the prefix (default 256)")
      ->check(positive_number());
  cmd->add_option("--prefix-repetition-num-prefixes", a.repetition_num_prefixes,
                  "prefix_repetition: distinct prefixes (default 10)")
      ->check(positive_number());
  cmd->add_option("--prefix-repetition-output-len", a.repetition_output_len,
                  "prefix_repetition: output tokens of every request (default 128)")
      ->check(positive_number());
  cmd->add_option("--dataset-path", a.dataset_path, "The sharegpt or custom dataset's file")
      ->check(CLI::ExistingFile);
  cmd->add_option("--sharegpt-output-len", a.sharegpt_output_len,
                  "Output tokens of every ShareGPT request (default: the token count of its first reply)")
      ->check(positive_number());
  cmd->add_option("--sharegpt-context-len", a.sharegpt_context_len,
                  "SGLang's ShareGPT filter with this context: prompt and output of 2 tokens or more, together at "
                  "most this many (instead of vLLM's 4 / 1024 / 2048)")
      ->check(positive_number());
  cmd->add_option("--custom-output-len", a.custom_output_len,
                  "Output tokens of every custom-dataset request (default 256, as vLLM's)")
      ->check(positive_number());
  o.prefix_hit = cmd->add_option("--prefix-hit", a.prefix_hit,
                                 "Target prefix-cache hit ratio: prompts share one of --num-prefixes prefixes of "
                                 "hit*input-len tokens")
                     ->check(CLI::Range(0.0, 0.999));
  cmd->add_option("--num-prefixes", c.workload.num_prefixes, "Distinct shared prefixes (default 4)")
      ->check(positive_number());
  cmd->add_option("--random-prefix-len", a.random_prefix_len,
                  "Tokens of one prefix every prompt starts with, before its --input-len (vLLM's form of --prefix-hit)")
      ->check(non_negative_number());
}

// The levels: request rates or concurrencies, requests or seconds per level.
void add_level_options(CLI::App* cmd, BenchArgs& a, ExplicitOptions& o) {
  bench::BenchConfig& c = a.cfg;
  o.rates = cmd->add_option("--request-rate", a.request_rates,
                            "Open-loop levels, req/s, comma separated (e.g. 0.5,1,1.5,2,2.25,2.4; inf = all at once)");
  cmd->add_option("--burstiness", c.burstiness, "Gamma shape of arrival gaps: 1 = Poisson, <1 burstier")
      ->check(positive_number())
      ->capture_default_str();
  o.concurrencies = cmd->add_option("--max-concurrency", a.concurrencies,
                                    "Closed-loop levels: requests in flight, comma separated (e.g. 1,4,16,64)");
  cmd->add_option("--rate-max-concurrency", c.rate_max_concurrency, "Cap in-flight requests of request-rate levels");
  o.num_prompts = cmd->add_option("--num-prompts", a.num_prompts,
                                  "Measured requests per level (default: rate r: max(16, 60r); concurrency c: max(16, 4c))");
  CLI::Option* duration = cmd->add_option("--duration", c.duration_s, "Seconds per level instead of a request count")
                              ->check(positive_number());
  o.num_prompts->excludes(duration);
  o.warmup = cmd->add_option("--warmup,--num-warmups,--warmup-requests", a.warmup,
                             "Unmeasured requests before each level (default: 1 per rate level, c per concurrency level)")
                 ->check(non_negative_number());
  cmd->add_option("--seed", c.seed, "Seed of prompts and arrival schedules")->capture_default_str();
  cmd->add_option("--slo", a.slo, "Goodput bounds in ms, e.g. ttft:2000,tpot:50 (keys ttft, tpot, itl, e2el)");
  cmd->add_option("--goodput", a.goodput, "vLLM's form of --slo: KEY:VALUE items in ms, e.g. ttft:2000 tpot:50")
      ->expected(1, 4);
}

// What each token costs, and how the client retries and gives up.
void add_cost_and_client_options(CLI::App* cmd, BenchArgs& a) {
  bench::BenchConfig& c = a.cfg;
  cmd->add_option("--num-gpus", c.cost.num_gpus, "GPUs behind the server (for tok/s/GPU and cost)")
      ->check(positive_number())
      ->capture_default_str();
  cmd->add_option("--gpu-hour-price", c.cost.gpu_hour_price, "$ per GPU-hour (adds $ per million tokens)")
      ->check(non_negative_number());
  cmd->add_option("--power-watts", c.cost.power_watts, "Watts per GPU (adds tok/s per MW)")->check(non_negative_number());
  cmd->add_option("--retries", c.retry.retries, "Client retries per request (exponential backoff; default 0)")
      ->check(non_negative_number());
  cmd->add_option("--retry-backoff", a.retry_backoff, "First retry delay in seconds, doubled each retry (max 30)")
      ->check(positive_number())
      ->capture_default_str();
  cmd->add_option("--circuit-breaker", c.circuit_breaker,
                  "K:T: after K consecutive failures fail fast for T seconds (counted as failures)");
  cmd->add_option("--timeout", c.timeout_s, "Seconds per request attempt")->check(positive_number())->capture_default_str();
  cmd->add_flag("--token-ids,--tokenize-prompt", c.token_id_prompts, "Send prompts as token ids (/v1/completions only)");
  cmd->add_option("--extra-body,--extra-request-body", c.extra_body, "JSON object merged into every request body");
  for (const char* field : {"temperature", "top_p", "top_k", "min_p", "repetition_penalty", "frequency_penalty",
                            "presence_penalty", "logprobs"}) {
    std::string flag = std::string("--") + field;
    std::replace(flag.begin(), flag.end(), '_', '-');
    cmd->add_option_function<std::string>(
           flag, [&a, field](const std::string& value) { a.sampling[field] = value; },
           std::string("Sent as ") + field + " in every request (vLLM's sampling flags)")
        ->check(CLI::Number);
  }
}

// What the run reads besides its requests and what it writes.
void add_output_options(CLI::App* cmd, BenchArgs& a) {
  bench::BenchConfig& c = a.cfg;
  cmd->add_flag("--no-metrics", a.no_metrics, "Do not read the server's /metrics around each level");
  cmd->add_option("--metrics-path", c.metrics_path, "Prometheus page of the server")->capture_default_str();
  cmd->add_option("--output-dir,--result-dir", c.output_dir,
                  "Write bench.json, bench.csv, requests.csv, report.md, report.html and SVG charts here");
  cmd->add_flag("--save-result", a.save_result, "Accepted: the results are written where --output-dir says");
  cmd->add_option("--backend", a.backend,
                  "vllm, sglang, openai or glmserve (any OpenAI-compatible server: /v1/completions), or openai-chat "
                  "(/v1/chat/completions)");
  cmd->add_flag("--no-progress,--disable-tqdm", a.no_progress, "No live progress line on stderr");
  cmd->add_option("--result-filename", a.result_filename, "The run's JSON record's file name (default bench.json)");
  cmd->add_option("--output-file", a.output_file,
                  "SGLang's: the run's JSON record at this path (the other files go beside it)");
  add_flags_with_nothing_to_set(cmd->add_option_group("vLLM's bench flags with nothing to set"),
                                kBenchFlagsWithNothingToSet, a.nothing_to_set);
  cmd->add_option("--max-failure-rate", a.max_failure_rate,
                  "Share of failed requests (0-1) allowed before bench exits with status 1")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
}

// An option's names as a user may have typed them: "--input-len/--random-input-len/--random-input".
std::string as_given(const CLI::Option& option) {
  std::string names = option.get_name(false, true);
  std::replace(names.begin(), names.end(), ',', '/');
  return names;
}

// vLLM's prefix_repetition dataset as the random workload: prompts of prefix + suffix tokens
// whose prefix is one of N (a prefix-cache hit of prefix / (prefix + suffix) once each is cached),
// exact lengths. The random workload's own shaping flags are refused beside it.
void resolve_prefix_repetition(const BenchArgs& a, bench::BenchConfig& cfg, const CLI::App& cmd) {
  for (const char* flag : {"--preset", "--input-len", "--output-len", "--range-ratio", "--prefix-hit",
                           "--num-prefixes", "--random-prefix-len", "--dataset-path"})
    if (cmd.count(flag) > 0)
      fail("bench: " + as_given(*cmd.get_option(flag)) +
           " does not go with --dataset-name prefix_repetition, whose --prefix-repetition-* flags shape its prompts");
  const int prefix = a.repetition_prefix_len, suffix = a.repetition_suffix_len;
  cfg.workload.input_len = prefix + suffix;
  cfg.workload.output_len = a.repetition_output_len;
  cfg.workload.prefix_hit = double(prefix) / (prefix + suffix);
  cfg.workload.num_prefixes = a.repetition_num_prefixes;
  cfg.workload.range_ratio = 0;
}

// The dataset's flags checked against each other and against the random workload's: a dataset's
// file sets the prompts and their lengths, so the random workload's flags are refused beside it.
void resolve_dataset(const BenchArgs& a, bench::BenchConfig& cfg, const CLI::App& cmd) {
  const std::string& name = a.dataset_name;
  const bool sharegpt = name == "sharegpt", custom = name == "custom";
  if (name == "prefix_repetition") return resolve_prefix_repetition(a, cfg, cmd);
  for (const char* flag : {"--prefix-repetition-prefix-len", "--prefix-repetition-suffix-len",
                           "--prefix-repetition-num-prefixes", "--prefix-repetition-output-len"})
    if (cmd.count(flag) > 0) fail(std::string("bench: ") + flag + " goes with --dataset-name prefix_repetition");
  if (name != "random" && !sharegpt && !custom)
    fail("bench: --dataset-name " + name + ": expects one of " + bench::kDatasetNames +
         ", prefix_repetition (random tokens at exact lengths, a ShareGPT JSON file, a JSON-lines file of prompts, "
         "random prompts sharing a few prefixes)");
  if (!sharegpt && (cmd.count("--sharegpt-output-len") > 0 || cmd.count("--sharegpt-context-len") > 0))
    fail("bench: --sharegpt-output-len and --sharegpt-context-len go with --dataset-name sharegpt");
  if (!custom && cmd.count("--custom-output-len") > 0)
    fail("bench: --custom-output-len goes with --dataset-name custom");
  if (name == "random") {
    if (!a.dataset_path.empty())
      fail("bench: --dataset-path " + a.dataset_path + " goes with --dataset-name sharegpt or custom; the random "
           "dataset makes its prompts");
    return;
  }
  if (a.dataset_path.empty())
    fail("bench: --dataset-name " + name + " needs --dataset-path FILE" +
         (sharegpt ? " (e.g. ShareGPT_V3_unfiltered_cleaned_split.json of the Hugging Face dataset "
                     "anon8231489123/ShareGPT_Vicuna_unfiltered; bench downloads nothing)"
                   : " (JSON lines, each {\"prompt\": \"...\"})"));
  for (const char* flag : {"--preset", "--input-len", "--output-len", "--range-ratio", "--prefix-hit",
                           "--num-prefixes", "--random-prefix-len"})
    if (cmd.count(flag) > 0)
      fail("bench: " + as_given(*cmd.get_option(flag)) + " shapes the random dataset's prompts; --dataset-name " +
           name + " reads them from " + a.dataset_path +
           (sharegpt ? " (--sharegpt-output-len sets their output lengths)" : " (--custom-output-len sets their "
                                                                              "output lengths)"));
  cfg.dataset.name = name;
  cfg.dataset.path = a.dataset_path;
  cfg.dataset.output_len = sharegpt ? a.sharegpt_output_len : a.custom_output_len;
  cfg.dataset.context_len = a.sharegpt_context_len;
  // SGLang's bench filters ShareGPT its own way; its --sharegpt-context-len asks for that filter.
  cfg.dataset.sglang_filter = sharegpt && (a.backend == "sglang" || a.sharegpt_context_len > 0);
  cfg.dataset.seed = cfg.seed;
}

// vLLM's and SGLang's bench flags in the configuration: the dataset, --host/--port as the base
// URL, the tokenizer from --model's folder and --backend openai-chat as the chat endpoint.
void resolve_peer_bench_flags(const BenchArgs& a, bench::BenchConfig& cfg, const CLI::App& cmd) {
  resolve_dataset(a, cfg, cmd);
  if ((!a.host.empty() || a.port > 0) && cmd.count("--base-url") > 0)
    fail("bench: give the server as --base-url or as --host and --port, not both");
  if (!a.host.empty() || a.port > 0)
    cfg.base_url = "http://" + (a.host.empty() ? std::string("127.0.0.1") : a.host) + ":" +
                   std::to_string(a.port > 0 ? a.port : 8000);
  if (cfg.tokenizer.empty()) cfg.tokenizer = tokenizer_of_model_name(cfg.model);
  static const char* const kBackends[] = {"vllm", "sglang", "openai", "glmserve", "openai-chat", "vllm-chat"};
  if (!a.backend.empty() &&
      std::none_of(std::begin(kBackends), std::end(kBackends), [&](const char* b) { return a.backend == b; }))
    fail("bench: --backend " + a.backend + ": expects vllm, sglang, openai or glmserve (completions), or openai-chat "
         "(chat completions); every one is an OpenAI-compatible server");
  if ((a.backend == "openai-chat" || a.backend == "vllm-chat") && cmd.count("--endpoint") == 0)
    cfg.endpoint = "/v1/chat/completions";
  if (!a.served_model_name.empty()) cfg.model = a.served_model_name;  // --model named the tokenizer
}

// vLLM's bench flags that set glmserve bench's own: --goodput as --slo, its sampling flags into
// every request, --random-prefix-len as one shared prefix, --result-filename, and its default
// request rate (inf) where no level is given. The notes go to stderr.
void apply_vllm_bench_flags(const BenchArgs& a, bench::BenchConfig& cfg, const CLI::App& cmd) {
  std::vector<std::string> notes;
  check_flags_with_nothing_to_set(kBenchFlagsWithNothingToSet, a.nothing_to_set, notes);
  if (!a.goodput.empty()) {
    if (!a.slo.empty()) fail("bench: give --slo or --goodput (the same bounds), not both");
    std::string joined;
    for (const std::string& item : a.goodput) joined += (joined.empty() ? "" : ",") + item;
    cfg.slo = bench::parse_slo(joined);
  }
  if (!a.sampling.empty()) {
    nlohmann::json body = cfg.extra_body.empty() ? nlohmann::json::object()
                                                  : nlohmann::json::parse(cfg.extra_body, nullptr, false);
    if (!body.is_object()) fail("bench: --extra-body must be a JSON object, got '" + cfg.extra_body + "'");
    for (const auto& [field, value] : a.sampling) body[field] = nlohmann::json::parse(value);
    cfg.extra_body = body.dump();
  }
  if (a.backend == "sglang" && cmd.count("--range-ratio") > 0) {
    // SGLang's lengths are uniform in [len*r, len]: the same interval as a range about its middle.
    const double r = a.range_ratio;
    cfg.workload.input_len = static_cast<int>(std::lround(cfg.workload.input_len * (1 + r) / 2));
    cfg.workload.output_len = std::max(1, static_cast<int>(std::lround(cfg.workload.output_len * (1 + r) / 2)));
    cfg.workload.range_ratio = (1 - r) / (1 + r);
    notes.push_back(fmt::format("--random-range-ratio {:g} (SGLang's: lengths in [len*r, len]): {} in and {} out, "
                                "range ratio {:.3g}",
                                r, cfg.workload.input_len, cfg.workload.output_len, cfg.workload.range_ratio));
  } else if (a.range_ratio >= 1) {
    fail("bench: --random-range-ratio must be below 1: lengths are uniform in [len*(1-r), len*(1+r)] (with "
         "--backend sglang, SGLang's [len*r, len])");
  } else {
    cfg.workload.range_ratio = a.range_ratio;
  }
  if (a.random_prefix_len > 0) {
    if (cmd.count("--prefix-hit") > 0) fail("bench: give --prefix-hit or --random-prefix-len, not both");
    cfg.workload.input_len += a.random_prefix_len;
    cfg.workload.prefix_hit = double(a.random_prefix_len) / cfg.workload.input_len;
    cfg.workload.num_prefixes = 1;
  }
  if (!a.output_file.empty()) {
    if (!a.result_filename.empty() || cmd.count("--output-dir") > 0)
      fail("bench: give --output-file, or --result-dir with --result-filename, not both");
    const std::filesystem::path file(a.output_file);
    cfg.output_dir = file.has_parent_path() ? file.parent_path().string() : ".";
    cfg.result_filename = file.filename().string();
  }
  if (!a.result_filename.empty()) {
    if (a.result_filename.find('/') != std::string::npos)
      fail("bench: --result-filename " + a.result_filename + ": a file name; --result-dir names the folder");
    cfg.result_filename = a.result_filename;
  }
  if (cfg.request_rates.empty() && cfg.concurrencies.empty()) {
    cfg.request_rates = {std::numeric_limits<double>::infinity()};
    notes.push_back("--request-rate inf (vLLM's default): every request at once; --request-rate or "
                    "--max-concurrency give levels");
  }
  for (const std::string& note : notes) std::fprintf(stderr, "bench: note: %s\n", note.c_str());
}

// The run's configuration: the preset's values first, then every explicit flag.
bench::BenchConfig resolve_config(const BenchArgs& a, const ExplicitOptions& o) {
  bench::BenchConfig cfg = a.cfg;
  if (o.preset->count()) {
    const auto p = bench::find_preset(a.preset);
    if (!p) fail("bench: unknown --preset '" + a.preset + "'; presets: " + preset_names());
    cfg.preset = p->name;
    cfg.workload.input_len = p->input_len;
    cfg.workload.output_len = p->output_len;
    cfg.workload.prefix_hit = p->prefix_hit;
    cfg.request_rates = p->request_rates;
    cfg.concurrencies = p->concurrencies;
    cfg.num_prompts = p->num_prompts;
    cfg.warmup = p->warmup;
  } else {
    cfg.workload.input_len = a.input_len;
    cfg.workload.output_len = a.output_len;
  }
  if (o.input_len->count()) cfg.workload.input_len = a.input_len;
  if (o.output_len->count()) cfg.workload.output_len = a.output_len;
  if (o.prefix_hit->count()) cfg.workload.prefix_hit = a.prefix_hit;
  if (o.rates->count() || o.concurrencies->count()) {
    cfg.request_rates =
        o.rates->count() ? bench::parse_double_list(a.request_rates, "--request-rate") : std::vector<double>{};
    cfg.concurrencies =
        o.concurrencies->count() ? bench::parse_int_list(a.concurrencies, "--max-concurrency") : std::vector<int>{};
  }
  if (o.num_prompts->count()) cfg.num_prompts = a.num_prompts;
  if (o.warmup->count()) cfg.warmup = a.warmup;
  if (cfg.duration_s > 0) cfg.num_prompts = 0;
  cfg.workload.seed = cfg.seed;
  if (!a.slo.empty()) cfg.slo = bench::parse_slo(a.slo);
  cfg.retry.base_s = a.retry_backoff;
  cfg.scrape_metrics = !a.no_metrics;
  cfg.progress = !a.no_progress;
  return cfg;
}

// A run whose requests failed is not a measurement: say so in the exit status.
void check_failures(const bench::BenchOutcome& outcome, double max_failure_rate, const std::string& output_dir) {
  const double failed = outcome.scheduled > 0 ? double(outcome.failed) / double(outcome.scheduled) : 0.0;
  if (outcome.scheduled == 0) fail("bench: no request was sent");
  if (failed > max_failure_rate)
    fail(fmt::format("bench: {} of {} requests failed ({:.1f}%), more than --max-failure-rate {:g}; the errors are "
                     "above{}",
                     outcome.failed, outcome.scheduled, failed * 100, max_failure_rate,
                     output_dir.empty() ? "" : " and in " + output_dir + "/requests.csv"));
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto a = std::make_shared<BenchArgs>();
  auto o = std::make_shared<ExplicitOptions>();
  CLI::App* cmd = app.add_subcommand("bench", "Benchmark an OpenAI-compatible server (throughput, latency, cost)");
  add_server_options(cmd, *a);
  add_workload_options(cmd, *a, *o);
  add_level_options(cmd, *a, *o);
  add_cost_and_client_options(cmd, *a);
  add_output_options(cmd, *a);
  cmd->callback([a, o, cmd] {
    bench::BenchConfig cfg = resolve_config(*a, *o);
    resolve_peer_bench_flags(*a, cfg, *cmd);
    apply_vllm_bench_flags(*a, cfg, *cmd);
    // The options as given (CLI11's config form), recorded in bench.json.
    cfg.command_line = "glmserve bench\n" + cmd->config_to_str(false, false);
    check_failures(bench::run_bench(cfg), a->max_failure_rate, cfg.output_dir);
  });
}

}  // namespace glms::cli
