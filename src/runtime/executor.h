// What the engine runs its steps on: one step of every data-parallel rank at once, over however
// many workers the layout has (runtime/layout.h). The engine hands it one batch per
// data-parallel rank (empty for an idle rank, which still joins the MoE layers' collectives);
// every tensor-parallel peer of a rank runs that rank's batch, and the first peer's outputs
// come back. With one rank it is today's single-device path, run on the caller's thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/model_config.h"
#include "model/batch.h"
#include "model/step_runner.h"
#include "runtime/layout.h"

namespace glms::runtime {

// One data-parallel rank's part of a step. The executor fills batch.dp_peers.
struct RankStep {
  model::ForwardBatch batch;              // no tokens: the rank idles through the collectives
  std::vector<model::RowOutput> outputs;  // one per logits row (StepRunner::forward_selected)
  const float* h_prev = nullptr;          // MTP steps: [tokens, hidden] host fp32
};

struct RankResult {
  model::StepLogits logits;
  // forward with want_hidden: every token's hidden state before the final norm [tokens, hidden];
  // mtp_forward: the draft block's output [tokens, hidden] (for chaining).
  std::vector<float> hidden;
};

class Executor {
 public:
  virtual ~Executor() = default;
  virtual const io::ModelConfig& config() const = 0;
  virtual const ParallelLayout& layout() const = 0;
  int data_parallel_size() const { return layout().data_parallel; }
  virtual std::string device() const = 0;  // "cpu", "cuda"
  // Cache bytes of one token on one data-parallel rank (each of its tensor-parallel peers keeps a
  // copy on its own device).
  // With `mtp`, the MTP layer's rows too (the drafts' cache, CacheShape::mtp).
  virtual int64_t cache_bytes_per_token(kv::CacheDtype dtype, bool mtp) const = 0;
  // Every data-parallel rank gets a paged cache of `shape` (block ids index the rank's own); with
  // shape.num_blocks 0 each device fits what its memory budget allows and every rank then uses
  // the smallest count.
  virtual void allocate(const model::CacheShape& shape) = 0;
  virtual int num_blocks() const = 0;  // each rank's cache, in blocks
  // Per world rank: weights and cache bytes on its device.
  struct RankMemory {
    int64_t weight_bytes = 0, cache_bytes = 0;
  };
  virtual std::vector<RankMemory> memory() const = 0;
  virtual bool has_mtp() const = 0;

  // steps[r] runs on data-parallel rank r; returns one result per rank. Throws glms::Error when a
  // rank fails; the executor stays usable where its communicators can recover (CPU ranks).
  virtual std::vector<RankResult> forward(std::vector<RankStep>& steps, bool want_hidden) = 0;
  // The MTP draft layer's step (StepRunner::mtp_forward_selected) on every rank.
  virtual std::vector<RankResult> mtp_forward(std::vector<RankStep>& steps) = 0;
};

// One rank on the caller's thread.
std::unique_ptr<Executor> make_local_executor(std::unique_ptr<model::StepRunner> runner);

// A StepRunner over `executor` that runs every step on data-parallel rank 0 (the others idle
// through the collectives): for single-request generation under any layout.
std::unique_ptr<model::StepRunner> rank_zero_runner(Executor& executor);

}  // namespace glms::runtime
