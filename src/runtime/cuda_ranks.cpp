#include "runtime/cuda_ranks.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "comm/nccl_communicator.h"
#include "core/error.h"
#include "model/cuda/model.h"
#include "model/cuda_support.h"
#include "ops/cuda/cuda_ops.h"
#include "runtime/device_collectives.h"
#include "runtime/distributed_executor.h"
#include "runtime/parallel_executor.h"

namespace glms::runtime {

namespace {

// A layout's NCCL communicators, indexed by world rank (null where a group was not made or this
// process does not host the rank).
class NcclRankGroups : public RankGroups {
 public:
  model::Peers peers(int world_rank) const override { return {tp_[world_rank].get(), dp_[world_rank].get()}; }
  std::string backend() const override { return "nccl"; }
  void abort(const std::string&) override {
    for (auto& c : tp_)
      if (c) c->abort();
    for (auto& c : dp_)
      if (c) c->abort();
  }
  bool reset() override { return false; }  // an aborted NCCL communicator is gone

 protected:
  explicit NcclRankGroups(const ParallelLayout& layout) : tp_(layout.world_size()), dp_(layout.world_size()) {}
  std::vector<std::unique_ptr<comm::Communicator>> tp_, dp_;
};

// Every rank in this process, rank w on GPU w; groups of one rank only when asked for.
class NcclGroups : public NcclRankGroups {
 public:
  NcclGroups(const ParallelLayout& layout, bool groups_of_one) : NcclRankGroups(layout) {
    auto library = comm::nccl::Library::load();
    if (layout.tensor_parallel > 1 || groups_of_one) make(library, tensor_parallel_groups(layout), tp_);
    if (layout.data_parallel > 1) make(library, data_parallel_groups(layout), dp_);
  }

 private:
  static void make(const std::shared_ptr<const comm::nccl::Library>& library,
                   const std::vector<std::vector<int>>& groups,
                   std::vector<std::unique_ptr<comm::Communicator>>& by_rank) {
    for (const std::vector<int>& group : groups) {  // rank w runs on device w
      auto comms = comm::make_nccl_group(library, group);
      for (size_t i = 0; i < group.size(); ++i) by_rank[group[i]] = std::move(comms[i]);
    }
  }
};

// A layout spread over processes: this process joins the groups of its ranks.
class NcclProcessGroups : public NcclRankGroups {
 public:
  NcclProcessGroups(const comm::ProcessGroup& processes, const ParallelLayout& layout, int first, int count)
      : NcclRankGroups(layout) {
    auto library = comm::nccl::Library::load();
    if (layout.tensor_parallel > 1) join(processes, library, tensor_parallel_groups(layout), first, count, tp_);
    if (layout.data_parallel > 1) join(processes, library, data_parallel_groups(layout), first, count, dp_);
  }

 private:
  static void join(const comm::ProcessGroup& processes, const std::shared_ptr<const comm::nccl::Library>& library,
                   const std::vector<std::vector<int>>& groups, int first, int count,
                   std::vector<std::unique_ptr<comm::Communicator>>& by_rank) {
    for (const std::vector<int>& group : groups) {
      std::vector<std::byte> id_bytes(sizeof(comm::nccl::UniqueId));
      if (processes.rank() == 0) {
        const comm::nccl::UniqueId id = comm::make_nccl_unique_id(*library);
        std::memcpy(id_bytes.data(), &id, sizeof(id));
      }
      processes.broadcast(id_bytes, 0);
      comm::nccl::UniqueId id;
      std::memcpy(&id, id_bytes.data(), sizeof(id));
      std::vector<int> ranks, devices;  // this process's members: their index in the group, their GPU
      for (size_t i = 0; i < group.size(); ++i)
        if (group[i] >= first && group[i] < first + count) {
          ranks.push_back(static_cast<int>(i));
          devices.push_back(group[i] - first);
        }
      if (ranks.empty()) continue;
      auto comms = comm::join_nccl_group_ranks(library, id, ranks, devices, static_cast<int>(group.size()),
                                               [](int device) { ops::cuda::set_device(device); });
      for (size_t i = 0; i < ranks.size(); ++i) by_rank[group[ranks[i]]] = std::move(comms[i]);
    }
  }
};

std::unique_ptr<model::StepRunner> make_rank_runner(const CudaRankSource& source, const model::ModelShard& shard,
                                                    const model::Peers& peers) {
  if (source.synthetic_config)
    return model::make_synthetic_cuda_runner(*source.synthetic_config, source.seed, source.experts_format, shard, peers,
                                             source.runner);
  model::LoadOptions options = source.load;
  options.shard = shard;
  return model::make_cuda_runner(model::load_weights(source.model_dir, options), peers, source.runner);
}

// Fails with what to do unless GPUs 0 .. count - 1 run glmserve's kernels (model/cuda_support.h).
void require_supported_gpus(int count) {
  for (int device = 0; device < count; ++device) {
    const ops::cuda::GpuModel gpu = ops::cuda::gpu_model(device);
    const std::string why = model::cuda_gpu_unsupported(gpu.name, gpu.major, gpu.minor);
    if (!why.empty()) fail(fmt::format("--device cuda: GPU {} ({}); --device cpu runs the model on the CPU", device, why));
  }
}

}  // namespace

std::unique_ptr<Executor> make_cuda_executor(const CudaRankSource& source, const ParallelLayout& layout,
                                             DeviceCollectives collectives, bool collectives_at_world_one) {
  const int gpus = ops::cuda::device_count();
  if (gpus == 0) fail("--device cuda: no CUDA device is visible on this machine");
  require_supported_gpus(std::min(gpus, layout.world_size()));
  const io::ModelConfig config =
      source.synthetic_config ? *source.synthetic_config : io::load_model_config(source.model_dir);
  check_layout(config, layout);
  if (layout.world_size() == 1 && !collectives_at_world_one)
    return make_local_executor(make_rank_runner(source, layout.shard(0), {}));
  std::unique_ptr<RankGroups> groups;
  if (collectives == DeviceCollectives::kNccl) {
    if (layout.world_size() > gpus)
      fail(fmt::format("the layout {} needs {} GPUs (one per rank); {} {} visible", layout.describe(),
                       layout.world_size(), gpus, gpus == 1 ? "is" : "are"));
    groups = std::make_unique<NcclGroups>(layout, collectives_at_world_one);
  } else {
    groups = make_device_copy_groups(layout);
  }
  return make_parallel_executor(layout, std::move(groups), [=](int rank, const model::Peers& peers) {
    ops::cuda::set_device(rank % gpus);
    return make_rank_runner(source, layout.shard(rank), peers);
  });
}

std::unique_ptr<Executor> make_cuda_executor_across(const comm::ProcessGroup& processes, const CudaRankSource& source,
                                                    const ParallelLayout& layout) {
  const io::ModelConfig config =
      source.synthetic_config ? *source.synthetic_config : io::load_model_config(source.model_dir);
  check_layout(config, layout);
  const auto [first, count] = hosted_ranks(layout, processes.rank(), processes.size());
  const int gpus = ops::cuda::device_count();
  if (count > gpus)
    fail(fmt::format("each process hosts {} ranks of {}, a GPU each, but {} GPUs are visible here", count,
                     layout.describe(), gpus));
  require_supported_gpus(count);
  auto groups = std::make_unique<NcclProcessGroups>(processes, layout, first, count);
  auto make_runner = [=, first = first](int rank, const model::Peers& peers) {
    ops::cuda::set_device(rank - first);
    return make_rank_runner(source, layout.shard(rank), peers);
  };
  if (processes.rank() == 0) return make_distributed_executor(processes, layout, std::move(groups), make_runner);
  serve_remote_ranks(processes, layout, std::move(groups), make_runner);
  return nullptr;
}

}  // namespace glms::runtime
