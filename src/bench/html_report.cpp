#include "bench/html_report.h"

#include <sstream>

#include "bench/svg.h"

namespace glms::bench {

namespace {

// Escapes a line and turns `code` spans into <code>.
std::string inline_text(const std::string& s) {
  std::string out;
  bool code = false;
  for (const char c : s) {
    if (c == '`') {
      out += code ? "</code>" : "<code>";
      code = !code;
    } else {
      out += xml_escape(std::string(1, c));
    }
  }
  if (code) out += "</code>";
  return out;
}

std::vector<std::string> cells(const std::string& row) {
  std::vector<std::string> out;
  std::string cell;
  const size_t first = row.find('|'), last = row.rfind('|');
  for (size_t i = first + 1; i < last; ++i) {
    if (row[i] == '|') {
      out.push_back(cell);
      cell.clear();
    } else {
      cell += row[i];
    }
  }
  out.push_back(cell);
  for (std::string& c : out) {
    const size_t a = c.find_first_not_of(' '), b = c.find_last_not_of(' ');
    c = a == std::string::npos ? "" : c.substr(a, b - a + 1);
  }
  return out;
}

bool separator_row(const std::string& row) { return row.find_first_not_of("|-: ") == std::string::npos; }

}  // namespace

std::string html_report(const std::string& title, const std::string& markdown, const std::vector<std::string>& charts) {
  std::ostringstream out;
  out << "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>" << xml_escape(title)
      << "</title>\n<style>body{font:14px/1.45 system-ui,sans-serif;margin:24px;color:#1d232b;max-width:1200px}"
         "table{border-collapse:collapse;margin:8px 0 16px}td,th{border:1px solid #dde2e8;padding:3px 8px;text-align:right}"
         "th{background:#f1f3f5}td:first-child,th:first-child{text-align:left}pre{background:#f6f7f9;padding:8px;overflow-x:auto}"
         "svg{max-width:100%;height:auto;display:block;margin:12px 0}</style></head><body>\n";
  std::istringstream in(markdown);
  std::vector<std::string> table;
  bool fenced = false;
  auto flush_table = [&] {
    if (table.empty()) return;
    out << "<table>\n";
    bool header = table.size() > 1 && separator_row(table[1]);
    for (size_t r = 0; r < table.size(); ++r) {
      if (header && r == 1) continue;
      const char* tag = header && r == 0 ? "th" : "td";
      out << "<tr>";
      for (const std::string& c : cells(table[r])) out << "<" << tag << ">" << inline_text(c) << "</" << tag << ">";
      out << "</tr>\n";
    }
    out << "</table>\n";
    table.clear();
  };
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("```", 0) == 0) {
      flush_table();
      out << (fenced ? "</pre>\n" : "<pre>");
      fenced = !fenced;
      continue;
    }
    if (fenced) {
      out << xml_escape(line) << "\n";
      continue;
    }
    if (!line.empty() && line[0] == '|') {
      table.push_back(line);
      continue;
    }
    flush_table();
    if (line.empty()) continue;
    size_t level = 0;
    while (level < line.size() && line[level] == '#') ++level;
    if (level > 0 && level <= 4 && level < line.size() && line[level] == ' ')
      out << "<h" << level << ">" << inline_text(line.substr(level + 1)) << "</h" << level << ">\n";
    else
      out << "<p>" << inline_text(line) << "</p>\n";
  }
  flush_table();
  if (fenced) out << "</pre>\n";
  for (const std::string& svg : charts) {
    const size_t start = svg.find("<svg");  // inline: drop any XML declaration
    out << (start == std::string::npos ? svg : svg.substr(start)) << "\n";
  }
  out << "</body></html>\n";
  return out.str();
}

}  // namespace glms::bench
