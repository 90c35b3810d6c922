// Which kernels take a step's routed experts on CUDA: the choice CudaGlm5Model makes each MoE
// layer, by CudaModelOptions' thresholds on the pairs an expert gets, apart from the launches so
// that it can be checked without a GPU.
#pragma once

#include <cstdint>

#include "model/cuda/model.h"
#include "ops/cuda/moe.h"

namespace glms::model {

// Batches whose (token, expert) pairs average at most this many per expert run the experts as
// weight-streaming kernels (no host synchronisation, graph-capturable); larger ones as
// per-expert cuBLAS GEMMs over the grouped rows. Measured at GLM-5.2 width on the H200
// (bench-step, docs/performance.md): bf16 GEMVs stream each expert once per 8 tokens, so 8;
// quantised experts on tensor cores take chunks of 64 tokens from 8 pairs per expert on, while
// the GEMM path first widens every expert to bf16 (about 45 ms per 4 MoE layers), so 64: MXFP4
// experts of a 2048-token prefill (64 pairs per expert) took 85.6 ms of 4 layers widened and
// 69.7 on tensor cores, of an 8192-token one (256 pairs) 101 widened and 282 on tensor cores.
// (kSmallMoePairsPerExpertTensorCores is in model/cuda_memory.h: it sizes the pair buffers.)
constexpr int kSmallMoePairsPerExpert = 8;

// The pairs per expert up to which a step's experts run without reading anything back to the
// host (past it choose_expert_path takes per-expert GEMMs where the host may synchronise):
// kSmallMoePairsPerExpertTensorCores for experts the tensor-core kernels take (MXFP4 in tiles,
// block FP8), else kSmallMoePairsPerExpert. Decode steps within it are captured as graphs.
int64_t small_moe_pairs_per_expert(const ops::cuda::ExpertWeights& experts, int64_t hidden, int64_t inter);

// In the order choose_expert_path tries them: the streamed kernels (MXFP4, decode-sized steps),
// tiled MXFP4 widened to bf16 once for the bf16 warp-specialised GEMMs (long gathered prefills),
// the grouped GEMMs that widen MXFP4 into wgmma's A registers, the warp-specialised grouped GEMMs,
// the grouped GEMMs with a block barrier a step, the W8A8 grouped GEMMs (FP8), the small-batch
// kernels, per-expert cuBLAS GEMMs (which read the group offsets back to the host).
enum class ExpertPath { kStreamed, kWidened, kRegisterWidened, kSpecialized, kGrouped, kW8a8, kSmall, kPerExpertGemms };

struct ExpertStep {
  int64_t pairs = 0;             // rows x top_k, every (gathered) row's
  int64_t local_pairs = 0;       // this rank's grouped pairs at most
  int64_t pairs_per_expert = 0;  // the real tokens' pairs over the model's experts
  bool host_sync_ok = true;      // false while capturing a graph
  bool fp8_staged = false;       // FP8 experts whose W8A8 staging fits the pair buffers
  bool widening_fits = false;    // pair_gate_up holds every local expert's gate/up rows in bf16
};

// `model_experts`: the model's routed experts (config.n_routed_experts); hidden and inter the
// experts' widths; pair_capacity the rows the per-pair buffers hold.
ExpertPath choose_expert_path(const CudaModelOptions& options, int64_t model_experts,
                              const ops::cuda::ExpertWeights& experts, int64_t hidden, int64_t inter,
                              int64_t pair_capacity, const ExpertStep& step);

}  // namespace glms::model
