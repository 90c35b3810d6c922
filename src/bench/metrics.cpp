#include "bench/metrics.h"

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "core/error.h"

namespace glms::bench {

SloSpec parse_slo(const std::string& spec) {
  SloSpec slo;
  size_t pos = 0;
  while (pos <= spec.size() && !spec.empty()) {
    size_t comma = spec.find(',', pos);
    if (comma == std::string::npos) comma = spec.size();
    const std::string item = spec.substr(pos, comma - pos);
    pos = comma + 1;
    if (item.empty()) continue;
    const size_t colon = item.find(':');
    const std::string key = item.substr(0, colon);
    char* end = nullptr;
    const char* v = colon == std::string::npos ? "" : item.c_str() + colon + 1;
    const double ms = std::strtod(v, &end);
    if (colon == std::string::npos || end == v || *end != '\0' || !(ms > 0))
      fail("--slo: expected key:milliseconds pairs like ttft:2000,tpot:50; bad item '" + item + "'");
    if (key == "ttft") slo.ttft_ms = ms;
    else if (key == "tpot") slo.tpot_ms = ms;
    else if (key == "itl") slo.itl_ms = ms;
    else if (key == "e2el") slo.e2el_ms = ms;
    else fail("--slo: unknown key '" + key + "' (use ttft, tpot, itl, e2el)");
    if (comma == spec.size()) break;
  }
  return slo;
}

CostFigures cost_figures(const CostSpec& cost, double output_tok_s, double total_tok_s, double median_tpot_ms) {
  CostFigures c;
  const double gpus = std::max(1, cost.num_gpus);
  c.total_tok_s_per_gpu = total_tok_s / gpus;
  c.output_tok_s_per_gpu = output_tok_s / gpus;
  c.tok_s_per_user = median_tpot_ms > 0 ? 1000.0 / median_tpot_ms : 0;
  if (cost.gpu_hour_price > 0) {
    const double usd_per_s = gpus * cost.gpu_hour_price / 3600.0;
    if (output_tok_s > 0) c.usd_per_million_output = usd_per_s / output_tok_s * 1e6;
    if (total_tok_s > 0) c.usd_per_million_total = usd_per_s / total_tok_s * 1e6;
  }
  if (cost.power_watts > 0) {
    const double mw = gpus * cost.power_watts / 1e6;
    c.output_tok_s_per_mw = output_tok_s / mw;
    c.total_tok_s_per_mw = total_tok_s / mw;
  }
  return c;
}

LevelMetrics compute_metrics(const LevelResult& result, const std::optional<ServerCounters>& counters,
                             const SloSpec& slo, const CostSpec& cost) {
  LevelMetrics m;
  m.scheduled = result.records.size();
  m.duration_s = result.duration_s;
  m.breaker_opened = result.breaker_opened;
  std::vector<double> ttft, tpot, itl, e2el;
  long long cached = 0, cached_prompt = 0, decode_tokens = 0;
  bool any_cached = false;
  for (const RequestRecord& r : result.records) {
    if (r.attempts > 1) ++m.retried;
    if (!r.success) {
      ++m.failed;
      if (r.attempts == 0) ++m.not_sent;
      ++m.errors[r.error.empty() ? "unknown error" : r.error];
      continue;
    }
    ++m.completed;
    m.input_tokens += r.prompt_tokens;
    m.output_tokens += r.completion_tokens;
    if (r.completion_tokens < r.expected_output_tokens) ++m.short_outputs;
    if (r.cached_tokens >= 0) {
      any_cached = true;
      cached += r.cached_tokens;
      cached_prompt += r.prompt_tokens;
    }
    const double e2e_ms = (r.end_s - r.start_s) * 1000.0;
    const double ttft_ms = r.ttft_s * 1000.0;
    ttft.push_back(ttft_ms);
    e2el.push_back(e2e_ms);
    double req_tpot = 0;
    if (r.completion_tokens > 1) {
      req_tpot = (e2e_ms - ttft_ms) / (r.completion_tokens - 1);
      tpot.push_back(req_tpot);
      decode_tokens += r.completion_tokens - 1;
    }
    for (double g : r.itl_s) itl.push_back(g * 1000.0);
    bool good = true;
    if (slo.ttft_ms && ttft_ms > *slo.ttft_ms) good = false;
    if (slo.tpot_ms && req_tpot > *slo.tpot_ms) good = false;
    if (slo.e2el_ms && e2e_ms > *slo.e2el_ms) good = false;
    if (slo.itl_ms)
      for (double g : r.itl_s)
        if (g * 1000.0 > *slo.itl_ms) good = false;
    if (good) ++m.good;
  }
  m.success_rate = m.scheduled ? static_cast<double>(m.completed) / m.scheduled : 0;
  if (m.duration_s > 0) {
    m.request_throughput = m.completed / m.duration_s;
    m.input_throughput = m.input_tokens / m.duration_s;
    m.output_throughput = m.output_tokens / m.duration_s;
    m.total_throughput = (m.input_tokens + m.output_tokens) / m.duration_s;
    m.goodput = m.good / m.duration_s;
  }
  m.ttft_ms = summarize(ttft);
  m.tpot_ms = summarize(tpot);
  m.itl_ms = summarize(itl);
  m.e2el_ms = summarize(e2el);
  if (any_cached && cached_prompt > 0) m.cached_share = static_cast<double>(cached) / cached_prompt;
  if (counters) {
    if (counters->prefix_queries && counters->prefix_hits && *counters->prefix_queries > 0)
      m.server_prefix_hit_rate = *counters->prefix_hits / *counters->prefix_queries;
    const auto& acc = counters->spec_accepted;
    if (acc && counters->spec_draft_tokens && *counters->spec_draft_tokens > 0)
      m.accept_rate = *acc / *counters->spec_draft_tokens;
    if (acc && counters->spec_drafts && *counters->spec_drafts > 0) {
      m.accept_length = 1.0 + *acc / *counters->spec_drafts;
      m.accept_length_source = "drafts counter";
    } else if (counters->spec_accept_length_gauge) {
      m.accept_length = *counters->spec_accept_length_gauge;
      m.accept_length_source = "gauge";
    } else if (acc && counters->spec_draft_tokens && decode_tokens > *acc) {
      // Each verification step yields 1 + (accepted in that step) tokens, so the bench's decode
      // tokens divided by (decode tokens - accepted) is the mean tokens per step.
      m.accept_length = decode_tokens / (decode_tokens - *acc);
      m.accept_length_source = "estimate from output tokens";
    }
  }
  m.cost = cost_figures(cost, m.output_throughput, m.total_throughput, m.tpot_ms.median);
  return m;
}

}  // namespace glms::bench
