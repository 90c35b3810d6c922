#include "bench/prom.h"

#include <cstdlib>
#include <string>

namespace glms::bench {

MetricSums parse_prometheus(std::string_view text) {
  MetricSums sums;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    std::string_view line = text.substr(pos, eol - pos);
    pos = eol + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    size_t b = line.find_first_not_of(" \t");
    if (b == std::string_view::npos || line[b] == '#') continue;
    line.remove_prefix(b);
    size_t name_end = line.find_first_of("{ \t");
    if (name_end == std::string_view::npos || name_end == 0) continue;
    const std::string name(line.substr(0, name_end));
    size_t rest = name_end;
    if (line[rest] == '{') {
      // Skip the label set; label values may hold escaped quotes and braces.
      bool in_quotes = false;
      for (; rest < line.size(); ++rest) {
        const char c = line[rest];
        if (in_quotes && c == '\\') ++rest;
        else if (c == '"') in_quotes = !in_quotes;
        else if (c == '}' && !in_quotes) break;
      }
      if (rest >= line.size()) continue;
      ++rest;
    }
    std::string value(line.substr(rest));
    const size_t vb = value.find_first_not_of(" \t");
    if (vb == std::string::npos) continue;
    const char* start = value.c_str() + vb;
    char* end = nullptr;
    const double v = std::strtod(start, &end);
    if (end == start) continue;
    sums[name] += v;
  }
  return sums;
}

std::optional<double> first_of(const MetricSums& m, const std::vector<std::string>& names) {
  for (const std::string& n : names)
    if (auto it = m.find(n); it != m.end()) return it->second;
  return std::nullopt;
}

namespace {

std::optional<double> delta(const MetricSums& before, const MetricSums& after, const std::vector<std::string>& names) {
  for (const std::string& n : names) {
    auto a = after.find(n);
    if (a == after.end()) continue;
    auto b = before.find(n);
    return a->second - (b == before.end() ? 0.0 : b->second);
  }
  return std::nullopt;
}

std::vector<std::string> names(const std::string& stem) {
  // glmserve first, then vLLM; "_total" is what Prometheus clients append to counters, and some
  // servers export the bare name.
  return {"glmserve:" + stem + "_total", "vllm:" + stem + "_total", "glmserve:" + stem, "vllm:" + stem};
}

}  // namespace

ServerCounters difference(const MetricSums& before, const MetricSums& after) {
  ServerCounters c;
  c.spec_accepted = delta(before, after, names("spec_decode_num_accepted_tokens"));
  c.spec_draft_tokens = delta(before, after, names("spec_decode_num_draft_tokens"));
  c.spec_drafts = delta(before, after, names("spec_decode_num_drafts"));
  c.prefix_queries = delta(before, after, names("prefix_cache_queries"));
  c.prefix_hits = delta(before, after, names("prefix_cache_hits"));
  c.spec_accept_length_gauge = first_of(after, {"sglang:spec_accept_length"});
  return c;
}

}  // namespace glms::bench
