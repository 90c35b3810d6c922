// glmserve bench-step's command line: the shapes to time, the model's kernel paths, a simulated
// rank of a parallel layout, and where the record goes (the run: bench_step_run.cpp).
#include <CLI/CLI.hpp>

#include <memory>

#include "bench/workload.h"
#include "cli/bench_step.h"
#include "cli/commands.h"
#include "cli/validators.h"
#include "core/error.h"

namespace glms::cli {

namespace {

// What to time: the model and its depth, the decode and prefill points, how each is measured.
void add_step_options(CLI::App* cmd, BenchStepOptions* o) {
  auto* model = cmd->add_option("--model", o->model_dir,
                                "Model folder (its config.json gives the shapes), or a Hugging Face repo id in the "
                                "hub cache")
                    ->transform(local_path_or_cached_repo())
                    ->check(CLI::ExistingDirectory);
  auto* config = cmd->add_option("--config", o->config_file, "A config.json file")->check(CLI::ExistingFile);
  model->excludes(config);
  cmd->add_flag("--synthetic", o->synthetic, "Seeded random weights made on the GPU (no checkpoint)");
  cmd->add_option("--num-layers", o->num_layers, "Keep the first N decoder layers")->check(CLI::Range(1, 1000));
  cmd->add_option("--batch", o->batches, "Decode batch sizes")->delimiter(',')->check(CLI::Range(1, 4096))->capture_default_str();
  cmd->add_option("--context", o->contexts, "Decode context lengths")->delimiter(',')->check(CLI::Range(1, 1 << 20))->capture_default_str();
  cmd->add_option("--prefill", o->prefills, "Prefill prompt lengths")->delimiter(',')->check(CLI::Range(1, 1 << 20))->capture_default_str();
  cmd->add_option("--prefill-context", o->prefill_context,
                  "Each prefill runs after this many cached positions (as a prefix-cache hit leaves them): its "
                  "indexer scores and its attention's selections span them too")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--steps", o->steps, "Timed decode steps per point")->check(CLI::Range(1, 100000))->capture_default_str();
  cmd->add_option("--graphs", o->graphs, "Replay decode steps as CUDA graphs (true/false)")->capture_default_str();
  cmd->add_flag("--profile-step", o->profile_step,
                "Run one eager decode step of the first point between cudaProfilerStart and cudaProfilerStop "
                "(for ncu --profile-from-start off)");
  cmd->add_flag("--profile-prefill", o->profile_prefill,
                "Run one prefill of the first --prefill length between cudaProfilerStart and cudaProfilerStop "
                "(for ncu --profile-from-start off)");
  cmd->add_option("--seed", o->seed, "Weight seed")->capture_default_str();
  cmd->add_option("--speculative-steps", o->speculative_steps,
                  "Also time MTP speculation with K drafts (synthetic MTP layer): verify and draft steps, break-even "
                  "acceptance length")
      ->check(CLI::Range(0, 16))
      ->capture_default_str();
  cmd->add_option("--project-layers", o->project_layers,
                  "Depth the speculation break-even is projected to (default: the config's num_hidden_layers)")
      ->check(CLI::Range(1, 1000));
}

// The kernel paths of the linear layers, the attention and the indexer.
void add_linear_and_attention_options(CLI::App* cmd, BenchStepOptions* o) {
  cmd->add_option("--gemv-tokens", o->kernels.small_batch_gemv_tokens,
                  "Linear layers of at most N tokens through glmserve's GEMV instead of cuBLAS (0: never, at most 4)")
      ->check(CLI::Range(0, 4))
      ->capture_default_str();
  cmd->add_option("--skinny-gemm-tokens", o->kernels.skinny_gemm_tokens,
                  "Linear layers of more tokens than the GEMV takes, up to N, through glmserve's tensor-core "
                  "skinny GEMM instead of cuBLAS (0: never, at most 128)")
      ->check(CLI::Range(0, 128))
      ->capture_default_str();
  cmd->add_option("--skinny-group-tokens", o->kernels.skinny_group_tokens,
                  "The attention's groups of projections over the same input, up to N tokens, through the skinny "
                  "GEMM (0: never, at most 128)")
      ->check(CLI::Range(0, 128))
      ->capture_default_str();
  cmd->add_option("--fused-attention-min-tokens", o->kernels.fused_attention_min_tokens,
                  "Decode batches of at least N tokens attend in one fused pass, smaller ones through gathered-row "
                  "GEMMs (0: always fused)")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--fused-prefill-attention", o->kernels.fused_prefill_attention,
                  "Long prefill chunks whose context is long against the top-k attend in the fused pass over each "
                  "token's top-k rows (true/false; false: always dense scores over the causal extent)")
      ->capture_default_str();
  cmd->add_option("--wgmma-attention", o->kernels.wgmma_attention,
                  "Fused attention passes with a block per token on Hopper's warpgroup tensor cores (true/false; "
                  "false: the mma.sync kernel)")
      ->capture_default_str();
  cmd->add_option("--wgmma-attention-splits", o->kernels.wgmma_attention_splits,
                  "The wgmma pass also for decode batches of fewer tokens than SMs, each token's rows split over "
                  "blocks (true/false; false: those take the mma.sync kernel)")
      ->capture_default_str();
  cmd->add_option("--warp-specialized-attention", o->kernels.warp_specialized_attention,
                  "The wgmma pass over bf16 rows without splits in the warp-specialised kernel: a producer warpgroup "
                  "gathers rows into two stages while two consumers score 32 rows each (true/false)")
      ->capture_default_str();
  cmd->add_option("--persistent-attention", o->kernels.persistent_attention,
                  "The two-stage attention kernel's prefill chunks in a block an SM taking token after token, the "
                  "next token's rows and queries landing while this one's last steps run (true/false; false: a block "
                  "a token)")
      ->capture_default_str();
  cmd->add_option("--paired-attention", o->kernels.paired_attention,
                  "The persistent kernel over pairs of stages, each consumer scoring a whole 64-row stage "
                  "(true/false; false: each consumer scores 32 rows of every stage)")
      ->capture_default_str();
  cmd->add_option("--attention-ring-stages", o->kernels.attention_ring_stages,
                  "The warp-specialised attention kernel with a ring of four 32-row stages whose steps its two "
                  "consumers score in turn (true/false; false: two 64-row stages, each consumer scoring half of every "
                  "step)")
      ->capture_default_str();
  cmd->add_option("--fused-projection-rows-max-tokens", o->kernels.fused_projection_rows_max_tokens,
                  "Steps of at most this many tokens write q_a's norm, the latent cache row and the indexer key after "
                  "the attention's first projections in one launch instead of three (0: never)")
      ->check(non_negative_number())
      ->capture_default_str();
  cmd->add_option("--reuse-step-selection", o->kernels.reuse_step_selection,
                  "Where every context fits the indexer's top-k, one top-k launch a step instead of one a layer "
                  "(true/false)")
      ->capture_default_str();
  cmd->add_option("--attention-cluster-splits", o->kernels.attention_cluster_splits,
                  "Decode tokens' splits of bf16 rows as one thread block cluster where they are at most N (2-16), "
                  "merged through distributed shared memory in the same launch (0: always partials and a merge "
                  "launch)")
      ->check(CLI::IsMember({0, 2, 4, 8, 16}))
      ->capture_default_str();
  cmd->add_option("--wgmma-decode-indexer", o->kernels.wgmma_decode_indexer,
                  "Decode tokens' indexer scores on the warpgroup tensor cores (true/false; false: fp32 FMAs, a "
                  "key a thread)")
      ->capture_default_str();
  cmd->add_option("--indexer-decode-one-wave", o->kernels.indexer_decode_one_wave,
                  "The decode indexer's tensor-core kernel in no more blocks than the SMs hold at once (true/false)")
      ->capture_default_str();
  cmd->add_option("--wgmma-indexer", o->kernels.wgmma_indexer,
                  "Long prefill chunks' indexer scores on the warpgroup tensor cores, fused with the sum over heads "
                  "(true/false; false: a TF32 GEMM through per-head products in memory)")
      ->capture_default_str();
  cmd->add_option("--fp8-prefill-indexer", o->kernels.fp8_prefill_indexer,
                  "Those indexer scores with E4M3 queries and keys on the FP8 tensor cores (true/false; DeepSeek-V3.2's "
                  "FP8 indexer)")
      ->capture_default_str();
}

// Which grouped GEMMs the routed experts take, by format and pairs per expert.
void add_expert_gemm_thresholds(CLI::App* cmd, BenchStepOptions* o) {
  cmd->add_option("--wgmma-experts-min-pairs", o->kernels.wgmma_experts_min_pairs,
                  "Routed experts (tiled MXFP4 or bf16) run as grouped GEMMs on the warpgroup tensor cores from this "
                  "many pairs per expert on average (0: never)")
      ->check(non_negative_number())
      ->capture_default_str();
  cmd->add_option("--wgmma-bf16-experts-min-pairs", o->kernels.wgmma_bf16_experts_min_pairs,
                  "bf16 routed experts take those GEMMs from this many pairs per expert instead (0: as "
                  "--wgmma-experts-min-pairs)")
      ->check(non_negative_number())
      ->capture_default_str();
  cmd->add_option("--wgmma-fp8-experts-min-pairs", o->kernels.wgmma_fp8_experts_min_pairs,
                  "Block-FP8 routed experts take the W8A8 grouped GEMMs from this many pairs per expert (0: as "
                  "--wgmma-experts-min-pairs)")
      ->check(non_negative_number())
      ->capture_default_str();
  cmd->add_option("--wgmma-bf16-experts-max-pairs", o->kernels.wgmma_bf16_experts_max_pairs,
                  "bf16 routed experts take those GEMMs only below this many pairs per expert (0: no bound; above, "
                  "cuBLAS's grouped GEMM)")
      ->check(non_negative_number())
      ->capture_default_str();
  cmd->add_option("--specialized-bf16-experts-min-pairs", o->kernels.specialized_bf16_experts_min_pairs,
                  "bf16 routed experts from this many pairs per expert take the warp-specialised grouped GEMMs (0: "
                  "never)")
      ->check(non_negative_number())
      ->capture_default_str();
  cmd->add_option("--specialized-mxfp4-experts-min-pairs", o->kernels.specialized_mxfp4_experts_min_pairs,
                  "Tiled MXFP4 routed experts from this many pairs per expert take the warp-specialised grouped GEMMs, "
                  "widened by their producer (0: never)")
      ->check(non_negative_number())
      ->capture_default_str();
  cmd->add_option("--wgmma-rs-mxfp4-experts-min-pairs", o->kernels.wgmma_rs_mxfp4_experts_min_pairs,
                  "Tiled MXFP4 routed experts from this many pairs per expert take the grouped GEMMs that widen the "
                  "codes into wgmma's A registers (0: never)")
      ->check(non_negative_number())
      ->capture_default_str();
  cmd->add_option("--widened-experts-min-pairs", o->kernels.widened_experts_min_pairs,
                  "Tiled MXFP4 routed experts from this many pairs per expert are widened to bf16 once a layer and "
                  "take the bf16 warp-specialised grouped GEMMs, where the rank holds the buffer (0: never)")
      ->check(non_negative_number())
      ->capture_default_str();
}

// The expert GEMMs' pairing, and where the MoE and the MLPs keep bf16 values.
void add_expert_pairing_and_precision(CLI::App* cmd, BenchStepOptions* o) {
  cmd->add_option("--paired-bf16-experts", o->kernels.paired_bf16_experts,
                  "Those GEMMs take an expert's row tiles two by two in thread block clusters that load each weight "
                  "line once for both (TMA multicast; true/false)")
      ->capture_default_str();
  cmd->add_option("--paired-widened-experts", o->kernels.paired_widened_experts,
                  "The widened experts' GEMMs take an expert's row tiles two by two the same way (true/false)")
      ->capture_default_str();
  cmd->add_option("--bf16-expert-sums", o->kernels.bf16_expert_sums,
                  "The grouped expert GEMMs of prefills write their down sums in bf16 for the combine (true/false; "
                  "false: fp32)")
      ->capture_default_str();
  cmd->add_option("--bf16-moe-reduce-scatter", o->kernels.bf16_moe_reduce_scatter,
                  "A data-parallel rank combines its experts' partial rows into bf16 and reduce-scatters them in bf16 "
                  "(true/false; false: fp32); the projections count the link bytes so")
      ->capture_default_str();
  cmd->add_option("--bf16-intermediates-min-tokens", o->kernels.bf16_intermediates_min_tokens,
                  "Steps of at least this many tokens keep q and the MLPs' gate/up values in bf16 straight from the "
                  "GEMMs where those weights are bf16 (0: never)")
      ->check(non_negative_number())
      ->capture_default_str();
  cmd->add_option("--fp8-bf16-intermediates", o->kernels.fp8_bf16_intermediates,
                  "The same where those weights are block FP8: cuBLASLt's FP8 GEMM writes the bf16 rows (true/false)")
      ->capture_default_str();
  cmd->add_option("--accumulate-residual-min-tokens", o->kernels.accumulate_residual_min_tokens,
                  "Steps of at least this many tokens add o_proj and the MLPs' down projections (bf16 or block-FP8 "
                  "weights, no tensor parallelism) into the residual stream in the GEMM itself (0: never)")
      ->check(non_negative_number())
      ->capture_default_str();
}

// The FP8 expert GEMMs' forms, persistent blocks, and the grouped GEMMs' tile rows.
void add_expert_gemm_shapes(CLI::App* cmd, BenchStepOptions* o) {
  cmd->add_option("--wgmma-fp8-experts", o->kernels.wgmma_fp8_experts,
                  "Block-FP8 routed experts take W8A8 grouped GEMMs on the FP8 tensor cores from those pairs per "
                  "expert (true/false; false: mma.sync kernels, then each expert widened to bf16 for cuBLAS)")
      ->capture_default_str();
  cmd->add_option("--specialized-fp8-experts", o->kernels.specialized_fp8_experts,
                  "Those GEMMs warp-specialised: a producer warpgroup copies while two consumer warpgroups multiply "
                  "(true/false)")
      ->capture_default_str();
  cmd->add_option("--wide-fp8-experts", o->kernels.wide_fp8_experts,
                  "Those warp-specialised GEMMs over 256 weight lines a block instead of 128 (true/false)")
      ->capture_default_str();
  cmd->add_option("--paired-fp8-experts", o->kernels.paired_fp8_experts,
                  "Those 256-line GEMMs with an expert's row tiles two by two in clusters that load each weight "
                  "line once for both (true/false; only with --wide-fp8-experts true)")
      ->capture_default_str();
  cmd->add_option("--persistent-bf16-experts", o->kernels.persistent_bf16_experts,
                  "The bf16 expert GEMMs (bf16 or widened weights) unpaired in a block an SM that claims tile after "
                  "tile (true/false; not where --paired-bf16-experts or, widened, --paired-widened-experts pairs them)")
      ->capture_default_str();
  cmd->add_option("--persistent-mxfp4-experts", o->kernels.persistent_mxfp4_experts,
                  "The MXFP4 expert GEMMs of prefill in a block an SM that claims tile after tile (true/false)")
      ->capture_default_str();
  cmd->add_option("--persistent-fp8-experts", o->kernels.persistent_fp8_experts,
                  "Those 256-line GEMMs unpaired in a block an SM that claims tile after tile (true/false; only with "
                  "--wide-fp8-experts true)")
      ->capture_default_str();
  cmd->add_option("--wgmma-experts-tile-rows", o->kernels.wgmma_experts_tile_rows,
                  "Grouped rows a block of those GEMMs: 64, 128, or 0 (128 from 80 pairs per expert)")
      ->check(CLI::IsMember({0, 64, 128}))
      ->capture_default_str();
}

// The streamed decode kernels of MXFP4 experts, and cuBLAS's grouped GEMM for large bf16 batches.
void add_streamed_expert_options(CLI::App* cmd, BenchStepOptions* o) {
  cmd->add_option("--stream-experts-min-pairs", o->kernels.stream_experts_min_pairs,
                  "MXFP4 routed experts of steps with from this many pairs per expert on average run on the streamed "
                  "decode kernels")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
  cmd->add_option("--stream-experts-max-pairs", o->kernels.stream_experts_max_pairs,
                  "... up to this many pairs per expert on average (0: never)")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
  cmd->add_option("--stream-experts-shape", o->kernels.stream_experts_shape,
                  "Their shape: mma.sync 0 (1 row fragment a warp, 8 steps in flight, 4 warps a block), 1 (2, 6, 4), "
                  "2 (1, 6, 8); wgmma 3 (6 steps, 8 warps), 4 (3 slots of 2 steps, 8 warps); or -1 (1 up to 8 pairs "
                  "per expert, 4 above)")
      ->check(CLI::IsMember({-1, 0, 1, 2, 3, 4}))
      ->capture_default_str();
  cmd->add_option("--stream-experts-chunk-factor", o->kernels.stream_experts_chunk_factor,
                  "Their token chunk: this many times the average pairs per expert (8, 16 or 32 tokens)")
      ->check(CLI::Range(1, 8))
      ->capture_default_str();
  cmd->add_option("--grouped-expert-gemm", o->kernels.grouped_expert_gemm,
                  "bf16 experts of large batches through one cuBLAS grouped GEMM per projection (true/false)")
      ->capture_default_str();
}

// The routed experts' kernel paths by format and pairs per expert.
void add_expert_options(CLI::App* cmd, BenchStepOptions* o) {
  add_expert_gemm_thresholds(cmd, o);
  add_expert_pairing_and_precision(cmd, o);
  add_expert_gemm_shapes(cmd, o);
  add_streamed_expert_options(cmd, o);
}

// Sampling on the device, the decode indexer's shape and the shared expert's second stream.
void add_sampling_and_overlap_options(CLI::App* cmd, BenchStepOptions* o) {
  cmd->add_option("--sample-on-device", o->kernels.sample_on_device,
                  "Sampled rows drawn on the GPU (true/false) instead of copied back and drawn on the host")
      ->capture_default_str();
  cmd->add_option("--sample-blocks-per-row", o->kernels.sample_blocks_per_row,
                  "Blocks (a thread block cluster) that draw each sampled row on the GPU: 1, 2, 4 or 8")
      ->check(CLI::IsMember({1, 2, 4, 8}))
      ->capture_default_str();
  cmd->add_option("--indexer-threads-per-key", o->kernels.indexer_threads_per_key,
                  "Lanes that score each cached key in the DSA indexer: 1 or 4")
      ->check(CLI::IsMember({1, 4}))
      ->capture_default_str();
  cmd->add_option("--indexer-topk-blocks", o->kernels.indexer_topk_blocks,
                  "Blocks (a thread block cluster) that select each token's top-k positions in steps of up to 16 tokens: 1, 2, 4 or 8")
      ->check(CLI::IsMember({1, 2, 4, 8}))
      ->capture_default_str();
  cmd->add_option("--overlap-shared-expert-tokens", o->kernels.overlap_shared_expert_tokens,
                  "Steps of at most this many tokens run the MoE shared expert on a second stream beside the routing "
                  "(0: never; untimed steps only)")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--router-terms-min-tokens", o->kernels.router_terms_min_tokens,
                  "Steps of at least this many tokens score the MoE router as three bf16 terms on the tensor cores "
                  "(shorter ones in fp32 on the CUDA cores)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--router-product-min-tokens", o->kernels.router_product_min_tokens,
                  "Shorter steps of at least this many tokens score the MoE router on the bf16 tensor cores in one "
                  "kernel (ops::cuda::router_product), the rest on the CUDA cores in fp32")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--overlap-indexer-tokens", o->kernels.overlap_indexer_tokens,
                  "Steps of at most this many tokens select the DSA indexer's positions on a second stream beside the "
                  "queries' absorption (0: never; untimed steps only)")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
}

// The weights' and cache's formats, a simulated rank of a layout, the memory the cache may fill and
// the token masks' host work.
void add_weight_and_layout_options(CLI::App* cmd, BenchStepOptions* o) {
  cmd->add_option("-q,--quantization", o->quantization,
                  "fp8: the linear layers in block FP8 (serve's flag); none: bf16 (the default)")
      ->check(CLI::IsMember({"none", "fp8"}));
  cmd->add_option("--kv-cache-dtype", o->kv_cache_dtype,
                  "The cache's rows: auto (bf16) or fp8 / fp8_e4m3 (E4M3 with a scale per 128 values, serve's flag)")
      ->check(CLI::IsMember({"auto", "fp8", "fp8_e4m3", "fp8_ds_mla"}))
      ->capture_default_str();
  cmd->add_option("--expert-format", o->expert_format, "Routed experts' storage: bf16, mxfp4 (W4A16) or fp8 (block E4M3)")
      ->check(CLI::IsMember({"bf16", "mxfp4", "fp8"}))
      ->capture_default_str();
  cmd->add_option("--simulate-rank", o->simulation.rank,
                  "Run exactly what this rank of --world does (its experts, heads and batch), collectives as "
                  "device copies plus their time at the link bandwidth")
      ->check(CLI::Range(0, 4095));
  cmd->add_option("--world", o->simulation.world, "Ranks of the simulated layout")->check(CLI::Range(1, 4096));
  cmd->add_option("--tensor-parallel-size", o->simulation.flags.tensor_parallel,
                  "The simulated layout in vLLM's terms (also -tp N; overrides --world/--layout)")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--data-parallel-size", o->simulation.flags.data_parallel, "The simulated layout's DP size (also -dp N)")
      ->check(CLI::Range(1, 1024));
  cmd->add_flag("--enable-expert-parallel", o->simulation.flags.expert_parallel,
                "The simulated layout spreads whole experts over its ranks");
  cmd->add_option("--layout", o->simulation.layout,
                  "Simulated layout: dp-ep (DP attention, EP MoE), tp (experts split by width) or tp-ep")
      ->check(CLI::IsMember({"dp-ep", "tp", "tp-ep"}))
      ->capture_default_str();
  cmd->add_option("--project-workload", o->project_workload,
                  "With --simulate-rank: the bench preset whose prompts and outputs the decode and the last prefill "
                  "project to, in output tok/s per GPU")
      ->check(CLI::IsMember(bench::preset_names()))
      ->capture_default_str();
  cmd->add_option("--gpu-memory-utilization", o->gpu_memory_utilization,
                  "Fraction of the GPU the weights, workspaces and cache may fill (more sequences share cache blocks)")
      ->check(CLI::Range(0.05, 1.0))
      ->capture_default_str();
  cmd->add_option("--token-mask-host-us", o->token_mask_host_us,
                  "The token-masked rows' masks are made on demand after this many microseconds of host work "
                  "each (as a structured output's new grammar state costs), overlapping the step's forward")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
}

}  // namespace

void add_bench_step_command(CLI::App& app) {
  auto o = std::make_shared<BenchStepOptions>();
  CLI::App* cmd = app.add_subcommand(
      "bench-step", "Time CUDA forward steps (decode by batch and context, prefill by length) against the hardware limits");
  add_step_options(cmd, o.get());
  add_linear_and_attention_options(cmd, o.get());
  add_expert_options(cmd, o.get());
  add_sampling_and_overlap_options(cmd, o.get());
  add_weight_and_layout_options(cmd, o.get());
  cmd->add_option("--json", o->json_out, "Write the results as JSON to this file");
  cmd->callback([o] {
    if (o->model_dir.empty() && o->config_file.empty()) fail("give --config FILE or --model DIR");
    run_bench_step(*o);
  });
}

}  // namespace glms::cli
