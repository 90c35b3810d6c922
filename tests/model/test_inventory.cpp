// Parameter counts from config.json alone must equal what a checkpoint actually holds.
#include <gtest/gtest.h>

#include "core/error.h"
#include "io/model_config.h"
#include "model/inventory.h"
#include "model/weights.h"
#include "random_model.h"

using namespace glms;

TEST(Inventory, CountsEqualTheTensorsOfACheckpoint) {
  glms::testing::TempDir dir("inventory");
  for (bool mtp : {false, true}) {
    glms::testing::RandomModelSpec spec;
    spec.with_mtp = mtp;
    const auto path = glms::testing::write_random_model(dir.path / (mtp ? "mtp" : "plain"), spec);
    const model::ModelWeights weights = model::load_weights(path.string());
    const model::Inventory inventory = model::parameter_inventory(weights.config);
    EXPECT_EQ(inventory.total(), weights.parameters) << "with mtp: " << mtp;
    EXPECT_EQ(inventory.weight_bytes("bf16"), 2 * weights.parameters);
  }
}

TEST(Inventory, Glm52AtFullSize) {
  const io::ModelConfig config = io::load_model_config(std::string(GLMS_SOURCE_DIR) + "/models/configs/glm-5.2.json");
  const model::Inventory inventory = model::parameter_inventory(config);
  int64_t mtp = 0;
  for (const auto& group : inventory.groups)
    if (group.in_mtp) mtp += group.parameters;
  // Published: about 744B parameters without the MTP layer (about 10B in 791 tensors), 40.7B active.
  EXPECT_NEAR((inventory.total() - mtp) / 1e9, 743.4, 1.0);
  EXPECT_NEAR(mtp / 1e9, 10.9, 0.2);
  EXPECT_NEAR(inventory.active_per_token(config) / 1e9, 40.3, 0.5);
  EXPECT_EQ(config.num_full_indexer_layers(), 21);
  EXPECT_LT(inventory.weight_bytes("mxfp4"), inventory.weight_bytes("fp8"));
  EXPECT_LT(inventory.weight_bytes("fp8"), inventory.weight_bytes("bf16"));
  EXPECT_THROW(inventory.weight_bytes("int3"), Error);
}
