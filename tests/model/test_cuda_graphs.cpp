// Steps of a few tokens a sequence replayed as CUDA graphs against the same steps eager: MTP
// verify steps (the pending token and its drafts, every row's logits) on a random model of odd
// sizes whose indexer scores (contexts past its top-k), and a sequence too long for a graph run
// eager. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <numeric>

#include "model/cuda/model.h"
#include "model/glm5.h"
#include "random_model.h"
#include "support/cuda_buffers.h"
#include "support/numerics.h"

using namespace glms;
using glms::testing::random_tokens;
using glms::testing::relative_l2;
using glms::testing::RandomModelSpec;
using glms::testing::TempDir;

namespace {

constexpr int kBlockSize = 8;
constexpr int kSequences = 4;
constexpr int kBlocksPerSequence = 3;  // positions 0..23: a 12-token prompt and a step of up to 12
constexpr int kPrompt = 12;            // past the random model's top-9: every step's indexer scores

class CudaGraphs : public glms::testing::CudaTest {};

std::vector<int32_t> blocks_of(int sequence) {
  std::vector<int32_t> table(kBlocksPerSequence);
  std::iota(table.begin(), table.end(), sequence * kBlocksPerSequence);
  std::reverse(table.begin(), table.end());  // not in physical order
  return table;
}

// Sequence s verifies tokens[s] tokens from position kPrompt on, with every row's logits.
model::ForwardBatch verify_step(const std::vector<int>& tokens, int seed, int vocab) {
  model::ForwardBatch batch;
  for (int s = 0; s < static_cast<int>(tokens.size()); ++s)
    batch.add_sequence(random_tokens(tokens[s], vocab, 100 * seed + s), kPrompt, blocks_of(s), kBlockSize, true);
  return batch;
}

}  // namespace

// A verify step of four tokens a sequence is captured once and replayed for another step of the
// same sizes (tokens, sequences, logits rows), however its tokens fall to its sequences: each
// token attends and scores its own keys, so the launches follow from the sizes. Each replay
// against the same step eager, as the decode graphs are checked (test_cuda_forward.cpp): the same
// kernels, so the logits agree, with room for an attention split sized for the longest context
// allowed. 16 tokens of top-3 routing over 8 experts keep the experts off host synchronisation.
// The phase-timed eager steps select the indexer's positions in line, the graphs on the side
// stream beside the absorption (CudaModelOptions::overlap_indexer_tokens): both paths, checked
// against each other here and the side stream against the CPU in test_cuda_forward.cpp.
TEST_F(CudaGraphs, VerifyStepsReplayAGraphThatMatchesEager) {
  RandomModelSpec spec;
  spec.with_mtp = false;
  TempDir dir("cuda_graphs");
  const model::Glm5Model cpu(model::load_weights(glms::testing::write_random_model(dir.path / "m", spec).string()));
  const int vocab = spec.vocab_size;
  model::CudaModelOptions options;
  options.block_size = kBlockSize;
  options.num_blocks = kSequences * kBlocksPerSequence;
  options.max_tokens = 64;
  options.max_sequences = kSequences;
  options.max_context = kBlockSize * kBlocksPerSequence;
  options.max_logits = 64;
  model::CudaGlm5Model gpu(cpu.weights(), options);
  model::ForwardBatch prefill;
  for (int s = 0; s < kSequences; ++s)
    prefill.add_sequence(random_tokens(kPrompt, vocab, 10 + s), 0, blocks_of(s), kBlockSize, false);
  gpu.forward(prefill);

  const std::vector<std::vector<int>> steps = {{4, 4, 4, 4}, {1, 7, 4, 4}, {4, 4, 4, 4}};
  for (size_t i = 0; i < steps.size(); ++i) {
    const model::ForwardBatch step = verify_step(steps[i], static_cast<int>(i), vocab);
    gpu.set_phase_timing(true);
    const std::vector<float> eager = gpu.forward(step, /*use_graph=*/false);
    EXPECT_FALSE(gpu.take_phase_times().empty()) << "an eager step records its phases";
    const std::vector<float> graphed = gpu.forward(step, /*use_graph=*/true);
    EXPECT_TRUE(gpu.take_phase_times().empty()) << "step " << i << " ran eager, not as a graph";
    gpu.set_phase_timing(false);
    const int rows = step.num_tokens();
    ASSERT_EQ(graphed.size(), static_cast<size_t>(rows) * vocab);
    std::vector<double> errors;
    for (int r = 0; r < rows; ++r)
      errors.push_back(relative_l2(graphed.data() + int64_t{r} * vocab, eager.data() + int64_t{r} * vocab, vocab));
    std::sort(errors.begin(), errors.end());
    std::printf("verify step %zu: graph against eager, per-row logits relative L2 median %.2e, max %.2e\n", i,
                errors[rows / 2], errors.back());
    EXPECT_LT(errors[rows / 2], 1e-3) << "step " << i;
    EXPECT_LT(errors.back(), 0.3) << "step " << i;
  }
  EXPECT_EQ(gpu.captured_graphs(), 1) << "the three steps share their sizes, so one graph";

  // A sequence of more than kGraphedSequenceTokens tokens (a prefill chunk) runs eager.
  gpu.set_phase_timing(true);
  gpu.forward(verify_step({model::kGraphedSequenceTokens + 1, 1, 1, 1}, 9, vocab), /*use_graph=*/true);
  EXPECT_FALSE(gpu.take_phase_times().empty()) << "a step with a sequence past the graphed size ran as a graph";
  EXPECT_EQ(gpu.captured_graphs(), 1);
}
