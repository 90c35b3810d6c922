// The ranks of a layout that one process hosts, world ranks [first, first + count): a worker
// thread each, owning the rank's StepRunner, joined by the layout's communicators. The one-process
// executor hosts every rank; under mpirun each process hosts its node's ranks
// (runtime/distributed_executor.h).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "runtime/executor.h"
#include "runtime/fault_injection.h"
#include "runtime/parallel_executor.h"
#include "runtime/rank_groups.h"
#include "runtime/worker.h"

namespace glms::runtime {

class RankSet {
 public:
  // Makes the runners on their workers; throws glms::Error when a rank cannot be made.
  RankSet(const ParallelLayout& layout, std::unique_ptr<RankGroups> groups, const RunnerFactory& make_runner, int first,
          int count);
  ~RankSet();  // the runners are destroyed on their own threads
  RankSet(const RankSet&) = delete;
  RankSet& operator=(const RankSet&) = delete;

  const ParallelLayout& layout() const { return layout_; }
  const model::StepRunner& first_runner() const { return *runners_.front(); }
  void allocate(const model::CacheShape& shape);
  int num_blocks() const;  // the fewest of the local ranks'
  void limit_blocks(int blocks);
  std::vector<Executor::RankMemory> memory() const;

  // Runs the local ranks' part of a step (steps: one per data-parallel rank, dp_peers filled).
  // Fills results[d] for each data-parallel rank d whose first tensor-parallel peer is local and
  // marks it in `produced`.
  void forward(const std::vector<RankStep>& steps, bool want_hidden, std::vector<RankResult>& results,
               std::vector<bool>& produced);
  void mtp_forward(const std::vector<RankStep>& steps, std::vector<RankResult>& results, std::vector<bool>& produced);

 private:
  template <typename Job>
  void run_all(const Job& job);

  ParallelLayout layout_;
  std::unique_ptr<RankGroups> groups_;
  int first_;
  std::vector<Worker> workers_;
  std::vector<std::unique_ptr<model::StepRunner>> runners_;
  bool broken_ = false;
  std::string broken_reason_;
  std::vector<FaultInjection> faults_;  // [local rank] test-only (fault_injection.h)
};

// Every rank's batch learns every rank's step (ForwardBatch::dp_peers: the MoE layers gather the
// tokens, and the ranks take a decode step's graph together or not at all); throws glms::Error
// unless there is one step per data-parallel rank.
void fill_dp_peers(const ParallelLayout& layout, std::vector<RankStep>& steps);

}  // namespace glms::runtime
