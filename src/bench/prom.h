// Prometheus text exposition (the /metrics page): parse samples and sum them per metric name,
// so counters can be differenced across a bench run.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace glms::bench {

// Metric name -> sum of the values of all its samples (over every label set). Comment lines,
// blank lines and unparsable lines are skipped; NaN/+Inf values are kept as such.
using MetricSums = std::map<std::string, double>;
MetricSums parse_prometheus(std::string_view text);

// The first of `names` present in `m`.
std::optional<double> first_of(const MetricSums& m, const std::vector<std::string>& names);

// Server-side counters differenced over one run (after - before). Fields are empty when the
// server does not export them.
struct ServerCounters {
  std::optional<double> spec_accepted, spec_draft_tokens, spec_drafts;
  std::optional<double> prefix_queries, prefix_hits;
  std::optional<double> spec_accept_length_gauge;  // SGLang-style gauge, read after the run
};
ServerCounters difference(const MetricSums& before, const MetricSums& after);

}  // namespace glms::bench
