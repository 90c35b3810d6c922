// The communicators of a layout (runtime/layout.h): a tensor-parallel group per attention group
// (world ranks d * tp .. d * tp + tp - 1) and a data-parallel group per tensor-parallel rank
// (ranks t, tp + t, 2 tp + t, ...), over CPU threads, NCCL or device copies.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/shard.h"
#include "runtime/layout.h"

namespace glms::runtime {

class RankGroups {
 public:
  virtual ~RankGroups() = default;
  virtual model::Peers peers(int world_rank) const = 0;
  virtual std::string backend() const = 0;
  // A rank failed in a step: wakes its peers wherever they wait in a collective.
  virtual void abort(const std::string& reason) = 0;
  // After an abort, once every rank has stopped: whether the groups can be used again.
  virtual bool reset() = 0;
};

// The world ranks of each tensor-parallel group, and of each data-parallel group.
std::vector<std::vector<int>> tensor_parallel_groups(const ParallelLayout& layout);
std::vector<std::vector<int>> data_parallel_groups(const ParallelLayout& layout);

// CPU ranks as threads of this process (comm/cpu_group.h); groups of one rank are left out.
std::unique_ptr<RankGroups> make_cpu_groups(const ParallelLayout& layout);

}  // namespace glms::runtime
