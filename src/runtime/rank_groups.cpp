#include "runtime/rank_groups.h"

#include "comm/cpu_group.h"

namespace glms::runtime {

std::vector<std::vector<int>> tensor_parallel_groups(const ParallelLayout& layout) {
  std::vector<std::vector<int>> groups(layout.data_parallel);
  for (int w = 0; w < layout.world_size(); ++w) groups[w / layout.tensor_parallel].push_back(w);
  return groups;
}

std::vector<std::vector<int>> data_parallel_groups(const ParallelLayout& layout) {
  std::vector<std::vector<int>> groups(layout.tensor_parallel);
  for (int w = 0; w < layout.world_size(); ++w) groups[w % layout.tensor_parallel].push_back(w);
  return groups;
}

namespace {

class CpuRankGroups : public RankGroups {
 public:
  explicit CpuRankGroups(const ParallelLayout& layout) : layout_(layout) {
    if (layout.tensor_parallel > 1)
      for (int d = 0; d < layout.data_parallel; ++d) tp_.push_back(std::make_unique<comm::CpuGroup>(layout.tensor_parallel));
    if (layout.data_parallel > 1)
      for (int t = 0; t < layout.tensor_parallel; ++t) dp_.push_back(std::make_unique<comm::CpuGroup>(layout.data_parallel));
  }
  model::Peers peers(int world_rank) const override {
    const model::ModelShard s = layout_.shard(world_rank);
    model::Peers p;
    if (!tp_.empty()) p.tp = &tp_[s.dp_rank]->rank(s.tp_rank);
    if (!dp_.empty()) p.dp = &dp_[s.tp_rank]->rank(s.dp_rank);
    return p;
  }
  std::string backend() const override { return "cpu"; }
  void abort(const std::string& reason) override {
    for (auto& g : tp_) g->abort(reason);
    for (auto& g : dp_) g->abort(reason);
  }
  bool reset() override {
    for (auto& g : tp_) g->reset();
    for (auto& g : dp_) g->reset();
    return true;
  }

 private:
  ParallelLayout layout_;
  std::vector<std::unique_ptr<comm::CpuGroup>> tp_, dp_;
};

}  // namespace

std::unique_ptr<RankGroups> make_cpu_groups(const ParallelLayout& layout) {
  return std::make_unique<CpuRankGroups>(layout);
}

}  // namespace glms::runtime
