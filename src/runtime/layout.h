// How the ranks of one run share the model (vLLM's terms): tensor_parallel ranks split each
// attention group's heads, data_parallel attention groups run their own sequences, and the MoE
// layers span all tensor_parallel * data_parallel ranks, whole experts each with
// expert_parallel, else every expert split by width. World rank w is (dp_rank, tp_rank) =
// (w / tensor_parallel, w % tensor_parallel); on one node it runs on GPU w.
#pragma once

#include <string>

#include "io/model_config.h"
#include "model/shard.h"

namespace glms::runtime {

struct ParallelLayout {
  int tensor_parallel = 1;
  int data_parallel = 1;
  bool expert_parallel = false;

  int world_size() const { return tensor_parallel * data_parallel; }
  model::ModelShard shard(int world_rank) const;
  // "TP2 x DP2, experts whole over 4 ranks (EP4)", "one rank".
  std::string describe() const;
};

// Throws glms::Error with what to change when the layout does not divide the model.
void check_layout(const io::ModelConfig& config, const ParallelLayout& layout);

}  // namespace glms::runtime
