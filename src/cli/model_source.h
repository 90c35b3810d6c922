// Where generate and serve get their model from: a checkpoint on the CPU, a checkpoint uploaded
// to CUDA devices, or seeded synthetic weights of a config made on the devices (--device
// cpu|cuda, --synthetic, --config, --num-layers, --weight-seed), under a parallel layout
// (--tensor-parallel-size/-tp, --data-parallel-size/-dp, --enable-expert-parallel).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "comm/mpi_world.h"
#include "runtime/executor.h"
#include "runtime/layout.h"

namespace CLI { class App; }

namespace glms::cli {

struct ModelSourceArgs {
  std::string model_dir;    // checkpoint folder (config.json, *.safetensors, tokenizer.json); a Hugging Face
                            // repo id until resolve_model_folder turns it into its cached snapshot
  std::string repo_id;      // set by resolve_model_folder when model_dir came from a repo id
  std::string revision;     // with a repo id: a branch, tag or commit of the cached repo (vLLM's --revision)
  std::string download_dir;  // with a repo id: the hub cache to look in (vLLM's --download-dir)
  std::string config_file;  // with --synthetic: shapes from this config.json instead of the folder's
  std::string device = "auto";  // auto, cpu or cuda (resolve_device turns auto into one of them)
  bool synthetic = false;
  uint64_t weight_seed = 1;
  int num_layers = -1;
  std::string quantization;  // "fp8": every linear layer in block FP8 on the GPU (vLLM's --quantization)
  std::string expert_format;  // with --synthetic: the routed experts' storage, bf16, mxfp4 or fp8 ("": bf16)
  bool cuda_graphs = true;  // decode steps replay CUDA graphs (vLLM's --enforce-eager: false)
  bool load_mtp = false;    // also upload the checkpoint's MTP layer to the device (commands that speculate
                            // set it; the CPU path always maps it)
  runtime::ParallelLayout layout;
};

// Registers the options on `cmd`; --model is required unless --synthetic --config is given.
void add_model_source_options(CLI::App* cmd, ModelSourceArgs& args);

struct LoadedModel {
  std::shared_ptr<comm::ProcessGroup> processes;  // under mpirun; outlives the executor
  std::unique_ptr<runtime::Executor> executor;    // every rank of the layout
  const io::ModelConfig& config() const { return executor->config(); }
};

// A given model_dir that is not a local folder is taken as a Hugging Face repo id and replaced by its
// snapshot in the hub cache (io/hf_cache.h), recording repo_id. Throws glms::Error with where it
// looked and the command that fetches the model when neither is there.
void resolve_model_folder(ModelSourceArgs& args);

// --device auto: cuda where this glmserve was built with CUDA and a GPU that runs its kernels is
// visible (model/cuda_support.h), else cpu (as vLLM picks its device); returns a note to print
// where a GPU is visible but cannot run them. cpu and cuda stay as given.
std::string resolve_device(ModelSourceArgs& args);

// Loads or makes the model the arguments name (the device resolved as resolve_device does). Throws glms::Error with what to do (no CUDA in
// this build, --synthetic without --device cuda, ...). Under mpirun (one process per node) the
// layout's ranks spread over the processes: process 0 returns, the others serve their ranks until
// process 0 is done and then end the program (docs/parallelism.md).
LoadedModel load_model(const ModelSourceArgs& args);

}  // namespace glms::cli
