#include "model/shard.h"

#include <fmt/format.h>

#include "core/error.h"

namespace glms::model {

std::string ModelShard::describe() const {
  return fmt::format("tp {}/{}, dp {}/{}, experts {}", tp_rank, tp_size, dp_rank, dp_size,
                     expert_parallel ? "whole" : "split by width");
}

void check_shard(const io::ModelConfig& c, const ModelShard& s) {
  if (s.tp_size < 1 || s.dp_size < 1) fail("tensor- and data-parallel sizes must be at least 1");
  if (s.tp_rank < 0 || s.tp_rank >= s.tp_size || s.dp_rank < 0 || s.dp_rank >= s.dp_size)
    fail("rank outside the layout");
  const int world = s.world_size();
  if (c.num_attention_heads % s.tp_size != 0)
    fail(fmt::format("--tensor-parallel-size {} does not divide the model's {} attention heads: use a divisor of {}",
                     s.tp_size, c.num_attention_heads, c.num_attention_heads));
  for (int l = 0; l < c.num_hidden_layers; ++l)
    if (!c.layer_is_moe[l] && c.intermediate_size % s.tp_size != 0)
      fail(fmt::format("--tensor-parallel-size {} does not divide the dense MLP's intermediate size {}", s.tp_size,
                       c.intermediate_size));
  if (c.n_routed_experts == 0) return;
  const int64_t shared = int64_t{c.moe_intermediate_size} * c.n_shared_experts;
  if (shared % s.tp_size != 0)
    fail(fmt::format("--tensor-parallel-size {} does not divide the shared expert's intermediate size {}", s.tp_size,
                     shared));
  if (s.expert_parallel && c.n_routed_experts % world != 0)
    fail(fmt::format("{} ranks (tensor x data parallel) do not divide the model's {} routed experts: with "
                     "--enable-expert-parallel the world size must divide {}",
                     world, c.n_routed_experts, c.n_routed_experts));
  if (!s.expert_parallel && c.moe_intermediate_size % world != 0)
    fail(fmt::format("{} ranks (tensor x data parallel) do not divide the experts' intermediate size {}: use a world "
                     "size that does, or --enable-expert-parallel to split whole experts",
                     world, c.moe_intermediate_size));
}

}  // namespace glms::model
