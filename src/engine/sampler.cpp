#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace glms::engine {

namespace {

// The tokens that survive the filters with their probabilities (not renormalised): entries
// [0, keep) of ids/probs, their mass kept_total.
struct Filtered {
  std::vector<int32_t> ids;
  std::vector<double> probs;
  std::vector<float> weight;  // [vocab] scratch: unnormalised weights by id
  size_t keep = 0;
  double kept_total = 0.0;
};

// Fills `f` (whose buffers a thread reuses from draw to draw: fresh vocabulary-sized
// allocations each time cost page faults comparable to the arithmetic).
void filter(const float* logits, int vocab_size, const SamplingParams& params, Filtered& f) {
  // Candidates in a fixed order (by logit, then id, wherever an order matters) so that a seed
  // always draws the same token. top_p needs the candidates in logit order up to the mass it
  // keeps: the largest ones are selected in growing batches (linear passes) until their mass
  // reaches top_p, and only those are sorted, instead of the whole vocabulary (154880 ids for
  // GLM-5: a full sort costs ~18 ms a row).
  auto better = [logits](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  f.kept_total = 0.0;
  std::vector<int32_t>& candidates = f.ids;
  candidates.resize(vocab_size);
  std::iota(candidates.begin(), candidates.end(), 0);
  if (params.top_k > 0 && params.top_k < vocab_size) {
    std::nth_element(candidates.begin(), candidates.begin() + params.top_k, candidates.end(), better);
    candidates.resize(params.top_k);
  }
  float max_logit = logits[candidates[0]];
  for (int32_t id : candidates) max_logit = std::max(max_logit, logits[id]);
  // Unnormalised weights exp((logit - max) / temperature) by id, in float (this pass over the
  // vocabulary is most of a draw's cost); sums in double.
  std::vector<float>& weight = f.weight;
  weight.resize(vocab_size);
  const float inv_temperature = 1.0f / params.temperature;
  double total = 0.0;
  for (int32_t id : candidates) total += weight[id] = std::exp((logits[id] - max_logit) * inv_temperature);

  size_t keep = candidates.size();
  if (params.top_p < 1.0f) {  // the smallest prefix (in logit order) whose mass reaches top_p
    size_t sorted = candidates.size();
    for (size_t batch = 1024; batch < candidates.size(); batch *= 4) {
      std::nth_element(candidates.begin(), candidates.begin() + batch, candidates.end(), better);
      double mass = 0.0;
      for (size_t i = 0; i < batch; ++i) mass += weight[candidates[i]] / total;
      if (mass >= params.top_p) {
        sorted = batch;
        break;
      }
    }
    std::sort(candidates.begin(), candidates.begin() + sorted, better);
    candidates.resize(sorted);
    double mass = 0.0;
    for (size_t i = 0; i < sorted; ++i) {
      mass += weight[candidates[i]] / total;
      if (mass >= params.top_p) {
        keep = i + 1;
        break;
      }
    }
    keep = std::min(keep, sorted);
  }
  std::vector<double>& probs = f.probs;
  probs.resize(keep);
  for (size_t i = 0; i < keep; ++i) probs[i] = weight[candidates[i]] / total;
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
  for (size_t i = 0; i < keep; ++i) f.kept_total += probs[i];
  f.keep = keep;
}

// The calling thread's Filtered, filled for this draw.
const Filtered& filtered(const float* logits, int vocab_size, const SamplingParams& params) {
  thread_local Filtered f;
  filter(logits, vocab_size, params, f);
  return f;
}

}  // namespace

int32_t Sampler::sample(const float* logits, int vocab_size, const SamplingParams& params) {
  if (params.temperature <= 0.0f) return argmax(logits, vocab_size);
  const Filtered& f = filtered(logits, vocab_size, params);
  std::uniform_real_distribution<double> uniform(0.0, f.kept_total);
  double draw = uniform(rng_);
  for (size_t i = 0; i < f.keep; ++i) {
    draw -= f.probs[i];
    if (draw <= 0.0) return f.ids[i];
  }
  return f.ids[f.keep - 1];
}

void Sampler::probabilities(const float* logits, int vocab_size, const SamplingParams& params, float* probs) {
  std::fill(probs, probs + vocab_size, 0.0f);
  if (params.temperature <= 0.0f) {
    probs[argmax(logits, vocab_size)] = 1.0f;
    return;
  }
  const Filtered& f = filtered(logits, vocab_size, params);
  for (size_t i = 0; i < f.keep; ++i) probs[f.ids[i]] = static_cast<float>(f.probs[i] / f.kept_total);
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
