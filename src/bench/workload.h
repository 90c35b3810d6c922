// Bench workloads: prompts of exact token lengths made from random vocabulary ids, optionally
// sharing a prefix so that a prefix cache can hit on a known share of every prompt, and the
// named presets of the write-ups' benchmark runs.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "text/tokenizer.h"

namespace glms::bench {

struct WorkloadSpec {
  int input_len = 1024;      // prompt tokens (mean when range_ratio > 0)
  int output_len = 128;      // max_tokens sent with ignore_eos (mean when range_ratio > 0)
  double range_ratio = 0;    // lengths uniform in [len*(1-r), len*(1+r)] as vLLM's random dataset
  double prefix_hit = 0;     // in [0, 1): share of input_len taken by a shared prefix
  int num_prefixes = 4;      // distinct shared prefixes; prompt i uses prefix i % num_prefixes
  uint64_t seed = 0;
};

// One request's prompt. `ids` is exactly what the server's tokenizer makes of `text`
// (encode(text, add_special_tokens = false) == ids), so sending either gives the same prompt.
struct Prompt {
  std::string text;
  std::vector<int32_t> ids;
  int output_len = 0;
  int prefix_len = 0;     // leading tokens shared with other prompts of the same group
  int prefix_group = -1;  // -1: no shared prefix
};

// `count` prompts, deterministic for a given spec and tokenizer (prompt i is made from
// seed + i, so the result does not depend on `threads`). Prompt i of a workload with
// prefix_hit h starts with the ids of shared prefix (i % num_prefixes), which are
// round(h * input_len) tokens long; the suffix is random. Throws glms::Error on bad specs
// or when no exact prompt can be made (a tokenizer whose round trip never settles).
std::vector<Prompt> make_prompts(const text::Tokenizer& tok, const WorkloadSpec& spec, size_t count,
                                 unsigned threads = 0);

// fn(i) for every i < count, spread over `threads` threads (0: the machine's); the first exception
// any call throws is thrown again once all have stopped.
void for_each_index(size_t count, unsigned threads, const std::function<void(size_t)>& fn);

// Ids whose text re-encodes to exactly themselves, `len` long, starting with `prefix` (which must
// itself be stable). Exposed for tests.
std::vector<int32_t> exact_ids(const text::Tokenizer& tok, const std::vector<int32_t>& prefix, int len, uint64_t seed);

// A named preset: the write-ups' runs. Values are defaults; every explicit flag overrides them.
struct Preset {
  std::string name, description;
  int input_len = 0, output_len = 0;
  double prefix_hit = 0;
  std::vector<double> request_rates;  // open-loop levels (empty: none)
  std::vector<int> concurrencies;     // closed-loop levels (empty: none)
  int num_prompts = 0;                // per level; 0: automatic (see bench.h)
  int warmup = 0;                     // -1: automatic (one per concurrency slot)
};
std::optional<Preset> find_preset(const std::string& name);
std::vector<Preset> presets();
std::vector<std::string> preset_names();  // presets()' names, in order

}  // namespace glms::bench
