// Sampling filters and the draw over fp32 logits (ops::sample_row, ops::sampling_probabilities).
#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <vector>

#include "ops/ops.h"
#include "ops/sampling_exp.h"

namespace glms::ops {

namespace {

// The tokens that survive the filters: ids[0, keep), each with the unnormalised weight
// weight[id] (its probability is weight[id] / kept_total).
struct Filtered {
  std::vector<int32_t> ids;
  std::vector<float> weight;         // [vocab] by id; set for the candidates
  std::vector<double> bucket_mass;   // scratch of bucketed_top_p
  std::vector<float> heap;           // scratch of kth_largest
  size_t keep = 0;
  double kept_total = 0.0;
};

// Orders candidates by logit, then id: which of equal logits top_k and top_p keep.
bool better(const float* logits, int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); }

// top_p keeps the smallest set of the most likely candidates (in logit-then-id order) whose mass
// reaches top_p. Up to this many candidates are sorted to find it; more (a vocabulary: 154880 ids
// for GLM-5, where a sort costs ~18 ms a row) go through bucketed_top_p.
constexpr size_t kSortedTopPCandidates = 4096;

// Sorts the candidates to find the kept prefix; leaves the kept ones first, in id order (the
// order the draw walks), and returns how many there are.
size_t sorted_top_p(const float* logits, std::vector<int32_t>& candidates, const std::vector<float>& weight,
                    double total, float top_p) {
  std::sort(candidates.begin(), candidates.end(), [logits](int32_t a, int32_t b) { return better(logits, a, b); });
  size_t keep = candidates.size();
  double mass = 0.0;
  for (size_t i = 0; i < candidates.size(); ++i) {
    mass += weight[candidates[i]];
    if (mass / total >= top_p) {
      keep = i + 1;
      break;
    }
  }
  std::sort(candidates.begin(), candidates.begin() + keep);
  return keep;
}

// The same kept set in linear time: candidates fall into kTopPBuckets buckets by logit (bucket 0
// holds the largest); the buckets' masses locate the one where the kept mass reaches top_p, and
// only that bucket's candidates are sorted. Moves the kept candidates to the front, in their
// incoming order (a fixed order: the draw walks them so), and returns how many there are.
constexpr int kTopPBuckets = 4096;
size_t bucketed_top_p(const float* logits, std::vector<int32_t>& candidates, const std::vector<float>& weight,
                      double total, float top_p, float max_logit, std::vector<double>& bucket_mass) {
  float min_logit = max_logit;
  for (int32_t id : candidates) min_logit = std::min(min_logit, logits[id]);
  const float scale = max_logit > min_logit ? kTopPBuckets / (max_logit - min_logit) : 0.0f;
  auto bucket_of = [&](int32_t id) {
    return std::min(kTopPBuckets - 1, static_cast<int>((max_logit - logits[id]) * scale));
  };
  bucket_mass.assign(kTopPBuckets, 0.0);
  for (int32_t id : candidates) bucket_mass[bucket_of(id)] += weight[id];
  int boundary = 0;
  double before = 0.0;  // mass of the buckets above the boundary
  for (; boundary < kTopPBuckets; before += bucket_mass[boundary++])
    if ((before + bucket_mass[boundary]) / total >= top_p) break;
  if (boundary == kTopPBuckets) return candidates.size();  // rounding kept the mass short: all stay
  std::vector<int32_t> edge;  // the boundary bucket, in logit-then-id order
  for (int32_t id : candidates)
    if (bucket_of(id) == boundary) edge.push_back(id);
  std::sort(edge.begin(), edge.end(), [logits](int32_t a, int32_t b) { return better(logits, a, b); });
  int32_t last_kept = edge.back();
  double mass = before;
  for (int32_t id : edge) {
    mass += weight[id];
    if (mass / total >= top_p) {
      last_kept = id;
      break;
    }
  }
  size_t kept = 0;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const int32_t id = candidates[i];
    const int bucket = bucket_of(id);
    if (bucket < boundary || (bucket == boundary && !better(logits, last_kept, id))) candidates[kept++] = id;
  }
  return kept;
}

// The k-th largest of values[0, count), 1 <= k <= count; `heap` is scratch.
float kth_largest(const float* values, int count, int k, std::vector<float>& heap) {
  heap.assign(values, values + k);
  std::make_heap(heap.begin(), heap.end(), std::greater<float>());
  for (int i = k; i < count; ++i)
    if (values[i] > heap.front()) {
      std::pop_heap(heap.begin(), heap.end(), std::greater<float>());
      heap.back() = values[i];
      std::push_heap(heap.begin(), heap.end(), std::greater<float>());
    }
  return heap.front();
}

// Fills `f` (whose buffers a thread reuses from draw to draw: fresh vocabulary-sized
// allocations each time cost page faults comparable to the arithmetic).
void filter(const float* logits, int vocab_size, const SamplingFilter& params, Filtered& f) {
  f.kept_total = 0.0;
  std::vector<int32_t>& candidates = f.ids;
  candidates.resize(vocab_size);
  std::iota(candidates.begin(), candidates.end(), 0);
  if (params.top_k > 0 && params.top_k < vocab_size) {
    // The k-th largest logit (a min-heap of the k largest values seen: one comparison for most
    // of the vocabulary), then the ids above it and, in id order, enough of those equal to it.
    const float kth = kth_largest(logits, vocab_size, params.top_k, f.heap);
    int64_t equal_kept = params.top_k;
    for (int i = 0; i < vocab_size; ++i) equal_kept -= logits[i] > kth;
    size_t kept = 0;
    for (int32_t id = 0; id < vocab_size; ++id)
      if (logits[id] > kth || (logits[id] == kth && equal_kept-- > 0)) candidates[kept++] = id;
    candidates.resize(kept);
  }
  // Tokens masked to -infinity (min_tokens, structured outputs) can never be drawn: they leave
  // the candidates here (the top-p buckets span the finite logits only).
  if (std::any_of(candidates.begin(), candidates.end(), [logits](int32_t id) { return std::isinf(logits[id]); })) {
    const auto finite_end = std::remove_if(candidates.begin(), candidates.end(),
                                           [logits](int32_t id) { return !std::isfinite(logits[id]); });
    if (finite_end != candidates.begin()) candidates.erase(finite_end, candidates.end());
    else {  // nothing finite (never expected): every id stays
      candidates.resize(vocab_size);
      std::iota(candidates.begin(), candidates.end(), 0);
    }
  }
  float max_logit = logits[candidates[0]];
  for (int32_t id : candidates) max_logit = std::max(max_logit, logits[id]);
  // Unnormalised weights exp((logit - max) / temperature) by id, in float (sampling_exp: the
  // same bits as the device sampler's); sums in double.
  std::vector<float>& weight = f.weight;
  weight.resize(vocab_size);
  const float inv_temperature = 1.0f / params.temperature;
  if (candidates.size() == static_cast<size_t>(vocab_size)) {  // every id: a loop the compiler vectorises
    float* w = weight.data();
    for (int id = 0; id < vocab_size; ++id) w[id] = sampling_exp((logits[id] - max_logit) * inv_temperature);
  } else {
    for (int32_t id : candidates) weight[id] = sampling_exp((logits[id] - max_logit) * inv_temperature);
  }
  double total = 0.0;
  for (int32_t id : candidates) total += weight[id];

  size_t keep = candidates.size();
  if (params.top_p < 1.0f) {
    keep = candidates.size() <= kSortedTopPCandidates
               ? sorted_top_p(logits, candidates, weight, total, params.top_p)
               : bucketed_top_p(logits, candidates, weight, total, params.top_p, max_logit, f.bucket_mass);
  }
  if (params.min_p > 0.0f) {  // drop tokens under min_p x the most likely one's probability
    float top = 0.0f;
    for (size_t i = 0; i < keep; ++i) top = std::max(top, weight[candidates[i]]);
    const float floor = top * params.min_p;
    size_t kept = 0;
    for (size_t i = 0; i < keep; ++i)
      if (weight[candidates[i]] >= floor) candidates[kept++] = candidates[i];
    keep = kept;
  }
  for (size_t i = 0; i < keep; ++i) f.kept_total += weight[candidates[i]];
  f.keep = keep;
}

// The calling thread's Filtered, filled for this draw.
const Filtered& filtered(const float* logits, int vocab_size, const SamplingFilter& params) {
  thread_local Filtered f;
  filter(logits, vocab_size, params, f);
  return f;
}

}  // namespace

int32_t sample_row(const float* logits, int vocab_size, const SamplingFilter& params, double canonical) {
  const Filtered& f = filtered(logits, vocab_size, params);
  double draw = canonical * f.kept_total;
  for (size_t i = 0; i < f.keep; ++i) {
    draw -= f.weight[f.ids[i]];
    if (draw <= 0.0) return f.ids[i];
  }
  return f.ids[f.keep - 1];
}

void sampling_probabilities(const float* logits, int vocab_size, const SamplingFilter& params, float* probs) {
  std::fill(probs, probs + vocab_size, 0.0f);
  const Filtered& f = filtered(logits, vocab_size, params);
  for (size_t i = 0; i < f.keep; ++i) probs[f.ids[i]] = static_cast<float>(f.weight[f.ids[i]] / f.kept_total);
}

}  // namespace glms::ops
