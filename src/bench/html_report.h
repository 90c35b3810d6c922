// `glmserve bench --output-dir`'s report.html: the Markdown report (tables, detail blocks) as
// HTML with the SVG charts inline, in one file that opens offline (no scripts, no fetches).
#pragma once

#include <string>
#include <vector>

namespace glms::bench {

// `markdown` is the report's text (headings, pipe tables, fenced blocks, lines); `charts` are
// SVG documents placed after it. `title` names the page.
std::string html_report(const std::string& title, const std::string& markdown, const std::vector<std::string>& charts);

}  // namespace glms::bench
