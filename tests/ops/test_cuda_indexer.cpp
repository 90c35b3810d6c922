// CUDA indexer scoring (GLM-5's DSA: the decode kernels, the tensor-core chunk kernel, the GEMM
// path) and top-k selection against plain CPU references, over model-sized and odd shapes, FP8
// keys and operands. Part of test_cuda_attention. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <numeric>
#include <random>
#include <tuple>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/indexer.h"
#include "ops/ops.h"
#include "paged_context.h"
#include "quant/kv_fp8.h"
#include "support/cuda_buffers.h"
#include "support/numerics.h"

using namespace glms;
using glms::testing::PagedContext;
using glms::testing::random_values;
using glms::testing::relative_l2;
using glms::testing::to_device;
using glms::testing::to_host;
using glms::testing::Token;
namespace cuda = glms::ops::cuda;

namespace {

class CudaIndexer : public glms::testing::CudaTest {};

// select_top_k against ops::top_k over rows of `stride` scores at `positions` (rows listed in
// `tied_rows` get many exact ties and a signed zero), with each blocks_per_token given.
void check_top_k(const std::vector<int32_t>& positions, int stride, int top_k, const std::vector<int>& tied_rows,
                 std::initializer_list<int> blocks_per_token_values) {
  const int n = static_cast<int>(positions.size());
  auto scores = random_values(int64_t{n} * stride, 9 + n);
  for (const int row : tied_rows) {
    for (int j = 0; j < stride; ++j) scores[int64_t{row} * stride + j] = std::round(scores[int64_t{row} * stride + j] * 2.0f) / 2.0f;
    scores[int64_t{row} * stride + 17] = -0.0f;
  }
  auto dscores = to_device(scores), dpos = to_device(positions);
  for (const int blocks_per_token : blocks_per_token_values) {
    cuda::DeviceBuffer dsel(int64_t{n} * top_k * sizeof(int32_t)), dnum(n * sizeof(int32_t));
    cuda::select_top_k(dscores.as<float>(), stride, dpos.as<int32_t>(), n, top_k, dsel.as<int32_t>(), top_k,
                       dnum.as<int32_t>(), nullptr, blocks_per_token);
    const auto selected = to_host<int32_t>(dsel, int64_t{n} * top_k);
    const auto num = to_host<int32_t>(dnum, n);
    for (int t = 0; t < n; ++t) {
      const int context = positions[t] + 1;
      std::vector<int32_t> expected;
      if (context <= top_k) {
        expected.resize(context);
        std::iota(expected.begin(), expected.end(), 0);
      } else {
        std::vector<float> row(scores.begin() + int64_t{t} * stride, scores.begin() + int64_t{t} * stride + context);
        for (float& v : row) v = v == 0.0f ? 0.0f : v;
        ops::top_k(row.data(), context, top_k, expected);
        std::sort(expected.begin(), expected.end());
      }
      ASSERT_EQ(num[t], static_cast<int>(expected.size())) << t << ", " << blocks_per_token << " blocks a token";
      EXPECT_TRUE(std::equal(expected.begin(), expected.end(), selected.begin() + int64_t{t} * top_k))
          << "row " << t << " of " << n << ", " << blocks_per_token << " blocks a token";
    }
  }
}

// `count` seeded positions below `limit`.
std::vector<int32_t> random_positions(int count, uint32_t seed, int limit) {
  std::vector<int32_t> positions;
  std::mt19937 rng(seed);
  for (int t = 0; t < count; ++t) positions.push_back(static_cast<int32_t>(rng() % limit));
  return positions;
}

}  // namespace

TEST_F(CudaIndexer, TopKSelectsTheLargestInPositionOrderWithLowerPositionsWinningTies) {
  // One block a token, or a cluster sharing it: contexts whose scores fit one block's registers
  // (up to 8192) take the cluster's first block alone, longer ones its slices; rows 5 and 2 with ties.
  check_top_k({0, 100, 2047, 2048, 5999, 4000}, 6000, 2048, {5}, {1, 2, 8});
  check_top_k({8191, 8192, 16999, 12000, 2048}, 17000, 2048, {2}, {1, 2, 4, 8});
}

TEST_F(CudaIndexer, TopKOfADecodeBatchPastSixteenTokensMatchesTheCpu) {
  // 40 tokens asking for clusters of 4, which select_top_k runs as one block a token past 16
  // tokens; rows 2 and 39 with ties.
  auto positions = random_positions(40, 7, 17000);
  positions[0] = 2048;
  positions[1] = 16999;
  check_top_k(positions, 17000, 2048, {2, 39}, {4});
}

TEST_F(CudaIndexer, TopKOfAPrefillChunkTakesTheManyTokenKernel) {
  // 600 tokens (a prefill chunk's count: one smaller block a token) at positions up to 6000.
  auto positions = random_positions(600, 5, 6000);
  positions[3] = 2048;
  positions[4] = 5999;
  check_top_k(positions, 6000, 2048, {4, 77, 599}, {4});
  // A top-256 over contexts of up to 2048 (the 256-thread block's keys held in registers).
  auto short_positions = random_positions(520, 11, 2048);
  short_positions[0] = 2047;
  short_positions[1] = 256;
  check_top_k(short_positions, 2048, 256, {0, 300}, {1});
}

TEST_F(CudaIndexer, TopKOfAPrefillChunkOverLongContextsMatchesTheCpu) {
  // Rows of up to 40000 scores: the ordered write over several staged segments, and tied rows
  // whose threshold bin holds more keys than the shared buffer (digits counted over the row).
  auto positions = random_positions(512, 13, 40000);
  positions[0] = 39999;
  positions[1] = 4096;
  positions[2] = 4097;
  check_top_k(positions, 40000, 2048, {0, 5, 200}, {1});
}

namespace {

// Random indexer inputs over paged sequences (keys, queries, head weights; token t of sequence
// tokens[t].seq at tokens[t].position), on the host and the device. The keys are bf16 values,
// or FP8 codes with a scale each (fp8), kept decoded on the host.
struct IndexerProblem {
  int heads, dim, T;
  PagedContext paged;
  std::vector<float> keys, q, w;
  std::vector<int32_t> positions, token_sequence;
  ops::cuda::DeviceBuffer dkeys, dscales, dq, dw, dpos, dseq, dtables;

  IndexerProblem(const std::vector<int>& contexts, uint64_t table_seed, const std::vector<Token>& tokens, int heads_,
                 int dim_, uint64_t seed, bool fp8 = false)
      : heads(heads_), dim(dim_), T(static_cast<int>(tokens.size())), paged(contexts, table_seed) {
    const int64_t slots = int64_t{paged.num_blocks} * paged.block_size;
    keys = random_values(slots * dim, seed);
    if (fp8) {
      std::vector<uint8_t> codes(slots * dim);
      std::vector<float> scales(slots);
      for (int64_t s = 0; s < slots; ++s) {
        quant::encode_index_key_fp8(keys.data() + s * dim, dim, codes.data() + s * dim, &scales[s]);
        quant::decode_index_key_fp8(codes.data() + s * dim, scales[s], dim, keys.data() + s * dim);
      }
      dkeys = to_device(codes), dscales = to_device(scales);
    } else {
      std::vector<uint16_t> keys_bf16;
      for (float& v : keys) keys_bf16.push_back(f32_to_bf16(v)), v = bf16_to_f32(keys_bf16.back());
      dkeys = to_device(keys_bf16);
    }
    q = random_values(int64_t{T} * heads * dim, seed + 1);
    w = random_values(int64_t{T} * heads, seed + 2);
    for (const Token& token : tokens) positions.push_back(token.position), token_sequence.push_back(token.seq);
    dq = to_device(q), dw = to_device(w), dpos = to_device(positions);
    dseq = to_device(token_sequence), dtables = to_device(paged.block_tables);
  }
  cuda::IndexerScoreArgs args(int top_k, int max_context, float* scores, int64_t stride) const {
    cuda::IndexerScoreArgs a;
    a.queries = dq.as<float>();
    a.head_weights = dw.as<float>();
    a.key_cache = dkeys.data();
    a.key_scales = dscales.bytes() > 0 ? dscales.as<float>() : nullptr;
    a.block_tables = dtables.as<int32_t>();
    a.max_blocks = paged.max_blocks;
    a.token_sequence = dseq.as<int32_t>();
    a.positions = dpos.as<int32_t>();
    a.block_size = paged.block_size;
    a.num_tokens = T;
    a.heads = heads;
    a.dim = dim;
    a.top_k = top_k;
    a.head_scale = 1.0f / std::sqrt(float(heads));
    a.softmax_scale = 1.0f / std::sqrt(float(dim));
    a.max_context = max_context;
    a.scores = scores;
    a.score_stride = stride;
    return a;
  }
  // Token t's scores over positions [0, positions[t]] in double: sum_h relu(q_h . k_j * softmax
  // scale) * w_h * head scale. With `fp8_operands` over each query row and bf16 key rounded to
  // E4M3 with a scale of its own (quant::round_index_key_fp8; FP8 keys are so already).
  std::vector<float> reference(int t, bool fp8_operands = false) const {
    const double softmax_scale = 1.0 / std::sqrt(double(dim)), head_scale = 1.0 / std::sqrt(double(heads));
    std::vector<float> expected(positions[t] + 1);
    std::vector<float> query(q.begin() + int64_t{t} * heads * dim, q.begin() + int64_t{t + 1} * heads * dim), rounded;
    if (fp8_operands)
      for (int h = 0; h < heads; ++h) quant::round_index_key_fp8(query.data() + h * dim, dim);
    for (int j = 0; j <= positions[t]; ++j) {
      const float* key = keys.data() + paged.slot(token_sequence[t], j) * dim;
      if (fp8_operands && dscales.bytes() == 0) {
        rounded.assign(key, key + dim);
        quant::round_index_key_fp8(rounded.data(), dim);
        key = rounded.data();
      }
      double score = 0;
      for (int h = 0; h < heads; ++h) {
        double dot = 0;
        for (int k = 0; k < dim; ++k) dot += double(query[h * dim + k]) * key[k];
        score += std::max(dot * softmax_scale, 0.0) * w[int64_t{t} * heads + h] * head_scale;
      }
      expected[j] = static_cast<float>(score);
    }
    return expected;
  }
};

// indexer_scores_wgmma over one sequence's prefill chunk (GLM-5's 32 heads of 128) against a
// double reference: blocks of 8 tokens with a part-filled last one, tokens whose context fits
// top_k left unwritten, and nothing written at or past a token's causal extent; with a small
// top_k the key tiles are split over several blocks of each token group.
// With `fp8_operands` the FP8 indexer, against the reference over the same E4M3 roundings: its
// only other error is the FP8 tensor cores' ~14-bit sums over 128 dims.
void check_indexer_wgmma(int context, int chunk_first, int top_k, bool fp8 = false, bool fp8_operands = false) {
  std::vector<Token> tokens;
  for (int p = chunk_first; p < context; ++p) tokens.push_back({0, p});
  const IndexerProblem problem({context}, 9, tokens, 32, 128, 4, fp8);
  const int T = problem.T, stride = context;
  auto dscores = to_device(std::vector<float>(int64_t{T} * stride, NAN));
  cuda::IndexerScoreArgs a = problem.args(top_k, context, dscores.as<float>(), stride);
  a.first_token = 0;
  a.launch_tokens = T;
  ASSERT_TRUE(cuda::indexer_scores_wgmma_supported(a.heads, a.dim));
  cuda::DeviceBuffer gathered_keys(int64_t{context} * a.dim * sizeof(float));
  cuda::indexer_scores_wgmma(a, problem.dtables.as<int32_t>(), context, {gathered_keys.as<float>(), nullptr, 0},
                             nullptr, fp8_operands);
  const auto scores = to_host<float>(dscores, int64_t{T} * stride);
  int scored = 0;
  for (int t = 0; t < T; ++t) {
    const int causal = problem.positions[t] + 1;
    const float* row = scores.data() + int64_t{t} * stride;
    int written_past = 0;
    for (int j = causal <= top_k ? 0 : causal; j < stride; ++j) written_past += !std::isnan(row[j]);
    EXPECT_EQ(written_past, 0) << "token " << t << (causal <= top_k ? " (selects every position)" : " past its extent");
    if (causal <= top_k) continue;
    ++scored;
    EXPECT_LT(relative_l2(row, problem.reference(t, fp8_operands).data(), causal), fp8_operands ? 2e-3 : 1e-2)
        << "token " << t << " (position " << problem.positions[t] << ")" << (fp8_operands ? ", E4M3 operands" : "");
  }
  EXPECT_GT(scored, 0);
}

// Scores written in `want` (not NaN), and entries where `got` holds other bits (NaN for NaN).
std::pair<int, int> compare_scores(const std::vector<float>& want, const std::vector<float>& got) {
  int scored = 0, differing = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    scored += !std::isnan(want[i]);
    differing += !(want[i] == got[i] || (std::isnan(want[i]) && std::isnan(got[i])));
  }
  return {scored, differing};
}

}  // namespace

TEST_F(CudaIndexer, IndexerWgmmaScoresAChunkLikeTheCpu) {
  check_indexer_wgmma(2100, 2030, 2048);  // 70 tokens: 18 select everything, the rest score 2049..2100 keys
  check_indexer_wgmma(700, 599, 64);      // 101 tokens, 6 key tiles split over blocks
  check_indexer_wgmma(700, 599, 64, /*fp8=*/true);
}

// The FP8 indexer (E4M3 queries and keys): over a bf16 cache (its keys rounded when gathered)
// and an FP8 cache (its codes as they are), the same shapes.
TEST_F(CudaIndexer, IndexerWgmmaWithE4m3OperandsScoresTheRoundedOperands) {
  check_indexer_wgmma(2100, 2030, 2048, false, true);
  check_indexer_wgmma(700, 599, 64, false, true);
  check_indexer_wgmma(700, 599, 64, true, true);
}

// The decode kernel's keys split over no more blocks than the SMs hold at once
// (decode_one_wave): 48 tokens of 2-7k positions make fewer, longer shares than the default's
// four blocks an SM; every score is the same, bit for bit, bf16 and FP8 keys.
TEST_F(CudaIndexer, DecodeScoresInOneWaveAreTheSameScores) {
  for (const bool fp8 : {false, true}) {
    std::vector<Token> tokens;
    for (int i = 0; i < 48; ++i) tokens.push_back({i % 3, 2100 + 300 * (i / 3)});  // up to 6600
    const IndexerProblem problem({9300, 8000, 7000}, 11, tokens, 32, 128, 3, fp8);
    const int T = problem.T, stride = 9300;
    auto default_scores = to_device(std::vector<float>(int64_t{T} * stride, NAN));
    auto one_wave_scores = to_device(std::vector<float>(int64_t{T} * stride, NAN));
    cuda::IndexerScoreArgs a = problem.args(2048, stride, default_scores.as<float>(), stride);
    cuda::indexer_scores_decode_wgmma(a, nullptr);
    a.scores = one_wave_scores.as<float>();
    a.decode_one_wave = true;
    cuda::indexer_scores_decode_wgmma(a, nullptr);
    const auto [scored, differing] = compare_scores(to_host<float>(default_scores, int64_t{T} * stride),
                                                    to_host<float>(one_wave_scores, int64_t{T} * stride));
    EXPECT_GT(scored, T * 2048);
    EXPECT_EQ(differing, 0) << "of " << scored << " scores" << (fp8 ? ", FP8 keys" : "");
  }
}

TEST_F(CudaIndexer, IndexerScoresMatchCpu) {
  for (auto [heads, dim, top_k, fp8] : {std::tuple{32, 128, 2048, false}, {4, 14, 9, false}, {32, 128, 2048, true},
                                        {4, 14, 9, true}}) {
    const std::vector<Token> tokens = {{0, 4999}, {0, 3000}, {1, 39}, {1, 5}};
    const IndexerProblem problem({5000, 40}, 5, tokens, heads, dim, 1, fp8);
    const int T = problem.T, stride = 5000;
    auto dscores = to_device(std::vector<float>(int64_t{T} * stride, NAN));
    const cuda::IndexerScoreArgs a = problem.args(top_k, 5000, dscores.as<float>(), stride);
    cuda::indexer_scores(a, nullptr);
    auto scores = to_host<float>(dscores, int64_t{T} * stride);
    // Four lanes a key (8 heads each where there are 32), into fresh scores.
    auto dscores_split = to_device(std::vector<float>(int64_t{T} * stride, NAN));
    cuda::IndexerScoreArgs split = a;
    split.threads_per_key = 4;
    split.scores = dscores_split.as<float>();
    cuda::indexer_scores(split, nullptr);
    const auto scores_split = to_host<float>(dscores_split, int64_t{T} * stride);
    // The GEMM path for sequence 0's two tokens (a prefill chunk of it), into fresh scores.
    auto dscores_gemm = to_device(std::vector<float>(int64_t{T} * stride, NAN));
    cuda::DeviceBuffer gathered_keys(5000 * dim * sizeof(float)), head_scores(2 * heads * 5000 * sizeof(float));
    cuda::IndexerGemmWorkspace workspace{gathered_keys.as<float>(), head_scores.as<float>(), int64_t{heads} * 5000};  // one token a chunk
    cuda::IndexerScoreArgs chunk = a;
    chunk.scores = dscores_gemm.as<float>();
    chunk.first_token = 0;
    chunk.launch_tokens = 2;
    cuda::Gemm gemm;
    cuda::indexer_scores_gemm(chunk, problem.dtables.as<int32_t>(), 5000, workspace, gemm, nullptr);
    const auto scores_gemm = to_host<float>(dscores_gemm, int64_t{T} * stride);
    // The tensor-core decode kernel (GLM-5's 32 heads of 128), into fresh scores: bf16 queries.
    std::vector<float> scores_wgmma;
    if (cuda::indexer_scores_decode_wgmma_supported(heads, dim)) {
      auto dscores_wgmma = to_device(std::vector<float>(int64_t{T} * stride, NAN));
      cuda::IndexerScoreArgs decode = a;
      decode.scores = dscores_wgmma.as<float>();
      cuda::indexer_scores_decode_wgmma(decode, nullptr);
      scores_wgmma = to_host<float>(dscores_wgmma, int64_t{T} * stride);
      for (int t = 0; t < T; ++t) {
        const int context = problem.positions[t] + 1;
        int written_past = 0;
        for (int j = context <= top_k ? 0 : context; j < stride; ++j) written_past += !std::isnan(scores_wgmma[int64_t{t} * stride + j]);
        EXPECT_EQ(written_past, 0) << "token " << t << (fp8 ? ", FP8 keys" : "");
      }
      // The kernel rotating fresh queries itself (64 rope values a head) gives the bits of
      // rope_rows followed by the kernel: what the model's decode step relies on.
      std::mt19937 rng(77);
      std::normal_distribution<float> normal;
      std::vector<float> fresh(int64_t{T} * heads * dim), inv_freq(32);
      for (float& v : fresh) v = normal(rng);
      for (int i = 0; i < 32; ++i) inv_freq[i] = std::pow(10000.0f, -static_cast<float>(i) / 32.0f);
      auto dplain = to_device(fresh), drotated = to_device(fresh), dinv = to_device(inv_freq);
      cuda::rope_rows(drotated.as<float>(), T, heads, dim, 0, 64, a.positions, dinv.as<float>(), nullptr);
      auto rotated_scores = to_device(std::vector<float>(int64_t{T} * stride, NAN));
      auto fused_scores = to_device(std::vector<float>(int64_t{T} * stride, NAN));
      cuda::IndexerScoreArgs rotated = a;
      rotated.queries = drotated.as<float>();
      rotated.scores = rotated_scores.as<float>();
      cuda::indexer_scores_decode_wgmma(rotated, nullptr);
      cuda::IndexerScoreArgs fused = a;
      fused.queries = dplain.as<float>();
      fused.scores = fused_scores.as<float>();
      fused.rope_inv_freq = dinv.as<float>();
      fused.rope_dim = 64;
      cuda::indexer_scores_decode_wgmma(fused, nullptr);
      const auto [scored, differing] = compare_scores(to_host<float>(rotated_scores, int64_t{T} * stride),
                                                      to_host<float>(fused_scores, int64_t{T} * stride));
      EXPECT_GT(scored, 0);
      EXPECT_EQ(differing, 0) << "of " << scored << " scores, the queries rotated in the kernel"
                              << (fp8 ? ", FP8 keys" : "");
    }
    for (int t = 0; t < T; ++t) {
      const int context = problem.positions[t] + 1;
      if (context <= top_k) continue;  // not scored: such tokens select every position
      if (!scores_wgmma.empty()) {
        EXPECT_LT(relative_l2(scores_wgmma.data() + int64_t{t} * stride, problem.reference(t).data(), context), 1e-2)
            << "token " << t << ", tensor-core decode kernel" << (fp8 ? ", FP8 keys" : "");
      }
      const std::vector<float> expected = problem.reference(t);
      EXPECT_LT(relative_l2(scores.data() + int64_t{t} * stride, expected.data(), context), 1e-5)
          << heads << " heads, token " << t;
      EXPECT_LT(relative_l2(scores_split.data() + int64_t{t} * stride, expected.data(), context), 1e-5)
          << heads << " heads, token " << t << ", 4 lanes a key";
      if (t < 2) {  // TF32 products: 10-bit mantissas
        EXPECT_LT(relative_l2(scores_gemm.data() + int64_t{t} * stride, expected.data(), context), 5e-3)
            << heads << " heads, token " << t << ", GEMM path";
      }
    }
  }
}
