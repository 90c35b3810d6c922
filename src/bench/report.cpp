#include "bench/report.h"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>

#include "bench/svg.h"

namespace glms::bench {

namespace {

std::string pct(double share) {
  if (share >= 1) return "100%";
  return fmt::format("{:.1f}%", share * 100);
}

std::string secs(double ms) { return ms >= 100000 ? fmt::format("{:.0f} s", ms / 1000) : fmt::format("{:.2f} s", ms / 1000); }

std::string num(double v) {
  if (v >= 100) return fmt::format("{:.0f}", v);
  if (v >= 10) return fmt::format("{:.1f}", v);
  return fmt::format("{:.2f}", v);
}

std::string rate_text(double r) { return std::isinf(r) ? "inf" : fmt::format("{:g}", r); }

// Markdown table with columns padded to their widest cell.
std::string table(const std::vector<std::string>& head, const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> w(head.size());
  for (size_t c = 0; c < head.size(); ++c) {
    w[c] = head[c].size();
    for (const auto& r : rows) w[c] = std::max(w[c], r[c].size());
  }
  auto line = [&](const std::vector<std::string>& cells) {
    std::string s = "|";
    for (size_t c = 0; c < cells.size(); ++c) s += " " + cells[c] + std::string(w[c] - cells[c].size(), ' ') + " |";
    return s + "\n";
  };
  std::string out = line(head);
  out += "|";
  for (size_t c = 0; c < head.size(); ++c) out += std::string(w[c] + 2, '-') + "|";
  out += "\n";
  for (const auto& r : rows) out += line(r);
  return out;
}

void summary_json(nlohmann::json& j, const std::string& name, const Summary& s) {
  j["mean_" + name + "_ms"] = s.mean;
  j["median_" + name + "_ms"] = s.median;
  j["std_" + name + "_ms"] = s.stdev;
  j["p90_" + name + "_ms"] = s.p90;
  j["p95_" + name + "_ms"] = s.p95;
  j["p99_" + name + "_ms"] = s.p99;
}

template <typename T>
nlohmann::json opt(const std::optional<T>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}

std::string opt_num(const std::optional<double>& v, const char* f = "{:.4f}") {
  return v ? fmt::format(fmt::runtime(f), *v) : std::string();
}

// Latency percentiles "p50 / p95", or N/A when no request of the level succeeded.
std::string ttft_text(const LevelMetrics& m) {
  return m.completed == 0 ? "N/A" : secs(m.ttft_ms.median) + " / " + secs(m.ttft_ms.p95);
}

}  // namespace

std::string rate_table(const std::vector<LevelMetrics>& levels) {
  std::vector<std::vector<std::string>> rows;
  for (const LevelMetrics& m : levels)
    rows.push_back({rate_text(m.request_rate), fmt::format("{:.2f}", m.request_throughput), num(m.output_throughput),
                    ttft_text(m), pct(m.success_rate)});
  return table({"Offered RPS", "Sustained req/s", "Aggregate tok/s", "TTFT p50 / p95", "Success"}, rows);
}

std::string sweep_table(const std::vector<LevelMetrics>& levels) {
  std::vector<std::vector<std::string>> rows;
  for (const LevelMetrics& m : levels)
    rows.push_back({m.max_concurrency > 0 ? std::to_string(m.max_concurrency) : "unlimited",
                    num(m.cost.total_tok_s_per_gpu), num(m.cost.tok_s_per_user), num(m.output_throughput),
                    ttft_text(m), m.completed == 0 ? "N/A" : secs(m.e2el_ms.median), pct(m.success_rate)});
  return table({"Concurrency", "tok/s/GPU", "tok/s/user", "Output tok/s", "TTFT p50 / p95", "E2E p50", "Success"},
               rows);
}

std::string cost_table(const std::vector<LevelMetrics>& levels, const CostSpec& cost) {
  if (cost.gpu_hour_price <= 0 && cost.power_watts <= 0) return {};
  std::vector<std::vector<std::string>> rows;
  for (const LevelMetrics& m : levels)
    rows.push_back({m.label, num(m.cost.output_tok_s_per_gpu), opt_num(m.cost.usd_per_million_output, "{:.3f}"),
                    opt_num(m.cost.usd_per_million_total, "{:.3f}"), opt_num(m.cost.output_tok_s_per_mw, "{:.0f}")});
  return table({"Level", "Output tok/s/GPU", "$/M output tok", "$/M total tok", "Output tok/s per MW"}, rows);
}

std::string detail_block(const LevelMetrics& m, const SloSpec& slo) {
  std::string o;
  auto title = [&](const std::string& t, char fill) {
    const size_t n = 50, pad = t.size() + 2 < n ? n - t.size() - 2 : 0;
    o += std::string(pad / 2, fill) + " " + t + " " + std::string(pad - pad / 2, fill) + "\n";
  };
  auto row = [&](const std::string& k, const std::string& v) { o += fmt::format("{:<40} {:<10}\n", k, v); };
  auto f2 = [](double v) { return fmt::format("{:.2f}", v); };
  title("Serving Benchmark Result (" + m.label + ")", '=');
  row("Successful requests:", std::to_string(m.completed));
  row("Failed requests:", std::to_string(m.failed));
  if (m.not_sent) row("  of which not sent (circuit open):", std::to_string(m.not_sent));
  if (m.retried) row("Requests retried:", std::to_string(m.retried));
  row("Success rate:", pct(m.success_rate));
  row("Request rate configured (RPS):", rate_text(m.request_rate));
  if (m.max_concurrency > 0) row("Maximum request concurrency:", std::to_string(m.max_concurrency));
  row("Benchmark duration (s):", f2(m.duration_s));
  row("Total input tokens:", std::to_string(m.input_tokens));
  row("Total generated tokens:", std::to_string(m.output_tokens));
  if (m.short_outputs) row("Outputs shorter than asked:", std::to_string(m.short_outputs));
  row("Request throughput (req/s):", f2(m.request_throughput));
  if (!slo.empty()) row("Request goodput (req/s):", f2(m.goodput));
  row("Output token throughput (tok/s):", f2(m.output_throughput));
  row("Input token throughput (tok/s):", f2(m.input_throughput));
  row("Total Token throughput (tok/s):", f2(m.total_throughput));
  if (m.cached_share) row("Cached prompt tokens (usage):", pct(*m.cached_share));
  if (m.server_prefix_hit_rate) row("Server prefix-cache hit rate:", pct(*m.server_prefix_hit_rate));
  auto section = [&](const std::string& t, const std::string& key, const Summary& s) {
    title(t, '-');
    // No latency without a success: N/A, not zeros.
    auto value = [&](double v) { return m.completed == 0 ? std::string("N/A") : f2(v); };
    row("Mean " + key + " (ms):", value(s.mean));
    row("Median " + key + " (ms):", value(s.median));
    row("P90 " + key + " (ms):", value(s.p90));
    row("P95 " + key + " (ms):", value(s.p95));
    row("P99 " + key + " (ms):", value(s.p99));
  };
  section("Time to First Token", "TTFT", m.ttft_ms);
  section("Time per Output Token (excl. 1st token)", "TPOT", m.tpot_ms);
  section("Inter-token Latency", "ITL", m.itl_ms);
  section("End-to-end Latency", "E2EL", m.e2el_ms);
  if (m.accept_length || m.accept_rate) {
    title("Speculative Decoding", '-');
    if (m.accept_rate) row("Acceptance rate (%):", f2(*m.accept_rate * 100));
    if (m.accept_length) row("Acceptance length:", f2(*m.accept_length) + " (" + m.accept_length_source + ")");
  }
  if (!m.errors.empty()) {
    title("Errors", '-');
    for (const auto& [msg, n] : m.errors) o += fmt::format("{:>6} x {}\n", n, msg.substr(0, 300));
  }
  o += std::string(50, '=') + "\n";
  return o;
}

nlohmann::json level_json(const LevelMetrics& m) {
  nlohmann::json j;
  j["label"] = m.label;
  j["request_rate"] = std::isinf(m.request_rate) ? nlohmann::json("inf") : nlohmann::json(m.request_rate);
  j["max_concurrency"] = m.max_concurrency;
  j["scheduled"] = m.scheduled;
  j["completed"] = m.completed;
  j["failed"] = m.failed;
  j["not_sent"] = m.not_sent;
  j["retried"] = m.retried;
  j["short_outputs"] = m.short_outputs;
  j["success_rate"] = m.success_rate;
  j["duration"] = m.duration_s;
  j["total_input_tokens"] = m.input_tokens;
  j["total_output_tokens"] = m.output_tokens;
  j["request_throughput"] = m.request_throughput;
  j["request_goodput"] = m.goodput;
  j["input_throughput"] = m.input_throughput;
  j["output_throughput"] = m.output_throughput;
  j["total_token_throughput"] = m.total_throughput;
  summary_json(j, "ttft", m.ttft_ms);
  summary_json(j, "tpot", m.tpot_ms);
  summary_json(j, "itl", m.itl_ms);
  summary_json(j, "e2el", m.e2el_ms);
  j["cached_token_share"] = opt(m.cached_share);
  j["server_prefix_cache_hit_rate"] = opt(m.server_prefix_hit_rate);
  j["spec_accept_rate"] = opt(m.accept_rate);
  j["spec_accept_length"] = opt(m.accept_length);
  j["spec_accept_length_source"] = m.accept_length_source;
  j["total_tok_s_per_gpu"] = m.cost.total_tok_s_per_gpu;
  j["output_tok_s_per_gpu"] = m.cost.output_tok_s_per_gpu;
  j["tok_s_per_user"] = m.cost.tok_s_per_user;
  j["usd_per_million_output_tokens"] = opt(m.cost.usd_per_million_output);
  j["usd_per_million_total_tokens"] = opt(m.cost.usd_per_million_total);
  j["output_tok_s_per_mw"] = opt(m.cost.output_tok_s_per_mw);
  j["total_tok_s_per_mw"] = opt(m.cost.total_tok_s_per_mw);
  j["errors"] = m.errors;
  j["circuit_breaker_opened"] = m.breaker_opened;
  return j;
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

std::string levels_csv(const std::vector<LevelMetrics>& levels) {
  std::string o =
      "label,request_rate,max_concurrency,scheduled,completed,failed,success_rate,duration_s,input_tokens,"
      "output_tokens,request_throughput,request_goodput,input_throughput,output_throughput,total_throughput,"
      "mean_ttft_ms,median_ttft_ms,p90_ttft_ms,p95_ttft_ms,p99_ttft_ms,mean_tpot_ms,median_tpot_ms,p90_tpot_ms,"
      "p95_tpot_ms,p99_tpot_ms,mean_itl_ms,median_itl_ms,p90_itl_ms,p95_itl_ms,p99_itl_ms,mean_e2el_ms,"
      "median_e2el_ms,p90_e2el_ms,p95_e2el_ms,p99_e2el_ms,cached_token_share,spec_accept_length,"
      "total_tok_s_per_gpu,tok_s_per_user,usd_per_million_output_tokens,output_tok_s_per_mw\n";
  for (const LevelMetrics& m : levels) {
    std::vector<std::string> f = {csv_field(m.label), rate_text(m.request_rate), std::to_string(m.max_concurrency),
                                  std::to_string(m.scheduled), std::to_string(m.completed), std::to_string(m.failed)};
    for (double v : {m.success_rate, m.duration_s}) f.push_back(fmt::format("{:.6g}", v));
    f.push_back(std::to_string(m.input_tokens));
    f.push_back(std::to_string(m.output_tokens));
    for (double v : {m.request_throughput, m.goodput, m.input_throughput, m.output_throughput, m.total_throughput})
      f.push_back(fmt::format("{:.6g}", v));
    for (const Summary* s : {&m.ttft_ms, &m.tpot_ms, &m.itl_ms, &m.e2el_ms})
      for (double v : {s->mean, s->median, s->p90, s->p95, s->p99}) f.push_back(fmt::format("{:.6g}", v));
    f.push_back(opt_num(m.cached_share, "{:.6g}"));
    f.push_back(opt_num(m.accept_length, "{:.6g}"));
    f.push_back(fmt::format("{:.6g}", m.cost.total_tok_s_per_gpu));
    f.push_back(fmt::format("{:.6g}", m.cost.tok_s_per_user));
    f.push_back(opt_num(m.cost.usd_per_million_output, "{:.6g}"));
    f.push_back(opt_num(m.cost.output_tok_s_per_mw, "{:.6g}"));
    for (size_t i = 0; i < f.size(); ++i) o += (i ? "," : "") + f[i];
    o += "\n";
  }
  return o;
}

std::string requests_csv(const std::vector<std::pair<std::string, const LevelResult*>>& levels) {
  std::string o =
      "level,request,prompt_index,scheduled_s,start_s,end_s,success,http_status,attempts,prompt_tokens,"
      "output_tokens,cached_tokens,ttft_ms,e2el_ms,error\n";
  for (const auto& [label, result] : levels) {
    size_t i = 0;
    for (const RequestRecord& r : result->records)
      o += fmt::format("{},{},{},{:.6f},{:.6f},{:.6f},{},{},{},{},{},{},{:.3f},{:.3f},{}\n", csv_field(label), i++,
                       r.template_index, r.scheduled_s, r.start_s, r.end_s, r.success ? 1 : 0, r.http_status,
                       r.attempts, r.prompt_tokens, r.completion_tokens, r.cached_tokens,
                       r.success ? r.ttft_s * 1000 : 0.0, (r.end_s - r.start_s) * 1000, csv_field(r.error));
  }
  return o;
}

std::string throughput_interactivity_svg(const std::vector<LevelMetrics>& levels) {
  Chart c;
  c.title = "Throughput vs interactivity";
  c.x_label = "Interactivity (tok/s/user = 1000 / median TPOT ms)";
  c.y_label = "Total tok/s/GPU";
  ChartSeries closed{"concurrency sweep", {}}, open{"request-rate sweep", {}};
  for (const LevelMetrics& m : levels) {
    if (m.cost.tok_s_per_user <= 0) continue;
    const bool is_open = !std::isinf(m.request_rate);
    ChartPoint p{m.cost.tok_s_per_user, m.cost.total_tok_s_per_gpu,
                 is_open ? rate_text(m.request_rate) + " rps" : "c=" + std::to_string(m.max_concurrency)};
    (is_open ? open : closed).points.push_back(p);
  }
  for (ChartSeries* s : {&closed, &open}) {
    std::sort(s->points.begin(), s->points.end(), [](const ChartPoint& a, const ChartPoint& b) { return a.x < b.x; });
    if (!s->points.empty()) c.series.push_back(*s);
  }
  return render_svg(c);
}

std::string ttft_svg(const std::vector<LevelMetrics>& levels, bool by_rate) {
  Chart c;
  c.title = by_rate ? "TTFT vs request rate" : "TTFT vs concurrency";
  c.x_label = by_rate ? "Request rate (req/s)" : "Concurrency";
  c.y_label = "TTFT (s)";
  ChartSeries p50{"TTFT p50", {}}, p95{"TTFT p95", {}};
  for (const LevelMetrics& m : levels) {
    const double x = by_rate ? m.request_rate : m.max_concurrency;
    if (!std::isfinite(x) || m.completed == 0) continue;
    p50.points.push_back({x, m.ttft_ms.median / 1000, ""});
    p95.points.push_back({x, m.ttft_ms.p95 / 1000, fmt::format("{:.2f} s", m.ttft_ms.p95 / 1000)});
  }
  c.series = {p50, p95};
  return render_svg(c);
}

}  // namespace glms::bench
