#include "cli/model_source.h"

#include <CLI/CLI.hpp>
#include <filesystem>
#include <iostream>

#include "core/error.h"
#include "io/hf_cache.h"
#include "io/model_config.h"
#include "model/cuda_support.h"
#include "runtime/cpu_ranks.h"

#include <cstdlib>

#ifdef GLMS_HAVE_CUDA
#include "ops/cuda/cuda_ops.h"
#include "runtime/cuda_ranks.h"
#endif

namespace glms::cli {

void add_model_source_options(CLI::App* cmd, ModelSourceArgs& args) {
  cmd->add_option("--model,--model-path", args.model_dir, "Model folder (config.json, *.safetensors, tokenizer.json)");
  cmd->add_option("--device", args.device,
                  "Where the model runs: auto (the GPUs where this glmserve has CUDA and one is visible, else the "
                  "CPU), cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  cmd->add_option("--revision", args.revision,
                  "With a Hugging Face repo id as the model: the cached snapshot's branch, tag or commit (default main)");
  cmd->add_option("--download-dir", args.download_dir,
                  "With a Hugging Face repo id as the model: the hub cache it was fetched into (default $HF_HUB_CACHE, "
                  "else ~/.cache/huggingface/hub); glmserve does not download");
  cmd->add_flag("--synthetic", args.synthetic,
                "Seeded random weights of the model's config, made on the GPU (needs --device cuda; no checkpoint)");
  cmd->add_option("--config", args.config_file, "With --synthetic: take the shapes from this config.json")
      ->check(CLI::ExistingFile);
  cmd->add_option("--weight-seed", args.weight_seed, "With --synthetic: the weights' seed")->capture_default_str();
  cmd->add_option("--expert-format", args.expert_format,
                  "With --synthetic: the routed experts' storage, bf16 (default), mxfp4 (as AMD Quark's MXFP4 "
                  "checkpoints; W4A16 on the GPU) or fp8 (block E4M3, as the FP8 checkpoints): full GLM-5.2 fits "
                  "eight H200s with mxfp4 or fp8 experts, not with bf16")
      ->check(CLI::IsMember({"bf16", "mxfp4", "fp8"}));
  cmd->add_option("--num-layers", args.num_layers, "Run only the first N decoder layers")->check(CLI::Range(1, 100000));
  cmd->add_option("-q,--quantization", args.quantization,
                  "fp8: the linear layers in block FP8 on the GPU, quantised at load where the checkpoint has "
                  "them in bf16 (an FP8 checkpoint's stay FP8 without it)")
      ->check(CLI::Validator(
          [](std::string& value) -> std::string {
            if (value == "fp8") return "";
            return value + ": glmserve reads a checkpoint's own quantisation as stored (AMD Quark MXFP4 or MXFP6, "
                           "block FP8) without this flag; --quantization fp8 quantises bf16 linear layers to block FP8 "
                           "at load (glmserve quantize writes MXFP4, MXFP6 or FP8 copies)";
          },
          "fp8"));
  cmd->add_option("--tensor-parallel-size,--tp-size,--tp", args.layout.tensor_parallel,
                  "Ranks that split each attention group's heads and MLP widths (also -tp N; SGLang's --tp-size "
                  "with --enable-dp-attention counts every rank)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  cmd->add_option("--data-parallel-size,--dp-size,--dp", args.layout.data_parallel,
                  "Attention groups with their own sequences, KV cache and prefix cache (also -dp N)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  cmd->add_flag("--enable-expert-parallel", args.layout.expert_parallel,
                "Spread whole routed experts over the tensor x data parallel ranks (else each expert's width is split)");
}

namespace {

#ifdef GLMS_HAVE_CUDA
runtime::CudaRankSource cuda_source(const ModelSourceArgs& args) {
  runtime::CudaRankSource source;
  if (args.synthetic) {
    const std::filesystem::path path =
        args.config_file.empty() ? std::filesystem::path(args.model_dir) / "config.json" : std::filesystem::path(args.config_file);
    io::ModelConfig config = io::load_model_config(path);
    config.keep_first_layers(args.num_layers);
    source.synthetic_config = config;
    source.seed = args.weight_seed;
    // Synthetic weights have no stored format: bf16 linears unless --quantization fp8, routed
    // experts as --expert-format says.
    source.experts_format = args.expert_format == "mxfp4" ? ops::WeightFormat::Mxfp4
                            : args.expert_format == "fp8" ? ops::WeightFormat::Fp8Block
                                                          : ops::WeightFormat::Plain;
  } else {
    source.model_dir = args.model_dir;
    source.load.num_layers = args.num_layers;
    source.load.load_mtp = args.load_mtp;  // 1 layer's weights more on the device, only to draft with
  }
  if (args.quantization == "fp8") source.runner.linears = model::CudaLinearWeights::kFp8;
  source.runner.cuda_graphs = args.cuda_graphs;
  return source;
}
#endif

// Under mpirun: process 0 gets the executor; the others serve their ranks and end here.
LoadedModel load_across_processes(const ModelSourceArgs& args) {
#ifdef GLMS_HAVE_MPI
  LoadedModel loaded;
  loaded.processes = std::make_shared<comm::MpiWorld>();
  if (args.device == "cpu") {
    model::LoadOptions options;
    options.num_layers = args.num_layers;
    loaded.executor = runtime::make_cpu_executor_across(*loaded.processes, args.model_dir, args.layout, options);
  } else {
#ifdef GLMS_HAVE_CUDA
    loaded.executor = runtime::make_cuda_executor_across(*loaded.processes, cuda_source(args), args.layout);
#else
    fail("this glmserve was built without CUDA: rebuild where nvcc is installed (-DGLMS_CUDA=ON), or use --device cpu");
#endif
  }
  if (!loaded.executor) {  // a process that served its ranks: nothing else to do
    loaded.processes.reset();  // MPI_Finalize
    std::exit(0);
  }
  return loaded;
#else
  (void)args;
  fail("mpirun started this glmserve, which was built without MPI: rebuild where libopenmpi-dev is installed");
#endif
}

}  // namespace

void resolve_model_folder(ModelSourceArgs& args) {
  if (args.model_dir.empty()) {
    if (!args.revision.empty() || !args.download_dir.empty())
      fail("--revision and --download-dir pick a Hugging Face repo id's snapshot: give the repo id as the model");
    return;
  }
  if (!args.repo_id.empty()) return;  // resolved already
  const io::ResolvedModel model = io::resolve_model(args.model_dir, io::HubCacheEnvironment::from_environment(),
                                                    args.revision, args.download_dir);
  args.model_dir = model.folder.string();
  args.repo_id = model.repo_id;
}

std::string resolve_device(ModelSourceArgs& args) {
  if (args.device != "auto") return "";
  args.device = "cpu";
#ifdef GLMS_HAVE_CUDA
  if (ops::cuda::device_count() == 0) return "";
  const ops::cuda::GpuModel gpu = ops::cuda::gpu_model(0);
  const std::string why = model::cuda_gpu_unsupported(gpu.name, gpu.major, gpu.minor);
  if (!why.empty()) return "--device auto runs the model on the CPU: " + why;
  args.device = "cuda";
#endif
  return "";
}

LoadedModel load_model(const ModelSourceArgs& given) {
  ModelSourceArgs args = given;
  const std::string device_note = resolve_device(args);
  if (!device_note.empty()) std::cerr << "glmserve: " << device_note << "\n";
  if (args.model_dir.empty() && !(args.synthetic && !args.config_file.empty()))
    fail("give --model DIR (or --synthetic --config FILE)");
  resolve_model_folder(args);
  if (!args.config_file.empty() && !args.synthetic) {
    const std::string ext = std::filesystem::path(args.config_file).extension().string();
    if (ext == ".yaml" || ext == ".yml")
      fail("--config " + args.config_file + ": vLLM's YAML file of serve flags is not read here; give its settings "
           "as flags (`glmserve serve --help`; vLLM's names work). glmserve's --config is a config.json for "
           "--synthetic weights");
    fail("--config is for --synthetic weights; a checkpoint brings its own");
  }
  if (args.synthetic && args.device != "cuda")
    fail("--synthetic makes its weights on the GPU: add --device cuda");
  if (!args.expert_format.empty() && !args.synthetic)
    fail("--expert-format " + args.expert_format +
         " is for --synthetic weights: a checkpoint's experts keep their stored format (glmserve quantize writes "
         "MXFP4 or FP8 copies)");
  if (!args.quantization.empty() && args.device != "cuda")
    fail("--quantization " + args.quantization +
         " is for --device cuda: the CPU path runs a checkpoint in its stored format (quantise one with "
         "glmserve quantize)");
  LoadedModel loaded;
  if (comm::launched_by_mpirun()) return load_across_processes(args);
  if (args.device == "cpu") {
    model::LoadOptions options;
    options.num_layers = args.num_layers;
    loaded.executor = runtime::make_cpu_executor(args.model_dir, args.layout, options);
    return loaded;
  }
#ifdef GLMS_HAVE_CUDA
  try {
    loaded.executor = runtime::make_cuda_executor(cuda_source(args), args.layout);
  } catch (const Error& e) {
    if (given.device != "auto") throw;
    fail(std::string(e.what()) + " (--device auto chose the GPU; --device cpu runs the model on the CPU)");
  }
  return loaded;
#else
  fail("this glmserve was built without CUDA: rebuild where nvcc is installed (-DGLMS_CUDA=ON), or use --device cpu");
#endif
}

}  // namespace glms::cli
