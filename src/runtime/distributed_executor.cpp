#include "runtime/distributed_executor.h"

#include <fmt/format.h>

#include "core/error.h"
#include "log/log.h"
#include "runtime/rank_set.h"
#include "runtime/step_codec.h"

namespace glms::runtime {

namespace {

// What a process sends back after a step: the results it produced, or its error.
std::vector<std::byte> encode_results(const std::vector<RankResult>& results, const std::vector<bool>& produced,
                                      const std::string& error) {
  ByteWriter out;
  out.put_vector(std::vector<char>(error.begin(), error.end()));
  uint32_t count = 0;
  for (bool p : produced) count += p;
  out.put(count);
  for (size_t d = 0; d < produced.size(); ++d)
    if (produced[d]) {
      out.put<uint32_t>(static_cast<uint32_t>(d));
      write_result(out, results[d]);
    }
  return std::move(out.bytes);
}

// Runs one forward or MTP step of this process's ranks; returns what to send back. A rank that
// fails mid-step leaves its peers in other processes waiting inside collectives no message can
// reach: the run ends then, every process with status 1 and this one saying why.
std::vector<std::byte> run_step(const comm::ProcessGroup& processes, RankSet& ranks, Command command,
                                const std::vector<RankStep>& steps, bool want_hidden, std::vector<RankResult>& results,
                                std::vector<bool>& produced) {
  try {
    if (command == Command::kForward) ranks.forward(steps, want_hidden, results, produced);
    else ranks.mtp_forward(steps, results, produced);
  } catch (const std::exception& e) {
    if (processes.size() > 1) {
      log::error(fmt::format("glmserve: process {} of {}: a step failed ({}); its peers may wait for it in a collective, "
                             "so every process of the run ends now",
                             processes.rank(), processes.size(), e.what()));
      processes.abort_all(1);
    }
    return encode_results(results, produced, e.what());
  }
  return encode_results(results, produced, "");
}

// The same token ids check each rank makes, before any process starts: a rank that failed on
// its own would leave its peers waiting in a collective across processes.
void check_steps(const io::ModelConfig& config, const std::vector<RankStep>& steps) {
  for (const RankStep& step : steps)
    for (int32_t id : step.batch.token_ids)
      if (id < 0 || id >= config.vocab_size)
        fail("token id " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(config.vocab_size) +
             ")");
}

class DistributedExecutor : public Executor {
 public:
  DistributedExecutor(const comm::ProcessGroup& processes, const ParallelLayout& layout,
                      std::unique_ptr<RankGroups> groups, const RunnerFactory& make_runner)
      : processes_(processes),
        ranks_(layout, std::move(groups), make_runner, hosted_ranks(layout, 0, processes.size()).first,
               hosted_ranks(layout, 0, processes.size()).second) {}
  ~DistributedExecutor() override {
    try {
      ByteWriter stop;
      stop.put(Command::kStop);
      processes_.broadcast(stop.bytes, 0);
    } catch (...) {
    }
  }

  const io::ModelConfig& config() const override { return ranks_.first_runner().config(); }
  const ParallelLayout& layout() const override { return ranks_.layout(); }
  std::string device() const override { return ranks_.first_runner().device(); }
  int64_t cache_bytes_per_token(kv::CacheDtype dtype, bool mtp) const override {
    return ranks_.first_runner().cache_bytes_per_token(dtype, mtp);
  }
  bool has_mtp() const override { return ranks_.first_runner().has_mtp(); }
  int num_blocks() const override { return ranks_.num_blocks(); }
  std::vector<RankMemory> memory() const override { return ranks_.memory(); }  // this process's ranks

  void allocate(const model::CacheShape& shape) override {
    ByteWriter message;
    message.put(Command::kAllocate);
    write_cache_shape(message, shape);
    processes_.broadcast(message.bytes, 0);
    ranks_.allocate(shape);
    ranks_.limit_blocks(processes_.min_over_processes(ranks_.num_blocks()));
  }

  std::vector<RankResult> forward(std::vector<RankStep>& steps, bool want_hidden) override {
    return step(Command::kForward, steps, want_hidden);
  }
  std::vector<RankResult> mtp_forward(std::vector<RankStep>& steps) override {
    return step(Command::kMtpForward, steps, false);
  }

 private:
  std::vector<RankResult> step(Command command, std::vector<RankStep>& steps, bool want_hidden) {
    fill_dp_peers(ranks_.layout(), steps);
    check_steps(config(), steps);
    ByteWriter message;
    message.put(command);
    message.put<uint8_t>(want_hidden);
    write_steps(message, steps, config().hidden_size);
    processes_.broadcast(message.bytes, 0);
    std::vector<RankResult> results(steps.size());
    std::vector<bool> produced(steps.size(), false);
    const std::vector<std::byte> mine = run_step(processes_, ranks_, command, steps, want_hidden, results, produced);
    std::string error;
    for (const std::vector<std::byte>& reply : processes_.gather(mine, 0)) {
      ByteReader in(reply);
      const std::vector<char> text = in.get_vector<char>();
      if (!text.empty() && error.empty()) error.assign(text.begin(), text.end());
      for (uint32_t n = in.get<uint32_t>(); n > 0; --n) {
        const uint32_t d = in.get<uint32_t>();
        results[d] = read_result(in);
      }
    }
    if (!error.empty()) fail(error);
    return results;
  }

  const comm::ProcessGroup& processes_;
  RankSet ranks_;
};

class ProcessRankGroups : public RankGroups {
 public:
  ProcessRankGroups(const comm::ProcessGroup& processes, const ParallelLayout& layout)
      : tp_(layout.world_size()), dp_(layout.world_size()) {
    if (layout.world_size() != processes.size())
      fail(fmt::format("CPU ranks across processes are one a process: {} ranks need {} processes, mpirun started {}",
                       layout.world_size(), layout.world_size(), processes.size()));
    const int me = processes.rank();
    if (layout.tensor_parallel > 1)
      for (const std::vector<int>& group : tensor_parallel_groups(layout))
        if (auto c = processes.communicator(group)) tp_[me] = std::move(c);
    if (layout.data_parallel > 1)
      for (const std::vector<int>& group : data_parallel_groups(layout))
        if (auto c = processes.communicator(group)) dp_[me] = std::move(c);
  }
  model::Peers peers(int world_rank) const override { return {tp_[world_rank].get(), dp_[world_rank].get()}; }
  std::string backend() const override { return "mpi"; }
  void abort(const std::string&) override {}  // an MPI collective cannot be interrupted
  bool reset() override { return false; }

 private:
  std::vector<std::unique_ptr<comm::Communicator>> tp_, dp_;
};

}  // namespace

std::pair<int, int> hosted_ranks(const ParallelLayout& layout, int process, int processes) {
  if (processes < 1 || layout.world_size() % processes != 0)
    fail(fmt::format("{} processes do not divide the layout's {} ranks ({}): start one process per node with as many "
                     "ranks each",
                     processes, layout.world_size(), layout.describe()));
  const int per_process = layout.world_size() / processes;
  return {process * per_process, per_process};
}

std::unique_ptr<Executor> make_distributed_executor(const comm::ProcessGroup& processes, const ParallelLayout& layout,
                                                    std::unique_ptr<RankGroups> groups,
                                                    const RunnerFactory& make_runner) {
  return std::make_unique<DistributedExecutor>(processes, layout, std::move(groups), make_runner);
}

void serve_remote_ranks(const comm::ProcessGroup& processes, const ParallelLayout& layout,
                        std::unique_ptr<RankGroups> groups, const RunnerFactory& make_runner) {
  const auto [first, count] = hosted_ranks(layout, processes.rank(), processes.size());
  RankSet ranks(layout, std::move(groups), make_runner, first, count);
  const int64_t hidden = ranks.first_runner().config().hidden_size;
  while (true) {
    std::vector<std::byte> message;
    processes.broadcast(message, 0);
    ByteReader in(message);
    const Command command = in.get<Command>();
    if (command == Command::kStop) return;
    if (command == Command::kAllocate) {
      ranks.allocate(read_cache_shape(in));
      ranks.limit_blocks(processes.min_over_processes(ranks.num_blocks()));
      continue;
    }
    const bool want_hidden = in.get<uint8_t>() != 0;
    std::vector<std::vector<float>> h_prev_rows;
    const std::vector<RankStep> steps = read_steps(in, hidden, h_prev_rows);
    std::vector<RankResult> results(steps.size());
    std::vector<bool> produced(steps.size(), false);
    processes.gather(run_step(processes, ranks, command, steps, want_hidden, results, produced), 0);
  }
}

std::unique_ptr<RankGroups> make_process_groups(const comm::ProcessGroup& processes, const ParallelLayout& layout) {
  return std::make_unique<ProcessRankGroups>(processes, layout);
}

}  // namespace glms::runtime
