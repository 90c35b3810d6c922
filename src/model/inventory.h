// Parameter counts of a glm_moe_dsa model by kind of tensor, computed from the config alone
// (so a 744B model can be sized without its weights), and the weight bytes of each format.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/model_config.h"

namespace glms::model {

struct ParameterGroup {
  std::string name;         // "embed_tokens", "attention", "indexer", "routed_experts", ...
  int64_t parameters = 0;
  bool is_matrix = true;    // norms, biases and the router stay in bf16/fp32 in every format
  bool quantizable_fp4 = false;  // MXFP4 applies (expert and MLP weights, as the published checkpoints)
  bool in_mtp = false;      // MTP layer: kept out of quantisation
};

struct Inventory {
  std::vector<ParameterGroup> groups;
  int64_t total() const;
  int64_t active_per_token(const io::ModelConfig& config) const;  // routed experts counted top-k / E
  // Weight bytes when stored as `format`: "bf16"; "fp8" (E4M3 + fp32 128x128 block scales on
  // every matrix but embeddings and lm_head); "mxfp6" / "mxfp4" (6.25 / 4.25 bits per value on
  // MLP and expert weights, other matrices and the MTP layer bf16). Norms and router: bf16.
  int64_t weight_bytes(const std::string& format) const;
};

Inventory parameter_inventory(const io::ModelConfig& config);

}  // namespace glms::model
