// A layout spread over processes (mpirun starts one per node): process p hosts world ranks
// [p * W / P, (p + 1) * W / P) of the W = tp x dp ranks. Process 0 runs the engine and the server
// over make_distributed_executor; before each step it sends every other process the step's
// batches, each process runs its ranks, and the processes hosting a data-parallel rank's first
// peer send its results back. Every other process runs serve_remote_ranks until process 0's
// executor goes away.
#pragma once

#include <memory>

#include "comm/mpi_world.h"
#include "runtime/executor.h"
#include "runtime/parallel_executor.h"
#include "runtime/rank_groups.h"

namespace glms::runtime {

// The first world rank and the count process `process` hosts; throws glms::Error unless the
// processes divide the ranks.
std::pair<int, int> hosted_ranks(const ParallelLayout& layout, int process, int processes);

std::unique_ptr<Executor> make_distributed_executor(const comm::ProcessGroup& processes, const ParallelLayout& layout,
                                                    std::unique_ptr<RankGroups> groups,
                                                    const RunnerFactory& make_runner);
void serve_remote_ranks(const comm::ProcessGroup& processes, const ParallelLayout& layout,
                        std::unique_ptr<RankGroups> groups, const RunnerFactory& make_runner);

// CPU ranks one a process, over communicators of processes (MPI's).
std::unique_ptr<RankGroups> make_process_groups(const comm::ProcessGroup& processes, const ParallelLayout& layout);

}  // namespace glms::runtime
