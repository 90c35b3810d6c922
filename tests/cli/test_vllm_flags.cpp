// vLLM's argument forms and flags (cli/vllm_flags.h): the spellings vLLM's parser reads become
// glmserve's, --speculative-config in either form becomes MTP drafting, flags that pick what
// glmserve does anyway leave a note, and flags that cannot apply are refused saying what to type.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>

#include "cli/vllm_flags.h"
#include "core/error.h"

using namespace glms;
using cli::VllmFlags;
using cli::VllmTarget;

namespace {

// The flags of a serve-like subcommand (and of one without --speculative-config).
const std::set<std::string> kServeFlags = {"--tensor-parallel-size", "--data-parallel-size", "--pipeline-parallel-size",
                                           "--max-model-len", "--max-num-seqs", "--served-model-name",
                                           "--speculative-config", "--port", "--prompt"};

std::vector<std::string> normalized(const std::vector<std::string>& args,
                                    const std::set<std::string>& flags = kServeFlags) {
  std::vector<std::string> argv = {"glmserve"};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<std::string> out =
      cli::normalize_vllm_arguments(argv, [&](const std::string& name) { return flags.count(name) > 0; });
  out.erase(out.begin());
  return out;
}

VllmTarget cuda_target() {
  VllmTarget t;
  t.device = "cuda";
  t.model_dir = GLMS_SOURCE_DIR "/models/glm5-tiny-code";
  t.data_parallel = 2;
  return t;
}

// The message of the glms::Error `resolve` throws for `flags` ("" when it throws none).
std::string refusal(const VllmFlags& flags, const VllmTarget& target = cuda_target()) {
  try {
    cli::resolve_vllm_flags(flags, target);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(VllmArguments, ShortLayoutFlagsAndUnderscoresTakeGlmservesSpelling) {
  EXPECT_EQ(normalized({"serve", "DIR", "-tp", "8", "-dp=2", "-pp", "1", "--max_model_len=32K", "--max_num_seqs", "4"}),
            (std::vector<std::string>{"serve", "DIR", "--tensor-parallel-size", "8", "--data-parallel-size=2",
                                      "--pipeline-parallel-size", "1", "--max-model-len=32K", "--max-num-seqs", "4"}));
  // Values keep their underscores, even one that starts with "--" (a SQL comment as a prompt), and
  // everything after "--" stays as given.
  EXPECT_EQ(normalized({"--served-model-name", "my_model", "--prompt", "-- fetch user_id", "--", "--max_model_len"}),
            (std::vector<std::string>{"--served-model-name", "my_model", "--prompt", "-- fetch user_id", "--",
                                      "--max_model_len"}));
  // Only flags the subcommand takes are respelt.
  EXPECT_EQ(normalized({"--max_model_len", "8", "-tp", "2"}, {"--max_model_len"}),
            (std::vector<std::string>{"--max_model_len", "8", "-tp", "2"}));
}

TEST(VllmArguments, DottedSpeculativeConfigKeysMergeIntoOneJsonObject) {
  const auto out = normalized({"serve", "--speculative-config.method", "mtp", "--port", "0",
                               "--speculative_config.num-speculative-tokens=5"});
  ASSERT_EQ(out.size(), 5u);
  EXPECT_EQ(out[3], "--speculative-config");
  EXPECT_EQ(nlohmann::json::parse(out[4]), (nlohmann::json{{"method", "mtp"}, {"num_speculative_tokens", 5}}));
  // A dotted key overrides the object's, as vLLM merges them.
  const auto merged = normalized({"--speculative-config", R"({"method": "mtp", "num_speculative_tokens": 2})",
                                  "--speculative-config.num_speculative_tokens", "4"});
  EXPECT_EQ(nlohmann::json::parse(merged.at(1)), (nlohmann::json{{"method", "mtp"}, {"num_speculative_tokens", 4}}));
  EXPECT_THROW(normalized({"--speculative-config.method"}), Error);
  EXPECT_THROW(normalized({"--speculative-config", "{method: mtp}"}), Error);
  // The merged object goes before "--", so that what follows it stays positional.
  EXPECT_EQ(normalized({"serve", "--speculative-config.method", "mtp", "--", "DIR"}),
            (std::vector<std::string>{"serve", "--speculative-config", R"({"method":"mtp"})", "--", "DIR"}));
  // A subcommand without --speculative-config keeps the arguments as they are.
  EXPECT_EQ(normalized({"--speculative-config.method", "mtp"}, {"--port"}),
            (std::vector<std::string>{"--speculative-config.method", "mtp"}));
}

TEST(VllmFlagsResolve, SpeculativeConfigBecomesMtpDrafting) {
  VllmFlags flags;
  flags.speculative_config = R"({"method": "mtp", "num_speculative_tokens": 5, "disable_by_batch_size": 16})";
  const cli::VllmSettings s = cli::resolve_vllm_flags(flags, cuda_target());
  EXPECT_EQ(s.speculative_steps, 5);
  EXPECT_EQ(s.speculative_max_batch, 16);
  flags.speculative_config = R"({"method": "deepseek_mtp", "model": ")" GLMS_SOURCE_DIR "/models/glm5-tiny-code\"}";
  const cli::VllmSettings named = cli::resolve_vllm_flags(flags, cuda_target());
  EXPECT_EQ(named.speculative_steps, 1);  // vLLM's default for MTP: the checkpoint's one MTP layer
  EXPECT_FALSE(named.speculative_max_batch.has_value());
  const std::pair<std::string, std::string> refused[] = {
      {R"({"method": "ngram"})", "drafts with the checkpoint's MTP layer only"},
      {R"({"num_speculative_tokens": 2})", "needs method mtp"},
      {R"({"method": "mtp", "model": "/models/draft"})", "a separate draft model is not supported"},
      {R"({"method": "mtp", "num_speculative_tokens": 0})", "num_speculative_tokens must be a whole number from 1"},
      {R"({"method": "mtp", "num_speculative_tokens": "3"})", "num_speculative_tokens must be a whole number"},
      {R"({"method": "mtp", "prompt_lookup_max": 3})", "no key 'prompt_lookup_max'"},
      {"[1]", "is not a JSON object"},
  };
  for (const auto& [config, expect] : refused) {
    flags.speculative_config = config;
    EXPECT_NE(refusal(flags).find(expect), std::string::npos) << config << ": " << refusal(flags);
  }
}

TEST(VllmFlagsResolve, LayoutsOverSeveralNodesPointToMpirun) {
  auto with = [](void (*set)(VllmFlags&)) {
    VllmFlags f;
    set(f);
    return refusal(f);
  };
  for (const std::string& message : {with([](VllmFlags& f) { f.headless = true; }),
                                     with([](VllmFlags& f) { f.data_parallel_address = "10.0.0.1"; }),
                                     with([](VllmFlags& f) { f.data_parallel_rpc_port = 13345; }),
                                     with([](VllmFlags& f) { f.data_parallel_start_rank = 8; }),
                                     with([](VllmFlags& f) { f.nnodes = 2; }),
                                     with([](VllmFlags& f) { f.data_parallel_local = 1; }),
                                     with([](VllmFlags& f) { f.distributed_executor_backend = "ray"; })})
    EXPECT_NE(message.find("under mpirun, one process a node"), std::string::npos) << message;
  EXPECT_NE(with([](VllmFlags& f) { f.pipeline_parallel = 2; }).find("no pipeline parallelism"), std::string::npos);
  EXPECT_NE(with([](VllmFlags& f) { f.distributed_executor_backend = "threads"; }).find("expects mp or uni"),
            std::string::npos);
  // What one node runs anyway: accepted, each with its note.
  VllmFlags accepted;
  accepted.data_parallel_local = 2;
  accepted.distributed_executor_backend = "mp";
  accepted.enable_eplb = true;
  accepted.all2all_backend = "deepep_low_latency";
  accepted.disable_custom_all_reduce = true;
  accepted.nnodes = 1;
  accepted.data_parallel_start_rank = 0;
  const cli::VllmSettings s = cli::resolve_vllm_flags(accepted, cuda_target());
  EXPECT_EQ(s.notes.size(), 4u);
}

TEST(VllmFlagsResolve, HttpSideFlags) {
  VllmFlags flags;
  flags.tokenizer = GLMS_SOURCE_DIR "/models/glm5-tiny-code/tokenizer.json";  // the model's own
  flags.uvicorn_log_level = "warning";
  flags.disable_uvicorn_access_log = true;
  flags.max_logprobs = 5;
  flags.enable_chunked_prefill = true;
  flags.async_scheduling = true;
  const cli::VllmSettings s = cli::resolve_vllm_flags(flags, cuda_target());
  EXPECT_FALSE(s.access_log);
  EXPECT_EQ(s.max_logprobs, 5);
  EXPECT_EQ(s.notes.size(), 3u);  // uvicorn's level, chunked prefill, async scheduling
  flags.tokenizer = "/models/other-tokenizer";
  EXPECT_NE(refusal(flags).find("reads the model folder's own tokenizer.json"), std::string::npos) << refusal(flags);
  // A model found by its Hugging Face repo id: the same id as --tokenizer is its own tokenizer.
  VllmTarget from_repo = cuda_target();
  from_repo.repo_id = "zai-org/GLM-5.2";
  flags.tokenizer = "zai-org/GLM-5.2";
  EXPECT_EQ(refusal(flags, from_repo), "");
  EXPECT_NE(refusal(flags).find("reads the model folder's own tokenizer.json"), std::string::npos);
}

TEST(VllmFlagsResolve, LoadFormatEagerModeAndMemoryFlags) {
  VllmFlags flags;
  flags.load_format = "dummy";
  flags.enforce_eager = true;
  flags.swap_space = 4;
  flags.block_size = 64;
  const cli::VllmSettings s = cli::resolve_vllm_flags(flags, cuda_target());
  EXPECT_TRUE(s.synthetic);
  EXPECT_FALSE(s.cuda_graphs);
  EXPECT_EQ(s.notes.size(), 3u);  // eager, swap space, block size
  VllmTarget cpu = cuda_target();
  cpu.device = "cpu";
  EXPECT_NE(refusal(flags, cpu).find("add --device cuda"), std::string::npos);
  flags.load_format = "gguf";
  EXPECT_NE(refusal(flags).find("reads safetensors checkpoints"), std::string::npos);
  flags = VllmFlags{};
  flags.block_size = 16;  // the engine's own: nothing to say
  EXPECT_TRUE(cli::resolve_vllm_flags(flags, cuda_target()).notes.empty());
}

TEST(VllmFlagsResolve, FlagsWithNothingToSetAreNotedOrRefusedSayingWhy) {
  VllmFlags flags;
  flags.nothing_to_set["--cuda-graph-sizes"] = {"1", "2", "4"};
  flags.nothing_to_set["--disable-fastapi-docs"] = {};
  flags.nothing_to_set["--scheduling-policy"] = {"fcfs"};
  flags.nothing_to_set["--runner"] = {"generate"};
  flags.nothing_to_set["--logprobs-mode"] = {"raw_logprobs"};
  flags.nothing_to_set["--num-redundant-experts"] = {"32"};
  const cli::VllmSettings s = cli::resolve_vllm_flags(flags, cuda_target());
  ASSERT_EQ(s.notes.size(), 6u);
  EXPECT_NE(std::find_if(s.notes.begin(), s.notes.end(),
                         [](const std::string& n) { return n.rfind("--num-redundant-experts 32: experts stay", 0) == 0; }),
            s.notes.end());
  EXPECT_NE(std::find_if(s.notes.begin(), s.notes.end(),
                         [](const std::string& n) { return n.rfind("--cuda-graph-sizes 1 2 4: decode steps", 0) == 0; }),
            s.notes.end());
  const std::vector<std::pair<std::pair<std::string, std::vector<std::string>>, std::string>> refused = {
      {{"--ssl-certfile", {"cert.pem"}}, "TLS-terminating proxy"},
      {{"--lora-modules", {"sql=/lora"}}, "LoRA adapters are not supported"},
      {{"--scheduling-policy", {"priority"}}, "first come, first served"},
      {{"--runner", {"pooling"}}, "pooling, embedding and scoring are not served"},
      {{"--hf-overrides", {"{\"num_hidden_layers\": 4}"}}, "edit it in a copy"},
      {{"--logprobs-mode", {"processed_logits"}}, "raw_logprobs"},
      {{"--middleware", {"my.Middleware"}}, "no Python middleware"},
  };
  for (const auto& [flag, expect] : refused) {
    VllmFlags one;
    one.nothing_to_set[flag.first] = flag.second;
    const std::string message = refusal(one);
    EXPECT_NE(message.find(expect), std::string::npos) << flag.first << ": " << message;
    EXPECT_EQ(message.rfind(flag.first, 0), 0u) << message;  // names the flag as given
  }
}

TEST(VllmFlagsResolve, GenerationOverridesUsageAndCors) {
  VllmFlags flags;
  EXPECT_TRUE(cli::resolve_vllm_flags(flags, cuda_target()).cors_origins.empty());  // CORS off unless asked
  flags.override_generation_config = R"({"temperature": 0.6, "top_p": 0.95})";
  flags.force_include_usage = true;
  flags.exclude_tools_when_none = true;
  flags.tokens_as_ids = true;
  flags.request_id_headers = true;
  flags.default_chat_template_kwargs = R"({"enable_thinking": false})";
  flags.allowed_origins = R"(["https://a.example", "https://b.example"])";
  flags.allowed_methods = R"(["GET", "POST"])";
  flags.allow_credentials = true;
  const cli::VllmSettings s = cli::resolve_vllm_flags(flags, cuda_target());
  EXPECT_EQ(nlohmann::json::parse(s.generation_overrides), nlohmann::json::parse(flags.override_generation_config));
  EXPECT_TRUE(s.force_include_usage);
  EXPECT_TRUE(s.exclude_tools_when_none);
  EXPECT_TRUE(s.tokens_as_ids);
  EXPECT_TRUE(s.request_id_headers);
  EXPECT_EQ(nlohmann::json::parse(s.default_template_kwargs), (nlohmann::json{{"enable_thinking", false}}));
  EXPECT_EQ(s.cors_origins, (std::vector<std::string>{"https://a.example", "https://b.example"}));
  EXPECT_EQ(s.cors_methods, (std::vector<std::string>{"GET", "POST"}));
  EXPECT_EQ(s.cors_headers, std::vector<std::string>{"*"});
  EXPECT_TRUE(s.cors_credentials);
  EXPECT_EQ(s.notes.size(), 2u);  // the overrides and the CORS origins
  VllmFlags bad;
  bad.override_generation_config = "temperature=0.6";
  EXPECT_NE(refusal(bad).find("expects a JSON object"), std::string::npos);
  bad = {};
  bad.default_chat_template_kwargs = "[1]";
  EXPECT_NE(refusal(bad).find("--default-chat-template-kwargs '[1]': expects a JSON object"), std::string::npos)
      << refusal(bad);
  bad = {};
  bad.allowed_origins = "*";
  EXPECT_NE(refusal(bad).find("expects a JSON list of strings"), std::string::npos) << refusal(bad);
  bad = {};
  bad.allow_credentials = true;
  EXPECT_NE(refusal(bad).find("go with --allowed-origins"), std::string::npos) << refusal(bad);
}
