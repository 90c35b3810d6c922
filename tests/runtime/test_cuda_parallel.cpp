// CUDA layouts against one GPU rank: world size 1 through NCCL (the collectives run, in captured
// graphs too), every layout on one GPU with device-copy collectives (ranks share the GPU), and
// the same layouts over NCCL where the machine has a GPU per rank (skipped otherwise), and a
// data-parallel rank's decode graphs taken only with its peers'. bf16 activations: logits within
// bf16 tolerance, greedy tokens identical on the bundled model.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "comm/nccl_library.h"
#include "core/error.h"
#include "engine/generator.h"
#include "io/model_config.h"
#include "io/safetensors.h"
#include "ops/cuda/cuda_ops.h"
#include "runtime/cuda_ranks.h"
#include "runtime/device_collectives.h"
#include "support/cuda_buffers.h"
#include "support/numerics.h"

using namespace glms;
using glms::testing::relative_l2;

namespace {

const std::filesystem::path kSource = GLMS_SOURCE_DIR;
const std::string kBundled = (kSource / "models/glm5-tiny-code").string();
const std::string kGlm52 = (kSource / "tests/golden/glm52-random").string();

class CudaParallel : public glms::testing::CudaTest {};

bool nccl_loads() {
  try {
    comm::nccl::Library::load();
    return true;
  } catch (const Error&) {
    return false;
  }
}

std::vector<int32_t> golden_prompt(const std::string& dir) {
  const io::Checkpoint golden = io::Checkpoint::open(std::filesystem::path(dir) / "golden.safetensors");
  const std::vector<int64_t> ids = io::read_i64(golden.get("prompt_ids"));
  return {ids.begin(), ids.end()};
}

std::unique_ptr<runtime::Executor> executor(const std::string& dir, const runtime::ParallelLayout& layout,
                                            runtime::DeviceCollectives collectives, bool at_world_one = false) {
  runtime::CudaRankSource source;
  source.model_dir = dir;
  return runtime::make_cuda_executor(source, layout, collectives, at_world_one);
}

// Every position's logits of `prompt` on data-parallel rank 0 (the others idle through the
// collectives) and 12 greedy tokens after it.
struct RunResult {
  std::vector<float> logits;
  std::vector<int32_t> greedy;
};
RunResult run_prompt(runtime::Executor& e, const std::vector<int32_t>& prompt) {
  const auto runner = runtime::rank_zero_runner(e);
  const int block_size = 16, blocks = static_cast<int>(prompt.size()) / block_size + 2;
  model::CacheShape shape;
  shape.block_size = block_size;
  shape.num_blocks = blocks;
  shape.max_tokens = static_cast<int>(prompt.size());
  shape.max_sequences = 1;
  shape.max_logits = static_cast<int>(prompt.size());
  shape.max_context = blocks * block_size;
  runner->allocate(shape);
  std::vector<int32_t> table(blocks);
  for (int b = 0; b < blocks; ++b) table[b] = b;
  model::ForwardBatch batch;
  batch.add_sequence(prompt, 0, table, block_size, true);
  RunResult out;
  out.logits = runner->forward(batch);
  engine::GenerateOptions options;
  options.max_tokens = 12;
  options.sampling.temperature = 0.0f;
  options.ignore_eos = true;
  out.greedy = engine::generate(*runner, prompt, options).output_ids;  // allocates its own cache
  return out;
}

// Per prompt position, as the CUDA-vs-CPU tests compare bf16 paths: a shard sums its peers'
// parts in another order, so a bf16 rounding, an indexer top-k or a router choice near a tie can
// flip at a few positions (as it can between the GPU and the CPU); the typical position agrees
// to bf16 noise and none departs by more than such a flip.
void expect_like_one_rank(const std::string& dir, const runtime::ParallelLayout& layout,
                          runtime::DeviceCollectives collectives, const RunResult& one) {
  auto sharded = executor(dir, layout, collectives);
  const RunResult got = run_prompt(*sharded, golden_prompt(dir));
  const std::string name = layout.describe();
  ASSERT_EQ(got.logits.size(), one.logits.size()) << name;
  const size_t vocab = static_cast<size_t>(sharded->config().vocab_size), rows = one.logits.size() / vocab;
  std::vector<double> errors;
  for (size_t r = 0; r < rows; ++r)
    errors.push_back(relative_l2(got.logits.data() + r * vocab, one.logits.data() + r * vocab, vocab));
  std::sort(errors.begin(), errors.end());
  EXPECT_LT(errors[rows / 2], 1e-2) << name << ": median position";
  EXPECT_LT(errors.back(), 0.3) << name << ": worst position";
  std::printf("  %s: logits rel L2 median %.2e, worst %.2e, whole prompt %.2e\n", name.c_str(), errors[rows / 2],
              errors.back(), relative_l2(got.logits, one.logits));
  if (dir == kBundled) {
    EXPECT_EQ(got.greedy, one.greedy) << name;  // its greedy margins are wide (tests/golden)
  }
}

}  // namespace

TEST_F(CudaParallel, WorldSizeOneThroughNcclEqualsTheRunnerWithoutCollectives) {
  if (!nccl_loads()) GTEST_SKIP() << "libnccl.so.2 not found (set GLMS_NCCL_LIBRARY)";
  const auto prompt = golden_prompt(kBundled);
  auto plain = executor(kBundled, {}, runtime::DeviceCollectives::kNccl);
  auto through_nccl = executor(kBundled, {}, runtime::DeviceCollectives::kNccl, true);
  const RunResult want = run_prompt(*plain, prompt);
  const RunResult got = run_prompt(*through_nccl, prompt);  // decode steps captured as graphs with NCCL inside
  EXPECT_EQ(got.greedy, want.greedy);
  EXPECT_EQ(got.logits, want.logits);  // an all-reduce over one rank changes no bit
}

TEST_F(CudaParallel, LayoutsOnOneGpuWithDeviceCopiesMatchOneRank) {
  const auto copies = runtime::DeviceCollectives::kDeviceCopies;
  for (const std::string& dir : {kBundled, kGlm52}) {
    auto one = executor(dir, {}, copies);
    const RunResult want = run_prompt(*one, golden_prompt(dir));
    one.reset();
    std::vector<runtime::ParallelLayout> layouts = {{2, 1, false}, {1, 2, true}, {2, 2, true}, {1, 4, true}, {2, 2, false}};
    // The eight-rank layouts of the node run (one head a rank at TP8, experts 8 wide without EP).
    if (dir == kBundled) layouts.insert(layouts.end(), {{1, 8, true}, {4, 2, true}, {8, 1, false}, {2, 4, false}});
    for (const runtime::ParallelLayout& layout : layouts) expect_like_one_rank(dir, layout, copies, want);
  }
}

TEST_F(CudaParallel, LayoutsOverNcclOnSeveralGpusMatchOneRank) {
  const int gpus = ops::cuda::device_count();
  if (gpus < 2) GTEST_SKIP() << "needs 2 GPUs, " << gpus << " visible";
  // Several GPUs and no NCCL would skip the one test of the layouts over real links unnoticed.
  ASSERT_TRUE(nccl_loads()) << gpus << " GPUs visible but libnccl.so.2 not found: set GLMS_NCCL_LIBRARY "
                            << "(tools/gpu/nccl-env finds PyTorch's)";
  auto one = executor(kBundled, {}, runtime::DeviceCollectives::kNccl);
  const RunResult want = run_prompt(*one, golden_prompt(kBundled));
  one.reset();
  std::vector<runtime::ParallelLayout> layouts = {{2, 1, false}, {1, 2, true}};
  if (gpus >= 4) layouts.insert(layouts.end(), {{4, 1, false}, {2, 2, true}, {1, 4, true}});
  if (gpus >= 8) layouts.insert(layouts.end(), {{8, 1, false}, {4, 2, true}, {2, 4, false}, {1, 8, true}});
  for (const runtime::ParallelLayout& layout : layouts)
    expect_like_one_rank(kBundled, layout, runtime::DeviceCollectives::kNccl, want);
}

TEST_F(CudaParallel, ALayoutWiderThanTheMachineIsRefused) {
  const int gpus = ops::cuda::device_count();
  try {
    executor(kBundled, {1, 2 * gpus, true}, runtime::DeviceCollectives::kNccl);
    FAIL() << "a layout of more ranks than GPUs was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("GPUs (one per rank)"), std::string::npos) << e.what();
  }
}

// The rank simulation's stand-in peers: a group's all-gathers arrive in every slot (rows copied,
// expert ids shifted as each peer's would be), whether grouped into one launch or not.
TEST_F(CudaParallel, SimulatedPeersGatherEverySlotWithShiftedExpertIds) {
  constexpr int kSize = 8, kRank = 3, kExperts = 256;
  auto peer = runtime::make_simulated_peer(kRank, kSize, kExperts, 1024);
  std::vector<int32_t> ids(40);
  std::vector<float> weights(40);
  std::vector<uint16_t> rows(5 * 6144 + 2);  // an odd 4-byte word count: the word-wise copy
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = i % 7 == 3 ? -1 : static_cast<int32_t>((i * 37) % kExperts);
  for (size_t i = 0; i < weights.size(); ++i) weights[i] = 0.25f * static_cast<float>(i) - 3.0f;
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<uint16_t>(i * 2654435761u >> 7);
  const auto ids_d = glms::testing::to_device(ids);
  const auto weights_d = glms::testing::to_device(weights);
  const auto rows_d = glms::testing::to_device(rows);
  for (const bool grouped : {true, false}) {
    ops::cuda::DeviceBuffer ids_out(kSize * ids.size() * 4), weights_out(kSize * weights.size() * 4),
        rows_out(kSize * rows.size() * 2);
    if (grouped) peer->begin_group();
    peer->all_gather(ids_d.data(), ids_out.data(), ids.size(), comm::Element::I32);
    peer->all_gather(weights_d.data(), weights_out.data(), weights.size(), comm::Element::F32);
    peer->all_gather(rows_d.data(), rows_out.data(), rows.size() / 2, comm::Element::F32);  // as 4-byte words
    if (grouped) peer->end_group();
    ops::cuda::synchronize_stream(nullptr);
    const auto got_ids = glms::testing::to_host<int32_t>(ids_out);
    const auto got_weights = glms::testing::to_host<float>(weights_out);
    const auto got_rows = glms::testing::to_host<uint16_t>(rows_out);
    for (int slot = 0; slot < kSize; ++slot) {
      const int shift = (slot - kRank + kSize) % kSize * (kExperts / kSize);
      for (size_t i = 0; i < ids.size(); ++i)
        ASSERT_EQ(got_ids[slot * ids.size() + i], ids[i] < 0 ? -1 : (ids[i] + shift) % kExperts)
            << "slot " << slot << " id " << i << (grouped ? " grouped" : "");
      for (size_t i = 0; i < weights.size(); ++i) ASSERT_EQ(got_weights[slot * weights.size() + i], weights[i]);
      for (size_t i = 0; i < rows.size(); ++i) ASSERT_EQ(got_rows[slot * rows.size() + i], rows[i]);
    }
  }
}

// The stand-in peers' other collectives, as chained copies of the bytes a real one brings in: a
// reduce-scatter gives this rank's part of the sent rows (its peers' sums are not simulated), an
// all-reduce leaves the values in place; fp32 and bf16 rows; a width that is not whole words is
// refused.
TEST_F(CudaParallel, SimulatedPeersReduceScatterTheirRankAndAllReduceInPlace) {
  constexpr int kSize = 8, kRank = 5, kCount = 3 * 6144;
  auto peer = runtime::make_simulated_peer(kRank, kSize, 256, size_t{kCount} * 4);
  std::vector<float> rows(size_t{kSize} * kCount);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = 0.5f * static_cast<float>(i % 9973) - 7.0f;
  const auto rows_d = glms::testing::to_device(rows);
  ops::cuda::DeviceBuffer mine(size_t{kCount} * 4);
  peer->reduce_scatter_sum(rows_d.data(), mine.data(), kCount, comm::Element::F32);
  ops::cuda::DeviceBuffer mine_bf16(size_t{kCount} * 2);
  // The same bytes read as bf16 rows: this rank's kCount values of them.
  peer->reduce_scatter_sum(rows_d.data(), mine_bf16.data(), kCount, comm::Element::BF16);
  const auto in_place = glms::testing::to_device(std::vector<float>(rows.begin(), rows.begin() + kCount));
  peer->all_reduce_sum(in_place.data(), kCount, comm::Element::F32);
  ops::cuda::synchronize_stream(nullptr);
  const auto got = glms::testing::to_host<float>(mine);
  const auto got_bf16 = glms::testing::to_host<uint16_t>(mine_bf16);
  const auto got_in_place = glms::testing::to_host<float>(in_place);
  std::vector<uint16_t> sent_bf16(rows.size() * 2);
  std::memcpy(sent_bf16.data(), rows.data(), rows.size() * 4);
  for (int i = 0; i < kCount; ++i) {
    ASSERT_EQ(got[i], rows[size_t{kRank} * kCount + i]) << i;
    ASSERT_EQ(got_bf16[i], sent_bf16[size_t{kRank} * kCount + i]) << i;
    ASSERT_EQ(got_in_place[i], rows[i]) << i;
  }
  EXPECT_THROW(peer->reduce_scatter_sum(rows_d.data(), mine_bf16.data(), 3, comm::Element::BF16), Error);
}

// A data-parallel rank takes a decode step's graph only together with its peers (NCCL's rule for
// captured collectives): eager while any peer prefills though its own batch decodes, graphed
// once every rank decodes, its batch padded to the largest rank's, so that a graph is captured
// for each largest batch (not for each mix of batches); graphed, unpadded, beside a peer that
// verifies MTP drafts (a few tokens a sequence), such keys of each rank's own sizes up to an
// eighth of the graph bound; padded where both verify as many drafts; and each step's logits
// equal the same step run eager, unpadded. Rank 0 of DP2 + EP2 over a stand-in
// peer (the rank simulation's, capturable), synthetic weights of the bundled model's config.
TEST_F(CudaParallel, DataParallelRanksTakeADecodeGraphTogether) {
  const io::ModelConfig config = io::load_model_config(kBundled);
  const runtime::ParallelLayout layout{1, 2, true};
  auto dp = runtime::make_simulated_peer(0, 2, config.n_routed_experts, size_t{1} << 20);
  model::CudaModelOptions options;
  options.block_size = 16;
  options.num_blocks = 16;
  options.max_tokens = 64;
  options.max_sequences = 8;
  options.max_logits = 64;  // a verify step's rows, as every rank's options hold the largest rank's
  options.max_decode_graphs = 8;  // of which one (an eighth) keyed by each rank's own sizes, unpadded
  options.max_context = 256;
  auto rank = model::CudaGlm5Model::synthetic(config, 3, options, ops::WeightFormat::Plain, layout.shard(0),
                                              {nullptr, dp.get()});
  struct Step {
    model::DpStepShape peer;
    bool graphed;
    int graphs;  // captured after the step
  };
  rank->set_phase_timing(true);  // an eager step records its phases, a replayed graph none
  auto expect_step = [&](model::ForwardBatch& batch, const Step& step) {
    batch.dp_peers = {model::dp_step_shape(batch), step.peer};
    const std::vector<float> eager = rank->forward(batch, /*use_graph=*/false);
    rank->take_phase_times();
    const std::vector<float> got = rank->forward(batch, /*use_graph=*/true);
    SCOPED_TRACE("peer of " + std::to_string(step.peer.tokens) + " tokens, " + std::to_string(step.peer.sequences) +
                 " sequences");
    EXPECT_EQ(rank->take_phase_times().empty(), step.graphed);
    EXPECT_EQ(rank->captured_graphs(), step.graphs);
    ASSERT_EQ(got.size(), eager.size());
    // A padded step runs more tokens through the same layers: the linear layers may take another
    // kernel for them (the GEMV up to two tokens, the skinny GEMM from three), another bf16 order.
    EXPECT_LT(relative_l2(got, eager), 1e-2);
  };
  model::ForwardBatch decode;  // two sequences' first tokens: nothing read from the cache before them
  decode.add_sequence({5}, 0, {0}, 16, false);
  decode.add_sequence({9}, 0, {1}, 16, false);
  const model::DpStepShape smaller{1, 1, 1, 1, 1}, same{2, 2, 2, 1, 1}, larger{3, 3, 3, 1, 1};
  const model::DpStepShape prefilling{40, 1, 1, 40, 40}, verifying{8, 2, 8, 5, 4}, verifying_more{12, 3, 12, 5, 4};
  for (const Step& step : {Step{prefilling, false, 0}, Step{same, true, 1}, Step{smaller, true, 1},
                           Step{larger, true, 2}, Step{verifying, true, 3}, Step{verifying_more, false, 3},
                           Step{prefilling, false, 3}, Step{verifying, true, 3}, Step{same, true, 3}})
    expect_step(decode, step);
  // Both ranks verifying three drafts a sequence: padded to the largest rank's sequences too.
  model::ForwardBatch verify;
  verify.add_sequence({5, 6, 7, 8}, 0, {0}, 16, true);
  verify.add_sequence({9, 10, 11, 12}, 0, {1}, 16, true);
  const model::DpStepShape verify_same{8, 2, 8, 4, 4}, verify_smaller{4, 1, 4, 4, 4}, verify_larger{12, 3, 12, 4, 4};
  for (const Step& step : {Step{verify_same, true, 4}, Step{verify_smaller, true, 4}, Step{verify_larger, true, 5}})
    expect_step(verify, step);
}
