// CUDA MLA attention (gathered selections on tensor cores) against a plain CPU reference, over
// model-sized and odd shapes, one token and long contexts past top-k (the indexer's scores and
// top-k: test_cuda_indexer.cpp, the same test binary). Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>

#include "core/dtype.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/mla.h"
#include "ops/ops.h"
#include "paged_context.h"
#include "quant/kv_fp8.h"
#include "support/cuda_buffers.h"
#include "support/numerics.h"

using namespace glms;
using glms::testing::random_values;
using glms::testing::to_device;
using glms::testing::to_host;
using glms::testing::bf16_to_host;
using glms::testing::poisoned_bf16;
using glms::testing::relative_l2;
using glms::testing::PagedContext;
using glms::testing::Token;
namespace cuda = glms::ops::cuda;

namespace {

class CudaAttention : public glms::testing::CudaTest {};

// The device side of an attention problem: its queries ([T, H, padded row] bf16), cache rows,
// selections ([T, top_k] positions and [T] counts), the paged block tables and each token's
// sequence; args() gives the attention's arguments over them (out left unset).
struct MlaDeviceInputs {
  cuda::DeviceBuffer queries, cache, selected, counts, tables, sequences;
  cuda::MlaAttentionArgs args(const PagedContext& paged, int T, int H, int L, int rd, int top_k,
                              cuda::CacheStorage storage) const {
    cuda::MlaAttentionArgs a;
    a.queries = queries.as<uint16_t>();
    a.cache = cache.data();
    a.storage = storage;
    a.selected = selected.as<int32_t>();
    a.num_selected = counts.as<int32_t>();
    a.max_selected = top_k;
    a.block_tables = tables.as<int32_t>();
    a.max_blocks = paged.max_blocks;
    a.token_sequence = sequences.as<int32_t>();
    a.block_size = paged.block_size;
    a.num_tokens = T;
    a.num_heads = H;
    a.latent_dim = L;
    a.rope_dim = rd;
    return a;
  }
};

// A random attention problem on the host: cache rows stored in `storage` (FP8: encoded here;
// `cache` holds what the rows decode to, which the reference attends over), queries scaled by
// `query_scale` (larger: a sharper softmax), each token's selections (every causal position, or
// a sorted random subset of top_k of them) and the double-precision reference.
struct MlaProblem {
  int T, H, L, rd, top_k;
  int rows;  // the most rows any token selects
  cuda::CacheStorage storage;
  const std::vector<Token>& tokens;
  PagedContext paged;
  std::vector<float> cache;          // [slots, L + rd]
  std::vector<uint8_t> cache_bytes;  // the same rows as stored
  std::vector<float> q_latent, q;    // [T, H, L], [T, H, 7 + rd] (7 columns before the rope ones)
  std::vector<int32_t> selected, num_selected, token_sequence;  // [T, top_k], [T], [T]
  std::vector<float> expected;                                  // [T, H, L]

  MlaProblem(int H_, int L_, int rd_, const std::vector<int>& contexts, const std::vector<Token>& tokens_,
             int top_k_, float query_scale, cuda::CacheStorage storage_)
      : T(static_cast<int>(tokens_.size())), H(H_), L(L_), rd(rd_), top_k(top_k_), storage(storage_),
        tokens(tokens_), paged(contexts, 11) {
    fill_cache();
    q_latent = random_values(int64_t{T} * H * L, 4, query_scale);
    q = random_values(int64_t{T} * H * query_width(), 5, query_scale);
    select_rows();
    int max_context = 0;
    for (const Token& tok : tokens) max_context = std::max(max_context, tok.position + 1);
    rows = std::min(max_context, top_k);
    expected = reference();
  }
  int row() const { return L + rd; }
  int query_width() const { return 7 + rd; }
  float scale() const { return 1.0f / std::sqrt(static_cast<float>(query_width())); }
  const float* selected_row(int t, int i) const {
    return cache.data() + paged.slot(tokens[t].seq, selected[int64_t{t} * top_k + i]) * row();
  }
  // Token t's [H, L] block of a [T, H, L] output.
  std::vector<float> token_block(const std::vector<float>& out, int t) const {
    return std::vector<float>(out.begin() + int64_t{t} * H * L, out.begin() + int64_t{t + 1} * H * L);
  }

 private:
  void fill_cache() {
    const int64_t slots = int64_t{paged.num_blocks} * paged.block_size;
    cache = random_values(slots * row(), 3);
    if (storage == cuda::CacheStorage::kBf16) {
      for (float& v : cache) {
        const uint16_t bits = f32_to_bf16(v);
        v = bf16_to_f32(bits);
        cache_bytes.push_back(static_cast<uint8_t>(bits & 0xff));
        cache_bytes.push_back(static_cast<uint8_t>(bits >> 8));
      }
      return;
    }
    const int row_bytes = quant::kv_fp8_row_bytes(L, rd);
    cache_bytes.resize(slots * row_bytes);
    for (int64_t s = 0; s < slots; ++s) {
      quant::encode_latent_row_fp8(cache.data() + s * row(), L, rd, cache_bytes.data() + s * row_bytes);
      quant::decode_latent_row_fp8(cache_bytes.data() + s * row_bytes, L, rd, cache.data() + s * row());
    }
  }
  void select_rows() {
    selected.assign(int64_t{T} * top_k, 0);
    num_selected.resize(T);
    token_sequence.resize(T);
    std::mt19937 rng(7);
    for (int t = 0; t < T; ++t) {
      token_sequence[t] = tokens[t].seq;
      std::vector<int32_t> all(tokens[t].position + 1);
      std::iota(all.begin(), all.end(), 0);
      if (static_cast<int>(all.size()) > top_k) {
        std::shuffle(all.begin(), all.end(), rng);
        all.resize(top_k);
        std::sort(all.begin(), all.end());
      }
      num_selected[t] = static_cast<int>(all.size());
      std::copy(all.begin(), all.end(), selected.begin() + int64_t{t} * top_k);
    }
  }
  std::vector<float> reference() const {
    std::vector<float> out(int64_t{T} * H * L);
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < H; ++h) {
        const float* ql = q_latent.data() + (int64_t{t} * H + h) * L;
        const float* qr = q.data() + (int64_t{t} * H + h) * query_width() + 7;
        std::vector<double> p(num_selected[t]);
        double max_score = -INFINITY, total = 0;
        for (int i = 0; i < num_selected[t]; ++i) {
          const float* c = selected_row(t, i);
          double s = 0;
          for (int k = 0; k < L; ++k) s += double(ql[k]) * c[k];
          for (int k = 0; k < rd; ++k) s += double(qr[k]) * c[L + k];
          p[i] = s * scale();
          max_score = std::max(max_score, p[i]);
        }
        for (double& v : p) total += (v = std::exp(v - max_score));
        for (int k = 0; k < L; ++k) {
          double sum = 0;
          for (int i = 0; i < num_selected[t]; ++i) sum += p[i] * selected_row(t, i)[k];
          out[(int64_t{t} * H + h) * L + k] = static_cast<float>(sum / total);
        }
      }
    return out;
  }
};

// A problem's queries as the attention passes take them (the model's absorption and
// mla_prepare_queries write them so): [T, H, padded row] bf16(scale * [q_latent, q_rope]), zeros
// to the padded width.
std::vector<uint16_t> staged_queries(const MlaProblem& p) {
  const int width = cuda::mla_padded_row(p.L, p.rd);
  std::vector<uint16_t> staged(int64_t{p.T} * p.H * width, 0);
  for (int64_t th = 0; th < int64_t{p.T} * p.H; ++th) {
    for (int k = 0; k < p.L; ++k) staged[th * width + k] = f32_to_bf16(p.q_latent[th * p.L + k] * p.scale());
    for (int k = 0; k < p.rd; ++k)
      staged[th * width + p.L + k] = f32_to_bf16(p.q[th * p.query_width() + 7 + k] * p.scale());
  }
  return staged;
}

MlaDeviceInputs device_inputs(const MlaProblem& p) {
  return {to_device(staged_queries(p)),  to_device(p.cache_bytes),        to_device(p.selected),
          to_device(p.num_selected),     to_device(p.paged.block_tables), to_device(p.token_sequence)};
}

// Prints each token whose output is further than 5e-3 from the reference (which token a kernel
// gets wrong says which of its paths is wrong).
void report_token_errors(const MlaProblem& p, const std::string& name, const std::vector<float>& got) {
  for (int t = 0; t < p.T; ++t) {
    const double e = relative_l2(p.token_block(got, t), p.token_block(p.expected, t));
    if (e > 5e-3) std::printf("  %s token %d (position %d): relative L2 %.2e\n", name.c_str(), t, p.tokens[t].position, e);
  }
}

// mla_attention_gathered over the tokens in chunks of at most `chunk_tokens` (a small workspace
// forces several chunks); returns its error, which the other kernels are held to. bf16 queries,
// probabilities and outputs on tensor cores against a double reference on the rows' values (FP8
// rows: widened to bf16 on the device, one more rounding of the same size).
double check_gathered(const MlaProblem& p, cuda::MlaAttentionArgs a, int chunk_tokens) {
  cuda::MlaGatherWorkspace w;
  w.gathered_elements = int64_t{chunk_tokens} * p.rows * p.row();
  w.score_elements = int64_t{chunk_tokens} * p.H * p.rows;
  cuda::DeviceBuffer gathered(w.gathered_elements * 2), scores(w.score_elements * 4), probs(w.score_elements * 2);
  w.gathered = gathered.as<uint16_t>();
  w.scores = scores.as<float>();
  w.probs = probs.as<uint16_t>();
  auto out = poisoned_bf16(p.expected.size());
  a.out = out.as<uint16_t>();
  cuda::Gemm gemm;
  cuda::mla_attention_gathered(a, p.rows, w, gemm, nullptr);
  const double error = relative_l2(bf16_to_host(out, p.expected.size()), p.expected);
  EXPECT_LT(error, 1e-2) << "H=" << p.H << " L=" << p.L << " tokens=" << p.T << " chunk=" << chunk_tokens;
  return error;
}

// The mma.sync pass of mla_attention_fused with room for `partial_elements` of partial sums
// (fewer splits than tiles: several 64-row tiles per block, so the online softmax rescales).
// Both it and the gathered pass round queries and probabilities to bf16 once: the same error,
// give or take.
void check_fused(const MlaProblem& p, cuda::MlaAttentionArgs a, const cuda::DeviceBuffer& partials,
                 int64_t partial_elements, double gathered_error) {
  auto out = poisoned_bf16(p.expected.size());
  a.out = out.as<uint16_t>();
  cuda::mla_attention_fused(a, p.rows, partials.as<float>(), partial_elements, nullptr, false);
  const auto got = bf16_to_host(out, p.expected.size());
  report_token_errors(p, "fused", got);
  const double error = relative_l2(got, p.expected);
  EXPECT_LT(error, 1e-2) << "fused: H=" << p.H << " L=" << p.L << " tokens=" << p.T << " partial elements "
                         << partial_elements;
  EXPECT_LT(error, 2 * gathered_error + 1e-4);
  std::printf("H=%d L=%d rope=%d tokens=%d%s: relative L2 gathered %.2e, fused %.2e\n", p.H, p.L, p.rd, p.T,
              p.storage == cuda::CacheStorage::kFp8 ? " (FP8 rows)" : "", gathered_error, error);
}

// The wgmma kernel in one split a token: plain, warp-specialised in two stages, and the ring
// (bf16 rows only for the warp-specialised ones). The two-stage kernel's persistent launch, in as
// many blocks as SMs and in 1 and 3 (each block taking several tokens, its stages and barrier
// phases running on across them), gives the same values bit for bit, since each is the same
// sequence of roundings. Its paired stages (each consumer scoring a whole stage: other roundings)
// come as close to the reference as the others, the same bits in any count of blocks.
void check_wgmma_one_split(const MlaProblem& p, cuda::MlaAttentionArgs a, double gathered_error) {
  for (const int variant : {0, 1, 2}) {
    const bool specialized = variant > 0;
    if (specialized && p.storage != cuda::CacheStorage::kBf16) continue;
    auto out = poisoned_bf16(p.expected.size());
    a.out = out.as<uint16_t>();
    a.warp_specialized = specialized;
    a.ring_stages = variant == 2;
    cuda::mla_attention_wgmma(a, nullptr);
    const auto got = bf16_to_host(out, p.expected.size());
    const std::string name = variant == 2 ? "wgmma, warp-specialised ring"
                             : specialized ? "wgmma, warp-specialised"
                                           : "wgmma";
    report_token_errors(p, name, got);
    const double error = relative_l2(got, p.expected);
    EXPECT_LT(error, 1e-2) << name << ": H=" << p.H << " tokens=" << p.T;
    EXPECT_LT(error, 2 * gathered_error + 1e-4) << name;
    std::printf("  %s: relative L2 %.2e\n", name.c_str(), error);
    if (variant != 1) continue;
    const auto block_a_token = to_host<uint16_t>(out, p.expected.size());
    for (const int blocks : {0, 1, 3}) {
      auto persistent_out = poisoned_bf16(p.expected.size());
      a.out = persistent_out.as<uint16_t>();
      a.persistent = true;
      a.persistent_blocks = blocks;
      cuda::mla_attention_wgmma(a, nullptr);
      EXPECT_EQ(to_host<uint16_t>(persistent_out, p.expected.size()), block_a_token)
          << "persistent in " << blocks << " blocks (0: the SM count): H=" << p.H << " tokens=" << p.T;
    }
    std::vector<uint16_t> paired_first;
    for (const int blocks : {0, 1, 3}) {
      auto paired_out = poisoned_bf16(p.expected.size());
      a.out = paired_out.as<uint16_t>();
      a.persistent = true;
      a.paired_stages = true;
      a.persistent_blocks = blocks;
      cuda::mla_attention_wgmma(a, nullptr);
      const std::vector<uint16_t> bits = to_host<uint16_t>(paired_out, p.expected.size());
      if (paired_first.empty()) {
        paired_first = bits;
        const auto paired = bf16_to_host(paired_out, p.expected.size());
        report_token_errors(p, "paired stages", paired);
        const double paired_error = relative_l2(paired, p.expected);
        EXPECT_LT(paired_error, 2 * gathered_error + 1e-4) << "paired stages: H=" << p.H << " tokens=" << p.T;
        std::printf("  paired stages: relative L2 %.2e\n", paired_error);
      }
      EXPECT_EQ(bits, paired_first) << "paired stages in " << blocks << " blocks: H=" << p.H << " tokens=" << p.T;
    }
    a.persistent = false;
    a.paired_stages = false;
    a.persistent_blocks = 0;
  }
}

// Each token's rows split over blocks and merged: any count of whole tiles, including splits past
// a short token's selection, and the count mla_wgmma_splits picks; both kernels, and the
// warp-specialised one's splits as clusters merged through distributed shared memory where they
// are at most 8 (or 16); more take `partials` (one split a tile of every token) and the merge
// launch. The same for the ring of 32-row stages (variants 4 .. 6).
void check_wgmma_splits(const MlaProblem& p, cuda::MlaAttentionArgs a, const cuda::DeviceBuffer& partials,
                        int64_t partial_elements, double gathered_error) {
  const int tiles = (p.rows + 63) / 64;
  for (const int variant : {0, 1, 2, 3, 4, 5, 6}) {
    const bool specialized = variant > 0, ring = variant >= 4;
    const int cluster_splits = (variant - 1) % 3 == 1 ? 8 : (variant - 1) % 3 == 2 ? 16 : 0;
    if (specialized && p.storage != cuda::CacheStorage::kBf16) continue;
    a.warp_specialized = specialized;
    a.ring_stages = ring;
    a.cluster_splits = specialized ? cluster_splits : 0;
    const bool clustered = a.cluster_splits > 0;
    std::string name = !specialized ? "wgmma" : ring ? "wgmma, warp-specialised ring" : "wgmma, warp-specialised";
    if (clustered) name += ", clusters of " + std::to_string(cluster_splits);
    for (const int splits : {2, 3, tiles, cuda::mla_wgmma_splits(p.T, p.rows, p.H, partial_elements)}) {
      if (splits < 2 || splits > tiles) continue;
      auto out = poisoned_bf16(p.expected.size());
      a.out = out.as<uint16_t>();
      // Clustered splits need no partials (the unclustered path refuses to run without them).
      const bool one_cluster = clustered && splits <= a.cluster_splits;
      cuda::mla_attention_wgmma(a, nullptr, p.rows, splits, one_cluster ? nullptr : partials.as<float>(),
                                one_cluster ? 0 : partial_elements);
      const double error = relative_l2(bf16_to_host(out, p.expected.size()), p.expected);
      EXPECT_LT(error, 2 * gathered_error + 1e-4) << name << ", " << splits << " splits: H=" << p.H << " tokens=" << p.T;
      std::printf("  %s, %d splits: relative L2 %.2e\n", name.c_str(), splits, error);
    }
  }
}

// The model's call: mla_attention_fused picks the split count. Its partials here hold one split
// a token, so only clustered splits (which need none) can split a token further: with the ring,
// mla_splits_for counts splits up to the cluster limit so (a token of 32 tiles takes 16 in one
// cluster), the two-stage kernel keeps to what the partials hold. bf16 rows only.
void check_fused_own_splits(const MlaProblem& p, cuda::MlaAttentionArgs a, const cuda::DeviceBuffer& partials,
                            double gathered_error) {
  const int64_t one_split = int64_t{p.T} * p.H * (p.L + 2);
  for (const bool ring : {false, true})
    for (const int cluster_splits : {0, 8, 16}) {
      a.warp_specialized = true;
      a.ring_stages = ring;
      a.cluster_splits = cluster_splits;
      auto out = poisoned_bf16(p.expected.size());
      a.out = out.as<uint16_t>();
      cuda::mla_attention_fused(a, p.rows, partials.as<float>(), one_split, nullptr, true, true);
      const double error = relative_l2(bf16_to_host(out, p.expected.size()), p.expected);
      EXPECT_LT(error, 2 * gathered_error + 1e-4)
          << (ring ? "ring" : "two stages") << ", clusters of at most " << cluster_splits << ": H=" << p.H
          << " tokens=" << p.T;
      std::printf("  mla_attention_fused's own splits, %s, clusters of at most %d: relative L2 %.2e\n",
                  ring ? "ring" : "two stages", cluster_splits, error);
    }
}

// Tokens [1, T) alone (first_token / launch_tokens) on mma.sync, wgmma and wgmma persistent in 2
// blocks: their outputs right, the first token's untouched.
void check_later_tokens_alone(const MlaProblem& p, cuda::MlaAttentionArgs a, const cuda::DeviceBuffer& partials,
                              int64_t partial_elements) {
  auto out = poisoned_bf16(p.expected.size());
  a.out = out.as<uint16_t>();
  a.first_token = 1;
  a.launch_tokens = p.T - 1;
  const int64_t first = int64_t{p.H} * p.L;  // token 0's outputs
  for (const int variant : {0, 1, 2}) {
    const bool wgmma = variant > 0;
    if (wgmma && !cuda::mla_attention_wgmma_supported(p.H, p.L, p.rd)) continue;
    a.persistent = variant == 2;
    a.persistent_blocks = 2;
    if (wgmma) cuda::mla_attention_wgmma(a, nullptr);
    else cuda::mla_attention_fused(a, p.rows, partials.as<float>(), partial_elements, nullptr, false);
    const auto got = bf16_to_host(out, p.expected.size());
    const std::vector<float> tail(got.begin() + first, got.end()),
        expected_tail(p.expected.begin() + first, p.expected.end());
    const char* name = variant == 2 ? "wgmma persistent" : wgmma ? "wgmma" : "mma.sync";
    EXPECT_LT(relative_l2(tail, expected_tail), 1e-2) << name;
    EXPECT_TRUE(std::all_of(got.begin(), got.begin() + first, [](float v) { return std::isnan(v); }))
        << name << ": token 0 was written";
  }
}

// Every attention pass over one random problem against the double-precision reference:
// gathered (in chunks of at most `chunk_tokens`), fused mma.sync (partials for `chunk_tokens` x
// 2 splits), wgmma in one split and in several, mla_attention_fused's own split counts, and the
// later tokens alone. `query_scale` sharpens the softmax.
void check_mla(int H, int L, int rd, const std::vector<int>& contexts, const std::vector<Token>& tokens, int top_k,
               int chunk_tokens, float query_scale = 0.5f, cuda::CacheStorage storage = cuda::CacheStorage::kBf16) {
  const MlaProblem p(H, L, rd, contexts, tokens, top_k, query_scale, storage);
  const MlaDeviceInputs inputs = device_inputs(p);
  const cuda::MlaAttentionArgs a = inputs.args(p.paged, p.T, H, L, rd, top_k, storage);
  const double gathered_error = check_gathered(p, a, chunk_tokens);
  ASSERT_TRUE(cuda::mla_attention_fused_supported(H, L, rd));
  const int64_t partial_elements = int64_t{chunk_tokens} * 2 * H * (L + 2);
  cuda::DeviceBuffer partials(partial_elements * sizeof(float));
  check_fused(p, a, partials, partial_elements, gathered_error);
  if (cuda::mla_attention_wgmma_supported(H, L, rd)) {
    check_wgmma_one_split(p, a, gathered_error);
    const int64_t split_elements = int64_t{p.T} * ((p.rows + 63) / 64) * H * (L + 2);
    cuda::DeviceBuffer split_partials(split_elements * sizeof(float));
    check_wgmma_splits(p, a, split_partials, split_elements, gathered_error);
    if (storage == cuda::CacheStorage::kBf16) check_fused_own_splits(p, a, split_partials, gathered_error);
  }
  if (p.T > 1) check_later_tokens_alone(p, a, partials, partial_elements);
}

}  // namespace

// mla_prepare_queries: the nope columns in bf16 (rounded as the CPU rounds), the rope columns
// rotated, scaled and rounded within bf16 of the CPU's rotation, zeros to the padded width, and
// the latent columns (the absorption's) and the other columns of q_nope left as they were; and
// the same from bf16 q (whose nope columns are the absorption's input already).
TEST_F(CudaAttention, MlaPreparedQueriesRotateScaleAndPad) {
  struct Shape {
    int T, H, L, nope, rd;
  };
  for (const Shape shape : {Shape{7, 3, 18, 5, 6}, Shape{5, 64, 512, 192, 64}}) {
    const int T = shape.T, H = shape.H, L = shape.L, nope = shape.nope, rd = shape.rd, qd = nope + rd;
    const int width = cuda::mla_padded_row(L, rd);
    ASSERT_EQ(width % 16, 0);
    ASSERT_GE(width, L + rd);
    const float scale = 0.37f;
    const auto q = random_values(int64_t{T} * H * qd, 31, 2.0f);
    std::vector<float> inv_freq;
    for (int i = 0; i < rd / 2; ++i) inv_freq.push_back(1.0f / std::pow(1e4f, 2.0f * i / rd));
    std::vector<int32_t> positions(T);
    for (int t = 0; t < T; ++t) positions[t] = 977 * t + 3;
    const auto dq = to_device(q), dpos = to_device(positions), dfreq = to_device(inv_freq);
    const uint16_t untouched = 0x3f80;  // 1.0: what the absorption leaves in the latent columns
    auto q_nope = to_device(std::vector<uint16_t>(int64_t{T} * H * qd, untouched));
    auto prepared = to_device(std::vector<uint16_t>(int64_t{T} * H * width, untouched));
    cuda::mla_prepare_queries(dq.as<float>(), T, H, qd, nope, rd, dpos.as<int32_t>(), dfreq.as<float>(), L, scale,
                              q_nope.as<uint16_t>(), prepared.as<uint16_t>(), nullptr);
    const auto got_nope = to_host<uint16_t>(q_nope, int64_t{T} * H * qd);
    const auto got = to_host<uint16_t>(prepared, int64_t{T} * H * width);
    ops::RopeTable table;
    table.rope_dim = rd;
    table.inv_freq = inv_freq;
    std::vector<float> cos(rd / 2), sin(rd / 2), cpu = q, want_rope, got_rope;
    for (int t = 0; t < T; ++t) {
      table.angles(positions[t], cos.data(), sin.data());
      for (int h = 0; h < H; ++h) {
        const int64_t th = int64_t{t} * H + h;
        for (int k = 0; k < qd; ++k)
          ASSERT_EQ(got_nope[th * qd + k], k < nope ? f32_to_bf16(q[th * qd + k]) : untouched)
              << "row " << th << " column " << k;
        for (int k = 0; k < L; ++k)
          ASSERT_EQ(got[th * width + k], untouched) << "row " << th << " latent column " << k;
        for (int k = L + rd; k < width; ++k)
          ASSERT_EQ(got[th * width + k], 0) << "row " << th << " padding column " << k;
        float* row = cpu.data() + th * qd + nope;
        ops::rope_interleaved(row, rd, cos.data(), sin.data());
        for (int k = 0; k < rd; ++k) {
          want_rope.push_back(row[k] * scale);
          got_rope.push_back(bf16_to_f32(got[th * width + L + k]));
        }
      }
    }
    EXPECT_LT(relative_l2(got_rope, want_rope), 4e-3) << "H=" << H;

    // From q in bf16 (the q_b GEMM's bf16 output): the same staged row, rotated from the rounded
    // values, the latent columns left as they were.
    std::vector<uint16_t> q16(q.size());
    for (size_t i = 0; i < q.size(); ++i) q16[i] = f32_to_bf16(q[i]);
    const auto dq16 = to_device(q16);
    auto prepared16 = to_device(std::vector<uint16_t>(int64_t{T} * H * width, untouched));
    cuda::mla_prepare_queries(dq16.as<uint16_t>(), T, H, qd, nope, rd, dpos.as<int32_t>(), dfreq.as<float>(), L, scale,
                              prepared16.as<uint16_t>(), nullptr);
    const auto got16 = to_host<uint16_t>(prepared16, int64_t{T} * H * width);
    std::vector<float> want_rope16, got_rope16;
    for (int t = 0; t < T; ++t) {
      table.angles(positions[t], cos.data(), sin.data());
      for (int h = 0; h < H; ++h) {
        const int64_t th = int64_t{t} * H + h;
        for (int k = 0; k < L; ++k)
          ASSERT_EQ(got16[th * width + k], untouched) << "bf16 q: row " << th << " latent column " << k;
        for (int k = L + rd; k < width; ++k)
          ASSERT_EQ(got16[th * width + k], 0) << "bf16 q: row " << th << " padding column " << k;
        std::vector<float> row(rd);
        for (int k = 0; k < rd; ++k) row[k] = bf16_to_f32(q16[th * qd + nope + k]);
        ops::rope_interleaved(row.data(), rd, cos.data(), sin.data());
        for (int k = 0; k < rd; ++k) {
          want_rope16.push_back(row[k] * scale);
          got_rope16.push_back(bf16_to_f32(got16[th * width + L + k]));
        }
      }
    }
    EXPECT_LT(relative_l2(got_rope16, want_rope16), 4e-3) << "bf16 q, H=" << H;
  }
}

// Which split counts go as one cluster (runs without a GPU): at most cluster_splits (and 16) of
// them, bf16 rows in the warp-specialised kernel; more, or none asked for, keep partials and the
// merge launch (a batch of one takes 32 splits, and the default is 8).
TEST(MlaSplitsClustered, OnlyCountsThatFitTheClusterWithBf16RowsInTheSpecialisedKernel) {
  cuda::MlaAttentionArgs a;
  a.cluster_splits = 8;
  EXPECT_TRUE(cuda::mla_splits_clustered(a, 2));
  EXPECT_TRUE(cuda::mla_splits_clustered(a, 8));
  EXPECT_FALSE(cuda::mla_splits_clustered(a, 1));
  EXPECT_FALSE(cuda::mla_splits_clustered(a, 9));
  EXPECT_FALSE(cuda::mla_splits_clustered(a, 32));
  a.cluster_splits = 64;  // past Hopper's largest cluster
  EXPECT_TRUE(cuda::mla_splits_clustered(a, 16));
  EXPECT_FALSE(cuda::mla_splits_clustered(a, 17));
  a.cluster_splits = 0;
  EXPECT_FALSE(cuda::mla_splits_clustered(a, 2));
  a.cluster_splits = 8;
  a.warp_specialized = false;
  EXPECT_FALSE(cuda::mla_splits_clustered(a, 2));
  a.warp_specialized = true;
  a.storage = cuda::CacheStorage::kFp8;
  EXPECT_FALSE(cuda::mla_splits_clustered(a, 2));
}

// The decode split counts (runs without a GPU), on 132 SMs over 32 tiles (a context past the
// top-k of 2048): without clusters a batch of one takes 32 splits and the merge, 64 tokens two;
// where splits up to 16 go as one cluster (no merge) a batch of one takes 16; with clusters of
// at most 8 a batch of 8 keeps 16 splits (a tie with 8 clustered keeps the unclustered count).
TEST(MlaSplitsFor, FewestWavesTimesTilesAndTheMergeUnlessClustered) {
  constexpr int kSms = 132, kTiles = 32, kRoom = 512;
  EXPECT_EQ(cuda::mla_splits_for(1, kTiles, kSms, kRoom, 0), 32);
  EXPECT_EQ(cuda::mla_splits_for(8, kTiles, kSms, kRoom, 0), 16);
  EXPECT_EQ(cuda::mla_splits_for(64, kTiles, kSms, kRoom, 0), 2);
  EXPECT_EQ(cuda::mla_splits_for(128, kTiles, kSms, kRoom, 0), 1);
  EXPECT_EQ(cuda::mla_splits_for(1, kTiles, kSms, kRoom, 16), 16);
  EXPECT_EQ(cuda::mla_splits_for(8, kTiles, kSms, kRoom, 16), 16);
  EXPECT_EQ(cuda::mla_splits_for(1, kTiles, kSms, kRoom, 8), 32);
  EXPECT_EQ(cuda::mla_splits_for(8, kTiles, kSms, kRoom, 8), 16);
  // Partials for at most 4 splits: more only as one cluster.
  EXPECT_EQ(cuda::mla_splits_for(1, kTiles, kSms, 4, 0), 4);
  EXPECT_EQ(cuda::mla_splits_for(1, kTiles, kSms, 4, 16), 16);
  // A short selection: the merge costs more than three tiles in parallel save, a cluster does not.
  EXPECT_EQ(cuda::mla_splits_for(1, 3, kSms, kRoom, 0), 1);
  EXPECT_EQ(cuda::mla_splits_for(1, 3, kSms, kRoom, 16), 3);
}

TEST_F(CudaAttention, MlaDecodeOneTokenShortContext) { check_mla(64, 512, 64, {1}, {{0, 0}}, 2048, 1); }

TEST_F(CudaAttention, MlaDecodeBatchMixedContextsAndChunks) {
  const std::vector<int> contexts = {37, 300, 1000};
  const std::vector<Token> tokens = {{0, 36}, {1, 299}, {2, 999}};
  for (int chunk : {1, 2, 3}) check_mla(64, 512, 64, contexts, tokens, 2048, chunk);
}

TEST_F(CudaAttention, MlaSparseOverTopKPastTheContextLimit) {
  check_mla(64, 512, 64, {3000, 5000}, {{0, 2999}, {1, 4999}}, 2048, 2);
  // Sharp softmaxes (scores in the tens): the online max must rescale exactly.
  check_mla(64, 512, 64, {3000, 5000}, {{0, 2999}, {1, 4999}}, 2048, 1, 3.0f);
}

TEST_F(CudaAttention, MlaPrefillChunkAndOddShapes) {
  // A prefill chunk (consecutive positions of one sequence) beside a decode; odd head count and dims.
  std::vector<Token> tokens;
  for (int p = 20; p < 45; ++p) tokens.push_back({0, p});
  tokens.push_back({1, 8});
  check_mla(3, 16, 6, {45, 9}, tokens, 9, 26);
  check_mla(8, 64, 16, {45, 9}, tokens, 96, 5);
}

TEST_F(CudaAttention, MlaOddLatentWidthOverSeveralSplits) {
  // A latent width that is not a multiple of 4 or 16 (scalar merge, padded column tiles), with
  // room for four splits of each token's 200-300 rows.
  check_mla(5, 18, 6, {300, 200}, {{0, 299}, {1, 199}}, 2048, 4);
}

TEST_F(CudaAttention, MlaWgmmaOverManyTilesPaddedHeadsAndSharpScores) {
  // A prefill chunk deep in a sequence (each token reads top_k = 2048 rows: 32 tiles) beside
  // one whose rows end mid-tile; 64 heads and 20 (zero-padded to the wgmma's 64).
  std::vector<Token> tokens;
  for (int p = 2200; p < 2206; ++p) tokens.push_back({0, p});
  tokens.push_back({1, 99});
  check_mla(64, 512, 64, {2206, 100}, tokens, 2048, 7);
  check_mla(20, 512, 64, {2206, 100}, tokens, 2048, 7, 3.0f);
}

TEST_F(CudaAttention, MlaPrefillFromTheFirstPosition) {
  // A sequence's first chunk: token t attends positions 0..t, fewer rows than a tile.
  std::vector<Token> tokens;
  for (int p = 0; p < 29; ++p) tokens.push_back({0, p});
  check_mla(8, 64, 16, {29}, tokens, 96, 29);
  check_mla(64, 512, 64, {29}, tokens, 2048, 29);
}

TEST_F(CudaAttention, MlaRowCountsAroundThe32And64RowSteps) {
  // Selections of 1, 31, 32, 33, 65, 97, 129 and 160 rows: one to five steps of the ring's 32
  // rows (a partial last one or not), splits of 64 rows with a short or empty last split.
  std::vector<Token> tokens;
  for (int p : {0, 30, 31, 32, 64, 96, 128, 159}) tokens.push_back({0, p});
  check_mla(64, 512, 64, {160}, tokens, 2048, 8);
}

TEST_F(CudaAttention, MlaTokensWithoutRowsWriteZerosInTheWarpSpecialisedKernels) {
  // Tokens that select no rows (a padded batch's) among tokens that do, one split a token: the
  // block-a-token kernel writes their output as zeros, and the persistent launch (in 1, 2 and as
  // many blocks as SMs, so that blocks meet such tokens between others) writes the same bytes.
  constexpr int H = 64, L = 512, rd = 64, row = L + rd, top_k = 2048;
  const std::vector<int> counts = {3, 0, 70, 0, 0, 1, 130, 0};
  const int T = static_cast<int>(counts.size());
  const PagedContext paged({200}, 5);
  std::vector<uint16_t> cache(int64_t{paged.num_blocks} * paged.block_size * row), queries(int64_t{T} * H * row);
  const auto cache_values = random_values(cache.size(), 6), query_values = random_values(queries.size(), 7, 0.05f);
  for (size_t i = 0; i < cache.size(); ++i) cache[i] = f32_to_bf16(cache_values[i]);
  for (size_t i = 0; i < queries.size(); ++i) queries[i] = f32_to_bf16(query_values[i]);
  std::vector<int32_t> selected(int64_t{T} * top_k, 0);
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < counts[t]; ++i) selected[int64_t{t} * top_k + i] = i;
  const std::vector<int32_t> sequences(T, 0);
  const MlaDeviceInputs inputs{to_device(queries), to_device(cache),              to_device(selected),
                               to_device(counts),  to_device(paged.block_tables), to_device(sequences)};
  cuda::MlaAttentionArgs a = inputs.args(paged, T, H, L, rd, top_k, cuda::CacheStorage::kBf16);
  auto block_a_token = poisoned_bf16(int64_t{T} * H * L);
  a.out = block_a_token.as<uint16_t>();
  cuda::mla_attention_wgmma(a, nullptr);
  const auto expected = to_host<uint16_t>(block_a_token);
  for (int t = 0; t < T; ++t) {
    const auto first = expected.begin() + int64_t{t} * H * L, last = first + int64_t{H} * L;
    if (counts[t] == 0) EXPECT_TRUE(std::all_of(first, last, [](uint16_t v) { return v == 0; })) << "token " << t;
    else EXPECT_TRUE(std::none_of(first, last, [](uint16_t v) { return v == 0xffff; })) << "token " << t;
  }
  a.persistent = true;
  for (const int blocks : {1, 2, 0}) {
    auto persistent = poisoned_bf16(int64_t{T} * H * L);
    a.out = persistent.as<uint16_t>();
    a.persistent_blocks = blocks;
    cuda::mla_attention_wgmma(a, nullptr);
    EXPECT_EQ(to_host<uint16_t>(persistent), expected) << "persistent in " << blocks << " blocks (0: the SM count)";
  }
  a.paired_stages = true;  // its zeros too; other tokens' values within the reference's reach
  for (const int blocks : {1, 2, 0}) {
    auto paired = poisoned_bf16(int64_t{T} * H * L);
    a.out = paired.as<uint16_t>();
    a.persistent_blocks = blocks;
    cuda::mla_attention_wgmma(a, nullptr);
    const auto got = to_host<uint16_t>(paired);
    for (int t = 0; t < T; ++t) {
      const auto first = got.begin() + int64_t{t} * H * L, last = first + int64_t{H} * L;
      if (counts[t] == 0)
        EXPECT_TRUE(std::all_of(first, last, [](uint16_t v) { return v == 0; })) << "paired, token " << t;
      else
        EXPECT_TRUE(std::none_of(first, last, [](uint16_t v) { return v == 0xffff; })) << "paired, token " << t;
    }
  }
}

TEST_F(CudaAttention, MlaClusterSizesTheDeviceHolds) {
  // What CudaGlm5Model caps attention_cluster_splits at: 16, 8, 4 or 2 blocks of the
  // warp-specialised kernel (a block an SM), or 0; a whole H200 holds 16. Then a token's splits as
  // one cluster of that size give the attention the unclustered splits give.
  for (const bool ring : {false, true}) {
    const int largest = cuda::mla_largest_cluster_splits(ring);
    std::printf("largest cluster of %s splits: %d\n", ring ? "the ring's" : "two-stage", largest);
    EXPECT_TRUE(largest == 0 || largest == 2 || largest == 4 || largest == 8 || largest == 16) << largest;
  }
}

TEST_F(CudaAttention, MlaOverFp8Rows) {
  const auto fp8 = cuda::CacheStorage::kFp8;
  // One token; a decode batch of mixed contexts (several splits); top-k past the context limit
  // with sharp scores (the wgmma pass widening many tiles); a prefill chunk of odd shapes (the
  // mma.sync kernel's value-by-value widening, a partial scale group).
  check_mla(64, 512, 64, {1}, {{0, 0}}, 2048, 1, 0.5f, fp8);
  check_mla(64, 512, 64, {37, 300, 1000}, {{0, 36}, {1, 299}, {2, 999}}, 2048, 2, 0.5f, fp8);
  check_mla(64, 512, 64, {3000, 5000}, {{0, 2999}, {1, 4999}}, 2048, 1, 3.0f, fp8);
  std::vector<Token> tokens;
  for (int p = 2200; p < 2206; ++p) tokens.push_back({0, p});
  tokens.push_back({1, 99});
  check_mla(20, 512, 64, {2206, 100}, tokens, 2048, 7, 3.0f, fp8);
  tokens.clear();
  for (int p = 20; p < 45; ++p) tokens.push_back({0, p});
  tokens.push_back({1, 8});
  check_mla(3, 200, 6, {45, 9}, tokens, 9, 26, 0.5f, fp8);
}
