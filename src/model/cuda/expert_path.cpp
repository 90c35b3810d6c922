#include "model/cuda/expert_path.h"

#include "model/cuda_memory.h"

namespace glms::model {

namespace cuda = ops::cuda;

int64_t small_moe_pairs_per_expert(const cuda::ExpertWeights& experts, int64_t hidden, int64_t inter) {
  return cuda::moe_experts_mma_supported(experts, hidden, inter) ? kSmallMoePairsPerExpertTensorCores
                                                                 : kSmallMoePairsPerExpert;
}

ExpertPath choose_expert_path(const CudaModelOptions& options, int64_t model_experts,
                              const cuda::ExpertWeights& experts, int64_t hidden, int64_t inter,
                              int64_t pair_capacity, const ExpertStep& step) {
  const int64_t per_expert = step.pairs_per_expert;
  const ops::WeightFormat format = experts.format;
  const bool pairs_fit = step.local_pairs <= pair_capacity;
  if (options.stream_experts_max_pairs > 0 && per_expert >= options.stream_experts_min_pairs &&
      per_expert <= options.stream_experts_max_pairs && cuda::moe_experts_stream_supported(experts, hidden, inter) &&
      pairs_fit)
    return ExpertPath::kStreamed;
  const int format_min_pairs = format == ops::WeightFormat::Plain      ? options.wgmma_bf16_experts_min_pairs
                               : format == ops::WeightFormat::Fp8Block ? options.wgmma_fp8_experts_min_pairs
                                                                       : 0;
  const int grouped_min_pairs = format_min_pairs > 0 ? format_min_pairs : options.wgmma_experts_min_pairs;
  const bool grouped = grouped_min_pairs > 0 && step.pairs >= int64_t{grouped_min_pairs} * model_experts && pairs_fit;
  // Tiled MXFP4 experts of long gathered prefills: widened to bf16 once for all their row tiles.
  if (grouped && options.widened_experts_min_pairs > 0 && per_expert >= options.widened_experts_min_pairs &&
      step.widening_fits && format == ops::WeightFormat::Mxfp4 && experts.mxfp4_tiled &&
      cuda::moe_experts_specialized_supported({ops::WeightFormat::Plain}, hidden, inter))
    return ExpertPath::kWidened;
  // The register-widening GEMMs stage their rows in pair_x as the streamed kernels do (inter <= hidden).
  if (grouped && options.wgmma_rs_mxfp4_experts_min_pairs > 0 &&
      per_expert >= options.wgmma_rs_mxfp4_experts_min_pairs && inter <= hidden &&
      cuda::moe_experts_wgmma_rs_supported(experts, hidden, inter))
    return ExpertPath::kRegisterWidened;
  const int specialized_min_pairs = format == ops::WeightFormat::Plain   ? options.specialized_bf16_experts_min_pairs
                                    : format == ops::WeightFormat::Mxfp4 ? options.specialized_mxfp4_experts_min_pairs
                                                                         : 0;
  if (grouped && specialized_min_pairs > 0 && per_expert >= specialized_min_pairs &&
      cuda::moe_experts_specialized_supported(experts, hidden, inter))
    return ExpertPath::kSpecialized;
  const bool below_bf16_bound = format != ops::WeightFormat::Plain || options.wgmma_bf16_experts_max_pairs == 0 ||
                                per_expert < options.wgmma_bf16_experts_max_pairs;
  if (grouped && below_bf16_bound && cuda::moe_experts_wgmma_supported(experts, hidden, inter))
    return ExpertPath::kGrouped;
  if (grouped && options.wgmma_fp8_experts && step.fp8_staged &&
      cuda::moe_experts_wgmma_fp8_supported(experts, hidden, inter))
    return ExpertPath::kW8a8;
  if (step.pairs <= small_moe_pairs_per_expert(experts, hidden, inter) * model_experts || !step.host_sync_ok)
    return ExpertPath::kSmall;
  return ExpertPath::kPerExpertGemms;
}

}  // namespace glms::model
