#include "runtime/parallel_executor.h"

#include "core/error.h"
#include "runtime/rank_set.h"

namespace glms::runtime {

namespace {

// Every rank of the layout in this process.
class ParallelExecutor : public Executor {
 public:
  ParallelExecutor(const ParallelLayout& layout, std::unique_ptr<RankGroups> groups, const RunnerFactory& make_runner)
      : ranks_(layout, std::move(groups), make_runner, 0, layout.world_size()) {}

  const io::ModelConfig& config() const override { return ranks_.first_runner().config(); }
  const ParallelLayout& layout() const override { return ranks_.layout(); }
  std::string device() const override { return ranks_.first_runner().device(); }
  int64_t cache_bytes_per_token(kv::CacheDtype dtype, bool mtp) const override {
    return ranks_.first_runner().cache_bytes_per_token(dtype, mtp);
  }
  void allocate(const model::CacheShape& shape) override {
    ranks_.allocate(shape);
    ranks_.limit_blocks(ranks_.num_blocks());  // peers share block ids
  }
  int num_blocks() const override { return ranks_.num_blocks(); }
  std::vector<RankMemory> memory() const override { return ranks_.memory(); }
  bool has_mtp() const override { return ranks_.first_runner().has_mtp(); }

  std::vector<RankResult> forward(std::vector<RankStep>& steps, bool want_hidden) override {
    fill_dp_peers(ranks_.layout(), steps);
    std::vector<RankResult> results(steps.size());
    std::vector<bool> produced(steps.size(), false);
    ranks_.forward(steps, want_hidden, results, produced);
    return results;
  }
  std::vector<RankResult> mtp_forward(std::vector<RankStep>& steps) override {
    fill_dp_peers(ranks_.layout(), steps);
    std::vector<RankResult> results(steps.size());
    std::vector<bool> produced(steps.size(), false);
    ranks_.mtp_forward(steps, results, produced);
    return results;
  }

 private:
  RankSet ranks_;
};

}  // namespace

std::unique_ptr<Executor> make_parallel_executor(const ParallelLayout& layout, std::unique_ptr<RankGroups> groups,
                                                 const RunnerFactory& make_runner) {
  return std::make_unique<ParallelExecutor>(layout, std::move(groups), make_runner);
}

}  // namespace glms::runtime
