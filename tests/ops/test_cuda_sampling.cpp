// CUDA greedy and sampled token choice and the structured-output token masks against the host's
// choice on random logits rows at GLM's vocabulary. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "ops/cuda/cuda_ops.h"
#include "ops/ops.h"
#include "support/cuda_buffers.h"
#include "support/numerics.h"

using namespace glms;
using glms::testing::random_values;
using glms::testing::to_device;
using glms::testing::to_host;
namespace cuda = glms::ops::cuda;

namespace {

class CudaSampling : public glms::testing::CudaTest {};

}  // namespace

// Greedy decoding's token per logits row on the device, as ops::argmax picks it on the host:
// random rows of GLM's vocabulary, ties (the lowest index wins), NaNs (never chosen), a row of
// -inf (index 0) and a short row.
TEST_F(CudaSampling, ArgmaxRowsMatchesHostArgmax) {
  const int64_t vocab = 154880;
  const int rows = 6;
  auto x = random_values(rows * vocab, 11, 4.0f);
  x[1 * vocab + 100] = x[1 * vocab + 90000] = 50.0f;  // tie: 100 wins
  x[2 * vocab + 7] = std::nanf("");
  x[2 * vocab + 8] = 60.0f;
  x[2 * vocab + 9] = std::nanf("");
  std::fill(x.begin() + 3 * vocab, x.begin() + 4 * vocab, -INFINITY);
  x[4 * vocab + vocab - 1] = 99.0f;  // the last column
  auto dx = to_device(x);
  cuda::DeviceBuffer out(rows * sizeof(int32_t));
  cuda::argmax_rows(dx.as<float>(), rows, vocab, out.as<int32_t>(), nullptr);
  const auto got = to_host<int32_t>(out, rows);
  for (int r = 0; r < rows; ++r) EXPECT_EQ(got[r], ops::argmax(x.data() + r * vocab, vocab)) << "row " << r;
  EXPECT_EQ(got[1], 100);
  EXPECT_EQ(got[2], 8);
  EXPECT_EQ(got[3], 0);
  EXPECT_EQ(got[4], vocab - 1);

  const std::vector<float> short_row = {1.0f, 3.0f, 3.0f};
  auto dshort = to_device(short_row);
  cuda::argmax_rows(dshort.as<float>(), 1, 3, out.as<int32_t>(), nullptr);
  EXPECT_EQ(to_host<int32_t>(out, 1)[0], 1);
}

// Sampling on the device against ops::sample_row, row by row with the same uniform draw, over
// GLM's vocabulary and an odd small one: temperature alone, top_k (ties at its boundary), top_p
// peaked and nearly flat, min_p, combinations, and draws at 0 and just under 1.
TEST_F(CudaSampling, SampleRowsMatchesTheHostSampler) {
  struct Case {
    float temperature;
    int top_k;
    float top_p;
    float min_p;
  };
  const std::vector<Case> cases = {{1.0f, 0, 1.0f, 0.0f},   {0.7f, 0, 1.0f, 0.0f},    {0.8f, 50, 1.0f, 0.0f},
                                   {1.0f, 0, 0.9f, 0.0f},   {40.0f, 0, 0.95f, 0.0f},  {0.8f, 20, 0.8f, 0.0f},
                                   {1.0f, 5000, 0.9f, 0.0f}, {1.3f, 0, 0.999f, 0.01f}, {1.0f, 0, 1.0f, 0.2f},
                                   {0.5f, 1, 1.0f, 0.0f},   {2.0f, 3, 0.5f, 0.1f}};
  for (const int vocab : {154880, 37}) {
    const int draws = 6;
    const int rows = static_cast<int>(cases.size()) * draws;
    std::mt19937 rng(vocab);
    std::normal_distribution<float> normal(0.0f, 2.0f);
    std::uniform_real_distribution<double> uniform(0.0, 1.0);
    std::vector<float> logits(static_cast<size_t>(rows) * vocab);
    std::vector<cuda::RowSampling> params(rows);
    for (int r = 0; r < rows; ++r) {
      float* row = logits.data() + static_cast<int64_t>(r) * vocab;
      for (int i = 0; i < vocab; ++i) row[i] = normal(rng);
      if (r % 3 == 1)  // coarse logits: many equal values, at top_k's and top_p's boundaries too
        for (int i = 0; i < vocab; ++i) row[i] = std::round(row[i] * 2.0f) / 2.0f;
      const Case& c = cases[r / draws];
      params[r] = {c.temperature, std::min(c.top_k, vocab - 1), c.top_p, c.min_p,
                   r % draws == 0 ? 0.0 : r % draws == 1 ? 0.9999999 : uniform(rng)};
    }
    auto dlogits = to_device(logits), dparams = to_device(params);
    std::vector<int32_t> expected(rows);
    for (int r = 0; r < rows; ++r) {
      const cuda::RowSampling& p = params[r];
      const ops::SamplingFilter filter{p.temperature, p.top_k, p.top_p, p.min_p};
      expected[r] = ops::sample_row(logits.data() + static_cast<int64_t>(r) * vocab, vocab, filter, p.canonical);
    }
    for (const int blocks_per_row : {1, 2, 8}) {  // one block a row, or a cluster sharing it
      cuda::DeviceBuffer dout(rows * sizeof(int32_t));
      cuda::sample_rows(dlogits.as<float>(), rows, vocab, nullptr, dparams.as<cuda::RowSampling>(), dout.as<int32_t>(),
                        nullptr, blocks_per_row);
      const auto got = to_host<int32_t>(dout, rows);
      for (int r = 0; r < rows; ++r) {
        const cuda::RowSampling& p = params[r];
        EXPECT_EQ(got[r], expected[r]) << "vocab " << vocab << " row " << r << ", " << blocks_per_row
                                       << " blocks a row: temperature " << p.temperature << " top_k " << p.top_k
                                       << " top_p " << p.top_p << " min_p " << p.min_p << " canonical " << p.canonical;
      }
    }
  }
}

namespace {

// `rows` random masks of `vocab` tokens ([rows, (vocab + 31) / 32] words, bits past vocab clear):
// about `density` of the tokens allowed, except that row 0 allows exactly one token (the last
// id, in the partial last word) and row 1 none.
std::vector<uint32_t> random_masks(int rows, int64_t vocab, double density, uint64_t seed) {
  const int64_t words = (vocab + 31) / 32;
  std::mt19937_64 rng(seed);
  std::bernoulli_distribution allowed(density);
  std::vector<uint32_t> masks(static_cast<size_t>(rows * words), 0u);
  for (int m = 2; m < rows; ++m)
    for (int64_t t = 0; t < vocab; ++t)
      if (allowed(rng)) masks[m * words + t / 32] |= uint32_t{1} << (t % 32);
  masks[(vocab - 1) / 32] |= uint32_t{1} << ((vocab - 1) % 32);
  return masks;
}

bool allowed_bit(const std::vector<uint32_t>& masks, int64_t words, int m, int64_t t) {
  return (masks[m * words + t / 32] >> (t % 32)) & 1u;
}

}  // namespace

// Structured-output masks on the device: masked rows get -inf exactly where their bit is clear,
// every other value (allowed logits, unmasked rows) stays bit for bit, over GLM's vocabulary and
// odd ones (not multiples of 32), a row with one allowed token and one with none, rows picked
// through indices in any order.
TEST_F(CudaSampling, TokenMasksSetExactlyTheRefusedLogitsToMinusInfinity) {
  for (const int64_t vocab : {int64_t{154880}, int64_t{8191}, int64_t{37}, int64_t{32}, int64_t{1}}) {
    SCOPED_TRACE("vocab " + std::to_string(vocab));
    const int rows = 7;
    const int64_t words = (vocab + 31) / 32;
    const std::vector<int32_t> row_of = {5, 0, 3, 6, 1};  // rows 2 and 4 are not masked
    const int masked = static_cast<int>(row_of.size());
    const auto logits = random_values(rows * vocab, 31 + vocab, 3.0f);
    const auto masks = random_masks(masked, vocab, 0.3, 7 + vocab);
    auto dlogits = to_device(logits);
    auto drows = to_device(row_of);
    auto dmasks = to_device(masks);
    cuda::apply_token_masks(dlogits.as<float>(), vocab, drows.as<int32_t>(), dmasks.as<uint32_t>(), masked, nullptr);
    const auto got = to_host<float>(dlogits, logits.size());
    std::vector<int> mask_of(rows, -1);
    for (int m = 0; m < masked; ++m) mask_of[row_of[m]] = m;
    int64_t refused = 0, wrong = 0;
    for (int r = 0; r < rows; ++r)
      for (int64_t t = 0; t < vocab; ++t) {
        const size_t i = static_cast<size_t>(r * vocab + t);
        const bool keep = mask_of[r] < 0 || allowed_bit(masks, words, mask_of[r], t);
        if (!keep) ++refused;
        const bool ok = keep ? std::memcmp(&got[i], &logits[i], sizeof(float)) == 0 : got[i] == -INFINITY;
        if (!ok && ++wrong <= 5) ADD_FAILURE() << "row " << r << " token " << t << ": " << got[i];
      }
    EXPECT_EQ(wrong, 0);
    EXPECT_GT(refused, 0);
    // The one-token row argmaxes to its token, on the device as on the host.
    cuda::DeviceBuffer out(rows * sizeof(int32_t));
    cuda::argmax_rows(dlogits.as<float>(), rows, vocab, out.as<int32_t>(), nullptr);
    EXPECT_EQ(to_host<int32_t>(out, rows)[row_of[0]], vocab - 1);
  }
  // Without row indices, mask m is row m.
  const int64_t vocab = 100;
  const auto logits = random_values(3 * vocab, 5, 1.0f);
  const auto masks = random_masks(3, vocab, 0.5, 9);
  auto dlogits = to_device(logits);
  auto dmasks = to_device(masks);
  cuda::apply_token_masks(dlogits.as<float>(), vocab, nullptr, dmasks.as<uint32_t>(), 3, nullptr);
  const auto got = to_host<float>(dlogits, logits.size());
  for (int r = 0; r < 3; ++r)
    for (int64_t t = 0; t < vocab; ++t)
      EXPECT_EQ(got[r * vocab + t], allowed_bit(masks, 4, r, t) ? logits[r * vocab + t] : -INFINITY) << r << " " << t;
}

// Draws from masked rows on the device are the host sampler's draws from the same masked rows
// (-inf logits are never drawn, and the filters see only the allowed tokens).
TEST_F(CudaSampling, SampleRowsDrawLikeTheHostFromMaskedRows) {
  const int64_t vocab = 154880;
  const int rows = 6;
  auto logits = random_values(rows * vocab, 77, 2.0f);
  std::vector<uint32_t> masks = random_masks(rows, vocab, 0.02, 78);
  masks[(vocab + 31) / 32 + 5] |= 1u;  // row 1 allows token 160 only (it had none)
  auto dlogits = to_device(logits);
  auto dmasks = to_device(masks);
  cuda::apply_token_masks(dlogits.as<float>(), vocab, nullptr, dmasks.as<uint32_t>(), rows, nullptr);
  const auto masked = to_host<float>(dlogits, logits.size());
  const std::vector<cuda::RowSampling> params = {{1.0f, 0, 1.0f, 0.0f, 0.5},   {0.8f, 0, 0.9f, 0.0f, 0.7},
                                                 {0.7f, 40, 1.0f, 0.0f, 0.3},  {1.0f, 0, 0.95f, 0.05f, 0.999},
                                                 {1.2f, 5, 0.8f, 0.0f, 0.01}, {0.9f, 0, 1.0f, 0.1f, 0.42}};
  auto dparams = to_device(params);
  cuda::DeviceBuffer dout(rows * sizeof(int32_t));
  cuda::sample_rows(dlogits.as<float>(), rows, vocab, nullptr, dparams.as<cuda::RowSampling>(), dout.as<int32_t>(),
                    nullptr, 4);
  const auto got = to_host<int32_t>(dout, rows);
  for (int r = 0; r < rows; ++r) {
    const cuda::RowSampling& p = params[r];
    const int32_t expected = ops::sample_row(masked.data() + r * vocab, static_cast<int>(vocab),
                                             {p.temperature, p.top_k, p.top_p, p.min_p}, p.canonical);
    EXPECT_EQ(got[r], expected) << "row " << r;
    EXPECT_TRUE(allowed_bit(masks, (vocab + 31) / 32, r, got[r])) << "row " << r << " drew a masked token";
  }
  EXPECT_EQ(got[0], vocab - 1);
  EXPECT_EQ(got[1], 160);
}
