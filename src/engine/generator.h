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

namespace glms::engine {

struct GenerateOptions {
  int max_tokens = 64;
  SamplingParams sampling;
  bool ignore_eos = false;
  int prefill_chunk = 512;                          // prompt tokens per forward step
  int block_size = 64;
  std::function<void(int32_t)> on_token;            // called as each token is chosen
};

struct GenerateResult {
  std::vector<int32_t> output_ids;
  std::string finish_reason;  // "stop" (EOS) or "length"
  double prefill_seconds = 0.0;
  double decode_seconds = 0.0;   // time from the first token to the last
  int decode_steps = 0;          // forward steps after the prefill
};

GenerateResult generate(const model::Glm5Model& model, const std::vector<int32_t>& prompt,
                        const GenerateOptions& options);

}  // namespace glms::engine
