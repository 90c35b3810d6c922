// glmserve quantize: writes an MXFP4, MXFP6 or block-FP8 copy of a checkpoint (streaming, one
// tensor in memory, sharded like Hugging Face checkpoints) and, with --eval, measures what the quantisation costs on a text: KL divergence
// of the next-token distributions, top-1 agreement and both perplexities.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>

#include "cli/commands.h"
#include "cli/validators.h"
#include "core/error.h"
#include "model/glm5.h"
#include "quant/checkpoint_quantizer.h"
#include "text/tokenizer.h"

namespace glms::cli {

namespace {

struct QuantizeArgs {
  std::string model_dir, out_dir, format, eval_file;
  std::vector<std::string> exclude;
  bool no_default_excludes = false;
  std::string max_shard_size = "5GB";
  int eval_tokens = 4096;
  int window = 256;
  std::string kv_cache_dtype = "auto";
  bool json = false;
};

// The quantised model's next-token distributions over `text_file` against the original's, in
// windows of `window` tokens (one prefill each). The original reads an fp32 cache, the quantised
// one a cache of `cache_dtype`; with `cache_only` the quantised side keeps the original weights
// (what the cache dtype alone costs).
quant::QualityStats evaluate(const std::string& original_dir, const std::string& quantised_dir,
                             const std::string& text_file, int max_tokens, int window, kv::CacheDtype cache_dtype,
                             bool cache_only) {
  std::ifstream in(text_file, std::ios::binary);
  if (!in) fail("--eval: cannot read " + text_file);
  std::stringstream buffer;
  buffer << in.rdbuf();
  const text::Tokenizer tokenizer = text::Tokenizer::load(original_dir);
  std::vector<int32_t> tokens = tokenizer.encode(buffer.str(), false);
  if (tokens.size() < 2) fail("--eval: " + text_file + " has fewer than 2 tokens");
  if (static_cast<int>(tokens.size()) > max_tokens) tokens.resize(max_tokens);
  const model::Glm5Model original(model::load_weights(original_dir));
  const model::Glm5Model quantised(model::load_weights(cache_only ? original_dir : quantised_dir));
  const int vocab = original.config().vocab_size;
  const int block_size = 64, num_blocks = (window + block_size - 1) / block_size;
  std::vector<int32_t> table(num_blocks);
  std::iota(table.begin(), table.end(), 0);
  quant::QualityStats stats;
  for (size_t start = 0; start + 1 < tokens.size(); start += window) {
    const size_t end = std::min(tokens.size(), start + window);
    const std::vector<int32_t> chunk(tokens.begin() + start, tokens.begin() + end);
    if (chunk.size() < 2) break;
    auto logits_of = [&](const model::Glm5Model& m, kv::CacheDtype dtype) {
      kv::CacheLayout layout = m.cache_layout(block_size);
      layout.dtype = dtype;
      kv::PagedLatentCache cache(std::move(layout), num_blocks);
      model::ForwardBatch batch;
      batch.add_sequence(chunk, 0, table, block_size, true);
      return m.forward(batch, cache);
    };
    const auto ref = logits_of(original, kv::CacheDtype::kAuto), quant = logits_of(quantised, cache_dtype);
    stats.add(ref.data(), quant.data(), static_cast<int64_t>(chunk.size()) - 1, vocab, chunk.data() + 1);
    std::fprintf(stderr, "\r[eval] %zu / %zu tokens", end, tokens.size());
  }
  std::fprintf(stderr, "\n");
  return stats;
}

// "5GB", "500MB", "2GiB", "123456": bytes (decimal units as Hugging Face's max_shard_size).
uint64_t parse_size(const std::string& text) {
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string unit = text.substr(used);
  std::transform(unit.begin(), unit.end(), unit.begin(), [](unsigned char c) { return std::toupper(c); });
  const std::pair<const char*, double> units[] = {{"", 1},        {"B", 1},         {"KB", 1e3},  {"MB", 1e6},
                                                  {"GB", 1e9},    {"TB", 1e12},     {"KIB", 1024.0},
                                                  {"MIB", 1048576.0}, {"GIB", 1073741824.0}};
  for (const auto& [name, scale] : units)
    if (used > 0 && unit == name && value > 0) return static_cast<uint64_t>(value * scale);
  fail("--max-shard-size expects a size such as 5GB, 500MB or 2GiB, got '" + text + "'");
}

void run_quantize(const QuantizeArgs& args) {
  quant::QuantizeOptions options;
  options.max_shard_bytes = parse_size(args.max_shard_size);
  options.format = args.format;
  options.exclude = args.exclude;
  options.default_excludes = !args.no_default_excludes;
  const quant::QuantizeReport report =
      quant::quantize_checkpoint(args.model_dir, args.out_dir, options, [](size_t done, size_t total, const std::string& name) {
        const int width = 30, filled = static_cast<int>(width * done / std::max<size_t>(total, 1));
        std::fprintf(stderr, "\r[%s%s] %zu/%zu tensors  %-60.60s", std::string(filled, '#').c_str(),
                     std::string(width - filled, ' ').c_str(), done, total, name.c_str());
      });
  std::fprintf(stderr, "\n");
  nlohmann::json out = {{"format", args.format}, {"output", args.out_dir}, {"quantized_tensors", report.quantized},
                        {"kept_tensors", report.kept}, {"bytes_in", report.bytes_in}, {"bytes_out", report.bytes_out},
                        {"exclude", report.exclude}, {"shards", report.shards}};
  if (!args.eval_file.empty()) {
    const kv::CacheDtype cache_dtype = kv::parse_cache_dtype(args.kv_cache_dtype);
    auto eval_json = [&](bool cache_only) -> nlohmann::json {
      const quant::QualityStats stats = evaluate(args.model_dir, args.out_dir, args.eval_file, args.eval_tokens,
                                                 args.window, cache_dtype, cache_only);
      return {{"text", args.eval_file}, {"positions", stats.positions}, {"mean_kl", stats.mean_kl()},
              {"top1_agreement", stats.top1()}, {"perplexity_original", stats.perplexity_ref()},
              {"perplexity_quantized", stats.perplexity_quant()}, {"kv_cache_dtype", kv::cache_dtype_name(cache_dtype)}};
    };
    out["eval"] = eval_json(false);
    if (cache_dtype != kv::CacheDtype::kAuto) out["eval_kv_cache_only"] = eval_json(true);
  }
  if (args.json) {
    std::printf("%s\n", out.dump(2).c_str());
    return;
  }
  std::printf("wrote %s (%d shard%s): %d matrices in %s, %d tensors kept; %.2f MB -> %.2f MB\n", args.out_dir.c_str(),
              report.shards, report.shards == 1 ? "" : "s", report.quantized, args.format.c_str(), report.kept,
              report.bytes_in / 1e6, report.bytes_out / 1e6);
  for (const char* key : {"eval", "eval_kv_cache_only"})
    if (out.contains(key))
      std::printf("%s on %lld positions of %s (KV cache %s): mean KL %.5f nats, top-1 agreement %.2f%%, perplexity "
                  "%.3f -> %.3f\n",
                  std::string(key) == "eval" ? "eval" : "eval of the KV cache alone",
                  static_cast<long long>(out[key]["positions"].get<int64_t>()), args.eval_file.c_str(),
                  out[key]["kv_cache_dtype"].get<std::string>().c_str(), out[key]["mean_kl"].get<double>(),
                  100.0 * out[key]["top1_agreement"].get<double>(), out[key]["perplexity_original"].get<double>(),
                  out[key]["perplexity_quantized"].get<double>());
}

}  // namespace

void add_quantize_command(CLI::App& app) {
  auto args = std::make_shared<QuantizeArgs>();
  CLI::App* cmd = app.add_subcommand("quantize", "Write an MXFP4, MXFP6 or block-FP8 copy of a checkpoint; --eval measures the loss");
  cmd->add_option("--model", args->model_dir, "Input model folder, or a Hugging Face repo id in the hub cache")
      ->required()
      ->transform(local_path_or_cached_repo())
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--out", args->out_dir, "Output folder (created; must be empty)")->required();
  cmd->add_option("--format", args->format,
                  "mxfp4 (AMD Quark layout), mxfp6 (E2M3) or mxfp6_e3m2 (four codes per 3 bytes), or fp8 (E4M3, "
                  "128x128 block scales)")
      ->required()->check(CLI::IsMember({"mxfp4", "mxfp6", "mxfp6_e3m2", "fp8"}));
  cmd->add_option("--exclude", args->exclude, "Glob of tensor names to keep unquantised (repeatable)");
  cmd->add_flag("--no-default-excludes", args->no_default_excludes,
                "Quantise embeddings, lm_head, routers, indexer weights_proj and the MTP layer too");
  cmd->add_option("--max-shard-size", args->max_shard_size,
                  "Largest output safetensors file (5GB, 500MB, 2GiB...); more become shards with an index")
      ->capture_default_str();
  cmd->add_option("--eval", args->eval_file, "Text file: report KL divergence, top-1 agreement and perplexities");
  cmd->add_option("--eval-tokens", args->eval_tokens, "Tokens of the text to evaluate")->check(positive_number());
  cmd->add_option("--eval-window", args->window, "Tokens per evaluated window")->check(CLI::Range(2, 65536));
  cmd->add_option("--kv-cache-dtype", args->kv_cache_dtype,
                  "With --eval: the quantised model reads a KV cache of this dtype (auto or fp8_e4m3); fp8 also "
                  "reports what the cache alone costs, on the original weights")
      ->capture_default_str();
  cmd->add_flag("--json", args->json, "Print one JSON object");
  cmd->callback([args]() { run_quantize(*args); });
}

}  // namespace glms::cli
