// Next-token choice from fp32 logits: greedy at temperature 0, otherwise temperature, top-k,
// top-p and min-p filtering (vLLM's order) and a draw from a seeded generator.
#pragma once

#include <cstdint>
#include <random>

namespace glms::engine {

struct SamplingParams {
  float temperature = 1.0f;  // 0 = greedy
  float top_p = 1.0f;        // (0, 1]
  int top_k = 0;             // 0 or -1 = off
  float min_p = 0.0f;        // [0, 1]
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(uint64_t seed) : rng_(seed) {}
  int32_t sample(const float* logits, int vocab_size, const SamplingParams& params);

 private:
  std::mt19937_64 rng_;
};

// Index of the largest logit (lowest index on ties).
int32_t argmax(const float* logits, int vocab_size);

}  // namespace glms::engine
