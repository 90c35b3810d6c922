// Which part of the model one rank holds, and the peers it exchanges with (the layout itself is
// runtime/layout.h). With tensor parallelism the attention heads, the dense MLP and the shared
// expert are split tp_size ways (q_a, kv_a, the DSA indexer, the router, norms and embeddings are
// replicated, so every peer writes the same latent cache rows); with data parallelism each group
// of tp_size ranks attends for its own sequences. The routed experts are spread over the whole
// world of dp_size * tp_size ranks: whole experts (expert_parallel) or every expert's
// intermediate width split world ways. A MoE layer gathers every data-parallel rank's tokens,
// runs its part of the experts on all of them, reduce-scatters the sums back, adds the shared
// expert and all-reduces over the tensor-parallel peers.
#pragma once

#include <cstdint>
#include <string>

#include "comm/communicator.h"
#include "io/model_config.h"

namespace glms::model {

struct ModelShard {
  int tp_rank = 0, tp_size = 1;
  int dp_rank = 0, dp_size = 1;
  bool expert_parallel = false;

  int world_rank() const { return dp_rank * tp_size + tp_rank; }
  int world_size() const { return dp_size * tp_size; }
  bool whole() const { return world_size() == 1; }

  // Attention heads [first_head, first_head + heads).
  int heads(const io::ModelConfig& c) const { return c.num_attention_heads / tp_size; }
  int first_head(const io::ModelConfig& c) const { return tp_rank * heads(c); }
  // A tensor-parallel slice of an MLP's intermediate width `inter`: [tp_rank * width, ...).
  int64_t mlp_width(int64_t inter) const { return inter / tp_size; }
  int64_t mlp_first(int64_t inter) const { return tp_rank * mlp_width(inter); }
  // Routed experts [first_expert, first_expert + experts), each [expert_first, + expert_width)
  // of its intermediate rows.
  int experts(const io::ModelConfig& c) const {
    return expert_parallel ? c.n_routed_experts / world_size() : c.n_routed_experts;
  }
  int first_expert(const io::ModelConfig& c) const { return expert_parallel ? world_rank() * experts(c) : 0; }
  int64_t expert_width(const io::ModelConfig& c) const {
    return expert_parallel ? c.moe_intermediate_size : c.moe_intermediate_size / world_size();
  }
  int64_t expert_first(const io::ModelConfig& c) const {
    return expert_parallel ? 0 : world_rank() * expert_width(c);
  }

  std::string describe() const;  // "tp 1/2, dp 0/2, experts whole"
};

// Throws glms::Error saying what does not divide (heads, experts, intermediate widths) and what
// layouts would.
void check_shard(const io::ModelConfig& config, const ModelShard& shard);

// A rank's peers: its tensor-parallel group and its data-parallel group (the ranks of the same
// tp_rank in every attention group). Null where the layout has none; a group of one rank still
// runs its collectives (world size 1 through NCCL is tested so).
struct Peers {
  comm::Communicator* tp = nullptr;
  comm::Communicator* dp = nullptr;
};

}  // namespace glms::model
