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

// Parses and validates; fills `samples`.
inline std::string validate_prometheus(const std::string& text, std::vector<PromSample>* samples = nullptr) {
  if (text.empty() || text.back() != '\n') return "text must end with a newline";
  std::map<std::string, std::string> types;
  std::set<std::string> helped, finished_families, series;
  std::string current_family;
  std::map<std::string, std::vector<std::pair<double, double>>> buckets;  // family+labels -> (le, count)
  std::map<std::string, double> counts;
  std::set<std::string> sums;
  auto family_of = [&](const std::string& name) {
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      const std::string s = suffix;
      if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0) {
        const std::string base = name.substr(0, name.size() - s.size());
        if (types.count(base) && types[base] == "histogram") return base;
      }
    }
    return name;
  };
  size_t line_no = 0, pos = 0;
  while (pos < text.size()) {
    const size_t nl = text.find('\n', pos);
    const std::string line = text.substr(pos, nl - pos);
    pos = nl + 1;
    ++line_no;
    const std::string at = "line " + std::to_string(line_no) + ": ";
    if (line.empty()) continue;
    if (line[0] == '#') {
      if (line.rfind("# HELP ", 0) == 0 || line.rfind("# TYPE ", 0) == 0) {
        const bool is_type = line[2] == 'T';
        const std::string rest = line.substr(7);
        const size_t sp = rest.find(' ');
        const std::string name = rest.substr(0, sp);
        if (!prom_name_ok(name, true)) return at + "bad metric name '" + name + "'";
        if (finished_families.count(name) || (!current_family.empty() && current_family != name && series.count(name)))
          return at + "HELP/TYPE after samples of " + name;
        if (is_type) {
          if (sp == std::string::npos) return at + "TYPE without a type";
          const std::string type = rest.substr(sp + 1);
          if (type != "counter" && type != "gauge" && type != "histogram" && type != "summary" && type != "untyped")
            return at + "unknown type '" + type + "'";
          if (types.count(name)) return at + "second TYPE for " + name;
          types[name] = type;
        } else {
          if (helped.count(name)) return at + "second HELP for " + name;
          helped.insert(name);
        }
        if (current_family != name && !current_family.empty()) finished_families.insert(current_family);
        current_family = name;
      }
      continue;
    }
    // A sample: name[{labels}] value [timestamp]
    size_t i = 0;
    while (i < line.size() && line[i] != '{' && line[i] != ' ') ++i;
    PromSample s;
    s.name = line.substr(0, i);
    if (!prom_name_ok(s.name, true)) return at + "bad metric name '" + s.name + "'";
    std::string label_key;
    if (i < line.size() && line[i] == '{') {
      ++i;
      while (true) {
        if (i >= line.size()) return at + "unterminated label set";
        if (line[i] == '}') { ++i; break; }
        size_t eq = line.find('=', i);
        if (eq == std::string::npos) return at + "label without '='";
        const std::string key = line.substr(i, eq - i);
        if (!prom_name_ok(key, false)) return at + "bad label name '" + key + "'";
        i = eq + 1;
        if (i >= line.size() || line[i] != '"') return at + "label value not quoted";
        ++i;
        std::string value;
        while (true) {
          if (i >= line.size()) return at + "unterminated label value";
          const char c = line[i++];
          if (c == '"') break;
          if (c == '\\') {
            if (i >= line.size()) return at + "dangling escape";
            const char e = line[i++];
            if (e == 'n') value += '\n';
            else if (e == '\\' || e == '"') value += e;
            else return at + "bad escape \\" + std::string(1, e);
          } else {
            value += c;
          }
        }
        if (s.labels.count(key)) return at + "duplicate label " + key;
        s.labels[key] = value;
        if (i < line.size() && line[i] == ',') ++i;
        else if (i < line.size() && line[i] != '}') return at + "expected ',' or '}'";
      }
    }
    if (i >= line.size() || line[i] != ' ') return at + "missing value";
    const std::string rest = line.substr(i + 1);
    const size_t sp = rest.find(' ');
    if (!prom_value(rest.substr(0, sp), s.value)) return at + "bad value '" + rest + "'";
    if (sp != std::string::npos) {
      double ts = 0;
      if (!prom_value(rest.substr(sp + 1), ts)) return at + "bad timestamp";
    }
    const std::string family = family_of(s.name);
    if (finished_families.count(family)) return at + "samples of " + family + " are not contiguous";
    if (family != current_family) {
      if (!current_family.empty()) finished_families.insert(current_family);
      current_family = family;
    }
    std::string key = s.name + "{";
    for (const auto& [k, v] : s.labels) key += k + "=" + v + ",";
    if (!series.insert(key + "}").second) return at + "duplicate series " + key + "}";
    series.insert(family);
    if (types.count(family) && types[family] == "histogram") {
      std::string base = family + "{";
      for (const auto& [k, v] : s.labels)
        if (k != "le") base += k + "=" + v + ",";
      if (s.name == family + "_bucket") {
        if (!s.labels.count("le")) return at + "bucket without le";
        double le = 0;
        if (!prom_value(s.labels["le"], le)) return at + "bad le";
        auto& list = buckets[base];
        if (!list.empty() && (le <= list.back().first || s.value < list.back().second))
          return at + "buckets not increasing/cumulative";
        list.emplace_back(le, s.value);
      } else if (s.name == family + "_count") {
        counts[base] = s.value;
      } else if (s.name == family + "_sum") {
        sums.insert(base);
      } else {
        return at + "unexpected histogram sample " + s.name;
      }
    } else if (types.count(family) && types[family] == "counter" && s.value < 0) {
      return at + "negative counter";
    }
    if (samples) samples->push_back(std::move(s));
  }
  for (const auto& [base, list] : buckets) {
    if (list.empty() || !std::isinf(list.back().first)) return base + ": no +Inf bucket";
    if (!counts.count(base) || counts[base] != list.back().second) return base + ": _count differs from +Inf bucket";
    if (!sums.count(base)) return base + ": no _sum";
  }
  return "";
}

}  // namespace glms::test
