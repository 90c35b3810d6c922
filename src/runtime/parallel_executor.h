// The executor of a layout of several ranks: one worker thread per rank, each owning its rank's
// StepRunner (weights shard, cache, workspaces), joined by the layout's communicators.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "model/shard.h"
#include "runtime/executor.h"
#include "runtime/rank_groups.h"

namespace glms::runtime {

// Makes rank `world_rank`'s runner on its worker's thread, over `peers`.
using RunnerFactory = std::function<std::unique_ptr<model::StepRunner>(int world_rank, const model::Peers& peers)>;

// Starts one worker per rank of `layout` and makes the runners there; throws glms::Error when
// a rank cannot be made.
std::unique_ptr<Executor> make_parallel_executor(const ParallelLayout& layout, std::unique_ptr<RankGroups> groups,
                                                 const RunnerFactory& make_runner);

}  // namespace glms::runtime
