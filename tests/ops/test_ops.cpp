// CPU ops against float64 references on random data, and the batch invariance of linear().
#include <gtest/gtest.h>

#include <limits>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "ops/cuda/moe_tiles.h"
#include "ops/cuda/moe_token_order.h"
#include "ops/ops.h"
#include "ops/sampling_exp.h"
#include "quant/formats.h"
#include "support/numerics.h"

using namespace glms;
using glms::testing::random_values;
using glms::testing::relative_l2;

namespace {

std::vector<uint16_t> to_bf16(const std::vector<float>& values) {
  std::vector<uint16_t> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) out[i] = f32_to_bf16(values[i]);
  return out;
}

}  // namespace

TEST(Linear, MatchesFloat64ReferenceOnOddShapes) {
  for (auto [n, rows, cols] : {std::tuple{1, 7, 5}, {3, 33, 17}, {9, 40, 64}, {17, 5, 129}}) {
    const auto x = random_values(n * cols, 1 + n);
    const auto w16 = to_bf16(random_values(rows * cols, 2 + rows));
    ops::WeightView w{DType::BF16, w16.data(), rows, cols, cols};
    std::vector<float> y(n * rows, NAN);
    ops::linear(x.data(), n, w, y.data());
    for (int i = 0; i < n; ++i)
      for (int r = 0; r < rows; ++r) {
        double ref = 0.0;
        for (int k = 0; k < cols; ++k) ref += double(x[i * cols + k]) * bf16_to_f32(w16[r * cols + k]);
        EXPECT_NEAR(y[i * rows + r], ref, 1e-4 * (1.0 + std::fabs(ref))) << n << "x" << rows << "x" << cols;
      }
  }
}

TEST(Linear, ATokensResultDoesNotDependOnItsBatch) {
  const int rows = 37, cols = 70;
  const auto w32 = random_values(rows * cols, 5);
  ops::WeightView w{DType::F32, w32.data(), rows, cols, cols};
  const auto x = random_values(11 * cols, 6);
  std::vector<float> all(11 * rows);
  ops::linear(x.data(), 11, w, all.data());
  for (int start = 0; start < 11; ++start)
    for (int n = 1; start + n <= 11; n += 3) {
      std::vector<float> part(n * rows);
      ops::linear(x.data() + start * cols, n, w, part.data());
      EXPECT_EQ(0, std::memcmp(part.data(), all.data() + start * rows, part.size() * sizeof(float)))
          << "tokens " << start << ".." << start + n;
    }
}

TEST(Linear, StridedInputsAndOutputs) {
  const int n = 5, rows = 6, cols = 16, x_stride = 20, y_stride = 9;
  const auto w32 = random_values(rows * cols, 7);
  const auto x = random_values(n * x_stride, 8);
  ops::WeightView w{DType::F32, w32.data(), rows, cols, cols};
  std::vector<float> y(n * y_stride, -7.0f);
  ops::linear(x.data(), n, w, y.data(), x_stride, y_stride);
  for (int i = 0; i < n; ++i) {
    for (int r = 0; r < rows; ++r) {
      double ref = 0.0;
      for (int k = 0; k < cols; ++k) ref += double(x[i * x_stride + k]) * w32[r * cols + k];
      EXPECT_NEAR(y[i * y_stride + r], ref, 1e-4);
    }
    for (int r = rows; r < y_stride; ++r) EXPECT_EQ(y[i * y_stride + r], -7.0f) << "wrote past the row";
  }
}

TEST(Linear, TransposedWeight) {
  const int n = 3, rows = 9, cols = 13;
  const auto w32 = random_values(rows * cols, 9);
  const auto x = random_values(n * rows, 10);
  ops::WeightView w{DType::F32, w32.data(), rows, cols, cols};
  std::vector<float> y(n * cols);
  ops::linear_transposed(x.data(), n, w, y.data());
  for (int i = 0; i < n; ++i)
    for (int c = 0; c < cols; ++c) {
      double ref = 0.0;
      for (int r = 0; r < rows; ++r) ref += double(x[i * rows + r]) * w32[r * cols + c];
      EXPECT_NEAR(y[i * cols + c], ref, 1e-4);
    }
}

TEST(Norms, RmsAndLayerNorm) {
  const int n = 4, dim = 23;
  const auto x = random_values(n * dim, 11, 3.0f);
  const auto weight = random_values(dim, 12);
  const auto bias = random_values(dim, 13);
  std::vector<float> rms(n * dim), ln(n * dim);
  ops::rms_norm(x.data(), n, dim, weight.data(), 1e-5f, rms.data());
  ops::layer_norm(x.data(), n, dim, weight.data(), bias.data(), 1e-6f, ln.data());
  for (int i = 0; i < n; ++i) {
    double sq = 0.0, mean = 0.0, var = 0.0;
    for (int k = 0; k < dim; ++k) { sq += double(x[i * dim + k]) * x[i * dim + k]; mean += x[i * dim + k]; }
    mean /= dim;
    for (int k = 0; k < dim; ++k) var += (x[i * dim + k] - mean) * (x[i * dim + k] - mean);
    var /= dim;
    for (int k = 0; k < dim; ++k) {
      EXPECT_NEAR(rms[i * dim + k], weight[k] * x[i * dim + k] / std::sqrt(sq / dim + 1e-5), 1e-5);
      EXPECT_NEAR(ln[i * dim + k], (x[i * dim + k] - mean) / std::sqrt(var + 1e-6) * weight[k] + bias[k], 1e-5);
    }
  }
}

TEST(Rope, InterleavedPairsRotateByPositionTimesFrequency) {
  ops::RopeTable table;
  table.rope_dim = 8;
  for (int i = 0; i < 4; ++i) table.inv_freq.push_back(1.0f / std::pow(10000.0f, 2.0f * i / 8.0f));
  float cos[4], sin[4];
  table.angles(37, cos, sin);
  auto x = random_values(8, 14);
  const auto original = x;
  ops::rope_interleaved(x.data(), 8, cos, sin);
  for (int i = 0; i < 4; ++i) {
    const double angle = 37.0 * table.inv_freq[i];
    EXPECT_NEAR(x[2 * i], original[2 * i] * std::cos(angle) - original[2 * i + 1] * std::sin(angle), 1e-5);
    EXPECT_NEAR(x[2 * i + 1], original[2 * i + 1] * std::cos(angle) + original[2 * i] * std::sin(angle), 1e-5);
  }
}

TEST(TopK, OrderedByValueThenIndex) {
  const float scores[] = {0.5f, 2.0f, -1.0f, 2.0f, 0.7f, 3.0f};
  std::vector<int32_t> chosen;
  ops::top_k(scores, 6, 4, chosen);
  EXPECT_EQ(chosen, (std::vector<int32_t>{5, 1, 3, 4}));
  ops::top_k(scores, 6, 10, chosen);
  EXPECT_EQ(chosen.size(), 6u);
}

TEST(QuantisedWeights, RowsAndSlicesDequantiseLikeTheWholeMatrix) {
  const int64_t rows = 300, cols = 256;
  const auto values = random_values(rows * cols, 21, 0.05f);
  std::vector<uint8_t> fp8(rows * cols), packed(rows * cols / 2), e8m0(rows * cols / 32);
  std::vector<float> scale_inv(3 * 2);
  quant::quantize_fp8_block(values.data(), rows, cols, fp8.data(), scale_inv.data());
  for (int64_t r = 0; r < rows; ++r)
    quant::quantize_mxfp4(values.data() + r * cols, cols, packed.data() + r * cols / 2, e8m0.data() + r * cols / 32);
  const ops::WeightView fp8_view{DType::F8_E4M3, fp8.data(), rows, cols, cols, ops::WeightFormat::Fp8Block,
                                 scale_inv.data(), 0};
  const ops::WeightView mx_view{DType::U8, packed.data(), rows, cols, cols / 2, ops::WeightFormat::Mxfp4, e8m0.data(), 0};
  for (const ops::WeightView& whole : {fp8_view, mx_view}) {
    const ops::WeightView slice = whole.slice_rows(130, 140).slice_rows(7, 100);  // rows 137..236 of the matrix
    std::vector<float> expected(cols), got(cols);
    for (int64_t r = 0; r < 100; ++r) {
      whole.row_to_f32(137 + r, expected.data());
      slice.row_to_f32(r, got.data());
      ASSERT_EQ(expected, got) << "row " << r;
    }
    EXPECT_LT(glms::testing::relative_l2(expected.data(), values.data() + 236 * cols, cols), 0.2);
  }
}

// Tensor-parallel shards take column blocks (o_proj, down projections): a column slice of a
// row-and-column slice dequantises to the same values as those columns of the whole row; slices
// that would cut a scale block are refused.
TEST(QuantisedWeights, ColumnSlicesDequantiseLikeThoseColumnsOfTheWholeMatrix) {
  const int64_t rows = 300, cols = 512;
  const auto values = random_values(rows * cols, 22, 0.05f);
  std::vector<uint8_t> fp8(rows * cols), packed(rows * cols / 2), e8m0(rows * cols / 32);
  std::vector<float> scale_inv(3 * 4);
  quant::quantize_fp8_block(values.data(), rows, cols, fp8.data(), scale_inv.data());
  for (int64_t r = 0; r < rows; ++r)
    quant::quantize_mxfp4(values.data() + r * cols, cols, packed.data() + r * cols / 2, e8m0.data() + r * cols / 32);
  std::vector<uint16_t> bf16(rows * cols);
  for (size_t i = 0; i < bf16.size(); ++i) bf16[i] = f32_to_bf16(values[i]);
  const ops::WeightView fp8_view{DType::F8_E4M3, fp8.data(), rows, cols, cols, ops::WeightFormat::Fp8Block,
                                 scale_inv.data(), 0};
  const ops::WeightView mx_view{DType::U8, packed.data(), rows, cols, cols / 2, ops::WeightFormat::Mxfp4, e8m0.data(), 0};
  const ops::WeightView plain_view{DType::BF16, bf16.data(), rows, cols, cols};
  for (const ops::WeightView& whole : {fp8_view, mx_view, plain_view}) {
    // Columns 128..383, then 128 of those (256..383 of the matrix), of rows 137..236.
    const ops::WeightView slice = whole.slice_rows(130, 140).slice_columns(128, 256).slice_rows(7, 100).slice_columns(128, 128);
    ASSERT_EQ(slice.cols, 128);
    std::vector<float> row(cols), got(128);
    for (int64_t r = 0; r < 100; ++r) {
      whole.row_to_f32(137 + r, row.data());
      slice.row_to_f32(r, got.data());
      ASSERT_TRUE(std::equal(got.begin(), got.end(), row.begin() + 256)) << "row " << r;
    }
    std::vector<float> y(2), x(128, 1.0f);
    ops::linear(x.data(), 1, slice.slice_rows(0, 2), y.data());  // the linear reads the slice too
    slice.row_to_f32(0, got.data());
    float sum = 0.0f;
    for (float v : got) sum += v;
    EXPECT_NEAR(y[0], sum, 1e-4f);
  }
  EXPECT_THROW(fp8_view.slice_columns(64, 128), Error);   // cuts a 128-column scale block
  EXPECT_THROW(mx_view.slice_columns(16, 32), Error);     // cuts a 32-column one
  EXPECT_NO_THROW(mx_view.slice_columns(32, 64));
  EXPECT_NO_THROW(plain_view.slice_columns(3, 5));
}

// sample_row's draw: the first kept token in id order whose cumulative weight reaches canonical x
// the kept total (the rule ops::cuda::sample_rows follows too). Weights 8, 4, 2, 1, 1 at
// temperature 1; top_k 3 keeps ids 0..2 (total 14).
TEST(Sampling, TheCanonicalDrawWalksTheKeptTokensInIdOrder) {
  const std::vector<float> logits = {std::log(8.0f), std::log(4.0f), std::log(2.0f), 0.0f, 0.0f};
  ops::SamplingFilter all;
  EXPECT_EQ(ops::sample_row(logits.data(), 5, all, 0.0), 0);
  EXPECT_EQ(ops::sample_row(logits.data(), 5, all, 7.9 / 16), 0);
  EXPECT_EQ(ops::sample_row(logits.data(), 5, all, 8.1 / 16), 1);
  EXPECT_EQ(ops::sample_row(logits.data(), 5, all, 14.5 / 16), 3);
  EXPECT_EQ(ops::sample_row(logits.data(), 5, all, 15.5 / 16), 4);
  EXPECT_EQ(ops::sample_row(logits.data(), 5, all, 0.999999), 4);
  ops::SamplingFilter top_k;
  top_k.top_k = 3;
  EXPECT_EQ(ops::sample_row(logits.data(), 5, top_k, 12.5 / 14), 2);
  EXPECT_EQ(ops::sample_row(logits.data(), 5, top_k, 0.999999), 2);
  // A kept set found by sorting (top_k, then top_p 0.7 of the three: ids 0 and 1) is still
  // walked in id order.
  const std::vector<float> reversed = {0.0f, 0.0f, std::log(2.0f), std::log(4.0f), std::log(8.0f)};
  ops::SamplingFilter both = top_k;
  both.top_p = 0.7f;
  EXPECT_EQ(ops::sample_row(reversed.data(), 5, both, 0.1), 3);
  EXPECT_EQ(ops::sample_row(reversed.data(), 5, both, 0.5), 4);
  std::vector<float> probs(5);
  ops::sampling_probabilities(reversed.data(), 5, both, probs.data());
  EXPECT_NEAR(probs[3], 4.0 / 12, 1e-6);
  EXPECT_NEAR(probs[4], 8.0 / 12, 1e-6);
  EXPECT_EQ(probs[0] + probs[1] + probs[2], 0.0f);
}

// Logits masked to -infinity (min_tokens, structured outputs) are never drawn, whatever the
// filters: the top-p buckets over a large vocabulary span the finite logits only.
TEST(Sampling, MaskedTokensAreNeverDrawn) {
  const int vocab = 5000;  // past the sorted top-p path's size: the bucketed one
  std::vector<float> logits(vocab, -std::numeric_limits<float>::infinity());
  const std::vector<int32_t> open = {7, 1234, 4999};
  for (size_t i = 0; i < open.size(); ++i) logits[open[i]] = static_cast<float>(i);
  for (const auto& [top_p, top_k] : {std::pair<float, int>{1.0f, 0}, {0.95f, 0}, {0.5f, 40}, {0.95f, 2}}) {
    ops::SamplingFilter filter;
    filter.top_p = top_p;
    filter.top_k = top_k;
    for (double u : {0.0, 0.1, 0.5, 0.9, 0.999999}) {
      const int32_t t = ops::sample_row(logits.data(), vocab, filter, u);
      EXPECT_NE(std::find(open.begin(), open.end(), t), open.end()) << top_p << " " << top_k << " " << u << ": " << t;
    }
  }
}

// The sampler's exponential (the same float operations on the host and the device) against
// the double-precision exp: about 1e-7 relative down to the subnormals, 1 at 0, 0 past -104.
TEST(Sampling, SamplingExpIsAccurateAndExactAtZero) {
  EXPECT_EQ(ops::sampling_exp(0.0f), 1.0f);
  EXPECT_EQ(ops::sampling_exp(-105.0f), 0.0f);
  EXPECT_EQ(ops::sampling_exp(std::nanf("")), 0.0f);
  double worst = 0.0;
  for (float x = -87.0f; x <= 0.0f; x += 0.000731f) {
    const double want = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::abs(ops::sampling_exp(x) - want) / want);
  }
  EXPECT_LT(worst, 3e-7);
  for (float x = -103.0f; x < -87.0f; x += 0.01f) {  // subnormal results: within one subnormal step
    const double want = std::exp(static_cast<double>(x));
    EXPECT_NEAR(ops::sampling_exp(x), want, 1.5e-45) << x;
  }
  std::printf("sampling_exp: worst relative error %.2e over [-87, 0]\n", worst);
}

// The wgmma expert kernels' staged token order (ops/cuda/moe_token_order.h): the staging
// kernel's words (staged_source_pair) and the gate/up kernel's value stores (staged_position)
// put every value of a row in the same place, once, inside its own 32-value block; the order the
// fragments' comment states (position 16 h + 8 i + 2 t + e holds value 8 t + 4 h + 2 i + e).
TEST(MoeTokenOrder, StagedWordsAndValuePositionsAgree) {
  namespace cuda = glms::ops::cuda;
  for (int64_t block = 0; block < 3; ++block) {
    std::vector<int> placed(32, 0);
    for (int w = 0; w < 32; ++w) {
      const int64_t v = 32 * block + w, position = cuda::staged_position(v);
      ASSERT_EQ(position / 32, block) << v;
      const int in_block = static_cast<int>(position % 32);
      ++placed[in_block];
      // The staged word holding that position, and the half of its bf16 pair.
      const int q = in_block / 2, e = in_block % 2;
      EXPECT_EQ(2 * cuda::staged_source_pair(q) + e, w) << "value " << v;
    }
    for (int p = 0; p < 32; ++p) EXPECT_EQ(placed[p], 1) << "position " << p;
  }
  for (int t = 0; t < 4; ++t)
    for (int h = 0; h < 2; ++h)
      for (int i = 0; i < 2; ++i)
        for (int e = 0; e < 2; ++e) EXPECT_EQ(cuda::staged_position(8 * t + 4 * h + 2 * i + e), 16 * h + 8 * i + 2 * t + e);
}

// The row tiles the grouped expert GEMMs' launches take (ops/cuda/moe_tiles.h, shared with the
// kernels): every tile once, or in the clusters' units every tile's weight lines once (a pair's
// two tiles whole, an odd last tile as two halves), a pair's first tile full; and no launch has
// more units than the grid its host sizes.
TEST(MoeTiles, PairsAndSplitLastTilesCoverEveryTileOnce) {
  namespace tiles = glms::ops::cuda::moe_tiles;
  using tiles::TileSet;
  std::mt19937 rng(5);
  for (int trial = 0; trial < 300; ++trial) {
    const int rows = trial % 2 ? 128 : 64, experts = 1 + static_cast<int>(rng() % 300);
    const int most = trial % 3 == 0 ? 5 * rows : 2 * rows + 1;  // some experts without pairs
    std::vector<int> pairs(experts);
    int64_t total = 0;
    for (int& p : pairs) total += p = static_cast<int>(rng() % (most + 1));
    int64_t units[2] = {0, 0};
    for (int e = 0; e < experts; ++e) {
      const int count = tiles::tiles_of(pairs[e], rows);
      ASSERT_EQ(count, (pairs[e] + rows - 1) / rows);
      std::vector<int> every(count, 0), halves(count, 0);  // halves: of the tile's weight lines
      for (const TileSet set : {TileSet::kEvery, TileSet::kPairs}) {
        const int n = tiles::units_of(set, count);
        units[static_cast<int>(set)] += n;
        for (int i = 0; i < n; ++i) {
          const bool split = tiles::splits_lines(set, count, i);
          if (set == TileSet::kEvery) {
            EXPECT_FALSE(split);
          }
          for (int rank = 0; rank < (set == TileSet::kPairs ? 2 : 1); ++rank) {
            const int tile = tiles::tile_of(set, count, i, rank);
            ASSERT_GE(tile, 0);
            ASSERT_LT(tile, count) << "expert " << e << " with " << pairs[e] << " pairs";
            if (set == TileSet::kPairs && rank == 0 && !split) {
              EXPECT_LE((tile + 1) * rows, pairs[e]) << "a pair's first tile is full";
            }
            if (set == TileSet::kEvery) ++every[tile];
            else halves[tile] += split ? 1 : 2;
          }
        }
      }
      for (int t = 0; t < count; ++t) {
        EXPECT_EQ(every[t], 1) << "tile " << t << " of expert " << e;
        EXPECT_EQ(halves[t], 2) << "tile " << t << " of expert " << e << " in the clusters' units";
      }
    }
    for (const TileSet set : {TileSet::kEvery, TileSet::kPairs})
      EXPECT_LE(units[static_cast<int>(set)], tiles::units_bound(set, total, experts, rows))
          << "set " << static_cast<int>(set) << ", " << experts << " experts, " << total << " pairs";
  }
  // 300 pairs in 128-row tiles: tiles 0 and 1 as a pair, tile 2 (44 rows) split by lines.
  EXPECT_EQ(tiles::units_of(TileSet::kPairs, 3), 2);
  EXPECT_EQ(tiles::tile_of(TileSet::kPairs, 3, 0, 1), 1);
  EXPECT_FALSE(tiles::splits_lines(TileSet::kPairs, 3, 0));
  EXPECT_TRUE(tiles::splits_lines(TileSet::kPairs, 3, 1));
  EXPECT_EQ(tiles::tile_of(TileSet::kPairs, 3, 1, 0), 2);
  EXPECT_EQ(tiles::tile_of(TileSet::kPairs, 3, 1, 1), 2);
}
