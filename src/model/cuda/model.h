// The GLM-5 forward pass on one CUDA device: the same layer sequence as Glm5Model (glm5.cpp),
// over the ops/cuda kernels. Weights are uploaded once as bf16 (quantised checkpoints are
// dequantised on upload, except routed experts in MXFP4 or block FP8; the router and its bias
// stay fp32), the paged latent cache lives on the
// device in bf16 (indexer keys too), and a step uploads the batch's metadata in one copy.
// Activations between blocks are fp32; GEMM inputs are bf16 with fp32 accumulation.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "io/model_config.h"
#include "model/batch.h"
#include "model/cuda_memory.h"
#include "kv/latent_cache.h"
#include "model/cuda/weights.h"
#include "model/step_runner.h"
#include "model/weights.h"

namespace glms::model {

// What a rank's GPU held when its cache was sized from the memory budget (all zero when the
// cache size was given): `glmserve plan` computes the same figures (model/cuda_memory.h).
struct CudaMemoryReport {
  int64_t device_total = 0;  // the GPU's memory
  int64_t budget = 0;        // gpu_memory_utilization of it
  int64_t in_use = 0;        // before the cache: weights, workspaces, CUDA runtime, communicators
  int64_t weights = 0, workspaces = 0, cache = 0;
  CudaRankWidths widths;   // the rank's layer widths (from its weights) and the limits that sized
  CudaStepLimits limits;   // the workspaces: cuda_workspace_bytes of them is `workspaces`
  int64_t runtime() const { return in_use - weights - workspaces; }  // context, libraries, peers' buffers
};

struct CudaModelOptions {
  int block_size = 64;       // cache block, tokens
  // Cache blocks; 0: what gpu_memory_utilization leaves after the weights and workspaces (more
  // than running sequences need serves the prefix cache).
  int num_blocks = 0;
  double gpu_memory_utilization = 0.9;  // of the device's total memory (vLLM's flag)
  int max_tokens = 2048;     // tokens per step (prefill chunk plus decodes)
  int max_sequences = 256;   // sequences per step
  int max_context = 32768;   // positions per sequence
  int max_logits = 0;        // logits rows per step; 0: max_sequences
  bool mtp = false;          // run the checkpoint's MTP layer (its cache, one layer more, is allocated)
  // What the cache's rows hold (--kv-cache-dtype): kAuto bf16 latent rows and indexer keys;
  // kFp8E4m3 the FP8 layout of quant/kv_fp8.h (ops::cuda::CacheStorage::kFp8), 56% of the bytes
  // a token at GLM-5's widths.
  kv::CacheDtype cache_dtype = kv::CacheDtype::kAuto;
  // Linear layers of at most this many tokens go through ops::cuda::gemv_bf16 instead of cuBLAS
  // (0: never). 2 measured fastest on the H200 at GLM-5.2 width (docs/performance.md).
  int small_batch_gemv_tokens = 2;
  // Linear layers of more tokens than that, up to this many, go through ops::cuda::linear_skinny
  // (tensor cores, weights streamed once, k split over a cluster) instead of cuBLAS (0: never; at
  // most ops::cuda::kSkinnyMaxTokens), and the attention's groups of projections (q_a with kv_a
  // and the indexer's, q_b with wq_b) up to skinny_group_tokens. At 128 tokens single matrices
  // measured no faster than cuBLAS, the groups 1.1-3.5x faster (docs/performance.md).
  int skinny_gemm_tokens = 64;
  int skinny_group_tokens = 128;
  // Runs of at least this many decode / short-chunk tokens attend through
  // ops::cuda::mla_attention_fused (one pass over the selected rows), shorter ones through the
  // gathered-row GEMMs (0: always fused). On the H200 at GLM-5.2 width the fused pass, with its
  // wgmma splits, wins at every batch from 1 (0.22 -> 0.13 ms for 5 layers; docs/performance.md).
  int fused_attention_min_tokens = 0;
  // Long prefill chunks through the same fused pass (each token reads only its top-k rows)
  // where it pays, instead of dense scores over the chunk's causal extent and a sparse softmax:
  // where the chunk's context is long against index_topk (kFusedPrefillWorkRatio, measured on
  // the H200: prefill 8k 214 -> 188 ms, 2k dense stays). false: always the dense path.
  bool fused_prefill_attention = true;
  // Fused passes with a block per token (prefill chunks, large batches) on Hopper's warpgroup
  // tensor cores (ops::cuda::mla_attention_wgmma) where the shapes are GLM-5's; false: the
  // mma.sync kernel. With it the fused pass pays from kFusedPrefillWorkRatioWgmma on.
  bool wgmma_attention = true;
  // The wgmma pass also for tokens fewer than SMs (decode batches), each token's selection split
  // over blocks (ops::cuda::mla_wgmma_splits) and merged; false: such runs take the mma.sync kernel.
  bool wgmma_attention_splits = true;
  // Those passes with bf16 rows and one split in the warp-specialised kernel (a producer
  // warpgroup, two consumers on each step of 64 rows; ops::cuda::mla_attention_wgmma_specialized);
  // false: one block's warpgroups splitting every tile.
  bool warp_specialized_attention = true;
  // That kernel with a ring of four 32-row stages whose steps its two consumers score in turn
  // (ops::cuda::MlaAttentionArgs::ring_stages); false: two 64-row stages, each consumer scoring
  // half of every step. With the ring, a decode batch's split count weighs splits that go as one
  // cluster (at most attention_cluster_splits) as free of the merge (ops::cuda::mla_splits_for).
  bool attention_ring_stages = false;
  // The two-stage kernel's prefill chunks (one split a token) in a block an SM taking token after
  // token (ops::cuda::MlaAttentionArgs::persistent): the next token's look-ups, rows and queries
  // land while this one's last steps and epilogue run; false: a block a token. On: an H100,
  // GLM-5.2 width, 5 layers, attention.core of a prefill of 2048 3.82-3.90 -> 3.74-3.77 ms in
  // three A/Bs, 8192 within the step's spread (bench/results/cuda-persistent-attention-20261206.json).
  bool persistent_attention = true;
  // That launch over pairs of stages, each consumer scoring a whole stage
  // (ops::cuda::MlaAttentionArgs::paired_stages): its S at shared memory's rate. The kernel alone
  // on an H100 (benchmarks/cuda_mla_prefill, GLM-5.2's shapes, two rounds): 2048 tokens 0.699 ->
  // 0.662 ms, 8192 4.32 -> 4.02-4.05 ms, 0.59 -> 0.64 of the bf16 GEMM rate
  // (bench/results/cuda-paired-attention-20261207.json).
  bool paired_attention = true;
  // Steps of at most this many tokens (0: none) write what follows the attention's first
  // projections (q_a's RMSNorm, the latent cache row, the indexer key) in one launch instead of
  // three (ops::cuda::write_projection_rows): two fewer kernels in a layer's chain, which at a
  // rank's batch 1 is some 24 short kernels a layer. Measured on an H200 with reuse_step_selection
  // (bench/results/cuda-fused-rows-20261205.json, EP8 rank, 2k context): 5 layers, two rounds,
  // batch 1 1.582 -> 1.560 / 1.569 ms, 8 2.417 -> 2.397 / 2.398, 64 3.334 -> 3.294 / 3.299; 78
  // layers batch 1 16.85 -> 16.72, 64 44.80 -> 44.60; but prefill 8192 108.3 -> 108.8 and
  // 109.3 -> 109.7 (attention.projections 6.74 -> 7.00 ms): one block a token and job does not
  // keep up with the three passes at thousands of rows, hence decode-sized steps only.
  int fused_projection_rows_max_tokens = 256;
  // A step whose every context is at most index_topk selects every position, the same in each
  // layer: with this, the first indexed layer's top-k serves the rest of the step (one top-k launch
  // a step instead of one a layer, at a 2k context all of a decode step's). Same record: the
  // indexer phase of the 5-layer rank at batch 1 0.060 -> 0.050 ms.
  bool reuse_step_selection = true;
  // Decode batches whose tokens' rows go in splits: a token's splits as one thread block cluster
  // of that kernel where they are at most this many (0, 2-16), combined through distributed shared
  // memory in the same launch (ops::cuda::MlaAttentionArgs::cluster_splits); more splits (a batch
  // of one token takes 32) keep partials in global memory and a merge launch. H200, EP8 rank,
  // 5 layers, two rounds: batch 64 (2 splits) 3.35 -> 3.31 ms at 2k, 3.78 -> 3.73 at 16k
  // (attention.core 0.316 -> 0.295); capping a batch of one at 8 or 16 clustered splits was
  // slower (1.585 -> 1.635 ms).
  int attention_cluster_splits = 8;
  // Long prefill chunks' indexer scores on the warpgroup tensor cores, fused with the sum over
  // heads (ops::cuda::indexer_scores_wgmma; GLM-5's 32 heads of 128); false: a TF32 GEMM whose
  // per-head products go through global memory. Prefill 8192 on the H200 at GLM-5.2 width:
  // indexer 21.95 -> 12.76 ms, 160.1 -> 150.1 ms in all.
  bool wgmma_indexer = true;
  // Those scores with E4M3 queries and keys (DeepSeek-V3.2's FP8 indexer: a scale a query row and
  // a key, the codes on the FP8 tensor cores; ops::cuda::indexer_scores_wgmma's fp8_operands).
  // The CPU reference keeps fp32 scores, so near-tied positions can enter or leave the top-k.
  bool fp8_prefill_indexer = false;
  // Routed experts (tiled MXFP4, or bf16) through the grouped GEMMs on the warpgroup tensor
  // cores (ops::cuda::moe_experts_wgmma) where a step has at least this many pairs per expert on
  // average; 0: never (MXFP4: the mma.sync kernels and, above their range, widening to bf16;
  // bf16: the small-batch kernels and cuBLAS).
  int wgmma_experts_min_pairs = 16;
  // bf16 and block-FP8 experts take them (FP8: the W8A8 GEMMs below) from these many pairs per
  // expert instead (0: as wgmma_experts_min_pairs). H200, GLM-5.2 width, 5 layers, one lease each
  // (bench/results/cuda-grouped-experts-thresholds-20261204.json), step times with the threshold
  // at 16 -> lower:
  //   bf16 (the small-batch kernels stream bf16 weights on the CUDA cores: near the memory bound
  //   at 2 pairs an expert, far from it above): decode batch 96 (3 pairs an expert) 25.0 -> 19.8
  //   ms, 128 30.4 -> 20.4, 256 55.6 -> 22.3; prefill 256 55.2 -> 20.4, 384 27.4 -> 21.4; batch
  //   64 (2 pairs) 19.5 either way.
  //   FP8 (the mma.sync kernels): decode batch 96 12.5 -> 14.5 ms, 128 13.4 -> 15.3, 160 15.2 ->
  //   15.6, 192 16.6 -> 17.0, 224 (7 pairs) 18.7 -> 17.5, 256 20.3 -> 17.3; prefill 192 15.9 ->
  //   14.5, 256 19.0 -> 15.2, 384 22.6 -> 15.4.
  // MXFP4 keeps wgmma_experts_min_pairs (its mma.sync kernels at 3-4 pairs: 9.3 against 16.2 ms).
  int wgmma_bf16_experts_min_pairs = 3;
  int wgmma_fp8_experts_min_pairs = 7;
  // bf16 experts take them only below this many pairs per expert (0: no bound): from there
  // cuBLAS's grouped GEMM is faster. H200, GLM-5.2 width, 5 layers, experts of a prefill
  // (bench/results/cuda-moe-wgmma-bf16-20261203.json), cuBLAS -> wgmma: 512 tokens (16 pairs an
  // expert) 31.3 -> 18.6 ms, 2048 (64) 33.0 -> 24.2, 4096 (128) 37.4 -> 33.3, 8192 (256) 52.2 -> 57.4.
  int wgmma_bf16_experts_max_pairs = 256;
  // bf16 experts from this many pairs per expert (0: never) through the warp-specialised grouped
  // GEMMs (ops::cuda::moe_experts_specialized), ahead of the two paths above. H200, GLM-5.2 width,
  // 5 layers, experts of a prefill, the paths above -> these: 2048 tokens (64 pairs an expert)
  // 23.1 -> 19.8 ms, 4096 32.9 -> 25.8, 8192 51.0 -> 39.3.
  int specialized_bf16_experts_min_pairs = 64;
  // Tiled MXFP4 experts from this many pairs per expert (0: never) through the same GEMMs, the
  // producer widening the codes into each stage, ahead of the W4A16 GEMMs of the wgmma path (the
  // streamed kernels keep their range). H200, GLM-5.2 width (bench/results/
  // cuda-mxfp4-specialized-experts-20261204.json), 256 experts a layer, W4A16 -> these: 2048
  // tokens (64 pairs an expert) 5.34 -> 5.14 ms, 8192 (256) 13.63 -> 12.94 ms (128-row tiles);
  // prefill 1536 (48 pairs) in 5 layers 26.6 -> 29.1 ms, so not below 64.
  int specialized_mxfp4_experts_min_pairs = 64;
  // Tiled MXFP4 experts from this many pairs per expert (0: never) through the grouped GEMMs that
  // widen the codes into wgmma's A registers (ops::cuda::moe_experts_wgmma_rs), ahead of the
  // two paths above (the streamed kernels keep their range, to 32). H200, GLM-5.2 width, 256
  // experts a layer (bench/results/cuda-mxfp4-wgmma-rs-experts-20261204.json), best of the
  // paths above -> these: 1088 tokens (34 pairs) 3.76 -> 3.31 ms, 2048 5.12 -> 3.94, 8192
  // 13.04 -> 11.05; at 32 pairs even with the streamed kernels (3.31 against 3.27).
  int wgmma_rs_mxfp4_experts_min_pairs = 33;
  // Tiled MXFP4 experts from this many pairs per expert (0: never) widened to bf16 (every local
  // expert's gate/up rows into pair_gate_up, then their down rows into the same bytes) and run
  // through the bf16 warp-specialised GEMMs, ahead of the paths above: the widening is paid once
  // a layer, not once a row tile. Only a rank whose steps can bring that many pairs an expert
  // sizes pair_gate_up for it (model/cuda_memory.h): an expert-parallel rank's long prefills.
  // H200, the 78-layer EP8 rank (bench/results/cuda-widened-paired-78-layers-20261206.json),
  // prefill after 12288 cached: 8192 tokens (2048 pairs an expert) 1947 -> 1814 ms, 4096 (1024)
  // 988 -> 962 ms with the tiles paired (paired_widened_experts). 2048 tokens (512 pairs) keep
  // the register-widened GEMMs: one layer's experts there 3.26 ms widened against 3.28.
  int widened_experts_min_pairs = kDefaultWidenedExpertsMinPairs;
  // Those GEMMs over bf16 experts with an expert's row tiles two by two in thread block clusters
  // that load each weight line once for both (TMA multicast), an odd last tile split by lines
  // between the two.
  // Off: on the H200 at GLM-5.2 width, 5 layers (bench/results/cuda-paired-experts-20261204.json)
  // the experts of a prefill took 20.1 -> 22.1 ms at 2048 tokens, 24.8 -> 26.3 at 4096 and
  // 39.7 -> 39.8 at 8192: with the L2 reads halved the GEMM is bound by the tensor cores at the
  // board's power-capped clock.
  bool paired_bf16_experts = false;
  // The same GEMMs (bf16 weights, and quantised ones widened to bf16) unpaired in a block an SM
  // that claims tile after tile in order, as persistent_fp8_experts below; only where not paired.
  // On: an H100 at GLM-5.2 width, 3 layers (bench/results/cuda-fp8-persistent-experts-20261206.json)
  // read the experts of a prefill of 8192 19.51 / 19.53 -> 19.15 / 19.13 ms and the step 62.6 /
  // 63.1 -> 62.1 / 62.7 in two rounds, 2048 even; the micro-benchmark (cuda_moe_experts, one
  // layer again and again) read 8192 1% slower (9.73 -> 9.84 ms).
  bool persistent_bf16_experts = true;
  // The same for tiled MXFP4 experts (the GEMMs that widen them in the producer warpgroup). Off:
  // an H100 at GLM-5.2 width, 5 layers, one round, read their experts slower (8192 tokens 52.19
  // -> 53.04 ms, 2048 17.70 -> 17.89; same record as persistent_bf16_experts).
  bool persistent_mxfp4_experts = false;
  // The grouped GEMMs' down sums (moe_experts_wgmma, _wgmma_rs, _specialized, _wgmma_fp8) in bf16
  // rows for the combine, as transformers' bf16 experts give theirs; false: fp32. At 8192 tokens
  // GLM-5.2's sums are 1.6 GB a MoE layer in fp32, written once and read by the combine: bf16
  // takes 0.8 GB of writes and 0.8 GB of reads off each MoE layer of a long prefill. Measured at
  // GLM-5.2 width, 5 layers (bench/results/cuda-pending-options-20261205.json): prefill 8192 106.9
  // -> 106.8 and 106.3 -> 104.4 ms in two rounds (moe.combine 2.25 -> 1.74 ms); 2048 even.
  bool bf16_expert_sums = true;
  // A data-parallel rank's partial MoE rows (its experts' share of every rank's tokens) are
  // combined into bf16 rows and reduce-scattered in bf16, as vLLM and SGLang send theirs; the next
  // norm widens the summed rows as it reads them. false: fp32 rows. Halves the combine's writes
  // and the reduce-scatter's link bytes (at 8192 tokens a rank of DP8 + EP8 sends 1.4 GB a MoE
  // layer in fp32). Off: on an H100 (bench/results/cuda-bf16-reduce-scatter-20261206.json) the
  // 5-layer EP8 rank's prefill of 8192 after 12288 cached took 1 ms less on the GPU and 5% less
  // with the plan's link time, but the data-parallel layouts of the random GLM-5.2 fixture moved
  // from a median logits rel L2 of 3e-3 against one rank to 1.4e-2 (worst position 0.47-0.57,
  // from 0.03); on the CPU the same rounding of the partial rows changes greedy tokens of that
  // fixture, where rounding each token's summed output once does not (docs/performance.md).
  bool bf16_moe_reduce_scatter = kDefaultBf16MoeReduceScatter;
  // The widened experts' bf16 GEMMs (widened_experts_min_pairs) with an expert's row tiles two by
  // two in clusters, as paired_bf16_experts does for bf16 experts. On an H100 the 5-layer EP8
  // rank's prefill of 8192 after 12288 cached (2048 pairs an expert) took 118.5 / 118.8 -> 116.6 /
  // 117.7 ms (experts 37.0 / 37.2 -> 36.2 / 36.7 ms; same record as above).
  bool paired_widened_experts = true;
  // Steps of at least this many tokens (0: none) keep in bf16 the intermediates transformers'
  // bf16 model keeps in bf16, straight from cuBLAS (Gemm::linear_to_bf16): q, where q_b's weights
  // are bf16 (the absorption GEMM's input as it is; only its rope columns are rotated from there),
  // and the gate and up values of the dense MLPs and shared experts with bf16 weights (SwiGLU reads
  // them so). Otherwise they are fp32 rows, converted once read. At 8192 tokens and GLM-5.2
  // width, q is 0.5 GB a layer and a dense layer's gate/up 0.8 GB, each written and read again.
  // Measured (same record): prefill 8192 105.7 -> 104.3 and 105.2 -> 105.0 ms (attention.absorb
  // 2.45 -> 1.95 ms), 2048 33.2 -> 32.4 and 35.3 -> 34.7; with MXFP4 experts 111.5 -> 109.7 and
  // 111.0 -> 111.0 at 8192; decode steps are below 256 tokens.
  int bf16_intermediates_min_tokens = 256;
  // The same where q_b's or an MLP's gate/up weights are block FP8: cuBLASLt's block-scaled FP8
  // GEMM writes those bf16 rows itself (Fp8Gemm::linear_to_bf16), where it has such an algorithm.
  // Measured on an H200 (bench/results/cuda-ring-fp8-bf16-20261205.json, FP8 linears and experts,
  // 5 layers, two rounds): prefill 8192 91.4 -> 89.9 and 92.1 -> 90.6 ms, decode unchanged; a
  // third round (cuda-fp8-default-20261205.json) 92.0 -> 91.9, 2048 24.5 -> 24.3. The FP8 forward,
  // linear and engine tests pass with it on.
  bool fp8_bf16_intermediates = true;
  // Steps of at least this many tokens (0: none) add each block's last linear layer (o_proj, a
  // dense MLP's down, a whole model's shared expert's down; bf16 or block FP8) into the fp32
  // residual stream in the GEMM itself (cuBLAS / cuBLASLt with beta 1) where there is no
  // tensor-parallel sum to wait for, instead of writing it for the next norm (or the MoE
  // combine) to read and add. The same fp32 sums, added in another order; at 8192 tokens and
  // GLM-5.2 width each such output is 0.2 GB written and read again. Off: measured even (same
  // record: prefill 8192 105.9 -> 106.0 and 105.9 -> 104.9 ms, 2048 35.0 -> 32.9 and 35.5 ->
  // 36.4; with FP8 weights and bf16 intermediates 90.0 -> 90.4 and 90.6 -> 90.9): its norms and
  // combine lose 0.6 ms at 8192, the GEMMs that read the residual back gain about as much.
  int accumulate_residual_min_tokens = 0;
  // Block-FP8 routed experts from wgmma_experts_min_pairs pairs per expert through the W8A8
  // grouped GEMMs on the FP8 tensor cores (ops::cuda::moe_experts_wgmma_fp8: the tokens and act
  // quantised per 128 columns as the FP8 linear layers' are); false: the mma.sync kernels and,
  // above their range, each expert widened to bf16 for cuBLAS.
  bool wgmma_fp8_experts = true;
  // Those GEMMs warp-specialised: a producer warpgroup copies each stage while two consumer
  // warpgroups multiply and promote, meeting on transaction barriers instead of a block barrier
  // a step (ops::cuda::moe_experts_wgmma_fp8's warp_specialized; the same sums). H200, GLM-5.2
  // width, 5 layers, FP8 linears and experts (bench/results/cuda-fp8-specialized-experts-20261204.json),
  // experts of a prefill: 2048 tokens 16.0 -> 14.4 ms, 4096 23.2 -> 20.7, 8192 40.8 -> 34.6.
  bool specialized_fp8_experts = true;
  // Those warp-specialised GEMMs over 256 weight lines a block instead of 128 (Fp8ExpertGemm::kWide:
  // 48 KB read from L2 a step for twice the tensor work of the 128-line tile's 32 KB; the same sums
  // bit for bit). The 128-line GEMMs at 8192 tokens are bound by their copies. H100, GLM-5.2 width,
  // 5 layers, FP8 linears and experts (bench/results/cuda-fp8-wide-experts-20261206.json), experts
  // of a prefill, two rounds: 2048 tokens 15.5 -> 14.7 ms, 4096 21.0 -> 17.6, 8192 36.0 -> 29.8
  // (the step 91.7 -> 86.5 ms); with the weight lines by TMA since (another call, where the
  // cp.async tiles read 28.8 / 29.5 at 8192), 16.9 at 4096 and 27.5 at 8192.
  bool wide_fp8_experts = true;
  // Those 256-line GEMMs with an expert's row tiles two by two in clusters that load each weight
  // line once for both (TMA multicast: 32 KB from L2 a block-step instead of 48); only with
  // wide_fp8_experts. Off: slower than
  // the unpaired 256-line tiles in the same run (experts at 8192 tokens 30.7 / 31.3 against 29.8,
  // 4096 19.7 against 17.6 ms).
  bool paired_fp8_experts = false;
  // Those 256-line GEMMs unpaired in a block an SM that claims tile after tile in order, its ring
  // of stages running on into the next tile while the consumers store the last one's sums
  // (Fp8ExpertGemm::kWidePersistent; the same sums bit for bit); only with wide_fp8_experts and
  // not paired. On: experts of a prefill of 8192 tokens 25.9 -> 24.3 / 24.5 ms on an H100, 2048
  // 13.44 -> 13.32.
  bool persistent_fp8_experts = true;
  // Their grouped rows a block, 64 or 128; 0: 128 from 80 pairs per expert on average (prefill
  // 3072, 96 pairs an expert: experts MXFP4 36.7 -> 30.6 ms, bf16 31.2 -> 28.5; at 64 the two
  // within 2%).
  int wgmma_experts_tile_rows = 0;
  // Tiled MXFP4 routed experts of steps with stream_experts_min_pairs to stream_experts_max_pairs
  // pairs per expert on average (the step's routed tokens x top-k over the model's experts; max
  // 0: never) through the streamed decode kernels (ops::cuda::moe_experts_stream) instead of the
  // mma.sync and W4A16 wgmma ones, in stream_experts_shape (0 .. 4: MoeStreamShape; -1: 1 up to
  // 8 pairs per expert, the wgmma shape 4 above) with chunks of stream_experts_chunk_factor x
  // that average (8, 16 or 32 tokens). On the H200 at GLM-5.2's widths, 32 experts of a rank
  // (benchmarks/cuda_moe_experts, one run; docs/performance.md): 8 pairs an expert mma.sync
  // streamed 343 us, wgmma two-step slots 358; 16 pairs 370 against 435 (a step a slot) and 487
  // (mma.sync streamed); 31 pairs 583 against the W4A16 GEMMs' 590.
  int stream_experts_min_pairs = 5;
  int stream_experts_max_pairs = 32;
  int stream_experts_shape = -1;
  int stream_experts_chunk_factor = 2;
  // bf16 routed experts of large batches (prefill) through one cuBLAS grouped GEMM per
  // projection instead of one GEMM per expert: prefill 512 tokens 39.2 -> 36.3 ms, 2k 56.9 ->
  // 54.5 ms on the H200 at GLM-5.2 width with 5 layers (docs/performance.md).
  bool grouped_expert_gemm = true;
  // Sampled rows (RowOutput::kSample) drawn on the device (ops::cuda::sample_rows: four bytes
  // back a row, the same token as ops::sample_row draws from the same uniform value) instead of
  // copied back and drawn on the host: a batch-64 step at temperature 0.8, top_p 0.95 on the
  // H200 (GLM-5.2 width, 5 layers, 2k context) 78 -> 23 ms (docs/performance.md).
  bool sample_on_device = true;
  // Blocks that share each sampled row (1, 2, 4 or 8; more than one: a thread block cluster): one
  // block makes some 13 passes over a 154880-id row alone. On the H200 (GLM-5.2 width, 5 layers)
  // a sampled batch-1 step took 2.80 ms with 1, 2.56 with 4 or 8; batch 8 and 64 did not move.
  int sample_blocks_per_row = 4;
  // Lanes that score each cached key in the DSA indexer's decode kernel: 1 (all 32 heads' sums in
  // one thread's registers) or 4 (8 heads a lane: four times the warps for one token's launch).
  // 4 measured slower on the H200 at 16k context: batch 1 2.40 -> 2.43 ms, batch 64 21.7 -> 27.3.
  int indexer_threads_per_key = 1;
  // Decode tokens' indexer scores on the warpgroup tensor cores (ops::cuda::
  // indexer_scores_decode_wgmma; GLM-5's 32 heads of 128) instead of indexer_scores' fp32 FMAs.
  bool wgmma_decode_indexer = true;
  // That kernel's blocks no more than the SMs hold at once (IndexerScoreArgs::decode_one_wave;
  // three an SM with bf16 keys, where four an SM made a part-filled second wave from 16 tokens
  // on). H100, EP8 rank, 5 layers, two rounds: 16k context batch 16-128 0.6-1.7% faster (batch 64
  // 4.05 -> 3.99 ms, the indexer phase 0.618 -> 0.562), 2k even.
  bool indexer_decode_one_wave = true;
  // Blocks that select each token's top-k positions in steps of up to 16 tokens (1, 2, 4 or 8;
  // more than one: a thread block cluster; larger steps take one block a token, and a token of
  // at most 8192 positions the cluster's first block alone, select_top_k): one 1024-thread block
  // makes the radix passes over a 16k context alone. 4 on the H200 at 16k context: batch 1 2.37
  // -> 2.34 ms (indexer 0.18 -> 0.15).
  int indexer_topk_blocks = 4;
  // Steps of at most this many tokens run the MoE layers' shared expert on a second stream,
  // beside the router and the grouping (latency-bound launches that leave the memory bandwidth
  // idle), joined before the combine (0: never; off while a step's phases are timed). At
  // GLM-5.2 width (5 layers, 2k context, MXFP4 experts, an H100) batches 2 to 128 took 1.6-2.3%
  // less on an EP8 rank and 1.0-2.6% less on one GPU than with the shared expert on the main
  // stream (bench/results/cuda-shared-expert-overlap-20261207.json). Beside a router on cuBLAS,
  // before router_product, it had cost 2% from batch 4.
  int overlap_shared_expert_tokens = 128;
  // Steps of at most this many tokens select the indexer's positions (rope, scores, top-k) on a
  // second stream beside the queries' absorption, joined before the attention core (0: never;
  // off while a step's phases are timed): a decode token's top-k is one block (or cluster) of
  // dependent passes, the absorption a bandwidth-bound GEMV on the other SMs.
  int overlap_indexer_tokens = 64;
  // Steps of at least this many tokens score the MoE router on the bf16 tensor cores: bf16
  // router weights against the normed fp32 rows as three bf16 terms, which the post-attention
  // norm writes in place of the fp32 rows (three accumulating GEMMs, exact products in fp32);
  // shorter steps take router_product_min_tokens' kernel, or else the fp32 GEMV (1-2 tokens) or
  // cuBLAS's fp32 GEMM on the CUDA cores. At 2048 and 8192 tokens the terms took 0.07 and 0.38
  // ms a MoE layer less (bench/results/cuda-router-bf16-terms-20261204.json); from 3 tokens they
  // moved no decode step of the EP8 rank (bench/results/cuda-router-terms-decode-20261206.json).
  int router_terms_min_tokens = 256;
  // Shorter steps of at least this many tokens score the router on the bf16 tensor cores in one
  // kernel of our own (ops::cuda::router_product: the terms of the fp32 rows made in shared
  // memory, a rounded fp32 add every k16 step; twice as close to a double product as cuBLAS's
  // fp32 GEMM), where the router is bf16 and its shape fits; 1-2 tokens keep the fp32 GEMV. On an
  // H100, the 5-layer EP8 rank: steps of 4-64 tokens 0.4-2.1% faster than with cuBLAS's fp32 GEMM
  // (routing at batch 8 0.144 -> 0.089 ms over 4 MoE layers), 128 even, 1-2 tokens 0.7-1.6%
  // slower than the GEMV (bench/results/cuda-router-product-20261206.json).
  int router_product_min_tokens = 3;
  // Decode and verify step shapes captured as CUDA graphs at most; a shape first seen beyond that
  // runs eager. One GPU decoding sees at most two shapes a batch size (whether its contexts fit
  // the indexer's top-k): 512 at vLLM's 256 sequences a step (MTP verify steps add theirs).
  // Data-parallel ranks pad their batches to the largest rank's for a graph (padded_for_graph),
  // so theirs are as few; keys of each rank's own sizes (ranks that differ in tokens a sequence)
  // take at most an eighth of the bound. The bound is the same on every rank, as are the keys,
  // so the ranks stop capturing at the same step.
  int max_decode_graphs = 512;
  // Linear layers in block FP8 on the device (model/cuda/weights.h): an FP8 checkpoint's as it
  // stores them, every one (--quantization fp8), or none. Decode-sized steps multiply FP8 weights
  // with bf16 activations (ops::cuda::gemv_fp8), larger ones quantise the activations per 128
  // columns for cuBLASLt's block-scaled FP8 GEMMs.
  CudaLinearWeights linear_weights = CudaLinearWeights::kAsStored;
};

class CudaGlm5Model {
 public:
  // Uploads `weights` (the decoder layers, the head and the first MTP layer). Routed experts
  // stored as MXFP4 or block FP8 stay quantised on the device (cuda/weights.h).
  // `weights` may be a shard (model/shard.h): then `peers` join it to the rest of its layout
  // (collectives on the model's stream, so they go into captured graphs too).
  CudaGlm5Model(const ModelWeights& weights, const CudaModelOptions& options, Peers peers = {},
                const std::function<void(int, int, int64_t)>& upload_progress = {});
  // Seeded random weights of `config`, made on the device (no checkpoint): matrices uniform with
  // standard deviation 1/sqrt(fan_in), norms one, router bias small; routed experts in
  // `experts_format` (bf16, MXFP4 or block FP8) made directly in it; with options.mtp, an MTP
  // layer too; `shard`'s part only. For benchmarks at full width.
  static std::unique_ptr<CudaGlm5Model> synthetic(const io::ModelConfig& config, uint64_t seed,
                                                  const CudaModelOptions& options,
                                                  ops::WeightFormat experts_format = ops::WeightFormat::Plain,
                                                  const ModelShard& shard = {}, Peers peers = {});
  ~CudaGlm5Model();
  CudaGlm5Model(const CudaGlm5Model&) = delete;
  CudaGlm5Model& operator=(const CudaGlm5Model&) = delete;

  const io::ModelConfig& config() const;
  const CudaModelOptions& options() const;
  int64_t weight_bytes() const;  // device bytes of the weights
  int64_t cache_bytes() const;   // device bytes of the paged cache
  CudaMemoryReport memory_report() const;
  // The linear layers' matrices on the device (q_a, q_b, kv_a, o_proj, MLPs) and how many of them
  // are block FP8; the values those FP8 ones hold.
  std::pair<int, int> linear_matrices() const;
  int64_t fp8_linear_parameters() const;
  // Uses only the first `blocks` cache blocks (options().num_blocks becomes that).
  void limit_blocks(int blocks);

  // One step over `batch` (block ids index this model's device cache): writes the batch's cache
  // rows and returns logits [batch.logits_tokens.size(), vocab] fp32. Throws glms::Error when
  // the batch exceeds the options' limits. With `use_graph`, decode and verify batches (at most
  // kGraphedSequenceTokens tokens per sequence, few enough that the experts need no host
  // synchronisation: small_moe_pairs_per_expert) replay a CUDA graph captured once per batch
  // shape; the first step of a shape captures it.
  // `last_hidden`, when given, receives every token's hidden state before the final norm
  // [batch.num_tokens(), hidden] (what the MTP layer consumes).
  std::vector<float> forward(const ForwardBatch& batch, bool use_graph = false, std::vector<float>* last_hidden = nullptr);

  // The same step returning what outputs[i] asks for each logits row (StepRunner::forward_selected):
  // each row's token mask (RowOutput::mask) applied on the device, argmaxes made there, draws
  // too with options.sample_on_device, and only the kLogits rows copied back.
  StepLogits forward_selected(const ForwardBatch& batch, const std::vector<RowOutput>& outputs, bool use_graph = false,
                              std::vector<float>* last_hidden = nullptr);

  // The checkpoint's MTP layer (its cache after the decoder layers', same block ids), as
  // Glm5Model::mtp_forward(0, ...): h_prev [batch.num_tokens(), hidden] host fp32; returns the
  // draft logits and fills h_out with the block's output for chaining. Needs options.mtp and an
  // MTP layer with its own indexer (as the CPU path does).
  bool has_mtp() const;
  std::vector<float> mtp_forward(const ForwardBatch& batch, const float* h_prev, std::vector<float>* h_out);
  // The same with forward_selected's outputs.
  StepLogits mtp_forward_selected(const ForwardBatch& batch, const float* h_prev, const std::vector<RowOutput>& outputs,
                                  std::vector<float>* h_out);

  // The same step without copying logits back (they stay on the device); for timing.
  void forward_on_device(const ForwardBatch& batch, bool use_graph = false);
  void synchronize();

  // Phase timing: while on, eager steps record device events between their phases (attention
  // projections, indexer, attention core, MoE routing/shared/experts, head, ...); graph replays
  // are not split. take_phase_times returns milliseconds per phase summed over the steps run
  // since the last call, in first-seen order.
  void set_phase_timing(bool on);
  std::vector<std::pair<std::string, double>> take_phase_times();
  // Decode and verify step shapes captured as graphs so far (CudaModelOptions::max_decode_graphs).
  int captured_graphs() const;

  // Fills every cache row with seeded random values (benchmarks that need long contexts
  // without prefilling them).
  void fill_cache_random(uint64_t seed);

 private:
  struct Impl;
  explicit CudaGlm5Model(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// How a CUDA StepRunner runs its model.
struct CudaRunnerOptions {
  // CudaModelOptions::linear_weights (synthetic weights: kFp8 makes them FP8).
  CudaLinearWeights linears = CudaLinearWeights::kAsStored;
  bool cuda_graphs = true;  // decode and verify steps replay captured graphs (false: vLLM's --enforce-eager)
};

// StepRunners over CudaGlm5Model: for a loaded checkpoint (kept mapped until allocate() uploads
// it), or for seeded synthetic weights of `config`. allocate() builds the model with the
// cache shape asked for (a second call with another shape builds it again).
std::unique_ptr<StepRunner> make_cuda_runner(ModelWeights weights, Peers peers = {}, CudaRunnerOptions runner = {});
std::unique_ptr<StepRunner> make_synthetic_cuda_runner(const io::ModelConfig& config, uint64_t seed,
                                                       ops::WeightFormat experts_format = ops::WeightFormat::Plain,
                                                       const ModelShard& shard = {}, Peers peers = {},
                                                       CudaRunnerOptions runner = {});

}  // namespace glms::model
