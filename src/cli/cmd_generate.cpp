// glmserve generate: one prompt through the engine on this machine, printed as it is produced
// or as one JSON object with ids, text and timings.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "cli/commands.h"
#include "cli/validators.h"
#include "core/error.h"
#include "cli/model_source.h"
#include "engine/generator.h"
#include "text/detokenizer.h"
#include "text/tokenizer.h"

namespace glms::cli {

namespace {

struct GenerateArgs {
  ModelSourceArgs source;
  std::string prompt;
  std::string input_ids;
  int max_tokens = 64;
  float temperature = 1.0f;
  float top_p = 1.0f;
  int top_k = 0;
  float min_p = 0.0f;
  uint64_t seed = 0;
  bool json = false;
  bool ignore_eos = false;
  std::string speculative;
  std::string kv_cache_dtype = "auto";
  int speculative_steps = 3;
};

std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) {
    const auto first = item.find_first_not_of(" \t");
    if (first == std::string::npos) continue;
    size_t used = 0;
    long long value = 0;
    try {
      value = std::stoll(item.substr(first), &used);
    } catch (const std::exception&) {
      fail("--input-ids: '" + item + "' is not an integer (expected e.g. --input-ids 1,2,3)");
    }
    if (item.find_first_not_of(" \t", first + used) != std::string::npos || value < 0 || value > INT32_MAX)
      fail("--input-ids: '" + item + "' is not a non-negative token id");
    ids.push_back(static_cast<int32_t>(value));
  }
  if (ids.empty()) fail("--input-ids is empty");
  return ids;
}

void run_generate(GenerateArgs args) {
  resolve_model_folder(args.source);
  const std::string& model_dir = args.source.model_dir;
  std::optional<text::Tokenizer> tokenizer;
  if (!model_dir.empty() && std::filesystem::exists(std::filesystem::path(model_dir) / "tokenizer.json"))
    tokenizer = text::Tokenizer::load(model_dir);

  std::vector<int32_t> prompt_ids;
  if (!args.input_ids.empty()) {
    prompt_ids = parse_ids(args.input_ids);
  } else {
    if (!tokenizer) fail("--prompt needs a tokenizer.json in the --model folder; or pass --input-ids");
    prompt_ids = tokenizer->encode(args.prompt, false);
  }

  ModelSourceArgs source = args.source;
  source.load_mtp = !args.speculative.empty();
  const LoadedModel model = load_model(source);
  for (int32_t id : prompt_ids)
    if (id >= model.config().vocab_size)
      fail("--input-ids: token id " + std::to_string(id) + " is outside the vocabulary (size " +
           std::to_string(model.config().vocab_size) + ")");

  engine::GenerateOptions options;
  options.max_tokens = args.max_tokens;
  options.sampling = {args.temperature, args.top_p, args.top_k, args.min_p, args.seed};
  options.ignore_eos = args.ignore_eos;
  options.kv_cache_dtype = kv::parse_cache_dtype(args.kv_cache_dtype);
  if (!args.speculative.empty()) options.speculative_steps = args.speculative_steps;
  std::optional<text::IncrementalDetokenizer> stream;
  if (!args.json && tokenizer) {
    stream.emplace(*tokenizer, text::IncrementalDetokenizer::Options{true});
    std::fputs(args.prompt.c_str(), stdout);
    options.on_token = [&stream](int32_t id) {
      std::fputs(stream->feed(id).c_str(), stdout);
      std::fflush(stdout);
    };
  }
  const std::unique_ptr<model::StepRunner> runner = runtime::rank_zero_runner(*model.executor);
  const engine::GenerateResult result = engine::generate(*runner, prompt_ids, options);

  const double prefill_tps = result.prefill_seconds > 0 ? prompt_ids.size() / result.prefill_seconds : 0.0;
  // Tokens after the first (which the prefill produces) over the time spent producing them.
  const double decode_tps =
      result.decode_seconds > 0 && result.output_ids.size() > 1 ? (result.output_ids.size() - 1) / result.decode_seconds : 0.0;
  if (args.json) {
    nlohmann::json out;
    out["input_ids"] = prompt_ids;
    out["output_ids"] = result.output_ids;
    out["text"] = tokenizer ? tokenizer->decode(result.output_ids, true) : "";
    out["finish_reason"] = result.finish_reason;
    out["timings"] = {{"prefill_seconds", result.prefill_seconds},
                      {"decode_seconds", result.decode_seconds},
                      {"prefill_tokens_per_s", prefill_tps},
                      {"decode_tokens_per_s", decode_tps}};
    if (options.speculative_steps > 0) {
      const auto& spec = result.speculative;
      out["spec"] = {{"method", "mtp"}, {"steps", options.speculative_steps},
                     {"acceptance_length", spec.acceptance_length()}, {"drafted", spec.drafted},
                     {"accepted", spec.accepted}, {"accepted_per_position", spec.accepted_per_position},
                     {"verify_steps", spec.steps}};
    }
    std::cout << out.dump() << std::endl;
    return;
  }
  if (stream) std::fputs(stream->flush().c_str(), stdout);
  else for (int32_t id : result.output_ids) std::printf("%d ", id);
  std::printf("\n");
  std::fprintf(stderr, "[%zu prompt tokens, %.1f tok/s prefill; %zu generated, %.1f tok/s decode; finish: %s]\n",
               prompt_ids.size(), prefill_tps, result.output_ids.size(), decode_tps, result.finish_reason.c_str());
}

}  // namespace

void add_generate_command(CLI::App& app) {
  auto args = std::make_shared<GenerateArgs>();
  CLI::App* cmd = app.add_subcommand("generate", "Generate a completion for one prompt (CPU or CUDA)");
  add_model_source_options(cmd, args->source);
  auto* prompt = cmd->add_option("--prompt", args->prompt, "Prompt text (encoded without special tokens)");
  auto* ids = cmd->add_option("--input-ids", args->input_ids, "Prompt token ids, comma-separated");
  prompt->excludes(ids);
  cmd->add_option("--max-tokens", args->max_tokens, "Tokens to generate")->check(non_negative_number());
  cmd->add_option("--temperature", args->temperature, "Sampling temperature; 0 = greedy")->check(CLI::Range(0.0, 100.0));
  cmd->add_option("--top-p", args->top_p, "Nucleus sampling mass")->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--top-k", args->top_k, "Keep the k most likely tokens (0 = all)")->check(non_negative_number());
  cmd->add_option("--min-p", args->min_p, "Drop tokens under min_p x the top probability")->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--seed", args->seed, "Random seed for sampling");
  cmd->add_option("--kv-cache-dtype", args->kv_cache_dtype,
                  "auto (the runner's precision) or fp8 / fp8_e4m3 (E4M3 latent rows and indexer keys with a scale "
                  "per 128 values: 656 bytes a token and layer instead of 1152 on a GPU; the CPU rounds its fp32 rows the "
                  "same way)")
      ->capture_default_str();
  cmd->add_flag("--ignore-eos", args->ignore_eos, "Keep generating past end-of-sequence tokens");
  cmd->add_option("--speculative", args->speculative, "Speculative decoding with the checkpoint's MTP layer (greedy, or sampled by speculative rejection sampling)")
      ->check(CLI::IsMember({"mtp"}));
  cmd->add_option("--speculative-steps", args->speculative_steps, "Draft tokens per step (with --speculative mtp)")
      ->check(CLI::Range(1, 16));
  cmd->add_flag("--json", args->json, "Print one JSON object: input_ids, output_ids, text, timings");
  cmd->callback([args, cmd]() {
    if (cmd->count("--prompt") == 0 && cmd->count("--input-ids") == 0)
      fail("generate needs --prompt TEXT or --input-ids 1,2,3");
    run_generate(*args);
  });
}

}  // namespace glms::cli
