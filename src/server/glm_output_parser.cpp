// The GLM reasoning + tool-call parsers behind the server's OutputParser seam.
#include "server/text_stream.h"
#include "text/glm_parsers.h"

#include <optional>

namespace glms::server {
namespace {

class GlmOutputParser final : public OutputParser {
 public:
  explicit GlmOutputParser(const ParserOptions& o) : reasoning_(o.prompt_ends_in_think) {
    if (o.tools) tools_.emplace(o.tools_json);
  }

  ParsedDelta feed(std::string_view text) override { return route(reasoning_.feed(text), false); }
  ParsedDelta finish() override { return route(reasoning_.finish(), true); }

 private:
  ParsedDelta route(text::ReasoningDelta r, bool at_end) {
    ParsedDelta out;
    out.reasoning = std::move(r.reasoning);
    if (!tools_) {
      out.content = std::move(r.content);
      return out;
    }
    auto take = [&](text::ToolDelta d) {
      out.content += d.content;
      for (text::ToolCallDelta& c : d.calls) out.tool_calls.push_back({c.id, c.name, c.arguments});
    };
    if (!r.content.empty()) take(tools_->feed(r.content));
    if (at_end) take(tools_->finish());
    return out;
  }

  text::ReasoningParser reasoning_;
  std::optional<text::ToolCallParser> tools_;
};

}  // namespace

ParserFactory glm_parser_factory() {
  return [](const ParserOptions& o) -> std::unique_ptr<OutputParser> { return std::make_unique<GlmOutputParser>(o); };
}

}  // namespace glms::server
