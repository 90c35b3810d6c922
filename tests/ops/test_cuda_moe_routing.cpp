// The MoE routing, grouping and combine on CUDA against host references: routing against the
// CPU model's route_token, the plan's grouping (one block, and a count/scan/place pass past it),
// an expert-parallel rank's plan and combine of its own experts only, and the routing kernel's
// padding rows by a count read on the device (a data-parallel rank's padded batch: one captured
// graph serves steps of different real counts), and the router's product of a decode step on the
// tensor cores. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "io/model_config.h"
#include "model/layers.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/moe.h"
#include "ops/moe_test_support.h"
#include "support/cuda_buffers.h"
#include "support/numerics.h"

using namespace glms;
using glms::testing::PlanBuffers;
using glms::testing::double_product;
using glms::testing::poisoned;
using glms::testing::poisoned_bf16;
using glms::testing::random_choices;
using glms::testing::random_values;
using glms::testing::relative_l2;
using glms::testing::to_device;
using glms::testing::to_host;
namespace cuda = ops::cuda;

namespace {
class CudaMoeRouting : public glms::testing::CudaTest {};
}  // namespace

// The same experts and weights as the count given at launch, and rows from the device's count on
// are padding (ids -1, weights 0), the rows past the routed tokens too.
TEST_F(CudaMoeRouting, ACountOnTheDeviceMakesTheRowsPastItPadding) {
  constexpr int kTokens = 11, kRows = 14, kExperts = 256, kTopK = 8;
  const cuda::MoeRouting routing{kExperts, kTopK, 8, 4, true, 2.5f};
  auto d_logits = to_device(random_values(kTokens * kExperts, 3, 2.0f));
  auto d_bias = to_device(random_values(kExperts, 4, 0.5f));
  auto route = [&](int launch_count, const int32_t* device_count) {
    cuda::DeviceBuffer ids(sizeof(int32_t) * kRows * kTopK), weights(sizeof(float) * kRows * kTopK);
    cuda::moe_route(d_logits.as<float>(), d_bias.as<float>(), launch_count, routing, ids.as<int32_t>(),
                    weights.as<float>(), nullptr, kRows, device_count);
    return std::make_pair(to_host<int32_t>(ids), to_host<float>(weights));
  };
  for (const int routed : {0, 6, kTokens}) {
    SCOPED_TRACE("routed on the device: " + std::to_string(routed));
    const auto d_count = to_device(std::vector<int32_t>{routed});
    const auto [want_ids, want_weights] = route(routed, nullptr);  // the count given at launch
    const auto [ids, weights] = route(kTokens, d_count.as<int32_t>());
    EXPECT_EQ(ids, want_ids);
    EXPECT_EQ(weights, want_weights);
    for (int i = routed * kTopK; i < kRows * kTopK; ++i) {
      ASSERT_EQ(ids[i], -1) << "row " << i / kTopK;
      ASSERT_EQ(weights[i], 0.0f) << "row " << i / kTopK;
    }
    if (routed > 0) {
      EXPECT_GE(ids[0], 0);
    }
  }
}

TEST_F(CudaMoeRouting, RoutingGroupingAndCombineMatchCpu) {
  io::ModelConfig c;
  c.n_routed_experts = 256;
  c.num_experts_per_tok = 8;
  c.n_group = 8;
  c.topk_group = 4;
  c.norm_topk_prob = true;
  c.routed_scaling_factor = 2.5f;
  const int n = 37, E = c.n_routed_experts, K = c.num_experts_per_tok;
  const int64_t hidden = 1160;  // past one combine block of 1024 dims
  auto logits = random_values(n * E, 1, 2.0f), bias = random_values(E, 2, 0.5f);
  for (float& b : bias) b += 34.0f;  // as the real correction bias sits near 34
  bias[38] = bias[5] = 40.0f, logits[38] = logits[5] = 9.0f;  // token 0's top two tie, in two lanes
  cuda::MoeRouting routing{E, K, c.n_group, c.topk_group, c.norm_topk_prob, c.routed_scaling_factor};
  auto d_logits = to_device(logits), d_bias = to_device(bias);
  // Three padding rows after the routed ones (a data-parallel step's) in the same launch.
  cuda::DeviceBuffer d_ids(sizeof(int32_t) * (n + 3) * K), d_weights(sizeof(float) * (n + 3) * K);
  cuda::moe_route(d_logits.as<float>(), d_bias.as<float>(), n, routing, d_ids.as<int32_t>(), d_weights.as<float>(),
                  nullptr, n + 3);
  auto ids = to_host<int32_t>(d_ids);
  const auto weights = to_host<float>(d_weights);
  EXPECT_EQ(std::vector<int32_t>(ids.begin() + n * K, ids.end()), std::vector<int32_t>(3 * K, -1));
  EXPECT_EQ(std::vector<float>(weights.begin() + n * K, weights.end()), std::vector<float>(3 * K, 0.0f));
  ids.resize(n * K);
  std::vector<float> want_weights, got_weights(weights.begin(), weights.begin() + n * K);
  for (int t = 0; t < n; ++t) {
    std::vector<int32_t> experts;
    std::vector<float> expert_weights;
    model::route_token(c, logits.data() + t * E, bias.data(), experts, expert_weights);
    ASSERT_EQ(std::vector<int32_t>(ids.begin() + t * K, ids.begin() + (t + 1) * K), experts) << "token " << t;
    want_weights.insert(want_weights.end(), expert_weights.begin(), expert_weights.end());
  }
  EXPECT_LT(relative_l2(got_weights, want_weights), 1e-6);

  // Grouping: each expert's pairs contiguous, offsets the prefix sums of the counts, the active
  // experts listed in increasing id; the routed pairs (one block plans them) and 1100 random
  // tokens' (8800 pairs: the count, scan and place kernels).
  const int64_t P = int64_t{n} * K;
  PlanBuffers buffers(E, P);
  auto check_plan = [&](const std::vector<int32_t>& pair_ids, const cuda::DeviceBuffer& d_pair_ids,
                        const PlanBuffers& plan_buffers) {
    const int64_t pairs = static_cast<int64_t>(pair_ids.size());
    cuda::moe_plan(d_pair_ids.as<int32_t>(), pairs, E, plan_buffers.plan(), nullptr);
    const auto offsets = to_host<int32_t>(plan_buffers.offsets), sorted = to_host<int32_t>(plan_buffers.sorted_pairs),
               slot = to_host<int32_t>(plan_buffers.pair_slot), active = to_host<int32_t>(plan_buffers.active),
               num_active = to_host<int32_t>(plan_buffers.num_active);
    std::vector<int32_t> counts(E + 1, 0), want_active;
    for (int32_t id : pair_ids) ++counts[id + 1];
    for (int e = 0; e < E; ++e)
      if (counts[e + 1] > 0) want_active.push_back(e);
    std::partial_sum(counts.begin(), counts.end(), counts.begin());
    EXPECT_EQ(offsets, counts) << pairs << " pairs";
    ASSERT_EQ(num_active[0], static_cast<int32_t>(want_active.size())) << pairs << " pairs";
    EXPECT_EQ(std::vector<int32_t>(active.begin(), active.begin() + num_active[0]), want_active) << pairs << " pairs";
    for (int64_t p = 0; p < pairs; ++p) {
      ASSERT_EQ(sorted[slot[p]], p);
      ASSERT_TRUE(slot[p] >= offsets[pair_ids[p]] && slot[p] < offsets[pair_ids[p] + 1]) << "pair " << p;
    }
  };
  check_plan(ids, d_ids, buffers);
  const auto many_ids = random_choices(1100, E, K, 77);
  check_plan(many_ids, to_device(many_ids), PlanBuffers(E, static_cast<int64_t>(many_ids.size())));
  const auto slot = to_host<int32_t>(buffers.pair_slot);
  // Combine: x += shared + sum of weight * expert row, experts in increasing id.
  auto x = random_values(n * hidden, 3), shared = random_values(n * hidden, 4), expert_rows = random_values(P * hidden, 5);
  auto combined = [&](const std::vector<float>& rows) {
    std::vector<float> want = x;
    for (int t = 0; t < n; ++t)
      for (int64_t d = 0; d < hidden; ++d) {
        std::vector<int> order(K);
        std::iota(order.begin(), order.end(), 0);
        std::sort(order.begin(), order.end(), [&](int a, int b) { return ids[t * K + a] < ids[t * K + b]; });
        float sum = shared[t * hidden + d];
        for (int k : order) sum += weights[t * K + k] * rows[slot[t * K + k] * hidden + d];
        want[t * hidden + d] += sum;
      }
    return want;
  };
  auto d_x = to_device(x), d_shared = to_device(shared), d_rows = to_device(expert_rows);
  cuda::moe_combine(d_x.as<float>(), true, d_shared.as<float>(), d_rows.as<float>(), buffers.pair_slot.as<int32_t>(),
                    d_ids.as<int32_t>(), d_weights.as<float>(), n, K, hidden, nullptr);
  EXPECT_LT(relative_l2(to_host<float>(d_x), combined(expert_rows)), 1e-6);

  // The same over bf16 expert rows (the grouped GEMMs' sums), read as the values they hold.
  std::vector<uint16_t> rows_bf16(expert_rows.size());
  std::vector<float> rows_held(expert_rows.size());
  for (size_t i = 0; i < expert_rows.size(); ++i) rows_held[i] = bf16_to_f32(rows_bf16[i] = f32_to_bf16(expert_rows[i]));
  auto d_x_again = to_device(x), d_rows_bf16 = to_device(rows_bf16);
  cuda::moe_combine(d_x_again.as<float>(), true, d_shared.as<float>(), d_rows_bf16.as<uint16_t>(),
                    buffers.pair_slot.as<int32_t>(), d_ids.as<int32_t>(), d_weights.as<float>(), n, K, hidden, nullptr);
  EXPECT_LT(relative_l2(to_host<float>(d_x_again), combined(rows_held)), 1e-6);
}

namespace {

// moe_combine into bf16 rows against its fp32 rows from the same fp32 expert rows, bit for bit
// rounded (the same sums in the same order, each rounded to nearest even once).
void expect_bf16_combine_rounds_fp32_combine(PlanBuffers& buffers, const cuda::DeviceBuffer& d_ids,
                                             const cuda::DeviceBuffer& d_weights, int n, int K, int64_t hidden,
                                             const cuda::DeviceBuffer& d_rows) {
  auto d_f32 = poisoned(n * hidden), d_bf16 = poisoned_bf16(n * hidden);
  cuda::moe_combine(d_f32.as<float>(), false, nullptr, d_rows.as<float>(), buffers.pair_slot.as<int32_t>(),
                    d_ids.as<int32_t>(), d_weights.as<float>(), n, K, hidden, nullptr);
  cuda::moe_combine(d_bf16.as<uint16_t>(), false, nullptr, d_rows.as<float>(), buffers.pair_slot.as<int32_t>(),
                    d_ids.as<int32_t>(), d_weights.as<float>(), n, K, hidden, nullptr);
  const auto f32 = to_host<float>(d_f32);
  const auto bf16 = to_host<uint16_t>(d_bf16);
  int64_t differ = 0;
  for (size_t i = 0; i < f32.size(); ++i) differ += bf16[i] != f32_to_bf16(f32[i]);
  EXPECT_EQ(differ, 0) << "hidden " << hidden;
}

}  // namespace

// A rank of an expert-parallel layout plans only its experts' pairs (ids of other ranks' experts
// and padding rows' -1 get no slot), and its combine sums just those pairs, with no shared
// expert and without accumulating (the peers' sums complete it). A width that is not a
// multiple of 4 (the combine's scalar path, over fp32 and bf16 sums; RoutingGroupingAndCombineMatchCpu
// takes the other).
TEST_F(CudaMoeRouting, ARankPlansAndCombinesOnlyItsExperts) {
  const int E = 64, K = 8, first = 16, local = 16, n = 300;
  const int64_t hidden = 70, P = int64_t{n} * K;
  std::mt19937 rng(5);
  std::vector<int32_t> ids(P);
  for (int t = 0; t < n; ++t) {
    std::vector<int32_t> all(E);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    for (int k = 0; k < K; ++k) ids[t * K + k] = t % 7 == 3 ? -1 : all[k];  // every 7th token is padding
  }
  const auto weights = random_values(P, 6, 1.0f);
  auto d_ids = to_device(ids), d_weights = to_device(weights);
  PlanBuffers buffers(local, P);
  cuda::moe_plan(d_ids.as<int32_t>(), P, local, buffers.plan(), nullptr, first);
  const auto offsets = to_host<int32_t>(buffers.offsets), slot = to_host<int32_t>(buffers.pair_slot),
             sorted = to_host<int32_t>(buffers.sorted_pairs);
  int64_t mine = 0;
  for (int64_t p = 0; p < P; ++p) {
    const bool is_mine = ids[p] >= first && ids[p] < first + local;
    if (!is_mine) {
      EXPECT_EQ(slot[p], -1) << "pair " << p;
      continue;
    }
    ++mine;
    const int e = ids[p] - first;
    ASSERT_GE(slot[p], offsets[e]);
    ASSERT_LT(slot[p], offsets[e + 1]);
    EXPECT_EQ(sorted[slot[p]], p);
  }
  EXPECT_EQ(offsets[local], mine);
  const auto expert_rows = random_values(std::max<int64_t>(mine, 1) * hidden, 7, 1.0f);
  auto combined = [&](const std::vector<float>& rows) {
    std::vector<float> want(n * hidden, 0.0f);
    for (int t = 0; t < n; ++t)
      for (int64_t d = 0; d < hidden; ++d) {
        std::vector<int> order;
        for (int k = 0; k < K; ++k)
          if (slot[t * K + k] >= 0) order.push_back(k);
        std::sort(order.begin(), order.end(), [&](int a, int b) { return ids[t * K + a] < ids[t * K + b]; });
        float sum = 0.0f;
        for (int k : order) sum += weights[t * K + k] * rows[slot[t * K + k] * hidden + d];
        want[t * hidden + d] = sum;
      }
    return want;
  };
  auto d_out = poisoned(n * hidden);
  auto d_rows = to_device(expert_rows);
  cuda::moe_combine(d_out.as<float>(), false, nullptr, d_rows.as<float>(), buffers.pair_slot.as<int32_t>(),
                    d_ids.as<int32_t>(), d_weights.as<float>(), n, K, hidden, nullptr);
  EXPECT_LT(relative_l2(to_host<float>(d_out), combined(expert_rows)), 1e-6);  // padding tokens' rows are zero, not NaN

  // The scalar path over bf16 rows (the grouped GEMMs' sums with bf16_expert_sums).
  std::vector<uint16_t> rows_bf16(expert_rows.size());
  std::vector<float> rows_held(expert_rows.size());
  for (size_t i = 0; i < expert_rows.size(); ++i) rows_held[i] = bf16_to_f32(rows_bf16[i] = f32_to_bf16(expert_rows[i]));
  auto d_out_bf16 = poisoned(n * hidden);
  auto d_rows_bf16 = to_device(rows_bf16);
  cuda::moe_combine(d_out_bf16.as<float>(), false, nullptr, d_rows_bf16.as<uint16_t>(), buffers.pair_slot.as<int32_t>(),
                    d_ids.as<int32_t>(), d_weights.as<float>(), n, K, hidden, nullptr);
  EXPECT_LT(relative_l2(to_host<float>(d_out_bf16), combined(rows_held)), 1e-6);

  // Into bf16 rows (a data-parallel rank's partial rows for a bf16 reduce-scatter): the fp32
  // combine's values, each rounded once, at this width and at one the vector path takes.
  expect_bf16_combine_rounds_fp32_combine(buffers, d_ids, d_weights, n, K, hidden, d_rows);
  const int64_t wide = 72;
  const auto d_wide_rows = to_device(random_values(std::max<int64_t>(mine, 1) * wide, 8, 1.0f));
  expect_bf16_combine_rounds_fp32_combine(buffers, d_ids, d_weights, n, K, wide, d_wide_rows);
}

// The router's product of a decode step on the bf16 tensor cores (router_product) against a
// double product of the same values: its planes summed in plane order within 1e-6 relative L2
// (cuBLAS's fp32 GEMM beside it for scale), the same bits on a second run; and moe_route over the
// planes picks the experts and weights it picks over their sum made on the host in plane order.
// GLM-5's router (256 x 6144) at 1 to 200 tokens (one token tile and several, one part-filled),
// and the bundled model's (16 x 256), whose 16 k16 steps leave most blocks without one.
TEST_F(CudaMoeRouting, RouterProductOnTheTensorCoresMatchesADoubleProduct) {
  struct Shape {
    int rows, cols;
    std::vector<int> tokens;
  };
  cuda::Gemm gemm;
  for (const Shape& shape : {Shape{256, 6144, {1, 3, 64, 65, 200}}, Shape{16, 256, {1, 40}}}) {
    const int rows = shape.rows, cols = shape.cols;
    std::vector<uint16_t> w16(static_cast<size_t>(rows) * cols);
    std::vector<float> w32(w16.size());
    const auto w_values = random_values(static_cast<int64_t>(w16.size()), 81, 0.05f);
    for (size_t i = 0; i < w16.size(); ++i) w32[i] = bf16_to_f32(w16[i] = f32_to_bf16(w_values[i]));
    auto dw16 = to_device(w16), dw32 = to_device(w32);
    for (const int n : shape.tokens) {
      SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(cols) + ", " + std::to_string(n) + " tokens");
      const auto x = random_values(int64_t{n} * cols, 82 + n, 2.0f);
      auto dx = to_device(x);
      const int64_t plane = int64_t{n} * rows;
      auto product = [&] {
        auto planes = poisoned(cuda::kRouterProductPlanes * plane);
        cuda::router_product(dx.as<float>(), n, dw16.as<uint16_t>(), rows, cols, planes.as<float>(), nullptr);
        return to_host<float>(planes);
      };
      const auto planes = product();
      EXPECT_EQ(product(), planes) << "a second run";
      std::vector<float> summed(plane);
      for (int64_t i = 0; i < plane; ++i) {
        summed[i] = planes[i];
        for (int p = 1; p < cuda::kRouterProductPlanes; ++p) summed[i] += planes[p * plane + i];
      }
      const std::vector<float> expected = double_product(x, w32, n, rows, cols);
      auto dy_f32 = poisoned(plane);
      gemm.linear_f32(dx.as<float>(), n, dw32.as<float>(), rows, cols, dy_f32.as<float>(), nullptr);
      const double error = relative_l2(summed, expected), f32_error = relative_l2(to_host<float>(dy_f32), expected);
      std::printf("%d x %d, %d tokens: relative L2 %.2e (the fp32 GEMM's %.2e)\n", rows, cols, n, error, f32_error);
      EXPECT_LT(error, 1e-6) << "the fp32 GEMM's error " << f32_error;

      const int top_k = rows == 256 ? 8 : 4, groups = rows == 256 ? 8 : 4;
      cuda::MoeRouting routing{rows, top_k, groups, groups / 2, true, 2.5f};
      auto bias = to_device(random_values(rows, 83, 0.5f));
      auto route = [&](const std::vector<float>& logits, int logit_planes) {
        routing.logit_planes = logit_planes;
        auto d_logits = to_device(logits);
        cuda::DeviceBuffer ids(sizeof(int32_t) * n * top_k), weights(sizeof(float) * n * top_k);
        cuda::moe_route(d_logits.as<float>(), bias.as<float>(), n, routing, ids.as<int32_t>(), weights.as<float>(),
                        nullptr);
        return std::make_pair(to_host<int32_t>(ids), to_host<float>(weights));
      };
      const auto [ids, weights] = route(planes, cuda::kRouterProductPlanes);
      const auto [want_ids, want_weights] = route(summed, 1);
      EXPECT_EQ(ids, want_ids);
      EXPECT_EQ(weights, want_weights);
    }
  }
}
