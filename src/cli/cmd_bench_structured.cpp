// glmserve bench-structured: what structured outputs cost the engine per decode step. For each
// form (JSON schema, json_object, regex, forced tool calls) and batch size, B constraints walk
// random allowed tokens over a vocabulary (a tokenizer's, optionally widened to GLM-5's 154880
// entries by joining token pairs) and the time of every step's B masks is recorded: the host work
// the engine adds to a step. Prints a table and writes JSON (tools/bench-structured adds the
// record's command, revision, machine and date).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <fmt/format.h>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "cli/commands.h"
#include "core/error.h"
#include "structured/json_schema.h"
#include "structured/recognizer.h"
#include "structured/regex.h"
#include "structured/tool_calls.h"
#include "text/tokenizer.h"

namespace glms::cli {

namespace {

struct BenchStructuredArgs {
  std::string tokenizer;
  int vocab_size = 154880;
  std::vector<int> batches = {1, 64};
  int steps = 64;
  uint32_t seed = 1;
  std::string json_out;
};

using Clock = std::chrono::steady_clock;
using ordered_json = nlohmann::ordered_json;

// The tokenizer's texts (markup tokens as reserved bytes), then distinct joins of random token
// pairs until `size` entries: a vocabulary with the target's size and a realistic spread of bytes.
structured::TokenTexts bench_vocabulary(const text::Tokenizer& tokenizer, int size, uint32_t seed) {
  std::vector<std::string> texts(static_cast<size_t>(tokenizer.vocab_size()));
  std::vector<int32_t> plain;
  for (size_t id = 0; id < texts.size(); ++id) {
    const int32_t one = static_cast<int32_t>(id);
    if (tokenizer.is_special(one)) continue;
    texts[id] = tokenizer.decode(std::vector<int32_t>{one}, false);
    if (!texts[id].empty()) plain.push_back(one);
  }
  std::vector<int32_t> markup;
  for (const std::string_view tag : structured::kMarkupTokens) markup.push_back(tokenizer.token_to_id(std::string(tag)));
  std::set<std::string> seen(texts.begin(), texts.end());
  std::mt19937 rng(seed);
  for (size_t tries = 0; static_cast<int>(texts.size()) < size && tries < static_cast<size_t>(size) * 20; ++tries) {
    std::string joined = texts[static_cast<size_t>(plain[rng() % plain.size()])] + texts[static_cast<size_t>(plain[rng() % plain.size()])];
    if (seen.insert(joined).second) texts.push_back(std::move(joined));
  }
  return structured::make_vocabulary(std::move(texts), markup);
}

struct Form {
  std::string name;
  std::shared_ptr<const structured::Grammar> grammar;
};

std::vector<Form> bench_forms() {
  const ordered_json tool_args = ordered_json::parse(R"({"type": "object", "properties": {
      "query": {"type": "string", "maxLength": 40},
      "limit": {"type": "integer", "minimum": 1, "maximum": 100},
      "sort": {"enum": ["relevance", "date", "stars"]},
      "filters": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 4},
      "options": {"type": "object", "properties": {"exact": {"type": "boolean"}, "since": {"type": "string", "format": "date"}}}},
      "required": ["query", "limit"]})");
  const ordered_json tools = ordered_json::array(
      {{{"type", "function"}, {"function", {{"name", "search"}, {"parameters", tool_args}}}},
       {{"type", "function"},
        {"function", {{"name", "get_weather"}, {"parameters", ordered_json::parse(R"({"type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]})")}}}}});
  return {{"json_schema", structured::json_schema_grammar(tool_args)},
          {"json_object", structured::json_schema_grammar(ordered_json{{"type", "object"}})},
          {"regex", structured::regex_grammar(R"(\d{4}-\d{2}-\d{2}( [a-z]{1,12}){0,6})")},
          {"tool_calls", structured::tool_call_grammar(tools, {})}};
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

// One form at one batch: `steps` steps of B masks; a finished walk restarts with a new
// constraint (a new request). `matcher` is shared by the batch and the requests that follow, as
// the server shares it between requests with the same form: a fresh one measures cold masks, a
// second pass over it the warm ones.
nlohmann::json measure(const Form& form, const std::shared_ptr<structured::GrammarMatcher>& matcher,
                       const structured::TokenTexts& vocab, int batch, int steps, uint32_t seed) {
  const int n = vocab->vocab_size();
  std::vector<std::shared_ptr<engine::TokenConstraint>> walks(static_cast<size_t>(batch));
  for (auto& w : walks) w = structured::make_grammar_constraint(matcher);
  std::vector<float> logits(static_cast<size_t>(n));
  std::mt19937 rng(seed);
  std::vector<double> step_ms;
  int restarts = 0;
  for (int step = 0; step < steps; ++step) {
    double mask_seconds = 0.0;
    for (auto& w : walks) {
      std::fill(logits.begin(), logits.end(), 0.0f);
      const auto start = Clock::now();
      w->mask(logits.data(), n);
      mask_seconds += std::chrono::duration<double>(Clock::now() - start).count();
      std::vector<int32_t> allowed;
      for (int t = 0; t < n; ++t)
        if (std::isfinite(logits[static_cast<size_t>(t)])) allowed.push_back(t);
      if (allowed.empty() || (w->may_end() && rng() % 4 == 0)) {
        w = structured::make_grammar_constraint(matcher);
        ++restarts;
        continue;
      }
      w->accept(allowed[rng() % allowed.size()]);
    }
    step_ms.push_back(mask_seconds * 1e3);
  }
  double total = 0.0;
  for (double ms : step_ms) total += ms;
  return {{"form", form.name},         {"batch", batch},
          {"steps", steps},            {"mean_step_ms", total / steps},
          {"p50_step_ms", percentile(step_ms, 0.5)}, {"p99_step_ms", percentile(step_ms, 0.99)},
          {"max_step_ms", percentile(step_ms, 1.0)}, {"mean_mask_ms", total / steps / batch},
          {"requests_restarted", restarts}, {"dfa_states", matcher->num_states()}};
}

void run_bench_structured(const BenchStructuredArgs& a) {
  const text::Tokenizer tokenizer = text::Tokenizer::load(a.tokenizer);
  auto start = Clock::now();
  const structured::TokenTexts vocab = bench_vocabulary(tokenizer, a.vocab_size, a.seed);
  const double build_s = std::chrono::duration<double>(Clock::now() - start).count();
  std::cerr << fmt::format("vocabulary: {} tokens ({} from the tokenizer), trie of {} nodes built in {:.2f} s\n",
                           vocab->vocab_size(), tokenizer.vocab_size(), vocab->nodes.size(), build_s);
  nlohmann::json results = nlohmann::json::array();
  std::cerr << fmt::format("{:<12} {:>6} {:>5} {:>14} {:>14} {:>14} {:>14}\n", "form", "batch", "pass", "mean step ms",
                           "p50 ms", "p99 ms", "per mask ms");
  for (const Form& form : bench_forms())
    for (const int batch : a.batches) {
      const auto matcher = std::make_shared<structured::GrammarMatcher>(form.grammar, vocab);
      for (const char* pass : {"cold", "warm"}) {
        nlohmann::json r = measure(form, matcher, vocab, batch, a.steps, a.seed + (pass[0] == 'w'));
        r["pass"] = pass;
        std::cerr << fmt::format("{:<12} {:>6} {:>5} {:>14.3f} {:>14.3f} {:>14.3f} {:>14.4f}\n", form.name, batch, pass,
                                 r["mean_step_ms"].get<double>(), r["p50_step_ms"].get<double>(),
                                 r["p99_step_ms"].get<double>(), r["mean_mask_ms"].get<double>());
        results.push_back(r);
      }
    }
  const nlohmann::json out = {{"benchmark", "structured-masks"},
                              {"tokenizer", a.tokenizer},
                              {"vocab_size", vocab->vocab_size()},
                              {"tokenizer_vocab_size", tokenizer.vocab_size()},
                              {"trie_nodes", vocab->nodes.size()},
                              {"vocabulary_build_seconds", build_s},
                              {"results", results}};
  if (!a.json_out.empty()) {
    std::ofstream file(a.json_out);
    file << out.dump(2) << "\n";
    if (!file) fail("cannot write " + a.json_out);
  }
}

}  // namespace

void add_bench_structured_command(CLI::App& app) {
  auto a = std::make_shared<BenchStructuredArgs>();
  CLI::App* cmd = app.add_subcommand("bench-structured", "Measure the per-step host cost of structured-output masks");
  cmd->add_option("--tokenizer", a->tokenizer, "tokenizer.json file, or a model folder holding one")->required();
  cmd->add_option("--vocab-size", a->vocab_size, "Widen the vocabulary to this many tokens (joined token pairs)")
      ->capture_default_str();
  cmd->add_option("--batch", a->batches, "Batch sizes (requests masked per step)")->capture_default_str()->delimiter(',');
  cmd->add_option("--steps", a->steps, "Steps per form and batch")->capture_default_str()->check(CLI::Range(1, 100000));
  cmd->add_option("--seed", a->seed, "Seed of the vocabulary and the walks")->capture_default_str();
  cmd->add_option("--json-out", a->json_out, "Write the results as JSON here");
  cmd->callback([a] { run_bench_structured(*a); });
}

}  // namespace glms::cli
