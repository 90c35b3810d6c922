#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace glms::engine {

int32_t argmax(const float* logits, int vocab_size) {
  int32_t best = 0;
  for (int32_t i = 1; i < vocab_size; ++i)
    if (logits[i] > logits[best]) best = i;
  return best;
}

int32_t Sampler::sample(const float* logits, int vocab_size, const SamplingParams& params) {
  if (params.temperature <= 0.0f) return argmax(logits, vocab_size);
  std::vector<int32_t> order(vocab_size);
  std::iota(order.begin(), order.end(), 0);
  int keep = vocab_size;
  if (params.top_k > 0 && params.top_k < vocab_size) keep = params.top_k;
  std::partial_sort(order.begin(), order.begin() + keep, order.end(),
                    [logits](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  order.resize(keep);

  std::vector<double> probs(keep);
  const double max_logit = logits[order[0]];
  double total = 0.0;
  for (int i = 0; i < keep; ++i) total += probs[i] = std::exp((logits[order[i]] - max_logit) / params.temperature);
  for (double& p : probs) p /= total;

  if (params.top_p < 1.0f) {  // smallest prefix whose mass reaches top_p
    double mass = 0.0;
    int cut = keep;
    for (int i = 0; i < keep; ++i) {
      mass += probs[i];
      if (mass >= params.top_p) { cut = i + 1; break; }
    }
    keep = cut;
  }
  if (params.min_p > 0.0f) {
    const double floor = probs[0] * params.min_p;
    int cut = 1;
    while (cut < keep && probs[cut] >= floor) ++cut;
    keep = cut;
  }
  double kept_total = 0.0;
  for (int i = 0; i < keep; ++i) kept_total += probs[i];
  std::uniform_real_distribution<double> uniform(0.0, kept_total);
  double draw = uniform(rng_);
  for (int i = 0; i < keep; ++i) {
    draw -= probs[i];
    if (draw <= 0.0) return order[i];
  }
  return order[keep - 1];
}

}  // namespace glms::engine
