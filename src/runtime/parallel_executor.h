// The executor of a layout of several ranks: one worker thread per rank, each owning its rank's
// StepRunner (weights shard, cache, workspaces), joined by the layout's communicators.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "model/shard.h"
#include "runtime/executor.h"

namespace glms::runtime {

// The communicators of a layout: a tensor-parallel group per attention group and a
// data-parallel group per tensor-parallel rank.
class RankGroups {
 public:
  virtual ~RankGroups() = default;
  virtual model::Peers peers(int world_rank) = 0;
  virtual std::string backend() const = 0;
  // A rank failed in a step: wakes its peers wherever they wait in a collective.
  virtual void abort(const std::string& reason) = 0;
  // After an abort, once every rank has stopped: whether the groups can be used again.
  virtual bool reset() = 0;
};

// CPU ranks as threads of this process (comm/cpu_group.h); groups of one rank are left out.
std::unique_ptr<RankGroups> make_cpu_groups(const ParallelLayout& layout);

// Makes rank `world_rank`'s runner on its worker's thread, over `peers`.
using RunnerFactory = std::function<std::unique_ptr<model::StepRunner>(int world_rank, const model::Peers& peers)>;

// Starts one worker per rank of `layout` and makes the runners there; throws glms::Error when
// a rank cannot be made.
std::unique_ptr<Executor> make_parallel_executor(const ParallelLayout& layout, std::unique_ptr<RankGroups> groups,
                                                 const RunnerFactory& make_runner);

}  // namespace glms::runtime
