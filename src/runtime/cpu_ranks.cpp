#include "runtime/cpu_ranks.h"

#include <omp.h>

#include <algorithm>

#include "model/glm5.h"
#include "runtime/distributed_executor.h"
#include "runtime/parallel_executor.h"

namespace glms::runtime {

std::unique_ptr<Executor> make_cpu_executor(const std::string& model_dir, const ParallelLayout& layout,
                                            const model::LoadOptions& options) {
  if (layout.world_size() == 1) {
    auto model = std::make_shared<const model::Glm5Model>(model::load_weights(model_dir, options));
    return make_local_executor(model::make_cpu_runner(std::move(model)));
  }
  check_layout(io::load_model_config(model_dir), layout);
  // The ranks share the cores: each gets its part of the OpenMP threads.
  const int threads = std::max(1, omp_get_num_procs() / layout.world_size());
  return make_parallel_executor(layout, make_cpu_groups(layout), [=](int rank, const model::Peers& peers) {
    omp_set_num_threads(threads);
    model::LoadOptions rank_options = options;
    rank_options.shard = layout.shard(rank);
    auto model = std::make_shared<const model::Glm5Model>(model::load_weights(model_dir, rank_options), peers);
    return model::make_cpu_runner(std::move(model));
  });
}

std::unique_ptr<Executor> make_cpu_executor_across(const comm::ProcessGroup& processes, const std::string& model_dir,
                                                   const ParallelLayout& layout, const model::LoadOptions& options) {
  check_layout(io::load_model_config(model_dir), layout);
  auto make_runner = [=](int rank, const model::Peers& peers) {
    model::LoadOptions rank_options = options;
    rank_options.shard = layout.shard(rank);
    auto model = std::make_shared<const model::Glm5Model>(model::load_weights(model_dir, rank_options), peers);
    return model::make_cpu_runner(std::move(model));
  };
  std::unique_ptr<RankGroups> groups = make_process_groups(processes, layout);
  if (processes.rank() == 0) return make_distributed_executor(processes, layout, std::move(groups), make_runner);
  serve_remote_ranks(processes, layout, std::move(groups), make_runner);
  return nullptr;
}

}  // namespace glms::runtime
