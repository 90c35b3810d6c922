// A strict checker of the Prometheus text exposition format (0.0.4) for the tests: returns an
// empty string when `text` is valid, else the first problem with its line number. It checks
// line syntax, names, label escaping, values, one HELP/TYPE per family placed before its
// samples, contiguous families, unique series, and histogram consistency (le labels, cumulative
// buckets, a +Inf bucket equal to _count, _sum present).
#pragma once

#include <cmath>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace glms::test {

struct PromSample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

inline bool prom_name_ok(const std::string& s, bool allow_colon) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (allow_colon && c == ':');
    if (!(alpha || (i > 0 && c >= '0' && c <= '9'))) return false;
  }
  return true;
}

inline bool prom_value(const std::string& s, double& out) {
  if (s == "+Inf" || s == "Inf") { out = INFINITY; return true; }
  if (s == "-Inf") { out = -INFINITY; return true; }
  if (s == "NaN") { out = NAN; return true; }
  if (s.empty()) return false;
  char* end = nullptr;
  out = std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size();
}

// One sample line's label set from line[i] == '{' on: fills `labels`, leaves i past the '}'.
// Returns the problem, or "".
inline std::string prom_labels(const std::string& line, size_t& i, std::map<std::string, std::string>& labels) {
  ++i;
  while (true) {
    if (i >= line.size()) return "unterminated label set";
    if (line[i] == '}') {
      ++i;
      return "";
    }
    const size_t eq = line.find('=', i);
    if (eq == std::string::npos) return "label without '='";
    const std::string key = line.substr(i, eq - i);
    if (!prom_name_ok(key, false)) return "bad label name '" + key + "'";
    i = eq + 1;
    if (i >= line.size() || line[i] != '"') return "label value not quoted";
    ++i;
    std::string value;
    while (true) {
      if (i >= line.size()) return "unterminated label value";
      const char c = line[i++];
      if (c == '"') break;
      if (c != '\\') {
        value += c;
        continue;
      }
      if (i >= line.size()) return "dangling escape";
      const char e = line[i++];
      if (e == 'n') value += '\n';
      else if (e == '\\' || e == '"') value += e;
      else return "bad escape \\" + std::string(1, e);
    }
    if (labels.count(key)) return "duplicate label " + key;
    labels[key] = value;
    if (i < line.size() && line[i] == ',') ++i;
    else if (i < line.size() && line[i] != '}') return "expected ',' or '}'";
  }
}

// A sample line, name[{labels}] value [timestamp], into `s`. Returns the problem, or "".
inline std::string prom_sample(const std::string& line, PromSample& s) {
  size_t i = 0;
  while (i < line.size() && line[i] != '{' && line[i] != ' ') ++i;
  s.name = line.substr(0, i);
  if (!prom_name_ok(s.name, true)) return "bad metric name '" + s.name + "'";
  if (i < line.size() && line[i] == '{')
    if (std::string problem = prom_labels(line, i, s.labels); !problem.empty()) return problem;
  if (i >= line.size() || line[i] != ' ') return "missing value";
  const std::string rest = line.substr(i + 1);
  const size_t sp = rest.find(' ');
  if (!prom_value(rest.substr(0, sp), s.value)) return "bad value '" + rest + "'";
  double timestamp = 0;
  if (sp != std::string::npos && !prom_value(rest.substr(sp + 1), timestamp)) return "bad timestamp";
  return "";
}

// The exposition's state line by line: families' HELP and TYPE, which families are done, the
// series seen, and each histogram's buckets, counts and sums.
class PromChecker {
 public:
  // A "# HELP" or "# TYPE" line (other comments pass). Returns the problem, or "".
  std::string comment(const std::string& line) {
    if (line.rfind("# HELP ", 0) != 0 && line.rfind("# TYPE ", 0) != 0) return "";
    const bool is_type = line[2] == 'T';
    const std::string rest = line.substr(7);
    const size_t sp = rest.find(' ');
    const std::string name = rest.substr(0, sp);
    if (!prom_name_ok(name, true)) return "bad metric name '" + name + "'";
    if (finished_.count(name) || (!current_.empty() && current_ != name && series_.count(name)))
      return "HELP/TYPE after samples of " + name;
    if (is_type) {
      if (sp == std::string::npos) return "TYPE without a type";
      const std::string type = rest.substr(sp + 1);
      if (type != "counter" && type != "gauge" && type != "histogram" && type != "summary" && type != "untyped")
        return "unknown type '" + type + "'";
      if (types_.count(name)) return "second TYPE for " + name;
      types_[name] = type;
    } else {
      if (helped_.count(name)) return "second HELP for " + name;
      helped_.insert(name);
    }
    if (current_ != name && !current_.empty()) finished_.insert(current_);
    current_ = name;
    return "";
  }

  // A parsed sample: contiguous families, unique series, histogram samples in order, counters
  // not negative. Returns the problem, or "".
  std::string sample(const PromSample& s) {
    const std::string family = family_of(s.name);
    if (finished_.count(family)) return "samples of " + family + " are not contiguous";
    if (family != current_) {
      if (!current_.empty()) finished_.insert(current_);
      current_ = family;
    }
    std::string key = s.name + "{";
    for (const auto& [k, v] : s.labels) key += k + "=" + v + ",";
    if (!series_.insert(key + "}").second) return "duplicate series " + key + "}";
    series_.insert(family);
    const std::string type = types_.count(family) ? types_.at(family) : "";
    if (type == "histogram") return histogram_sample(s, family);
    if (type == "counter" && s.value < 0) return "negative counter";
    return "";
  }

  // After the last line: every histogram has its +Inf bucket equal to _count, and a _sum.
  std::string finish() const {
    for (const auto& [base, list] : buckets_) {
      if (list.empty() || !std::isinf(list.back().first)) return base + ": no +Inf bucket";
      if (!counts_.count(base) || counts_.at(base) != list.back().second) return base + ": _count differs from +Inf bucket";
      if (!sums_.count(base)) return base + ": no _sum";
    }
    return "";
  }

 private:
  std::string family_of(const std::string& name) const {
    for (const std::string suffix : {"_bucket", "_sum", "_count"}) {
      if (name.size() <= suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
        continue;
      const std::string base = name.substr(0, name.size() - suffix.size());
      if (types_.count(base) && types_.at(base) == "histogram") return base;
    }
    return name;
  }

  std::string histogram_sample(const PromSample& s, const std::string& family) {
    std::string base = family + "{";
    for (const auto& [k, v] : s.labels)
      if (k != "le") base += k + "=" + v + ",";
    if (s.name == family + "_bucket") {
      if (!s.labels.count("le")) return "bucket without le";
      double le = 0;
      if (!prom_value(s.labels.at("le"), le)) return "bad le";
      auto& list = buckets_[base];
      if (!list.empty() && (le <= list.back().first || s.value < list.back().second))
        return "buckets not increasing/cumulative";
      list.emplace_back(le, s.value);
    } else if (s.name == family + "_count") {
      counts_[base] = s.value;
    } else if (s.name == family + "_sum") {
      sums_.insert(base);
    } else {
      return "unexpected histogram sample " + s.name;
    }
    return "";
  }

  std::map<std::string, std::string> types_;
  std::set<std::string> helped_, finished_, series_;
  std::string current_;
  std::map<std::string, std::vector<std::pair<double, double>>> buckets_;  // family+labels -> (le, count)
  std::map<std::string, double> counts_;
  std::set<std::string> sums_;
};

// Parses and validates; fills `samples`.
inline std::string validate_prometheus(const std::string& text, std::vector<PromSample>* samples = nullptr) {
  if (text.empty() || text.back() != '\n') return "text must end with a newline";
  PromChecker checker;
  size_t line_no = 0, pos = 0;
  while (pos < text.size()) {
    const size_t nl = text.find('\n', pos);
    const std::string line = text.substr(pos, nl - pos);
    pos = nl + 1;
    ++line_no;
    if (line.empty()) continue;
    std::string problem;
    PromSample s;
    if (line[0] == '#') problem = checker.comment(line);
    else if (problem = prom_sample(line, s); problem.empty()) problem = checker.sample(s);
    if (!problem.empty()) return "line " + std::to_string(line_no) + ": " + problem;
    if (line[0] != '#' && samples) samples->push_back(std::move(s));
  }
  return checker.finish();
}

}  // namespace glms::test
