#include "runtime/layout.h"

#include <fmt/format.h>

#include "core/error.h"

namespace glms::runtime {

model::ModelShard ParallelLayout::shard(int world_rank) const {
  GLMS_CHECK(world_rank >= 0 && world_rank < world_size(), "world rank outside the layout");
  model::ModelShard s;
  s.tp_size = tensor_parallel;
  s.dp_size = data_parallel;
  s.tp_rank = world_rank % tensor_parallel;
  s.dp_rank = world_rank / tensor_parallel;
  s.expert_parallel = expert_parallel;
  return s;
}

std::string ParallelLayout::describe() const {
  if (world_size() == 1) return "one rank";
  std::string out = fmt::format("TP{} x DP{}", tensor_parallel, data_parallel);
  if (expert_parallel) out += fmt::format(", experts whole over {} ranks (EP{})", world_size(), world_size());
  else out += fmt::format(", experts split by width over {} ranks", world_size());
  return out;
}

void check_layout(const io::ModelConfig& config, const ParallelLayout& layout) {
  if (layout.tensor_parallel < 1) fail("--tensor-parallel-size must be at least 1");
  if (layout.data_parallel < 1) fail("--data-parallel-size must be at least 1");
  model::check_shard(config, layout.shard(0));
}

}  // namespace glms::runtime
