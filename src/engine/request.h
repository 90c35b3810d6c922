// What a client asks of the engine, and what the engine reports back as a request runs.
// The server turns OpenAI JSON into a RequestParams; the engine never sees text.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/sampler.h"

namespace glms::engine {

// Limits the tokens a request may produce next (structured outputs, src/structured): masks the
// logits before each draw and follows the tokens drawn. Called on the engine's thread; each
// request (each of n choices) has its own.
class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // Sets logits[t] to -infinity for every token t of [0, vocab) not allowed next; the engine then
  // gives the model's EOS ids back their logits when may_end().
  virtual void mask(float* logits, int vocab) const = 0;
  // The same tokens as a packed bitmask: words[mask_words(vocab)], bit t % 32 of word t / 32 set
  // where mask() leaves token t's logit alone (bits past vocab clear). Like mask(), it decides
  // what may_end() says next. This default runs mask() over a row of zeros; a constraint with
  // its masks cached as bits overrides it.
  virtual void allowed_bits(uint32_t* words, int vocab) const;
  virtual bool may_end() const = 0;  // the output so far is complete
  virtual void accept(int32_t token) = 0;
  // Non-empty when the constraint cannot go on (it spent what a request may spend): the engine
  // ends the request with this error instead of reporting the token just drawn.
  virtual std::string failure() const { return {}; }

  static int mask_words(int vocab) { return (vocab + 31) / 32; }
  // What the engine draws from next, as bits: allowed_bits(), then, when may_end(), the bits of
  // `eos_ids` set (the EOS ids mask() + may_end() give back their logits; pass none where the
  // request ignores EOS). words: [mask_words(vocab)].
  void next_token_bits(uint32_t* words, int vocab, const std::vector<int32_t>& eos_ids) const {
    allowed_bits(words, vocab);
    if (!may_end()) return;
    for (const int32_t id : eos_ids)
      if (id >= 0 && id < vocab) words[id / 32] |= uint32_t{1} << (id % 32);
  }
};

inline void TokenConstraint::allowed_bits(uint32_t* words, int vocab) const {
  std::vector<float> row(static_cast<size_t>(vocab), 0.0f);
  mask(row.data(), vocab);
  std::fill(words, words + mask_words(vocab), 0u);
  for (int t = 0; t < vocab; ++t)
    if (row[static_cast<size_t>(t)] == 0.0f) words[t / 32] |= uint32_t{1} << (t % 32);
}

struct RequestParams {
  std::vector<int32_t> prompt_ids;     // must be non-empty and within the vocabulary
  int max_tokens = 16;                 // tokens to generate at most (>= 1)
  SamplingParams sampling;             // temperature 0 = greedy
  bool ignore_eos = false;             // keep going past the model's EOS ids
  std::vector<int32_t> stop_token_ids; // extra ids that end the request (finish_reason "stop")
  float presence_penalty = 0.0f;       // OpenAI semantics, applied to generated tokens
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;     // vLLM/HF semantics, over prompt + generated tokens
  int top_logprobs = -1;               // -1: no logprobs; 0: the chosen token's; k: plus top k
  double timeout_seconds = 0.0;        // 0 = none; past it the request ends with "timeout"
  std::vector<std::pair<int32_t, float>> logit_bias;  // added to those tokens' logits before drawing
  std::vector<int32_t> allowed_token_ids;  // vLLM's: only these may be drawn (empty: any token)
  // vLLM's bad_words as token sequences: a sequence's last token is never drawn where the tokens
  // generated so far end with the rest of it (a one-token sequence: never drawn).
  std::vector<std::vector<int32_t>> bad_word_ids;
  int min_tokens = 0;                  // EOS and stop_token_ids are held back until this many tokens
  std::shared_ptr<TokenConstraint> constraint;  // structured output: what may come next (null: anything)
  // -1: none; k >= 0: each prompt token's logprob given the tokens before it, its rank, and the k
  // likeliest tokens there (vLLM's prompt_logprobs). Such a request skips the prefix cache: a
  // cached prefix has no logits.
  int prompt_logprobs = -1;
  // Parts the prefix cache: blocks cached under one salt serve only requests with the same salt
  // (vLLM's cache_salt; empty: the unsalted part).
  std::string cache_salt;
};

// Whether anything adjusts a request's logits before its token is drawn (penalties, logit_bias,
// allowed tokens, bad words, min_tokens): then the logits come back to the host.
inline bool adjusts_logits(const RequestParams& p) {
  return p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f || p.repetition_penalty != 1.0f ||
         !p.logit_bias.empty() || !p.allowed_token_ids.empty() || !p.bad_word_ids.empty() || p.min_tokens > 0 ||
         p.constraint != nullptr;
}

// Whether a structured-output constraint is all that adjusts a request's logits and nothing else
// reads them (no penalties, logit_bias, token filters, min_tokens or logprobs): a runner that
// applies token masks where the logits are (RowOutput::mask; the CUDA one, on the device) can then
// return only its token.
inline bool only_masked(const RequestParams& p) {
  return p.constraint != nullptr && p.presence_penalty == 0.0f && p.frequency_penalty == 0.0f &&
         p.repetition_penalty == 1.0f && p.logit_bias.empty() && p.allowed_token_ids.empty() &&
         p.bad_word_ids.empty() && p.min_tokens <= 0 && p.top_logprobs < 0;
}

// Whether a request's next token is the argmax of its logits and nothing else reads them
// (temperature 0, nothing adjusting them, no logprobs): a step then returns only that row's argmax.
inline bool greedy_only(const RequestParams& p) {
  return p.sampling.temperature <= 0.0f && !adjusts_logits(p) && p.top_logprobs < 0;
}

// Whether a request samples (temperature above 0) with nothing else reading its logits (no
// adjustment, no logprobs): a step can then draw its token where the logits are.
inline bool plainly_sampled(const RequestParams& p) {
  return p.sampling.temperature > 0.0f && !adjusts_logits(p) && p.top_logprobs < 0;
}

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

struct GeneratedToken {
  int32_t token = 0;
  float logprob = 0.0f;                    // set when top_logprobs >= 0
  std::vector<TokenLogprob> top_logprobs;  // k most likely, when top_logprobs > 0
  int rank = 0;                            // prompt logprobs: 1 + the tokens likelier than `token`
};

// One report about a request: new tokens since the last report, and whether it is done.
// finish_reason: "stop" (EOS or stop id), "length" (max_tokens or model length), "abort"
// (cancelled), "timeout", or "error" (then `error` says why).
struct RequestOutput {
  uint64_t request_id = 0;
  std::vector<GeneratedToken> new_tokens;
  // With the first output of a request with prompt_logprobs: prompt tokens 1..prompt_len-1, each
  // scored given the tokens before it (token 0 has nothing before it).
  std::vector<GeneratedToken> prompt_logprobs;
  bool finished = false;
  std::string finish_reason;
  std::string error;
  bool request_error = false;  // the error is the request's own (an HTTP 400), not the server's
  int prompt_tokens = 0;
  int cached_prompt_tokens = 0;  // prompt tokens served from the prefix cache
  int completion_tokens = 0;     // generated so far
  // With `finished` (vLLM's request phases, seconds; 0 for a phase the request never reached):
  // waiting before its first step, first step to first token, first token to the end, and
  // first step to the end.
  double queued_seconds = 0, prefill_seconds = 0, decode_seconds = 0, inference_seconds = 0;
};

// Called on the engine's thread; must not block for long (hand the output to the connection).
using OutputCallback = std::function<void(const RequestOutput&)>;

}  // namespace glms::engine
