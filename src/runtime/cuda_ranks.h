// CUDA ranks (built with the CUDA backend): one worker thread per rank, each on its GPU (rank w
// on device w; with device copies, ranks may share GPUs), loading its shard of a checkpoint or
// making its synthetic weights there, joined by NCCL (libnccl loaded at run time) or, to run
// layouts on fewer GPUs than ranks (tests), by device copies.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "comm/mpi_world.h"
#include "io/model_config.h"
#include "model/cuda/model.h"
#include "model/cuda/weights.h"
#include "model/weights.h"
#include "runtime/executor.h"

namespace glms::runtime {

enum class DeviceCollectives {
  kNccl,         // one GPU per rank
  kDeviceCopies  // ranks spread over the visible GPUs, several on one (not graph-capturable)
};

struct CudaRankSource {
  std::string model_dir;                           // a checkpoint, or synthetic weights of:
  std::optional<io::ModelConfig> synthetic_config;
  uint64_t seed = 1;
  ops::WeightFormat experts_format = ops::WeightFormat::Plain;  // synthetic routed experts
  model::LoadOptions load;                         // num_layers, load_mtp (shard set per rank)
  model::CudaRunnerOptions runner;  // FP8 linear layers (--quantization), CUDA graphs (--enforce-eager)
};

// With one rank and no collectives asked for (`collectives_at_world_one` false): today's
// single-GPU runner on the caller's thread.
std::unique_ptr<Executor> make_cuda_executor(const CudaRankSource& source, const ParallelLayout& layout,
                                             DeviceCollectives collectives = DeviceCollectives::kNccl,
                                             bool collectives_at_world_one = false);

// The same over processes (mpirun, one a node): each hosts its share of the ranks on its GPUs
// 0.., joined by NCCL across the nodes (process 0 makes the groups' unique ids, the processes'
// control messages carry them). Process 0 gets the executor; every other process serves its
// ranks until that executor goes away, then gets null.
std::unique_ptr<Executor> make_cuda_executor_across(const comm::ProcessGroup& processes, const CudaRankSource& source,
                                                    const ParallelLayout& layout);

}  // namespace glms::runtime
