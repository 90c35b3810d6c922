// CPU ranks: each worker loads its shard of the checkpoint (views into the mapped files, only
// its tensors' bytes touched) and runs Glm5Model over a host cache. Every layout runs so on any
// machine, which is how the parallel paths are tested against one rank.
#pragma once

#include <memory>
#include <string>

#include "comm/mpi_world.h"
#include "model/weights.h"
#include "runtime/executor.h"

namespace glms::runtime {

// `options.shard` is set per rank. With one rank: the local executor over the whole model.
std::unique_ptr<Executor> make_cpu_executor(const std::string& model_dir, const ParallelLayout& layout,
                                            const model::LoadOptions& options = {});

// The same with the ranks in separate processes (mpirun, one rank a process): process 0 gets the
// executor; every other process serves its rank until process 0's executor goes away, then gets
// null.
std::unique_ptr<Executor> make_cpu_executor_across(const comm::ProcessGroup& processes, const std::string& model_dir,
                                                   const ParallelLayout& layout, const model::LoadOptions& options = {});

}  // namespace glms::runtime
