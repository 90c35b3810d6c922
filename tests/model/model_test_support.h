// What the CUDA model tests share (test_cuda_forward.cpp, test_cuda_router.cpp): random models at
// the grouped expert GEMMs' widths, checkpoints quantised as `glmserve quantize` writes them, and
// logits compared token by token.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "model/weights.h"
#include "quant/checkpoint_quantizer.h"
#include "random_model.h"
#include "support/numerics.h"

namespace glms::testing {

// A random model at the grouped expert GEMMs' widths: hidden 256, expert width 128, 16 experts,
// top-4 (a bf16 router), the indexer keeping `index_topk` positions, no MTP layer.
inline RandomModelSpec grouped_widths_spec(int index_topk) {
  RandomModelSpec spec;
  spec.hidden_size = 256;
  spec.intermediate_size = 256;
  spec.moe_intermediate_size = 128;
  spec.n_routed_experts = 16;
  spec.num_experts_per_tok = 4;
  spec.index_topk = index_topk;
  spec.with_mtp = false;
  return spec;
}

// The checkpoint at `source` as `glmserve quantize --format FORMAT` writes it (into dir / format),
// loaded without its MTP layer.
inline model::ModelWeights quantised_weights(const std::filesystem::path& source, const std::filesystem::path& dir,
                                             const std::string& format) {
  quant::QuantizeOptions quantize;
  quantize.format = format;
  quant::quantize_checkpoint(source, dir / format, quantize);
  return model::load_weights((dir / format).string(), {.load_mtp = false, .shard = {}});
}

// The random model of `spec` (written into dir / "bf16") in block FP8.
inline model::ModelWeights fp8_random_weights(const RandomModelSpec& spec, const TempDir& dir) {
  return quantised_weights(write_random_model(dir.path / "bf16", spec), dir.path, "fp8");
}

// The relative L2 of each of a's logits rows against b's ([n, vocab] each), sorted.
inline std::vector<double> sorted_token_errors(const std::vector<float>& a, const std::vector<float>& b, int n,
                                               int vocab) {
  std::vector<double> e;
  for (int t = 0; t < n; ++t)
    e.push_back(relative_l2(a.data() + int64_t{t} * vocab, b.data() + int64_t{t} * vocab, vocab));
  std::sort(e.begin(), e.end());
  return e;
}

// Median and largest of sorted_token_errors.
inline std::pair<double, double> token_errors(const std::vector<float>& a, const std::vector<float>& b, int n,
                                              int vocab) {
  const std::vector<double> e = sorted_token_errors(a, b, n, vocab);
  return {e[e.size() / 2], e.back()};
}

}  // namespace glms::testing
