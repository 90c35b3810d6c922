// Single-request generation on one model: chunked prefill into a private paged cache, then
// token-by-token decode. The serving engine (scheduler, shared cache) builds on the same
// ForwardBatch/forward contract.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/sampler.h"
#include "model/glm5.h"
#include "model/step_runner.h"

namespace glms::engine {

struct GenerateOptions {
  int max_tokens = 64;
  SamplingParams sampling;
  bool ignore_eos = false;
  int prefill_chunk = 512;                          // prompt tokens per forward step
  int block_size = 64;
  int speculative_steps = 0;                        // > 0: MTP drafts this many tokens per step
  kv::CacheDtype kv_cache_dtype = kv::CacheDtype::kAuto;
  std::function<void(int32_t)> on_token;            // called as each token is chosen
};

// Speculative decoding statistics: drafts proposed, and how often the draft at each depth was
// accepted (accepted_per_position[i] counts steps whose first i + 1 drafts were all accepted).
struct SpeculativeStats {
  int64_t steps = 0;
  int64_t drafted = 0;
  int64_t accepted = 0;
  std::vector<int64_t> accepted_per_position;
  // Tokens produced per target forward: 1 + accepted drafts per step.
  double acceptance_length() const { return steps ? 1.0 + static_cast<double>(accepted) / steps : 0.0; }
};

struct GenerateResult {
  std::vector<int32_t> output_ids;
  std::string finish_reason;  // "stop" (EOS) or "length"
  double prefill_seconds = 0.0;
  double decode_seconds = 0.0;   // time from the first token to the last
  int decode_steps = 0;          // forward steps after the prefill
  SpeculativeStats speculative;  // filled when options.speculative_steps > 0
};

GenerateResult generate(const model::Glm5Model& model, const std::vector<int32_t>& prompt,
                        const GenerateOptions& options);

// generate() over any runner (the CUDA one, say), which it allocates for this request.
GenerateResult generate(model::StepRunner& runner, const std::vector<int32_t>& prompt, const GenerateOptions& options);

// generate() with MTP speculative decoding (options.speculative_steps drafts per step, chained
// through the checkpoint's MTP layer, verified in one target forward by speculative rejection
// sampling). Greedy tokens equal generate()'s without speculation; sampled tokens follow the
// same distribution (not the same draws: the random stream is used differently).
GenerateResult generate_speculative(const model::Glm5Model& model, const std::vector<int32_t>& prompt,
                                    const GenerateOptions& options);
// The same over any runner with an MTP layer (StepRunner::has_mtp), which it allocates.
GenerateResult generate_speculative(model::StepRunner& target, const std::vector<int32_t>& prompt,
                                    const GenerateOptions& options);

}  // namespace glms::engine
