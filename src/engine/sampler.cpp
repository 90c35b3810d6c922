#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace glms::engine {

namespace {
ops::SamplingFilter filter_of(const SamplingParams& p) { return {p.temperature, p.top_k, p.top_p, p.min_p}; }
}  // namespace

double Sampler::canonical() { return std::generate_canonical<double, std::numeric_limits<double>::digits>(rng_); }

model::RowOutput Sampler::next_row_output(const SamplingParams& params) {
  model::RowOutput out;
  if (params.temperature <= 0.0f) return out;
  out.kind = model::RowOutput::Kind::kSample;
  out.temperature = params.temperature;
  out.top_k = params.top_k;
  out.top_p = params.top_p;
  out.min_p = params.min_p;
  out.canonical = canonical();
  return out;
}

int32_t Sampler::sample(const float* logits, int vocab_size, const SamplingParams& params) {
  if (params.temperature <= 0.0f) return argmax(logits, vocab_size);
  return ops::sample_row(logits, vocab_size, filter_of(params), canonical());
}

void Sampler::probabilities(const float* logits, int vocab_size, const SamplingParams& params, float* probs) {
  if (params.temperature <= 0.0f) {
    std::fill(probs, probs + vocab_size, 0.0f);
    probs[argmax(logits, vocab_size)] = 1.0f;
    return;
  }
  ops::sampling_probabilities(logits, vocab_size, filter_of(params), probs);
}

int32_t Sampler::sample_from(const float* probs, int vocab_size) {
  double total = 0.0;
  for (int i = 0; i < vocab_size; ++i) total += probs[i];
  if (!(total > 0.0) || !std::isfinite(total)) {  // no usable mass (a broken draft): the largest entry
    int32_t best = 0;
    for (int i = 1; i < vocab_size; ++i)
      if (probs[i] > probs[best] || std::isnan(probs[best])) best = i;
    return best;
  }
  std::uniform_real_distribution<double> uniform(0.0, total);
  double draw = uniform(rng_);
  int32_t last = 0;
  for (int i = 0; i < vocab_size; ++i) {
    if (probs[i] <= 0.0f) continue;
    last = i;
    draw -= probs[i];
    if (draw <= 0.0) return i;
  }
  return last;
}

DraftVerdict Sampler::verify_drafts(const int32_t* drafts, int num_drafts, const float* draft_probs,
                                    const float* target_probs, int vocab_size) {
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  DraftVerdict verdict;
  for (int k = 0; k < num_drafts; ++k) {
    const float* q = draft_probs + static_cast<int64_t>(k) * vocab_size;
    const float* p = target_probs + static_cast<int64_t>(k) * vocab_size;
    const int32_t d = drafts[k];
    if (uniform(rng_) * q[d] < p[d]) {  // accept with probability min(1, p(d) / q(d))
      ++verdict.accepted;
      continue;
    }
    std::vector<float> residual(vocab_size);
    double mass = 0.0;
    for (int i = 0; i < vocab_size; ++i) mass += residual[i] = std::max(0.0f, p[i] - q[i]);
    // No residual mass only when p == q up to rounding (then a rejection is itself rounding).
    verdict.next = mass > 0.0 ? sample_from(residual.data(), vocab_size) : sample_from(p, vocab_size);
    return verdict;
  }
  verdict.next = sample_from(target_probs + static_cast<int64_t>(num_drafts) * vocab_size, vocab_size);
  return verdict;
}

}  // namespace glms::engine
