// The MoE router on the bf16 tensor cores, scored from the post-attention norm's bf16 terms by
// three GEMMs (CudaModelOptions::router_terms_min_tokens; model.h says why) or from its fp32 rows
// by ops::cuda::router_product (router_product_min_tokens), against the same model scoring it with
// cuBLAS's fp32 GEMM. Everything but the router's sums runs the same kernels either way, so a
// prefill's logits differ only where two sums route a token otherwise; a term plane read before it
// is written, or overwritten by the FP8 expert staging that shares its buffer, or a plane of the
// product's lost would route every token at random and move its logits by order one. Skips
// without a GPU.
#include <gtest/gtest.h>

#include <cstdio>
#include <limits>
#include <numeric>
#include <string>

#include "model/cuda/model.h"
#include "model/glm5.h"
#include "model_test_support.h"
#include "random_model.h"
#include "support/cuda_buffers.h"
#include "support/numerics.h"

using namespace glms;
using glms::testing::fp8_random_weights;
using glms::testing::grouped_widths_spec;
using glms::testing::quantised_weights;
using glms::testing::random_tokens;
using glms::testing::sorted_token_errors;
using glms::testing::TempDir;

namespace {

constexpr int kBlockSize = 8;

class CudaRouter : public glms::testing::CudaTest {};

enum class Router { kFp32Gemm, kTerms, kProduct };

// A prefill of n random tokens (every row's logits) on `weights` with the router scored by `router`.
std::vector<float> prefill_logits(const model::ModelWeights& weights, int n, Router router) {
  model::CudaModelOptions options;
  options.block_size = kBlockSize;
  options.num_blocks = (n + kBlockSize - 1) / kBlockSize;
  options.max_tokens = n;
  options.max_sequences = 1;
  options.max_context = n;
  options.max_logits = n;
  const int never = std::numeric_limits<int>::max();
  options.router_terms_min_tokens = router == Router::kTerms ? 1 : never;
  options.router_product_min_tokens = router == Router::kProduct ? 1 : never;
  model::CudaGlm5Model gpu(weights, options);
  std::vector<int32_t> blocks(options.num_blocks);
  std::iota(blocks.rbegin(), blocks.rend(), 0);  // not in physical order
  model::ForwardBatch prefill;
  prefill.add_sequence(random_tokens(n, weights.config.vocab_size, 11), 0, blocks, kBlockSize, true);
  return gpu.forward(prefill);
}

// `router` against the fp32 GEMM, at prefills of 40 and 256 tokens: the per-token logits'
// relative L2 at the median and the third quartile within the bounds given.
void expect_router_routes_as_the_fp32_gemm(const model::ModelWeights& weights, Router router, const std::string& label,
                                           double median_bound, double quartile_bound) {
  const int vocab = weights.config.vocab_size;
  for (const int n : {40, 256}) {
    const auto got = prefill_logits(weights, n, router), fp32 = prefill_logits(weights, n, Router::kFp32Gemm);
    const auto errors = sorted_token_errors(got, fp32, n, vocab);
    const double median = errors[errors.size() / 2], quartile = errors[errors.size() * 3 / 4];
    std::printf("%s, %d tokens: per-token logits relative L2 against the fp32 GEMM's router, median %.2e, "
                "3rd quartile %.2e, max %.2e\n",
                label.c_str(), n, median, quartile, errors.back());
    EXPECT_LT(median, median_bound) << label << ", " << n << " tokens";
    EXPECT_LT(quartile, quartile_bound) << label << ", " << n << " tokens";
  }
}

}  // namespace

// A random model with block-FP8 experts at the W8A8 expert GEMMs' widths (hidden 256, expert
// width 128, 16 experts, top-4, a bf16 router): the experts' E4M3 token rows are staged into
// pair_x, the buffer the router's terms 1 and 2 occupy until the router has read them. The sums
// route alike: on an H100 at 40 and 256 tokens the median and third-quartile tokens' logits were
// bit for bit the same as with the fp32 GEMM, the largest 1.6e-5 (terms) and 2.5e-4
// (router_product) apart.
TEST_F(CudaRouter, RandomFp8ModelsTensorCoreRoutersRouteAsTheFp32Gemm) {
  TempDir dir("cuda_router_fp8_experts");
  const auto weights = fp8_random_weights(grouped_widths_spec(256), dir);
  expect_router_routes_as_the_fp32_gemm(weights, Router::kTerms, "random fp8 experts, terms", 1e-5, 1e-4);
  expect_router_routes_as_the_fp32_gemm(weights, Router::kProduct, "random fp8 experts, router_product", 1e-5, 1e-4);
}

// The bundled model (trained; its router bf16 in the checkpoint, as published ones keep it) and
// its block-FP8 quantisation, whose linear layers read the norms' E4M3 rows beside the terms. Its
// routing is tight (the CPU's smallest choice margin over a 40-token prompt 3.3e-5, over 256
// tokens 6.7e-6), and each tensor-core router routes some of its tokens otherwise than the fp32
// GEMM (such a token moves the tokens after it through attention): on an H100 the median token
// of 256 was 0.4-1.9e-3 apart, the third quartile 1.4-3.3e-3, none past 0.09, for both. Neither
// is the less exact: router_product comes twice as close to a double product as cuBLAS's fp32
// GEMM (CudaMoeRouting.RouterProductOnTheTensorCoresMatchesADoubleProduct), and at these margins
// two fp32 sum orders may choose apart. Random routing would move every token by order one.
TEST_F(CudaRouter, BundledModelsTensorCoreRoutersRouteNearlyAsTheFp32Gemm) {
  const std::filesystem::path bundled = GLMS_SOURCE_DIR "/models/glm5-tiny-code";
  TempDir dir("cuda_router_bundled");
  const model::ModelWeights bf16 = model::load_weights(bundled.string(), {.load_mtp = false, .shard = {}});
  const model::ModelWeights fp8 = quantised_weights(bundled, dir.path, "fp8");
  for (const Router router : {Router::kTerms, Router::kProduct}) {
    const std::string name = router == Router::kTerms ? ", terms" : ", router_product";
    expect_router_routes_as_the_fp32_gemm(bf16, router, "bundled bf16" + name, 1e-2, 2e-2);
    expect_router_routes_as_the_fp32_gemm(fp8, router, "bundled fp8" + name, 1e-2, 2e-2);
  }
}
