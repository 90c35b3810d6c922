// glmserve inspect: what a model folder (or a bare config.json) holds: sizes, layer kinds,
// parameters by kind, and the weight memory of each storage format.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "io/model_config.h"
#include "io/safetensors.h"
#include "cli/validators.h"
#include "model/inventory.h"

namespace glms::cli {

namespace {

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  int unit = 0;
  while (bytes >= 1000.0 && unit < 4) { bytes /= 1000.0; ++unit; }
  char text[32];
  std::snprintf(text, sizeof(text), unit == 0 ? "%.0f %s" : "%.2f %s", bytes, units[unit]);
  return text;
}

std::string human_count(double n) {
  const char* units[] = {"", "K", "M", "B", "T"};
  int unit = 0;
  while (n >= 1000.0 && unit < 4) { n /= 1000.0; ++unit; }
  char text[32];
  std::snprintf(text, sizeof(text), unit == 0 ? "%.0f%s" : "%.2f%s", n, units[unit]);
  return text;
}

std::string layer_kinds(const io::ModelConfig& c) {
  std::string kinds;
  for (int l = 0; l < c.num_hidden_layers; ++l) kinds += c.layer_is_moe[l] ? (c.indexer_full[l] ? 'M' : 'm')
                                                                          : (c.indexer_full[l] ? 'D' : 'd');
  return kinds;
}

void run_inspect(const std::string& path, bool json) {
  const io::ModelConfig c = io::load_model_config(path);
  const model::Inventory inventory = model::parameter_inventory(c);
  int64_t stored_bytes = -1, stored_tensors = 0;
  const std::filesystem::path folder = std::filesystem::is_directory(path) ? std::filesystem::path(path)
                                                                           : std::filesystem::path(path).parent_path();
  bool has_weights = false;
  for (const auto& entry : std::filesystem::directory_iterator(folder.empty() ? "." : folder))
    has_weights |= entry.path().extension() == ".safetensors";
  if (has_weights) {
    const io::Checkpoint checkpoint = io::Checkpoint::open(folder);
    stored_bytes = static_cast<int64_t>(checkpoint.total_bytes());
    stored_tensors = static_cast<int64_t>(checkpoint.names().size());
  }
  const char* formats[] = {"bf16", "fp8", "mxfp6", "mxfp4"};

  if (json) {
    nlohmann::json out;
    out["model_type"] = c.model_type;
    out["parameters"] = inventory.total();
    out["active_parameters_per_token"] = inventory.active_per_token(c);
    out["layers"] = c.num_hidden_layers;
    out["layer_kinds"] = layer_kinds(c);
    out["full_indexer_layers"] = c.num_full_indexer_layers();
    out["mtp_layers"] = c.num_nextn_predict_layers;
    for (const auto& g : inventory.groups) out["parameter_groups"][g.name] = g.parameters;
    for (const char* f : formats) out["weight_bytes"][f] = inventory.weight_bytes(f);
    if (stored_bytes >= 0) {
      out["checkpoint_bytes"] = stored_bytes;
      out["checkpoint_tensors"] = stored_tensors;
    }
    std::cout << out.dump(2) << std::endl;
    return;
  }
  std::printf("model        %s (%s)\n", path.c_str(), c.model_type.c_str());
  std::printf("parameters   %s total, %s active per token (top-%d of %d experts)\n",
              human_count(inventory.total()).c_str(), human_count(inventory.active_per_token(c)).c_str(),
              c.num_experts_per_tok, c.n_routed_experts);
  std::printf("shape        hidden %d, vocab %d, %d heads, q_lora %d, kv_lora %d + rope %d, v_head %d\n",
              c.hidden_size, c.vocab_size, c.num_attention_heads, c.q_lora_rank, c.kv_lora_rank, c.qk_rope_head_dim,
              c.v_head_dim);
  std::printf("layers       %d: %s\n", c.num_hidden_layers, layer_kinds(c).c_str());
  std::printf("             (D/d dense MLP, M/m MoE; upper case runs its own indexer, lower case shares top-k)\n");
  std::printf("indexer      %d full of %d layers, %d heads x %d, top-%d\n", c.num_full_indexer_layers(),
              c.num_hidden_layers, c.index_n_heads, c.index_head_dim, c.index_topk);
  std::printf("MoE          %d routed + %d shared experts, inter %d, groups %d (keep %d), scaling %.2f\n",
              c.n_routed_experts, c.n_shared_experts, c.moe_intermediate_size, c.n_group, c.topk_group,
              c.routed_scaling_factor);
  std::printf("MTP layers   %d\n", c.num_nextn_predict_layers);
  std::printf("KV cache     %s per token (bf16 latent + rope on every layer, indexer keys on full layers)\n",
              human_bytes(2.0 * (static_cast<double>(c.kv_lora_rank + c.qk_rope_head_dim) * c.num_hidden_layers +
                                 static_cast<double>(c.index_head_dim) * c.num_full_indexer_layers()))
                  .c_str());
  std::printf("\nparameters by kind\n");
  for (const auto& g : inventory.groups)
    if (g.parameters > 0) std::printf("  %-16s %12s\n", g.name.c_str(), human_count(g.parameters).c_str());
  std::printf("\nweight memory by format (MX formats on MLP/expert weights; MTP, embeddings, norms, router in bf16)\n");
  for (const char* f : formats)
    std::printf("  %-6s %12s\n", f, human_bytes(static_cast<double>(inventory.weight_bytes(f))).c_str());
  if (stored_bytes >= 0)
    std::printf("\ncheckpoint   %lld tensors, %s on disk\n", static_cast<long long>(stored_tensors),
                human_bytes(static_cast<double>(stored_bytes)).c_str());
}

}  // namespace

void add_inspect_command(CLI::App& app) {
  auto path = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand("inspect", "Show a model's sizes, layer kinds and memory per weight format");
  cmd->add_option("--model", *path, "Model folder, a config.json file, or a Hugging Face repo id in the hub cache")
      ->required()
      ->transform(local_path_or_cached_repo());
  cmd->add_flag("--json", *json, "Print JSON");
  cmd->callback([path, json]() { run_inspect(*path, *json); });
}

}  // namespace glms::cli
