// Prompts read from a dataset file, as vLLM's `bench serve` and SGLang's bench_serving read them
// (`--dataset-name sharegpt|custom --dataset-path FILE`): real text whose lengths vary, where the
// random workload (workload.h) gives exact lengths.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench/workload.h"
#include "text/tokenizer.h"

namespace glms::bench {

struct DatasetSpec {
  std::string name;  // "sharegpt" or "custom"
  std::string path;
  // > 0: every request's max_tokens (--sharegpt-output-len, --custom-output-len). 0: sharegpt takes
  // the token count of each conversation's first reply, custom takes kCustomOutputLen.
  int output_len = 0;
  // ShareGPT's filter: vLLM's (below), or with sglang_filter SGLang's: prompt and output of 2
  // tokens or more and, where context_len > 0, together at most context_len
  // (--sharegpt-context-len).
  bool sglang_filter = false;
  int context_len = 0;
  uint64_t seed = 0;
};

// vLLM's ShareGPT filter: a prompt of fewer than 4 tokens or more than 1024, a reply of fewer than
// 4 (when the reply sets the output length), or both together past 2048 are skipped.
inline constexpr int kShareGptMinLen = 4;
inline constexpr int kShareGptMaxPromptLen = 1024;
inline constexpr int kShareGptMaxTotalLen = 2048;
// vLLM's --custom-output-len default.
inline constexpr int kCustomOutputLen = 256;

// The dataset names bench knows, for messages.
inline constexpr const char* kDatasetNames = "random, sharegpt, custom";

// `count` prompts from the file, in an order shuffled by spec.seed (the same file, seed and
// tokenizer give the same prompts on any machine; not the sample vLLM or SGLang draw for that
// seed). ShareGPT: a JSON array of {"conversations": [{"from", "value"}, ...]}; each entry's first
// turn is the prompt and its second the reply; entries of fewer than two turns are skipped, as
// are those the filter (above) drops. Custom: JSON lines,
// each an object with a "prompt" string. Each prompt's ids are encode(text) without special
// tokens. Where the file has fewer usable prompts than `count`, they are used again in the same
// order, and `reused` (when not null) is set to how many usable ones there were (0 otherwise).
// Throws glms::Error naming the file (and line or entry) for an unreadable file, bad JSON, an
// entry of the wrong shape, or a file with no usable prompt.
std::vector<Prompt> read_dataset_prompts(const text::Tokenizer& tok, const DatasetSpec& spec, size_t count,
                                         size_t* reused = nullptr, unsigned threads = 0);

}  // namespace glms::bench
