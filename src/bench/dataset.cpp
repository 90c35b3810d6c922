#include "bench/dataset.h"

#include <algorithm>
#include <utility>
#include <fmt/format.h>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <random>

#include "bench/arrivals.h"
#include "core/error.h"

namespace glms::bench {

namespace {

using nlohmann::json;

// A dataset entry before tokenisation: the prompt's text and, for ShareGPT, the reply's.
struct Entry {
  std::string prompt, reply;
};

std::ifstream open_dataset(const DatasetSpec& spec) {
  std::ifstream in(spec.path, std::ios::binary);
  if (!in) fail("bench: --dataset-path " + spec.path + ": cannot open the file");
  return in;
}

// The turn's "value" string, or an error naming the entry.
std::string turn_text(const json& turn, size_t entry, int index, const DatasetSpec& spec) {
  if (!turn.is_object() || !turn.contains("value") || !turn["value"].is_string())
    fail(fmt::format("bench: {}: entry {}: conversation turn {} is not an object with a \"value\" string", spec.path,
                     entry, index));
  return turn["value"].get<std::string>();
}

// ShareGPT's JSON array: each entry's first two turns (entries of fewer turns are skipped).
std::vector<Entry> read_sharegpt(const DatasetSpec& spec) {
  std::ifstream in = open_dataset(spec);
  json doc;
  try {
    doc = json::parse(in);
  } catch (const json::parse_error& e) {
    fail("bench: " + spec.path + ": not valid JSON (" + e.what() + ")");
  }
  if (!doc.is_array())
    fail("bench: " + spec.path + ": a ShareGPT file is a JSON array of {\"conversations\": [...]} entries");
  std::vector<Entry> entries;
  for (size_t i = 0; i < doc.size(); ++i) {
    const json& e = doc[i];
    if (!e.is_object() || !e.contains("conversations") || !e["conversations"].is_array())
      fail(fmt::format("bench: {}: entry {} has no \"conversations\" array", spec.path, i));
    const json& turns = e["conversations"];
    if (turns.size() < 2) continue;
    entries.push_back({turn_text(turns[0], i, 0, spec), turn_text(turns[1], i, 1, spec)});
  }
  return entries;
}

// vLLM's custom dataset: JSON lines, each an object with a "prompt" string (blank lines skipped).
std::vector<Entry> read_custom(const DatasetSpec& spec) {
  std::ifstream in = open_dataset(spec);
  std::vector<Entry> entries;
  std::string line;
  for (size_t number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const json row = json::parse(line, nullptr, false);
    if (row.is_discarded() || !row.is_object() || !row.contains("prompt") || !row["prompt"].is_string())
      fail(fmt::format("bench: {}:{}: expected a JSON object with a \"prompt\" string on each line", spec.path,
                       number));
    entries.push_back({row["prompt"].get<std::string>(), {}});
  }
  return entries;
}

// Whether a ShareGPT conversation of `in` prompt and `out` output tokens passes the filter.
bool sharegpt_keeps(int in, int out, const DatasetSpec& spec) {
  if (spec.sglang_filter) return in >= 2 && out >= 2 && (spec.context_len <= 0 || in + out <= spec.context_len);
  const bool reply_sets_length = spec.output_len <= 0;
  return in >= kShareGptMinLen && (!reply_sets_length || out >= kShareGptMinLen) && in <= kShareGptMaxPromptLen &&
         in + out <= kShareGptMaxTotalLen;
}

// The filter in words, for the error of a file that nothing passes.
std::string filter_words(const DatasetSpec& spec) {
  if (spec.name == "custom") return "prompts that encode to at least one token";
  if (spec.sglang_filter)
    return "SGLang's filter: prompt and output of 2 tokens or more" +
           (spec.context_len > 0 ? fmt::format(", together at most {}", spec.context_len) : std::string());
  return fmt::format("vLLM's filter: prompts of {} to {} tokens{}, prompt and output together at most {}",
                     kShareGptMinLen, kShareGptMaxPromptLen,
                     spec.output_len > 0 ? "" : fmt::format(", replies of {} or more", kShareGptMinLen),
                     kShareGptMaxTotalLen);
}

// The entry as a request, or nothing where the dataset's filter drops it.
std::optional<Prompt> judge(const text::Tokenizer& tok, const Entry& entry, const DatasetSpec& spec) {
  Prompt p;
  p.text = entry.prompt;
  p.ids = tok.encode(entry.prompt, false);
  const int in = static_cast<int>(p.ids.size());
  if (spec.name == "custom") {
    p.output_len = spec.output_len > 0 ? spec.output_len : kCustomOutputLen;
    return in > 0 ? std::optional<Prompt>(std::move(p)) : std::nullopt;
  }
  p.output_len = spec.output_len > 0 ? spec.output_len : static_cast<int>(tok.encode(entry.reply, false).size());
  if (!sharegpt_keeps(in, p.output_len, spec)) return std::nullopt;
  return p;
}

// 0 .. n - 1 shuffled by Fisher-Yates over mt19937_64's draws (whose sequence the standard fixes,
// unlike std::shuffle's use of them): the same order from every standard library.
std::vector<size_t> shuffled_order(size_t n, uint64_t seed) {
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  std::mt19937_64 rng(mix_seed(seed));
  for (size_t i = n; i > 1; --i) std::swap(order[i - 1], order[rng() % i]);
  return order;
}

}  // namespace

std::vector<Prompt> read_dataset_prompts(const text::Tokenizer& tok, const DatasetSpec& spec, size_t count,
                                         size_t* reused, unsigned threads) {
  if (spec.name != "sharegpt" && spec.name != "custom")
    fail("bench: --dataset-name " + spec.name + ": expects one of " + kDatasetNames);
  const std::vector<Entry> entries = spec.name == "sharegpt" ? read_sharegpt(spec) : read_custom(spec);
  if (entries.empty())
    fail("bench: " + spec.path + ": no " +
         (spec.name == "sharegpt" ? std::string("conversation of two turns or more") : std::string("prompt")) +
         " in the file");
  const std::vector<size_t> order = shuffled_order(entries.size(), spec.seed);

  // Entries are tokenised in batches a little larger than what is still missing, in parallel,
  // and taken in the shuffled order: the result does not depend on `threads`.
  std::vector<Prompt> usable;
  for (size_t next = 0; usable.size() < count && next < order.size();) {
    const size_t batch = std::min(order.size() - next, std::max<size_t>(64, (count - usable.size()) * 5 / 4));
    std::vector<std::optional<Prompt>> judged(batch);
    for_each_index(batch, threads, [&](size_t i) { judged[i] = judge(tok, entries[order[next + i]], spec); });
    for (std::optional<Prompt>& p : judged)
      if (p && usable.size() < count) usable.push_back(std::move(*p));
    next += batch;
  }
  if (usable.empty())
    fail(fmt::format("bench: {}: none of its {} {} passes the filter ({})", spec.path, entries.size(),
                     spec.name == "sharegpt" ? "conversations" : "prompts", filter_words(spec)));
  if (reused) *reused = usable.size() < count ? usable.size() : 0;
  std::vector<Prompt> out;
  out.reserve(count);
  for (size_t i = 0; i < count; ++i) out.push_back(usable[i % usable.size()]);
  return out;
}

}  // namespace glms::bench
