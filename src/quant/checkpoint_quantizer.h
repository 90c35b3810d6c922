// Quantises a checkpoint folder tensor by tensor into MXFP4 (AMD Quark's layout), MXFP6 (the
// same with four 6-bit codes per 3 bytes, quant/formats.h) or block FP8 (the GLM-5-FP8 layout),
// streaming so that memory holds one tensor at a time.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace glms::quant {

struct QuantizeOptions {
  std::string format;                 // "mxfp4", "mxfp6" (E2M3), "mxfp6_e3m2" or "fp8"
  std::vector<std::string> exclude;   // extra glob patterns on tensor names ('*' and '?')
  bool default_excludes = true;       // embeddings, lm_head, routers, indexer weights_proj, the MTP layer
  // Output shards at most this many bytes (a tensor larger than that gets a shard of its own);
  // one model.safetensors when everything fits, else model-0000i-of-0000n.safetensors and
  // model.safetensors.index.json as Hugging Face writes them. A quantised matrix and its scales
  // stay in one shard.
  uint64_t max_shard_bytes = 5'000'000'000;
};

struct QuantizeReport {
  int quantized = 0;                  // matrices written quantised
  int kept = 0;                       // tensors copied as they were
  uint64_t bytes_in = 0, bytes_out = 0;
  std::vector<std::string> exclude;   // the patterns that applied
  int shards = 1;                     // safetensors files written
};

// The glob patterns a model folder's defaults exclude (they depend on num_hidden_layers).
std::vector<std::string> default_excludes(const std::filesystem::path& model_dir);
bool glob_match(const std::string& pattern, const std::string& text);

// Writes OUT/model.safetensors (or shards and their index), OUT/config.json (with
// quantization_config) and copies the tokenizer and template files. `progress(done, total,
// tensor)` is called after each tensor.
QuantizeReport quantize_checkpoint(const std::filesystem::path& in, const std::filesystem::path& out,
                                   const QuantizeOptions& options,
                                   const std::function<void(size_t, size_t, const std::string&)>& progress = {});

// Next-token distribution agreement of a quantised model with its original over the same
// positions: logits rows [n, vocab] each. Accumulates KL(P_ref || P_quant), top-1 agreement and
// the negative log-likelihood of the true next tokens under both.
struct QualityStats {
  int64_t positions = 0;
  double kl_sum = 0.0, top1_agree = 0.0, nll_ref = 0.0, nll_quant = 0.0;
  void add(const float* ref_logits, const float* quant_logits, int64_t rows, int vocab, const int32_t* next_tokens);
  double mean_kl() const { return positions ? kl_sum / positions : 0.0; }
  double top1() const { return positions ? top1_agree / positions : 0.0; }
  double perplexity_ref() const;
  double perplexity_quant() const;
};

}  // namespace glms::quant
