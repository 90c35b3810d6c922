// Step bookkeeping of CudaGlm5Model (cuda/model.cpp): the shape that keys captured graphs and
// per-phase device timing (where a step's metadata sits: model/cuda_memory.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ops/cuda/cuda_ops.h"

namespace glms::model::cuda_step {

namespace cuda = ops::cuda;

// What fixes a step's launches: its sizes and the context bound that sizes the grids. Two steps
// with the same shape issue the same kernels, so a decode shape can be captured once as a graph.
struct StepShape {
  int num_tokens = 0, num_sequences = 0, num_logits = 0;
  int max_context = 0;        // bound on any token's context (sizes the attention and indexer grids)
  bool selects_all = false;   // every token's context is at most index_topk: the top-k is all of it
  bool host_sync_ok = true;   // false while capturing a graph
  // Data-parallel peers: the rows each rank adds to the MoE layers' gather (the most tokens any
  // rank runs, rounded up to a few sizes so that decode graphs are reused). Which of this rank's
  // tokens route to experts is the metadata's routed_tokens, read on the device.
  int moe_rows = 0;
  // Every data-parallel rank's step (model::dp_graph_key), so that the ranks capture a decode
  // step's graph, collectives and all, together and replay the graphs of one joint capture.
  std::vector<int32_t> dp_graph_key;
  bool dp_padded = false;  // padded to the largest rank's batch (padded_for_graph)
  bool operator<(const StepShape& o) const {
    return std::tie(num_tokens, num_sequences, num_logits, max_context, selects_all, moe_rows, dp_graph_key,
                    dp_padded) < std::tie(o.num_tokens, o.num_sequences, o.num_logits, o.max_context, o.selects_all,
                                          o.moe_rows, o.dp_graph_key, o.dp_padded);
  }
};

// Device events between the phases of eager steps; summed per phase name when collected.
class PhaseTimer {
 public:
  bool enabled = false;
  void mark(const char* phase, cudaStream_t stream) {
    if (!enabled) return;
    if (used_ == events_.size()) events_.push_back(std::make_unique<cuda::Event>());
    if (used_ == names_.size()) names_.emplace_back();
    events_[used_]->record(stream);
    names_[used_++] = phase;
  }
  // After the stream has finished the marked work.
  void collect() {
    for (size_t i = 1; i < used_; ++i) {
      if (names_[i] == "start") continue;  // the host's time between steps
      if (!totals_.count(names_[i])) order_.push_back(names_[i]);
      totals_[names_[i]] += events_[i]->elapsed_ms_since(*events_[i - 1]);
    }
    used_ = 0;
  }
  std::vector<std::pair<std::string, double>> take() {
    collect();
    std::vector<std::pair<std::string, double>> out;
    for (const std::string& name : order_) out.emplace_back(name, totals_[name]);
    totals_.clear();
    order_.clear();
    return out;
  }

 private:
  std::vector<std::unique_ptr<cuda::Event>> events_;
  std::vector<std::string> names_;
  size_t used_ = 0;
  std::map<std::string, double> totals_;
  std::vector<std::string> order_;
};


}  // namespace glms::model::cuda_step
