// libFuzzer target: structured outputs. The input is a GBNF grammar, and also (when it parses as
// JSON) a JSON schema and a structural tag. Each either compiles or throws glms::Error; a compiled one is walked for a
// few tokens over a small vocabulary, taking the first allowed token each time, and must never
// leave a dead end it allowed into (a token allowed must keep the state alive).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "structured/grammar.h"
#include "structured/json_schema.h"
#include "structured/recognizer.h"
#include "structured/structural_tag.h"

namespace {

void walk(const std::shared_ptr<const glms::structured::Grammar>& g) {
  static const auto vocab = [] {
    std::vector<std::string> texts = {""};
    for (int c = 0x20; c < 0x7f; ++c) texts.emplace_back(1, static_cast<char>(c));
    for (const char* t : {"\n", "{\"", "\":", "true", "null", "12", "ab"}) texts.emplace_back(t);
    return glms::structured::make_vocabulary(std::move(texts));
  }();
  // A fortieth of a request's work bound: one spending it all takes about a second in Release,
  // past libFuzzer's timeout under the sanitizers.
  auto c = glms::structured::make_grammar_constraint(g, vocab, glms::structured::kMaxRequestGrammarWork / 40);
  std::vector<float> logits(static_cast<size_t>(vocab->vocab_size()));
  for (int step = 0; step < 24; ++step) {
    std::fill(logits.begin(), logits.end(), 0.0f);
    c->mask(logits.data(), vocab->vocab_size());
    int pick = -1;
    for (int t = 0; t < vocab->vocab_size() && pick < 0; ++t)
      if (std::isfinite(logits[static_cast<size_t>(t)])) pick = (t + step * 7) % vocab->vocab_size();
    if (pick < 0 || !std::isfinite(logits[static_cast<size_t>(pick)]) || !c->failure().empty()) break;
    c->accept(pick);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  try {
    walk(glms::structured::parse_gbnf(input));
  } catch (const glms::Error&) {
  }
  const auto schema = nlohmann::ordered_json::parse(input, nullptr, false);
  if (!schema.is_discarded()) {
    try {
      walk(glms::structured::json_schema_grammar(schema));
    } catch (const glms::Error&) {
    }
    try {
      walk(glms::structured::structural_tag_grammar(schema));
    } catch (const glms::Error&) {
    }
  }
  return 0;
}
