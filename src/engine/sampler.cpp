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
  // Candidates in a fixed order (by logit, then id, wherever an order matters) so that a seed
  // always draws the same token. Sorting the whole vocabulary (154880 ids for GLM-5) is done
  // only when top_p needs the cumulative mass; otherwise every pass is linear.
  auto better = [logits](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  std::vector<int32_t> candidates(vocab_size);
  std::iota(candidates.begin(), candidates.end(), 0);
  if (params.top_k > 0 && params.top_k < vocab_size) {
    std::nth_element(candidates.begin(), candidates.begin() + params.top_k, candidates.end(), better);
    candidates.resize(params.top_k);
  }
  if (params.top_p < 1.0f) std::sort(candidates.begin(), candidates.end(), better);

  float max_logit = logits[candidates[0]];
  for (int32_t id : candidates) max_logit = std::max(max_logit, logits[id]);
  std::vector<double> probs(candidates.size());
  double total = 0.0;
  for (size_t i = 0; i < candidates.size(); ++i)
    total += probs[i] = std::exp((logits[candidates[i]] - max_logit) / params.temperature);
  for (double& p : probs) p /= total;

  size_t keep = candidates.size();
  if (params.top_p < 1.0f) {  // the smallest prefix (in logit order) whose mass reaches top_p
    double mass = 0.0;
    for (size_t i = 0; i < keep; ++i) {
      mass += probs[i];
      if (mass >= params.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  if (params.min_p > 0.0f) {  // drop tokens under min_p x the most likely one's probability
    const double floor = *std::max_element(probs.begin(), probs.begin() + keep) * params.min_p;
    size_t kept = 0;
    for (size_t i = 0; i < keep; ++i)
      if (probs[i] >= floor) {
        candidates[kept] = candidates[i];
        probs[kept++] = probs[i];
      }
    keep = kept;
  }
  double kept_total = 0.0;
  for (size_t i = 0; i < keep; ++i) kept_total += probs[i];
  std::uniform_real_distribution<double> uniform(0.0, kept_total);
  double draw = uniform(rng_);
  for (size_t i = 0; i < keep; ++i) {
    draw -= probs[i];
    if (draw <= 0.0) return candidates[i];
  }
  return candidates[keep - 1];
}

}  // namespace glms::engine
