// Mixture-of-experts on CUDA: sigmoid routing with the fp32 correction bias and group-limited
// top-k, grouping of (token, expert) pairs by expert, expert MLPs for small batches in one
// fused kernel pair that streams each active expert's weights once (bf16, MXFP4 or block FP8,
// dequantised in registers), and the weighted combine. Large batches run the experts as
// per-expert cuBLAS GEMMs over the grouped rows (the model decides, by the number of pairs per
// expert); quantised experts are widened to bf16 one expert at a time for them.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ops/ops.h"

struct CUstream_st;
using cudaStream_t = CUstream_st*;

namespace glms::ops::cuda {

struct MoeRouting {
  int num_experts = 0, top_k = 0, n_group = 1, topk_group = 1;
  bool norm_topk_prob = true;
  float routed_scaling_factor = 1.0f;
  int logit_planes = 1;  // the logits as planes [logit_planes, n, num_experts] added in plane order
};

// The MoE router's logits of a decode step, x [n, cols] fp32 times w [rows, cols] bf16 transposed,
// on the bf16 tensor cores from the three bf16 terms of each x value (moe_router.cu says why and
// how), as kRouterProductPlanes planes [kRouterProductPlanes, n, rows] fp32 whose sum in plane
// order is the product (MoeRouting::logit_planes); the same bits on every run. Where
// router_product_fits(rows, cols): both multiples of 16, cols at most 8192.
inline constexpr int kRouterProductPlanes = 8;
bool router_product_fits(int64_t rows, int64_t cols);
void router_product(const float* x, int64_t n, const uint16_t* w, int64_t rows, int64_t cols, float* planes,
                    cudaStream_t stream);

// Per token: expert_ids[t, :top_k] in descending choice order and their weights, from router
// logits [n, num_experts] fp32 (or routing.logit_planes such planes, summed in plane order) and
// correction_bias [num_experts] fp32. num_experts <= 1024.
// Rows [n, padded_rows) (a data-parallel step's padding, which routes nowhere) get ids -1 and
// weights 0 in the same launch: a memset node of its own would stop the chained kernels there.
// With `routed_on_device`, rows from *routed_on_device on are padding too (read on the device, so
// that one captured graph serves steps of different counts: a data-parallel rank's padded batch).
void moe_route(const float* logits, const float* correction_bias, int64_t n, const MoeRouting& routing,
               int32_t* expert_ids, float* expert_weights, cudaStream_t stream, int64_t padded_rows = 0,
               const int32_t* routed_on_device = nullptr);

// The pairs p = t * top_k + k grouped by expert: expert e's pairs are sorted_pairs[offsets[e] ..
// offsets[e + 1]), pair p sits at pair_slot[p]; active_experts[0 .. *num_active) lists the
// experts with pairs. `counts` is scratch [num_experts + 1]. A rank holding experts
// [first_expert, first_expert + num_experts) of the model plans only their pairs (e is then the
// local index); other pairs, and pairs of id -1 (padding), get pair_slot -1.
struct MoePlan {
  int32_t* counts = nullptr;          // [num_experts + 1] scratch
  int32_t* offsets = nullptr;         // [num_experts + 1]
  int32_t* active_experts = nullptr;  // [num_experts]
  int32_t* num_active = nullptr;      // [1]
  int32_t* sorted_pairs = nullptr;    // [num_pairs]
  int32_t* pair_slot = nullptr;       // [num_pairs]
};
void moe_plan(const int32_t* expert_ids, int64_t num_pairs, int num_experts, const MoePlan& plan, cudaStream_t stream,
              int first_expert = 0);

// Rows of x in grouped order are ops::cuda::gather_rows(x, hidden, sorted_pairs, num_pairs, top_k).

// The routed experts of one layer, stacked: per expert the gate rows, then the up rows, in
// one [2 * inter, hidden] matrix, and down [hidden, inter]. By `format`:
//   Plain (bf16): gate_up [E, 2 * inter, hidden], down [E, hidden, inter]; no scales.
//   Mxfp4: gate_up [E, 2 * inter, hidden / 2] u8, gate_up_scales [E, 2 * inter, hidden / 32]
//     E8M0 codes; down and down_scales likewise over inter. The rows are either as AMD Quark
//     packs them (two E2M1 per byte, the even index in the low nibble; widths multiples of 32)
//     or, with mxfp4_tiled, codes and scales in quant/mxfp4_tiles.h's tile layout (multiples of
//     128), which only the tensor-core kernels read.
//   Fp8Block: gate_up [E, 2 * inter, hidden] E4M3 codes, gate_up_scales [E, 2 * inter,
//     ceil(hidden / 128)] fp32: each row carries its 128 x 128 block's weight_scale_inv (a row's
//     scales in one 16-byte-aligned run; 3% more bytes than the block grid). Needs hidden and
//     inter multiples of 16.
struct ExpertWeights {
  WeightFormat format = WeightFormat::Plain;
  const void* gate_up = nullptr;
  const void* gate_up_scales = nullptr;
  const void* down = nullptr;
  const void* down_scales = nullptr;
  // MXFP4 rows in the tile layout; made (by the model's upload) only when the widths are
  // multiples of 128 and every scale code is in 1..254 (no NaN scale and none under 2^-126,
  // which the kernels' scale extraction reads as zero).
  bool mxfp4_tiled = false;
};

// Where expert kernels write their down sums, [num_pairs, hidden] in the grouped order: fp32 rows,
// or bf16 rows (the grouped GEMMs of prefills: moe_experts_wgmma, _wgmma_rs, _specialized and
// _wgmma_fp8), which halves the bytes they and moe_combine move. One of the two is set.
struct ExpertSums {
  float* f32 = nullptr;
  uint16_t* bf16 = nullptr;
  ExpertSums(float* rows) : f32(rows) {}     // NOLINT(google-explicit-constructor): the usual case
  ExpertSums(uint16_t* rows) : bf16(rows) {}  // NOLINT(google-explicit-constructor)
};

// Small-batch expert MLP over the active experts, weights streamed once per step:
// act[s, :] = bf16(silu(gate_e . x) * (up_e . x)) for each grouped pair s of expert e, then
// expert_out[s, :] = down_e . act[s, :]. x: [n, hidden] bf16; act: [num_pairs, inter] bf16;
// expert_out: [num_pairs, hidden] fp32. `max_active` bounds the experts with pairs (grid
// size); `num_tokens` is the batch (an expert has at most one pair per token).
// Tiled MXFP4 experts and FP8 experts with widths multiples of 64 run on tensor cores
// (moe_experts_mma) unless `allow_tensor_cores` is false; the rest on CUDA-core GEMVs, which
// read MXFP4 in the checkpoint's packing only.
void moe_experts_small(const uint16_t* x, int64_t hidden, int64_t inter, const ExpertWeights& experts,
                       const MoePlan& plan, int num_experts, int top_k, int num_tokens, int max_active, uint16_t* act,
                       float* expert_out, cudaStream_t stream, bool allow_tensor_cores = true);

// The same on tensor cores for quantised experts (moe_experts_mma.cu): weights dequantised in
// registers to fp16, inputs staged as fp16 with a power-of-two scale per token, fp32 sums; an
// expert's tokens in chunks of 8 or 64 by the batch's pairs per expert (any batch size; the
// model widens experts for cuBLAS above 64 pairs per expert, where that measured faster).
bool moe_experts_mma_supported(const ExpertWeights& experts, int64_t hidden, int64_t inter);
void moe_experts_mma(const uint16_t* x, int64_t hidden, int64_t inter, const ExpertWeights& experts,
                     const MoePlan& plan, int num_experts, int top_k, int num_tokens, int max_active, uint16_t* act,
                     float* expert_out, cudaStream_t stream);

// The same for decode-sized batches of tiled MXFP4 experts (moe_experts_stream.cu): the grouped
// pairs' inputs staged once (a small kernel before a projection), then each warp streams its
// weight rows' codes once, kStages steps in flight, against all of an expert's pairs in chunks
// (8, 16 or 32 tokens) by `chunk_tokens`, the batch's pairs per expert. The mma.sync shapes
// stage the tokens as fp16 rows with a power-of-two scale each and multiply 8-token tiles; the
// wgmma shapes widen the codes into wgmma's A registers with the block scales (bf16, exact)
// against the whole chunk's bf16 tokens in shared memory; their gate/up kernel writes act
// ([num_pairs, inter] bf16) with each 32-value block in the order the down kernel reads, so the
// down projection needs no staging kernel (act is then not in column order). No host copy
// (graph-capturable). `num_pairs` bounds the plan's pairs on this rank (the staging grid);
// buffers.staged holds num_pairs x max(hidden, inter) 16-bit values, buffers.unscale num_pairs
// floats.
enum class MoeStreamShape {  // mma row fragments a warp, steps in flight, warps a block
  kFrags1Stages8,
  kFrags2Stages6,
  kFrags1Stages6Warps8,
  kWgmmaStages6Warps8,        // wgmma, one fragment a warp, a step a slot
  kWgmmaPairsStages3Warps8,  // wgmma, two steps a slot (128 contiguous bytes of a row a copy)
};
struct MoeStreamBuffers {
  uint32_t* staged = nullptr;
  float* unscale = nullptr;
};
bool moe_experts_stream_supported(const ExpertWeights& experts, int64_t hidden, int64_t inter);
void moe_experts_stream(const uint16_t* x, int64_t hidden, int64_t inter, const ExpertWeights& experts,
                        const MoePlan& plan, int num_experts, int top_k, int64_t num_pairs, int chunk_tokens,
                        int max_active, const MoeStreamBuffers& buffers, uint16_t* act, float* expert_out,
                        cudaStream_t stream, MoeStreamShape shape = MoeStreamShape::kFrags2Stages6);

// Rows of src ([*, dim] bf16, dim a multiple of 32) for the plan's grouped pairs p (row
// sorted_pairs[p] / top_k, or p itself without sorted_pairs) into staged ([num_pairs, dim / 2]
// bf16 pairs), each 32-value block in the k order of the A fragments widen_mxfp4_fragments makes
// (moe_fragments.cuh): the B operand of the wgmma kernels that take tiled MXFP4 weights as A.
void moe_stage_pairs_permuted(const uint16_t* src, int64_t dim, const int32_t* sorted_pairs, int top_k,
                              const MoePlan& plan, int num_experts, int64_t num_pairs, uint32_t* staged,
                              cudaStream_t stream);

// Tiled MXFP4 experts of prefills with the widened weights in wgmma's A registers
// (moe_experts_wgmma_rs.cu): each projection one grouped GEMM, a producer warpgroup copying the
// token rows (staged by moe_stage_pairs_permuted into `staged`, [num_pairs, max(hidden, inter)]
// bf16) and the codes into a ring while two consumer warpgroups widen their weight rows' codes
// into registers and multiply; act and expert_out as moe_experts_wgmma makes them. Needs hidden
// and inter multiples of 128. Tiled MXFP4 prefills take it from 33 pairs per expert
// (CudaModelOptions::wgmma_rs_mxfp4_experts_min_pairs).
bool moe_experts_wgmma_rs_supported(const ExpertWeights& experts, int64_t hidden, int64_t inter);
void moe_experts_wgmma_rs(const uint16_t* x, int64_t hidden, int64_t inter, const ExpertWeights& experts,
                          const MoePlan& plan, int num_experts, int top_k, int64_t num_pairs, uint32_t* staged,
                          uint16_t* act, ExpertSums expert_out, cudaStream_t stream);

// The same for prefill-sized batches with tiled MXFP4 experts (moe_experts_wgmma.cu): each
// projection one grouped GEMM over the plan's pairs on Hopper's warpgroup tensor cores, the
// weights widened to bf16 in shared memory with their block scales (exactly), the tokens bf16,
// fp32 sums; act = bf16(silu(gate) * up) as moe_experts_small makes it. `num_pairs` bounds the
// plan's pairs (the grid); each block finds its expert and rows in plan.offsets on the device,
// so the launch needs no host copy. Needs hidden a multiple of 256 and inter of 128.
// `tile_rows`: grouped rows a block, 64 or 128 (each weight widened once for twice the rows, more
// padding on experts with few pairs); 0 chooses by the pairs per expert.
bool moe_experts_wgmma_supported(const ExpertWeights& experts, int64_t hidden, int64_t inter);
void moe_experts_wgmma(const uint16_t* x, int64_t hidden, int64_t inter, const ExpertWeights& experts,
                       const MoePlan& plan, int num_experts, int top_k, int64_t num_pairs, uint16_t* act,
                       ExpertSums expert_out, cudaStream_t stream, int tile_rows = 0);

// The same for bf16 or tiled MXFP4 experts of long prefills (moe_experts_specialized.cu),
// warp-specialised: a producer warpgroup fills a ring of shared-memory stages (MXFP4: widening
// the codes to bf16 with their block scales, exactly) while two consumer warpgroups multiply,
// 128 grouped rows x 256 weight lines a block. Needs hidden a multiple of 256 and inter of 128.
// `tiles` (the same sums whichever; MXFP4 not kPaired): a block a row tile; an
// expert's row tiles two by two in thread block clusters that load each weight line once for
// both (TMA multicast), its odd last tile split between the two (kPaired); or a block an SM
// claiming tile after tile in order, its ring of stages running on from one to the next
// (kPersistent, launched as `persistent` says).
// `projections`: both, or one of them (gate/up writes act; down reads it): a caller that widens
// quantised experts into one bf16 buffer runs them in turn.
enum class SpecializedTiles { kEvery, kPaired, kPersistent };
enum class ExpertProjections { kBoth, kGateUp, kDown };
// A persistent grouped GEMM's launch. unit_counters: 2 ints from which its blocks claim their
// tiles, zero before the first launch; each launch leaves them zero, unless it is cut short by a
// fault (then later launches would skip tiles: the context is lost anyway). max_blocks: 0, a
// block an SM; more than 0, at most that many (a test's few blocks then take many tiles each).
struct PersistentLaunch {
  int* unit_counters = nullptr;
  int max_blocks = 0;
};
constexpr size_t kUnitCounterBytes = 2 * sizeof(int32_t);  // zeroed_buffer(kUnitCounterBytes) makes them
bool moe_experts_specialized_supported(const ExpertWeights& experts, int64_t hidden, int64_t inter);
void moe_experts_specialized(const uint16_t* x, int64_t hidden, int64_t inter, const ExpertWeights& experts,
                             const MoePlan& plan, int num_experts, int top_k, int64_t num_pairs, uint16_t* act,
                             ExpertSums expert_out, cudaStream_t stream,
                             SpecializedTiles tiles = SpecializedTiles::kEvery, const PersistentLaunch& persistent = {},
                             ExpertProjections projections = ExpertProjections::kBoth);

// Quantised experts through the bf16 GEMMs above, widened once a call rather than once a row
// tile: every expert's gate/up rows into `widened` (dequantize_experts: [num_experts, 2 inter,
// hidden] bf16), their GEMM, then the down rows into the same bytes ([num_experts, hidden,
// inter]) and theirs. For long gathered prefills, whose experts get a thousand pairs and more.
// `tiles`, `persistent`: those GEMMs' launch, as moe_experts_specialized's.
void moe_experts_widened(const uint16_t* x, int64_t hidden, int64_t inter, const ExpertWeights& experts,
                         const MoePlan& plan, int num_experts, int top_k, int64_t num_pairs, uint16_t* widened,
                         uint16_t* act, ExpertSums expert_out, cudaStream_t stream,
                         SpecializedTiles tiles = SpecializedTiles::kEvery, const PersistentLaunch& persistent = {});

// The same for block-FP8 experts (moe_experts_wgmma_fp8.cu), W8A8 as FP8 checkpoints are
// served: x and then act quantised to E4M3 with one scale a row and 128 columns
// (quantize_fp8_rows; kWide quantises act in its gate/up epilogue, the same codes; x not at all
// where staging.tokens_quantised) into `staging`, the expert weights' codes multiplied as they
// are on the FP8 tensor cores, each 128 k's sums scaled by the token's and the weight block's
// scales into fp32, in tiles of 128 rows (either kernel the same sums). Needs hidden and inter multiples of
// 128 and the weight scales uniform over each 128 x 128 block (ExpertWeights' Fp8Block layout).
// Staging, for n = num_pairs / top_k tokens and np(x) = fp8_padded_tokens(x): token_codes
// [np(n), hidden], token_scales [hidden / 128, np(n)], act_codes [np(num_pairs), inter],
// act_scales [inter / 128, np(num_pairs)].
struct MoeFp8Staging {
  uint8_t* token_codes = nullptr;
  float* token_scales = nullptr;
  uint8_t* act_codes = nullptr;
  float* act_scales = nullptr;
  PersistentLaunch persistent;  // kWidePersistent's launch
  bool tokens_quantised = false;  // token_codes / token_scales hold x's n E4M3 rows already
};
// The kernel: every warp copying and a block barrier a step, or a producer warpgroup copying
// while two consumer warpgroups multiply, over 128 weight lines a block or (kWide, where hidden
// is a multiple of 256; otherwise kWarpSpecialized) 256, and those with an expert's row tiles two
// by two in clusters that load each weight line once for both (kWidePaired), or unpaired in a
// block an SM claiming tile after tile (kWidePersistent; the same sums).
enum class Fp8ExpertGemm { kBlockBarrier, kWarpSpecialized, kWide, kWidePaired, kWidePersistent };
bool moe_experts_wgmma_fp8_supported(const ExpertWeights& experts, int64_t hidden, int64_t inter);
void moe_experts_wgmma_fp8(const uint16_t* x, int64_t hidden, int64_t inter, const ExpertWeights& experts,
                           const MoePlan& plan, int num_experts, int top_k, int64_t num_pairs,
                           const MoeFp8Staging& staging, uint16_t* act, ExpertSums expert_out, cudaStream_t stream,
                           Fp8ExpertGemm gemm = Fp8ExpertGemm::kWide);

// Experts first_expert .. first_expert + count - 1 of quantised `experts` widened to bf16, one
// launch a projection: gate_up_out [count, 2 * inter, hidden] and down_out [count, hidden, inter]
// (MXFP4 exactly, in either layout; FP8 rounded once from code x scale); a null output is skipped.
void dequantize_experts(const ExpertWeights& experts, int first_expert, int count, int64_t hidden, int64_t inter,
                        uint16_t* gate_up_out, uint16_t* down_out, cudaStream_t stream);

// out[t] (+= with `accumulate`, else =) shared_out[t] (when given) + the sum over the token's
// pairs on this rank (pair_slot >= 0), in increasing expert id, of weight * expert_out[slot]
// (read, fp32 or bf16 rows). out: [n, hidden] fp32 rows, or bf16 rows (each fp32 sum rounded
// once; neither accumulated nor with shared_out: a data-parallel rank's partial rows for a bf16
// reduce-scatter); shared_out: [n, hidden] fp32.
void moe_combine(ExpertSums out, bool accumulate, const float* shared_out, ExpertSums expert_out,
                 const int32_t* pair_slot, const int32_t* expert_ids, const float* expert_weights, int64_t n,
                 int top_k, int64_t hidden, cudaStream_t stream);

}  // namespace glms::ops::cuda
