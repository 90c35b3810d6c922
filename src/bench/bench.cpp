#include "bench/bench.h"

#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <thread>
#include <fmt/format.h>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>

#include "bench/html_report.h"
#include "bench/loadgen.h"
#include "bench/prom.h"
#include "bench/report.h"
#include "core/error.h"
#include "text/tokenizer.h"

namespace glms::bench {

namespace {

using nlohmann::json;

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return {};
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t c = s.find(',', pos);
    if (c == std::string::npos) c = s.size();
    out.push_back(trim(s.substr(pos, c - pos)));
    pos = c + 1;
  }
  return out;
}

// One level of the run: what to send and how.
struct LevelPlan {
  std::string label;
  LoadSpec load;
  size_t first_prompt = 0, prompt_count = 0;  // its measured prompts in the shared pool
  size_t first_warmup = 0, warmup_count = 0;
};

void raise_fd_limit() {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
}

std::string request_body(const BenchConfig& cfg, bool chat, const Prompt& p, const json& extra) {
  json body = {{"model", cfg.model}, {"stream", true}, {"stream_options", {{"include_usage", true}}},
               {"ignore_eos", true}, {"temperature", 0}};
  if (chat) {
    body["messages"] = json::array({{{"role", "user"}, {"content", p.text}}});
    body["max_completion_tokens"] = p.output_len;
  } else {
    if (cfg.token_id_prompts) body["prompt"] = p.ids;
    else body["prompt"] = p.text;
    body["max_tokens"] = p.output_len;
  }
  if (extra.is_object())
    for (auto it = extra.begin(); it != extra.end(); ++it) body[it.key()] = it.value();
  return body.dump(-1, ' ', false, json::error_handler_t::replace);
}

void write_file(const std::filesystem::path& path, const std::string& data, std::vector<std::string>& files) {
  std::ofstream out(path, std::ios::binary);
  out << data;
  if (!out) fail("bench: cannot write " + path.string());
  files.push_back(path.string());
}

std::optional<MetricSums> scrape(const ClientOptions& client, const BenchConfig& cfg, bool& enabled) {
  if (!enabled) return std::nullopt;
  try {
    return parse_prometheus(http_get(client, cfg.metrics_path, 10));
  } catch (const Error& e) {
    std::fprintf(stderr, "bench: not reading server metrics (%s)\n", e.what());
    enabled = false;
    return std::nullopt;
  }
}

}  // namespace

std::vector<double> parse_double_list(const std::string& s, const std::string& flag) {
  std::vector<double> out;
  for (const std::string& item : split_commas(s)) {
    if (item == "inf" || item == "Inf") {
      out.push_back(std::numeric_limits<double>::infinity());
      continue;
    }
    char* end = nullptr;
    const double v = std::strtod(item.c_str(), &end);
    if (item.empty() || *end != '\0' || !(v > 0))
      fail(flag + ": expected a comma-separated list of positive numbers, got '" + s + "'");
    out.push_back(v);
  }
  return out;
}

std::vector<int> parse_int_list(const std::string& s, const std::string& flag) {
  std::vector<int> out;
  for (const std::string& item : split_commas(s)) {
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 1 || v > 1'000'000)
      fail(flag + ": expected a comma-separated list of positive integers, got '" + s + "'");
    out.push_back(static_cast<int>(v));
  }
  return out;
}

namespace {

// The run's options checked against each other: a clear error for each combination that cannot run.
void check_config(const BenchConfig& cfg, bool chat) {
  if (cfg.model.empty()) fail("bench: --model is required (the model name the server serves)");
  if (cfg.tokenizer.empty()) fail("bench: --tokenizer is required (the served model's tokenizer folder)");
  if (cfg.token_id_prompts && chat) fail("bench: --token-ids works with /v1/completions only");
  if (cfg.request_rates.empty() && cfg.concurrencies.empty())
    fail("bench: nothing to run: give --request-rate and/or --max-concurrency (or a --preset)");
  if (cfg.duration_s > 0 && cfg.rate_max_concurrency == 0)
    for (double r : cfg.request_rates)
      if (std::isinf(r)) fail("bench: --duration with request rate inf needs a concurrency cap");
}

// The levels (each request rate, then each concurrency) and their places in one prompt pool:
// fresh prompts per level, its warm-up prompts apart. `pool` gets the pool's size.
std::vector<LevelPlan> plan_levels(const BenchConfig& cfg, size_t& pool) {
  std::vector<LevelPlan> plans;
  pool = 0;
  auto add_level = [&](std::string label, double rate, int concurrency) {
    LevelPlan p;
    p.label = std::move(label);
    p.load.request_rate = rate;
    p.load.burstiness = cfg.burstiness;
    p.load.max_concurrency = concurrency;
    p.load.duration_s = cfg.duration_s;
    p.load.seed = cfg.seed * 1315423911u + plans.size();
    const bool closed = std::isinf(rate);
    size_t n = cfg.num_prompts > 0 ? static_cast<size_t>(cfg.num_prompts)
               : closed           ? std::max<size_t>(16, 4 * static_cast<size_t>(concurrency))
                                  : std::max<size_t>(16, static_cast<size_t>(std::ceil(60 * rate)));
    if (cfg.duration_s > 0 && cfg.num_prompts <= 0)  // a pool that a duration run rarely exhausts
      n = closed ? std::max<size_t>(n, 64) : static_cast<size_t>(std::ceil(rate * cfg.duration_s * 1.3)) + 16;
    p.load.num_requests = n;
    p.warmup_count = cfg.warmup >= 0 ? static_cast<size_t>(cfg.warmup) : closed ? static_cast<size_t>(concurrency) : 1;
    p.first_warmup = pool;
    pool += p.warmup_count;
    p.first_prompt = pool;
    p.prompt_count = n;
    pool += n;
    plans.push_back(std::move(p));
  };
  for (double r : cfg.request_rates)
    add_level(fmt::format("rate {:g}", r), r, cfg.rate_max_concurrency);
  for (int c : cfg.concurrencies) add_level(fmt::format("concurrency {}", c), std::numeric_limits<double>::infinity(), c);
  return plans;
}

// `pool` prompts of the random workload or read from the dataset's file (progress on stderr; a
// dataset with fewer usable prompts than the run sends says so whatever --no-progress says).
std::vector<Prompt> pool_prompts(const BenchConfig& cfg, const text::Tokenizer& tok, size_t pool) {
  if (cfg.dataset.name.empty()) {
    if (cfg.progress)
      std::fprintf(stderr, "bench: making %zu prompts of %d tokens (prefix hit %.0f%%) with %s\n", pool,
                   cfg.workload.input_len, cfg.workload.prefix_hit * 100, tok.source().string().c_str());
    return make_prompts(tok, cfg.workload, pool);
  }
  if (cfg.progress)
    std::fprintf(stderr, "bench: reading %zu prompts from %s (%s) with %s\n", pool, cfg.dataset.path.c_str(),
                 cfg.dataset.name.c_str(), tok.source().string().c_str());
  size_t usable = 0;
  std::vector<Prompt> prompts = read_dataset_prompts(tok, cfg.dataset, pool, &usable);
  if (usable > 0)
    std::fprintf(stderr, "bench: note: %s has %zu usable prompts for the run's %zu requests (warm-ups included): "
                 "they are sent again in the same order, so later ones may hit the prefix cache\n",
                 cfg.dataset.path.c_str(), usable, pool);
  return prompts;
}

// The pool's request bodies, made from `pool` prompts (progress on stderr).
std::vector<RequestTemplate> make_templates(const BenchConfig& cfg, const text::Tokenizer& tok, bool chat,
                                            const json& extra, size_t pool) {
  const auto t_prep = std::chrono::steady_clock::now();
  const std::vector<Prompt> prompts = pool_prompts(cfg, tok, pool);
  std::vector<RequestTemplate> templates;
  templates.reserve(prompts.size());
  for (const Prompt& p : prompts)
    templates.push_back({request_body(cfg, chat, p, extra), static_cast<int>(p.ids.size()), p.output_len});
  if (cfg.progress)
    std::fprintf(stderr, "bench: prompts ready in %.1f s\n",
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t_prep).count());
  return templates;
}

// A level's warm-up requests, their failures reported (they do not count).
void warm_up(const ClientOptions& client, const LevelPlan& plan, const std::vector<RequestTemplate>& templates,
             const BenchConfig& cfg, const std::string& head) {
  std::vector<RequestTemplate> warm(templates.begin() + plan.first_warmup,
                                    templates.begin() + plan.first_warmup + plan.warmup_count);
  LoadSpec wl;
  wl.num_requests = warm.size();
  wl.max_concurrency = std::isinf(plan.load.request_rate) ? plan.load.max_concurrency : 0;
  CircuitBreaker off;
  LevelResult w = run_level(client, wl, warm, off);
  size_t bad = 0;
  for (const RequestRecord& r : w.records) bad += !r.success;
  if (cfg.progress && bad)
    std::fprintf(stderr, "%s warm-up: %zu of %zu requests failed (first error: %s)\n", head.c_str(), bad,
                 w.records.size(), [&] {
                   for (const auto& r : w.records)
                     if (!r.success) return r.error;
                   return std::string();
                 }().c_str());
}

// A level's requests and what they measured.
struct MeasuredLevel {
  LevelResult result;
  LevelMetrics metrics;
};

// SGLang's --flush-cache: the server's prefix cache emptied (SGLang's POST /flush_cache, else
// vLLM's /reset_prefix_cache, which vLLM serves with VLLM_SERVER_DEV_MODE=1). A 409 (requests
// still in flight, such as cut ones the server is ending) is tried again for up to 10 s; anything
// else but a 200 stops the run, since its levels would not start cold.
void flush_prefix_cache(const ClientOptions& client, const std::string& head, bool progress) {
  const char* path = "/flush_cache";
  HttpReply reply = http_call(client, true, path);
  if (reply.status == 404 || reply.status == 405) {
    path = "/reset_prefix_cache";
    reply = http_call(client, true, path);
  }
  for (int tries = 0; reply.status == 409 && tries < 20; ++tries) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    reply = http_call(client, true, path);
  }
  if (reply.status != 200)
    fail(fmt::format("--flush-cache: POST {} answered HTTP {}: {} (the server must serve SGLang's /flush_cache or "
                     "vLLM's /reset_prefix_cache, which vLLM serves with VLLM_SERVER_DEV_MODE=1)",
                     path, reply.status, error_message_from_body(reply.body)));
  if (progress) std::fprintf(stderr, "%s prefix cache flushed (POST %s)\n", head.c_str(), path);
}

// Level `index` of `count`: warm-up, then its measured requests (progress on stderr) between two
// scrapes of the server's counters where those are on; the records' token counts from the
// tokenizer where the server gave no usage.
MeasuredLevel run_measured_level(const ClientOptions& client, const LevelPlan& plan, size_t index, size_t count,
                                 const std::vector<RequestTemplate>& templates, const BenchConfig& cfg,
                                 const text::Tokenizer& tok, CircuitBreaker& breaker, bool& metrics_on) {
  const std::string head = fmt::format("[{} | level {}/{}]", plan.label, index + 1, count);
  const bool tty = isatty(STDERR_FILENO);
  double last_print = -1e9;
  auto progress = [&](const Progress& p) {
    if (!cfg.progress) return;
    if (!tty && p.elapsed_s - last_print < 10 && p.in_flight > 0) return;
    last_print = p.elapsed_s;
    const std::string total = p.planned ? fmt::format("/{}", p.planned) : fmt::format(" ({:.0f}/{:.0f} s)", p.elapsed_s, p.duration_s);
    std::string line = fmt::format("{} {}{} done, {} failed, {} in flight, {:.1f} s, ~{:.0f} tok/s out", head,
                                   p.finished, total, p.failed, p.in_flight, p.elapsed_s,
                                   p.elapsed_s > 0 ? p.output_tokens / p.elapsed_s : 0.0);
    if (tty) std::fprintf(stderr, "\r%-110s", line.c_str());
    else std::fprintf(stderr, "%s\n", line.c_str());
    std::fflush(stderr);
  };
  if (plan.warmup_count > 0) warm_up(client, plan, templates, cfg, head);
  if (cfg.flush_cache) flush_prefix_cache(client, head, cfg.progress);  // after the warm-up, as SGLang's
  const std::optional<MetricSums> before = scrape(client, cfg, metrics_on);
  std::vector<RequestTemplate> measured(templates.begin() + plan.first_prompt,
                                        templates.begin() + plan.first_prompt + plan.prompt_count);
  LevelResult result = run_level(client, plan.load, measured, breaker, progress);
  if (cfg.progress && tty) std::fprintf(stderr, "\n");
  const std::optional<MetricSums> after = before ? scrape(client, cfg, metrics_on) : std::nullopt;
  for (RequestRecord& r : result.records) {
    r.template_index += plan.first_prompt;  // index into the whole prompt pool
    if (r.success && !r.has_usage) {
      r.prompt_tokens = r.expected_prompt_tokens;
      r.completion_tokens = static_cast<int>(tok.encode(r.text, false).size());
    }
    r.text.clear();
    r.text.shrink_to_fit();
  }
  std::optional<ServerCounters> counters;
  if (before && after) counters = difference(*before, *after);
  LevelMetrics m = compute_metrics(result, counters, cfg.slo, cfg.cost);
  m.label = plan.label;
  m.request_rate = plan.load.request_rate;
  m.max_concurrency = plan.load.max_concurrency;
  return {std::move(result), std::move(m)};
}

// The report: the workload, the rate and concurrency tables, costs, each level's details and the
// totals.
std::string render_report(const BenchConfig& cfg, const BenchOutcome& outcome,
                          const std::vector<LevelMetrics>& rate_levels, const std::vector<LevelMetrics>& sweep_levels) {
  std::string rep;
  const std::string lengths =
      cfg.dataset.name.empty()
          ? fmt::format("{} in / {} out{}{}", cfg.workload.input_len, cfg.workload.output_len,
                        cfg.workload.range_ratio > 0 ? fmt::format(" (range ratio {:g})", cfg.workload.range_ratio) : "",
                        cfg.workload.prefix_hit > 0
                            ? fmt::format(", {:.0f}% shared prefix", cfg.workload.prefix_hit * 100)
                            : "")
          : fmt::format("{} dataset {}: mean {:.0f} in / {:.0f} out", cfg.dataset.name, cfg.dataset.path,
                        outcome.mean_input_len, outcome.mean_output_len);
  const std::string workload = fmt::format("{}, {} {}", lengths, cfg.model, cfg.endpoint);
  rep += "\n" + (cfg.preset.empty() ? std::string("bench") : "preset " + cfg.preset) + ": " + workload + "\n\n";
  if (!rate_levels.empty()) rep += rate_table(rate_levels) + "\n";
  if (!sweep_levels.empty()) rep += sweep_table(sweep_levels) + "\n";
  if (const std::string ct = cost_table(outcome.levels, cfg.cost); !ct.empty()) rep += ct + "\n";
  for (const LevelMetrics& m : outcome.levels) rep += detail_block(m, cfg.slo) + "\n";
  rep += fmt::format("Requests: {} sent, {} succeeded, {} failed{}\n", outcome.scheduled, outcome.completed,
                     outcome.failed, outcome.failed ? " (errors above and in requests.csv)" : "");
  return rep;
}

// The run's record as bench.json: date, command, configuration, totals and every level.
json run_json(const BenchConfig& cfg, const BenchOutcome& outcome) {
  json j;
  const std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  j["date"] = date;
  j["command"] = cfg.command_line;
  j["config"] = {{"base_url", cfg.base_url},
                 {"model", cfg.model},
                 {"tokenizer", cfg.tokenizer},
                 {"endpoint", cfg.endpoint},
                 {"preset", cfg.preset},
                 {"dataset_name", cfg.dataset.name.empty() ? "random" : cfg.dataset.name},
                 {"dataset_path", cfg.dataset.path},
                 {"mean_input_len", outcome.mean_input_len},
                 {"mean_output_len", outcome.mean_output_len},
                 {"input_len", cfg.workload.input_len},
                 {"output_len", cfg.workload.output_len},
                 {"range_ratio", cfg.workload.range_ratio},
                 {"prefix_hit", cfg.workload.prefix_hit},
                 {"num_prefixes", cfg.workload.num_prefixes},
                 {"token_id_prompts", cfg.token_id_prompts},
                 {"burstiness", cfg.burstiness},
                 {"num_prompts", cfg.num_prompts},
                 {"duration", cfg.duration_s},
                 {"warmup", cfg.warmup},
                 {"seed", cfg.seed},
                 {"num_gpus", cfg.cost.num_gpus},
                 {"gpu_hour_price", cfg.cost.gpu_hour_price},
                 {"power_watts", cfg.cost.power_watts},
                 {"retries", cfg.retry.retries},
                 {"circuit_breaker", cfg.circuit_breaker}};
  if (!cfg.dataset.name.empty())  // the random dataset's shape does not apply to the file's prompts
    for (const char* key : {"input_len", "output_len", "range_ratio", "prefix_hit", "num_prefixes"})
      j["config"].erase(key);
  j["totals"] = {{"scheduled", outcome.scheduled}, {"completed", outcome.completed}, {"failed", outcome.failed}};
  j["levels"] = json::array();
  for (const LevelMetrics& m : outcome.levels) j["levels"].push_back(level_json(m));
  return j;
}

// The files of --output-dir: bench.json and .csv, requests.csv, the report in Markdown and HTML,
// and the charts.
void write_outputs(const BenchConfig& cfg, BenchOutcome& outcome, const std::vector<LevelResult>& results,
                   const std::vector<LevelMetrics>& rate_levels, const std::vector<LevelMetrics>& sweep_levels) {
  namespace fs = std::filesystem;
  const fs::path dir(cfg.output_dir);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail("bench: cannot create --output-dir " + dir.string() + ": " + ec.message());
  const std::string& rep = outcome.report;
  write_file(dir / cfg.result_filename, run_json(cfg, outcome).dump(2, ' ', false, json::error_handler_t::replace) + "\n",
             outcome.files);
  write_file(dir / "bench.csv", levels_csv(outcome.levels), outcome.files);
  std::vector<std::pair<std::string, const LevelResult*>> per_request;
  for (size_t i = 0; i < results.size(); ++i) per_request.emplace_back(outcome.levels[i].label, &results[i]);
  write_file(dir / "requests.csv", requests_csv(per_request), outcome.files);
  write_file(dir / "report.md", rep, outcome.files);
  std::vector<std::string> charts{throughput_interactivity_svg(outcome.levels)};
  write_file(dir / "throughput_vs_interactivity.svg", charts.back(), outcome.files);
  if (!rate_levels.empty()) {
    charts.push_back(ttft_svg(rate_levels, true));
    write_file(dir / "ttft_vs_request_rate.svg", charts.back(), outcome.files);
  }
  if (!sweep_levels.empty()) {
    charts.push_back(ttft_svg(sweep_levels, false));
    write_file(dir / "ttft_vs_concurrency.svg", charts.back(), outcome.files);
  }
  write_file(dir / "report.html", html_report("glmserve bench: " + cfg.command_line, rep, charts), outcome.files);
  if (cfg.progress) std::fprintf(stderr, "bench: wrote %zu files to %s\n", outcome.files.size(), dir.string().c_str());
}

}  // namespace

BenchOutcome run_bench(const BenchConfig& cfg) {
  const bool chat = cfg.endpoint.find("chat") != std::string::npos;
  check_config(cfg, chat);
  json extra;
  if (!cfg.extra_body.empty()) {
    extra = json::parse(cfg.extra_body, nullptr, false);
    if (!extra.is_object()) fail("--extra-body: expected a JSON object");
  }
  ClientOptions client;
  client.endpoint = parse_base_url(cfg.base_url);
  client.path = cfg.endpoint;
  client.api_key = cfg.api_key;
  client.timeout_s = cfg.timeout_s;
  client.retry = cfg.retry;
  client.request_id_prefix = cfg.request_id_prefix;
  CircuitBreaker breaker = cfg.circuit_breaker.empty() ? CircuitBreaker() : parse_circuit_breaker(cfg.circuit_breaker);
  raise_fd_limit();

  size_t pool = 0;
  const std::vector<LevelPlan> plans = plan_levels(cfg, pool);
  const text::Tokenizer tok = text::Tokenizer::load(cfg.tokenizer);
  const std::vector<RequestTemplate> templates = make_templates(cfg, tok, chat, extra, pool);

  bool metrics_on = cfg.scrape_metrics;
  BenchOutcome outcome;
  for (const RequestTemplate& t : templates) {
    outcome.mean_input_len += t.prompt_tokens / static_cast<double>(templates.size());
    outcome.mean_output_len += t.output_tokens / static_cast<double>(templates.size());
  }
  std::vector<LevelResult> results;
  results.reserve(plans.size());
  for (size_t li = 0; li < plans.size(); ++li) {
    MeasuredLevel level = run_measured_level(client, plans[li], li, plans.size(), templates, cfg, tok, breaker,
                                             metrics_on);
    outcome.scheduled += level.metrics.scheduled;
    outcome.completed += level.metrics.completed;
    outcome.failed += level.metrics.failed;
    outcome.levels.push_back(std::move(level.metrics));
    results.push_back(std::move(level.result));
  }

  std::vector<LevelMetrics> rate_levels, sweep_levels;
  for (const LevelMetrics& m : outcome.levels) (std::isinf(m.request_rate) ? sweep_levels : rate_levels).push_back(m);
  outcome.report = render_report(cfg, outcome, rate_levels, sweep_levels);
  std::fputs(outcome.report.c_str(), stdout);
  std::fflush(stdout);
  if (!cfg.output_dir.empty()) write_outputs(cfg, outcome, results, rate_levels, sweep_levels);
  return outcome;
}

}  // namespace glms::bench
