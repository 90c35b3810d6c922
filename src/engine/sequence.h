// A request inside the engine: its tokens (prompt, then generated), how many of them have
// their cache rows computed, and the blocks holding those rows.
#pragma once

#include <chrono>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "engine/request.h"
#include "engine/sampler.h"

namespace glms::engine {

using Clock = std::chrono::steady_clock;

struct Sequence {
  uint64_t id = 0;
  RequestParams params;
  OutputCallback on_output;
  Sampler sampler{0};

  std::vector<int32_t> tokens;       // prompt + generated
  int prompt_len = 0;
  int num_computed = 0;              // tokens whose cache rows are written
  int rank = -1;                     // the data-parallel rank it runs on while admitted
  std::vector<int32_t> block_table;  // physical blocks of its rank's cache, one per block_size tokens
  int cached_blocks = 0;             // leading blocks already recorded in the prefix cache
  int cached_prompt_tokens = 0;      // prompt tokens that came from the prefix cache (first admission)
  bool admitted_once = false;
  std::unordered_map<int32_t, int> generated_counts;  // for presence/frequency penalties
  // params.prompt_logprobs >= 0: prompt tokens 1.. scored so far (kept across preemption), and
  // whether they went out with the first token.
  std::vector<GeneratedToken> prompt_logprobs;
  bool prompt_logprobs_sent = false;

  // MTP drafting (EngineConfig::speculative_steps > 0, requests without penalties): the target's
  // hidden states of positions [mtp_next, num_computed), whose draft-layer rows are not written
  // yet ([n, hidden]); the entry at position p pairs with tokens[p + 1].
  bool speculates = false;
  int mtp_next = 0;
  std::vector<float> mtp_hidden;

  Clock::time_point arrival;      // submitted
  Clock::time_point scheduled;    // first admitted to a step (admitted_once)
  Clock::time_point first_token;  // its first generated token reported (num_generated() >= 1)

  int num_generated() const { return static_cast<int>(tokens.size()) - prompt_len; }
  // Tokens still to run through the model before the next sample.
  int pending() const { return static_cast<int>(tokens.size()) - num_computed; }
  // Whether this step's chunk needs every token's logits: prompt tokens are still unscored.
  bool scores_prompt() const {
    return params.prompt_logprobs >= 0 && static_cast<int>(prompt_logprobs.size()) < prompt_len - 1;
  }
};

}  // namespace glms::engine
