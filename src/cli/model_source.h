// Where generate and serve get their model from: a checkpoint on the CPU, a checkpoint uploaded
// to a CUDA device, or seeded synthetic weights of a config made on the device
// (--device cpu|cuda, --synthetic, --config, --num-layers, --weight-seed).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "model/glm5.h"
#include "model/step_runner.h"

namespace CLI { class App; }

namespace glms::cli {

struct ModelSourceArgs {
  std::string model_dir;    // checkpoint folder (config.json, *.safetensors, tokenizer.json)
  std::string config_file;  // with --synthetic: shapes from this config.json instead of the folder's
  std::string device = "cpu";
  bool synthetic = false;
  uint64_t weight_seed = 1;
  int num_layers = -1;
  bool load_mtp = false;    // also upload the checkpoint's MTP layer to the device (commands that speculate
                            // set it; the CPU path always maps it)
};

// Registers the options on `cmd`; --model is required unless --synthetic --config is given.
void add_model_source_options(CLI::App* cmd, ModelSourceArgs& args);

struct LoadedModel {
  std::unique_ptr<model::Glm5Model> cpu_model;  // set on the CPU
  std::unique_ptr<model::StepRunner> runner;
  const io::ModelConfig& config() const { return runner->config(); }
};

// Loads or makes the model the arguments name. Throws glms::Error with what to do (no CUDA in
// this build, --synthetic without --device cuda, ...).
LoadedModel load_model(const ModelSourceArgs& args);

}  // namespace glms::cli
