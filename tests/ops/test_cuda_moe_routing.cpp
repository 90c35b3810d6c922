// The routing kernel's padding rows by a count read on the device (a data-parallel rank's padded
// batch: one captured graph serves steps of different real counts): the same experts and weights
// as the count given at launch, and rows from the device's count on are padding (ids -1,
// weights 0), the rows past the routed tokens too.
#include <gtest/gtest.h>

#include <vector>

#include "ops/cuda/moe.h"
#include "support/cuda_buffers.h"
#include "support/numerics.h"

using namespace glms;
using glms::testing::random_values;
using glms::testing::to_device;
using glms::testing::to_host;
namespace cuda = ops::cuda;

namespace {
class CudaMoeRouting : public glms::testing::CudaTest {};
}  // namespace

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
    if (routed > 0) EXPECT_GE(ids[0], 0);
  }
}
