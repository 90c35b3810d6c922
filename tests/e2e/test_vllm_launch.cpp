// vLLM and SGLang launch lines against `glmserve serve` on the bundled model: the positional
// model, vLLM's and SGLang's flag names and readable sizes start a server that answers under every
// served name, with the API key from the environment; flags that cannot apply are refused saying
// why.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "e2e_client.h"

using namespace glms::e2e;
using nlohmann::json;

namespace {

const std::string kBinary = GLMS_BINARY_DIR "/glmserve";
const std::string kModel = GLMS_SOURCE_DIR "/models/glm5-tiny-code";

// Runs glmserve with `args` (after `environment`, NAME=VALUE words); returns its stderr and stdout
// and its exit status.
std::pair<std::string, int> run_glmserve(const std::string& args, const std::string& environment = "") {
  FILE* pipe = popen((environment + (environment.empty() ? "" : " ") + kBinary + " " + args + " 2>&1").c_str(), "r");
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, pipe)) out.append(buf, n);
  const int status = pclose(pipe);
  return {out, WIFEXITED(status) ? WEXITSTATUS(status) : -1};
}

}  // namespace

TEST(VllmLaunch, AVllmServeLineStartsAndAnswersUnderEveryName) {
  setenv("GLMSERVE_API_KEY", "from-the-environment", 1);
  ServerProcess server(kBinary, {"serve", kModel, "--port", "0", "-tp", "1", "--max-num-batched-tokens", "512",
                                 "--max-model-len", "1K", "--kv-cache-memory", "64M", "--served-model-name", "glm-5",
                                 "zai-org/GLM-5", "--tool-call-parser", "glm47", "--reasoning-parser", "glm45",
                                 "--enable-auto-tool-choice", "--trust-remote-code", "--dtype", "bfloat16", "--seed",
                                 "3", "--generation-config", "vllm", "--enable-prefix-caching",
                                 "--disable-log-requests", "--gpu-memory-utilization", "0.9", "--vllm-metric-names",
                                 "--max-body-bytes", "4000", "--max-logprobs", "5", "--enable-chunked-prefill",
                                 "--async-scheduling", "--uvicorn-log-level", "warning"});
  unsetenv("GLMSERVE_API_KEY");
  const std::string& out = server.output();
  EXPECT_NE(out.find("max_model_len 1024"), std::string::npos) << out;
  EXPECT_NE(out.find("max_batch_tokens 512"), std::string::npos) << out;
  EXPECT_NE(out.find("served as 'glm-5', 'zai-org/GLM-5'"), std::string::npos) << out;
  EXPECT_NE(out.find("note: --trust-remote-code has no effect"), std::string::npos) << out;
  EXPECT_NE(out.find("note: --tool-call-parser glm47"), std::string::npos) << out;
  EXPECT_NE(out.find("tokens, 0.06 GiB)"), std::string::npos) << out;  // --kv-cache-memory 64M

  EXPECT_EQ(http(server.port(), "GET", "/v1/models").status, 401);
  const std::map<std::string, std::string> auth = {{"authorization", "Bearer from-the-environment"}};
  const Response models = http(server.port(), "GET", "/v1/models", "", auth);
  ASSERT_EQ(models.status, 200) << models.body;
  EXPECT_EQ(json::parse(models.body)["data"].size(), 2u);
  for (const char* name : {"glm-5", "zai-org/GLM-5"}) {
    const Response r = http(server.port(), "POST", "/v1/completions",
                            json{{"model", name}, {"prompt", "def f():"}, {"max_tokens", 4}}.dump(), auth);
    EXPECT_EQ(r.status, 200) << r.body;
  }
  // --max-logprobs 5 bounds what a request may ask.
  const Response many = http(server.port(), "POST", "/v1/completions",
                             json{{"model", "glm-5"}, {"prompt", "def f():"}, {"max_tokens", 2}, {"logprobs", 6}}.dump(),
                             auth);
  EXPECT_EQ(many.status, 400) << many.body;
  // An oversized body is answered 413 and counted; vLLM's phase metrics and names are there.
  EXPECT_EQ(http(server.port(), "POST", "/v1/completions", std::string(5000, 'x'), auth).status, 413);
  const std::string metrics = http(server.port(), "GET", "/metrics").body;
  for (const char* line : {"vllm:request_queue_time_seconds_count{model_name=\"glm-5\"} 2",
                           "glmserve:request_decode_time_seconds_count{model_name=\"glm-5\"} 2",
                           "glmserve:http_requests_total{handler=\"\",method=\"\",status=\"413\"} 1",
                           "glmserve:http_requests_total{handler=\"/v1/completions\",method=\"POST\",status=\"200\"} 2",
                           "vllm:cache_config_info{block_size=\"16\""})
    EXPECT_NE(metrics.find(line), std::string::npos) << line << "\n" << metrics;
  EXPECT_EQ(server.stop(SIGTERM, 60.0), 0);
}

// vLLM's GLM-5.2 recipe line (FP8 cache, MTP speculation in the dotted --speculative-config form,
// GLM's parsers) with the bundled model in place of the checkpoint and no --device (auto: the CPU
// here, where no GPU is visible): the server drafts 5 tokens a step with the MTP layer.
TEST(VllmLaunch, TheGlm52RecipeLineServesWithMtpDrafts) {
  ServerProcess server(kBinary, {"serve", kModel, "--port", "0", "--kv-cache-dtype", "fp8_e4m3",
                                 "--tensor-parallel-size", "1", "--speculative-config.method", "mtp",
                                 "--speculative-config.num_speculative_tokens", "5", "--tool-call-parser", "glm47",
                                 "--reasoning-parser", "glm45", "--enable-auto-tool-choice", "--served-model-name",
                                 "glm-5.2-fp8", "--max-model-len", "1K", "--kv-cache-memory", "64M"});
  const std::string& out = server.output();
  EXPECT_NE(out.find("speculative decoding with the MTP layer, 5 draft tokens per step"), std::string::npos) << out;
  EXPECT_NE(out.find(" on cpu;"), std::string::npos) << out;
  const Response r = http(server.port(), "POST", "/v1/completions",
                          json{{"model", "glm-5.2-fp8"}, {"prompt", "def f():"}, {"max_tokens", 12}, {"temperature", 0}}.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const std::string metrics = http(server.port(), "GET", "/metrics").body;
  EXPECT_EQ(metrics.find("glmserve:spec_decode_num_draft_tokens_total{model_name=\"glm-5.2-fp8\"} 0\n"), std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("glmserve:spec_decode_num_draft_tokens_total"), std::string::npos) << metrics;
  EXPECT_EQ(server.stop(SIGTERM, 60.0), 0);
}

// SGLang's launch line for GLM-5 (DP attention with expert parallelism, EAGLE drafting with the
// MTP layer as steps / topk / draft tokens, its memory and length flags) on two CPU ranks: the
// layout and the drafting it asks for, and the one-rank server's greedy text.
TEST(SglangLaunch, AnSglangLaunchLineServesItsLayoutWithMtpDrafts) {
  const json request = {{"model", "glm-5"}, {"prompt", "def fibonacci(n):"}, {"max_tokens", 16}, {"temperature", 0}};
  std::string one_rank_text;
  {
    ServerProcess one(kBinary, {"serve", kModel, "--port", "0", "--kv-cache-memory", "64M", "--served-model-name",
                                "glm-5"});
    const Response r = http(one.port(), "POST", "/v1/completions", request.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    one_rank_text = json::parse(r.body)["choices"][0]["text"];
    EXPECT_EQ(one.stop(SIGTERM, 60.0), 0);
  }
  ServerProcess server(kBinary, {"serve", "--model-path", kModel, "--port", "0", "--tp-size", "2", "--dp-size", "2",
                                 "--enable-dp-attention", "--ep-size", "2", "--speculative-algorithm", "EAGLE",
                                 "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
                                 "--speculative-num-draft-tokens", "4", "--mem-fraction-static", "0.85",
                                 "--context-length", "2048", "--tool-call-parser", "glm47", "--reasoning-parser",
                                 "glm45", "--served-model-name", "glm-5", "--kv-cache-memory", "64M"});
  const std::string& out = server.output();
  EXPECT_NE(out.find("layout TP1 x DP2, experts whole over 2 ranks (EP2)"), std::string::npos) << out;
  EXPECT_NE(out.find("speculative decoding with the MTP layer, 3 draft tokens per step"), std::string::npos) << out;
  EXPECT_NE(out.find("max_model_len 2048"), std::string::npos) << out;
  const Response r = http(server.port(), "POST", "/v1/completions", request.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["choices"][0]["text"], one_rank_text);
  EXPECT_EQ(server.stop(SIGTERM, 60.0), 0);
}

// A server started with the model's path and no --served-model-name answers to that path (vLLM's
// served name) besides the folder's name, and vLLM's bench line measures it: --backend vllm,
// --dataset-name random, --random-input-len, --host and --port, the tokenizer from --model's
// folder, --save-result into --result-dir; and its ShareGPT line.
TEST(VllmLaunch, TheModelPathIsAServedNameAndVllmsBenchLineMeasuresIt) {
  ServerProcess server(kBinary, {"serve", kModel, "--port", "0", "--kv-cache-memory", "64M"});
  for (const std::string& name : {kModel, std::string("glm5-tiny-code")}) {
    const Response r = http(server.port(), "POST", "/v1/completions",
                            json{{"model", name}, {"prompt", "def f():"}, {"max_tokens", 2}}.dump());
    EXPECT_EQ(r.status, 200) << name << ": " << r.body;
  }
  const std::string results = GLMS_BINARY_DIR "/tests/e2e/vllm_bench_results";
  std::filesystem::remove_all(results);
  const auto [out, status] =
      run_glmserve("bench --backend vllm --model " + kModel + " --dataset-name random --random-input-len 24 "
                   "--random-output-len 4 --num-prompts 4 --request-rate inf --host 127.0.0.1 --port " +
                   std::to_string(server.port()) + " --save-result --result-dir " + results + " --no-progress");
  EXPECT_EQ(status, 0) << out;
  EXPECT_TRUE(std::filesystem::exists(results + "/bench.json")) << out;
  // vLLM's forms: --model names the tokenizer's folder and --served-model-name the requests' model;
  // no --request-rate is vLLM's inf; --goodput, sampling flags, --random-prefix-len, --result-filename.
  const auto [vllm_out, vllm_status] = run_glmserve(
      "bench --backend vllm --model " + kModel + " --served-model-name glm5-tiny-code --dataset-name random "
      "--random-input-len 16 --random-output-len 4 --random-prefix-len 8 --num-prompts 4 --host 127.0.0.1 --port " +
      std::to_string(server.port()) + " --ignore-eos --temperature 0 --goodput ttft:60000 tpot:60000 --num-warmups 0 "
      "--save-result --result-dir " + results + " --result-filename vllm.json --disable-tqdm");
  EXPECT_EQ(vllm_status, 0) << vllm_out;
  EXPECT_NE(vllm_out.find("note: --request-rate inf (vLLM's default)"), std::string::npos) << vllm_out;
  EXPECT_NE(vllm_out.find("24 in / 4 out, 33% shared prefix"), std::string::npos) << vllm_out;
  EXPECT_TRUE(std::filesystem::exists(results + "/vllm.json")) << vllm_out;
  const json record = json::parse(std::ifstream(results + "/vllm.json"));
  EXPECT_NE(record.dump().find("temperature"), std::string::npos);  // the extra body it sent
  EXPECT_NE(vllm_out.find("Request goodput"), std::string::npos) << vllm_out;
  // SGLang's bench_serving line: --random-input/--random-output, its range ratio (1: exact lengths),
  // --output-file, --warmup-requests, --extra-request-body, and its flags with nothing to set.
  const auto [sglang_out, sglang_status] = run_glmserve(
      "bench --backend sglang --model glm5-tiny-code --tokenizer " + kModel + " --dataset-name random --random-input 16 "
      "--random-output 4 --random-range-ratio 1 --num-prompts 4 --request-rate inf --host 127.0.0.1 --port " +
      std::to_string(server.port()) + " --output-file " + results + "/sglang.json --warmup-requests 0 "
      "--extra-request-body '{\"temperature\": 0}' --disable-stream --flush-cache --disable-tqdm");
  EXPECT_EQ(sglang_status, 0) << sglang_out;
  EXPECT_NE(sglang_out.find("16 in / 4 out,"), std::string::npos) << sglang_out;  // exact lengths
  EXPECT_NE(sglang_out.find("note: --disable-stream:"), std::string::npos) << sglang_out;
  EXPECT_TRUE(std::filesystem::exists(results + "/sglang.json")) << sglang_out;
  // vLLM's prefix_repetition dataset: prompts of one of 2 prefixes of 32 tokens and 8 more.
  const auto [rep_out, rep_status] = run_glmserve(
      "bench --backend vllm --model " + kModel + " --dataset-name prefix_repetition --prefix-repetition-prefix-len 32 "
      "--prefix-repetition-suffix-len 8 --prefix-repetition-num-prefixes 2 --prefix-repetition-output-len 3 "
      "--num-prompts 8 --num-warmups 0 --host 127.0.0.1 --port " + std::to_string(server.port()) +
      " --result-dir " + results + " --result-filename repetition.json --disable-tqdm");
  EXPECT_EQ(rep_status, 0) << rep_out;
  const json repetition = json::parse(std::ifstream(results + "/repetition.json"));
  EXPECT_EQ(repetition["config"]["input_len"], 40);
  EXPECT_EQ(repetition["config"]["num_prefixes"], 2);
  EXPECT_NEAR(repetition["config"]["prefix_hit"].get<double>(), 0.8, 1e-9);
  EXPECT_EQ(repetition["totals"]["completed"], 8);
  // vLLM's ShareGPT line: the prompts and their lengths from the file's first turns.
  json conversations = json::array();
  for (const char* prompt : {"def quicksort(items):", "Explain what a prefix cache does in one sentence.",
                             "Write a haiku about GPUs.", "class Tokenizer:\n    def __init__(self):"})
    conversations.push_back({{"conversations", json::array({{{"from", "human"}, {"value", prompt}},
                                                            {{"from", "gpt"}, {"value", "A reply of some words."}}})}});
  const std::string sharegpt = results + "/sharegpt.json";
  std::ofstream(sharegpt) << conversations.dump();
  const auto [sharegpt_out, sharegpt_status] = run_glmserve(
      "bench --backend vllm --model " + kModel + " --dataset-name sharegpt --dataset-path " + sharegpt +
      " --sharegpt-output-len 3 --num-prompts 4 --num-warmups 0 --host 127.0.0.1 --port " +
      std::to_string(server.port()) + " --save-result --result-dir " + results + " --result-filename sharegpt-run.json "
      "--disable-tqdm");
  EXPECT_EQ(sharegpt_status, 0) << sharegpt_out;
  EXPECT_NE(sharegpt_out.find("sharegpt dataset " + sharegpt + ": mean"), std::string::npos) << sharegpt_out;
  const json sharegpt_record = json::parse(std::ifstream(results + "/sharegpt-run.json"));
  EXPECT_EQ(sharegpt_record["config"]["dataset_name"], "sharegpt");
  EXPECT_FALSE(sharegpt_record["config"].contains("input_len"));  // the random dataset's shape
  EXPECT_GT(sharegpt_record["config"]["mean_input_len"].get<double>(), 4.0);
  EXPECT_EQ(sharegpt_record["totals"]["completed"], 4);
  const auto [bad, bad_status] = run_glmserve("bench --model " + kModel + " --dataset-name sharegpt");
  EXPECT_NE(bad_status, 0);
  EXPECT_NE(bad.find("--dataset-name sharegpt needs --dataset-path FILE"), std::string::npos) << bad;
  const auto [mixed, mixed_status] = run_glmserve("bench --model " + kModel + " --dataset-name sharegpt --dataset-path " +
                                                  sharegpt + " --random-input-len 8 --request-rate 1");
  EXPECT_NE(mixed_status, 0);
  EXPECT_NE(mixed.find("--input-len/--random-input-len/--random-input shapes the random dataset's prompts"), std::string::npos) << mixed;
  const auto [stray_len, stray_len_status] =
      run_glmserve("bench --model " + kModel + " --sharegpt-output-len 8 --request-rate 1");
  EXPECT_NE(stray_len_status, 0);
  EXPECT_NE(stray_len.find("go with --dataset-name sharegpt"), std::string::npos) << stray_len;
  const auto [stray_path, stray_path_status] =
      run_glmserve("bench --model " + kModel + " --dataset-path " + sharegpt + " --request-rate 1");
  EXPECT_NE(stray_path_status, 0);
  EXPECT_NE(stray_path.find("goes with --dataset-name sharegpt or custom"), std::string::npos) << stray_path;
  EXPECT_EQ(server.stop(SIGTERM, 60.0), 0);
}

// Flags of vLLM's with nothing to set here start the server with a note each; generation-config
// overrides set the sampling defaults, CORS answers browsers, and streams always end with usage.
TEST(VllmLaunch, ProductionFlagsStartWithNotesAndTakeEffect) {
  // A one-value flag before the positional model leaves the model to it.
  ServerProcess server(kBinary, {"serve", "--max-parallel-loading-workers", "2", kModel, "--port", "0",
                                 "--kv-cache-memory", "64M", "--override-generation-config", R"({"temperature": 0})", "--allowed-origins",
                                 R"(["https://app.example"])", "--enable-force-include-usage", "--cuda-graph-sizes", "1",
                                 "2", "4", "--disable-fastapi-docs", "--chat-template-content-format", "openai",
                                 "--scheduling-policy", "fcfs"});
  const std::string& out = server.output();
  for (const char* note : {"note: --cuda-graph-sizes 1 2 4:", "note: --disable-fastapi-docs:",
                           "note: --max-parallel-loading-workers 2:",
                           "note: --chat-template-content-format openai:", "note: --override-generation-config:",
                           "note: CORS: browsers at https://app.example may call the API"})
    EXPECT_NE(out.find(note), std::string::npos) << note << "\n" << out;
  // Temperature 0 by default now: a request without one is greedy, as one that asks for 0.
  const json prompt = {{"model", "glm5-tiny-code"}, {"prompt", "def fibonacci(n):"}, {"max_tokens", 12}};
  json greedy = prompt;
  greedy["temperature"] = 0;
  const std::string expected = json::parse(http(server.port(), "POST", "/v1/completions", greedy.dump()).body)["choices"][0]["text"];
  for (int i = 0; i < 2; ++i)
    EXPECT_EQ(json::parse(http(server.port(), "POST", "/v1/completions", prompt.dump()).body)["choices"][0]["text"], expected);
  // CORS: the page's origin may call, another's may not.
  const Response allowed = http(server.port(), "POST", "/v1/completions", prompt.dump(), {{"origin", "https://app.example"}});
  EXPECT_EQ(allowed.headers.count("access-control-allow-origin") ? allowed.headers.at("access-control-allow-origin") : "",
            "https://app.example");
  const Response preflight = http(server.port(), "OPTIONS", "/v1/completions", "",
                                  {{"origin", "https://evil.example"}, {"access-control-request-method", "POST"}});
  EXPECT_EQ(preflight.status, 400);
  // A stream that does not ask for usage still ends with it.
  json streamed = prompt;
  streamed["stream"] = true;
  const std::string events = http(server.port(), "POST", "/v1/completions", streamed.dump()).body;
  EXPECT_NE(events.find("\"completion_tokens\":12,\"prompt_tokens_details\""), std::string::npos) << events;
  EXPECT_EQ(server.stop(SIGTERM, 60.0), 0);
}

// A hub cache as `hf download zai-org/glm5-tiny-code` leaves it: refs/main names a snapshot whose
// files link to the bundled model's (huggingface_hub links them into blobs/).
std::string make_hub_cache(const std::string& name) {
  namespace fs = std::filesystem;
  const fs::path cache = fs::path(GLMS_BINARY_DIR "/tests/e2e") / name;
  const std::string commit = "0a1b2c3d4e5f60718293a4b5c6d7e8f901234567";
  const fs::path repo = cache / "models--zai-org--glm5-tiny-code";
  fs::remove_all(cache);
  fs::create_directories(repo / "refs");
  fs::create_directories(repo / "snapshots" / commit);
  for (const auto& entry : fs::directory_iterator(kModel))
    fs::create_symlink(entry.path(), repo / "snapshots" / commit / entry.path().filename());
  std::ofstream(repo / "refs" / "main") << commit;
  return cache.string();
}

TEST(VllmLaunch, AHuggingFaceRepoIdIsReadFromTheHubCache) {
  const std::string cache = make_hub_cache("hub_cache");
  ServerProcess server(kBinary, {"serve", "zai-org/glm5-tiny-code", "--download-dir", cache, "--port", "0",
                                 "--kv-cache-memory", "64M", "--tokenizer", "zai-org/glm5-tiny-code"});
  EXPECT_NE(server.output().find("served as 'zai-org/glm5-tiny-code'"), std::string::npos) << server.output();
  const Response r = http(server.port(), "POST", "/v1/completions",
                          json{{"model", "zai-org/glm5-tiny-code"}, {"prompt", "def f():"}, {"max_tokens", 2}}.dump());
  EXPECT_EQ(r.status, 200) << r.body;
  // vLLM's bench line loads the tokenizer of --model, a repo id found through HF_HUB_CACHE.
  const auto [out, status] = run_glmserve("bench --backend vllm --model zai-org/glm5-tiny-code --dataset-name random "
                                          "--random-input-len 24 --random-output-len 4 --num-prompts 2 --request-rate "
                                          "inf --no-progress --host 127.0.0.1 --port " + std::to_string(server.port()),
                                          "HF_HUB_CACHE=" + cache);
  EXPECT_EQ(status, 0) << out;
  EXPECT_EQ(server.stop(SIGTERM, 60.0), 0);
  // A repo id not in the cache, or at a revision it lacks, is refused with the line that fetches it.
  const auto [missing, missing_status] =
      run_glmserve("serve zai-org/GLM-5.2 --download-dir " + cache + " --port 0");
  EXPECT_NE(missing_status, 0);
  EXPECT_NE(missing.find("hf download zai-org/GLM-5.2"), std::string::npos) << missing;
  const auto [revision, revision_status] =
      run_glmserve("serve zai-org/glm5-tiny-code --revision v9 --download-dir " + cache + " --port 0");
  EXPECT_NE(revision_status, 0);
  EXPECT_NE(revision.find("not at revision 'v9': it has 0a1b2c3d"), std::string::npos) << revision;
}

TEST(VllmLaunch, FlagsThatCannotApplyAreRefusedSayingWhy) {
  struct Case {
    std::string args, expect;
  };
  const std::string vllm_yaml = GLMS_BINARY_DIR "/tests/e2e/vllm-serve.yaml";  // vLLM's `serve --config`
  std::ofstream(vllm_yaml) << "tensor-parallel-size: 1\n";
  const Case cases[] = {
      {"serve " + kModel + " --config " + vllm_yaml, "vLLM's YAML file of serve flags is not read here"},
      {"serve " + kModel + " --dtype float16", "glmserve computes in bf16"},
      {"serve " + kModel + " --max-model-len 8x", "--max-model-len: '8x' has an unknown suffix"},
      {"serve " + kModel + " --kv-cache-memory 2Q", "--kv-cache-memory: '2Q' has an unknown suffix"},
      {"serve zai-org/GLM-5", "hf download zai-org/GLM-5"},
      {"serve " + kModel + " --tool-call-parser hermes", "glmserve parses GLM's format only"},
      {"serve " + kModel + " --quantization mxfp4", "reads a checkpoint's own quantisation as stored"},
      {"serve " + kModel + " --ssl-certfile cert.pem", "put a TLS-terminating proxy"},
      {"serve " + kModel + " --frobnicate", "vLLM's and SGLang's flags that serve takes"},
      {"serve " + kModel + " --model /tmp", "the model is given twice"},
      {"serve " + kModel + " --generation-config /tmp", "no generation_config.json there"},
      {"serve " + kModel + " --api-key-file /nonexistent/keys", "cannot read it"},
      {"serve " + kModel + " -pp 2", "glmserve has no pipeline parallelism"},
      {"serve " + kModel + " --headless --data-parallel-start-rank 1", "under mpirun, one process a node"},
      {"serve " + kModel + " --load-format dummy", "add --device cuda"},
      {"serve " + kModel + " --expert-format mxfp4", "is for --synthetic weights"},
      {"serve " + kModel + " --expert-format fp4", "fp4 not in {bf16,mxfp4,fp8}"},
      {"serve " + kModel + " --speculative-config.method eagle3", "drafts with the checkpoint's MTP layer only"},
      {"serve " + kModel + " --speculative_config '{\"method\": \"mtp\", \"num_speculative_tokens\": 99}'",
       "num_speculative_tokens must be a whole number from 1 to 16"},
      {"serve --model-path zai-org/GLM-5-FP8", "hf download zai-org/GLM-5-FP8"},
      {"serve " + kModel + " --speculative-algorithm EAGLE3", "MTP layer only"},
      {"serve " + kModel + " --tp 8 --dp 3 --enable-dp-attention", "is not a multiple of --dp-size 3"},
      {"serve " + kModel + " --dist-init-addr 10.0.0.1:5000 --nnodes 2", "under mpirun"},
  };
  for (const Case& c : cases) {
    const auto [out, status] = run_glmserve(c.args);
    EXPECT_EQ(status, 1) << c.args << "\n" << out;
    EXPECT_NE(out.find(c.expect), std::string::npos) << c.args << "\n" << out;
  }
}

// A bad number says what the flag expects, in words (CLI11's own checks print a range up to the
// largest double, 309 digits).
TEST(VllmLaunch, BadNumbersSayWhatTheFlagExpects) {
  const std::pair<std::string, std::string> cases[] = {
      {"serve " + kModel + " --max-num-seqs abc", "--max-num-seqs: expects a number above 0, not 'abc'"},
      {"serve " + kModel + " --request-timeout -1", "--request-timeout: expects a number of 0 or more, not '-1'"},
      {"generate --model " + kModel + " --max-tokens -5", "--max-tokens: expects a number of 0 or more, not '-5'"},
  };
  for (const auto& [args, expect] : cases) {
    const auto [out, status] = run_glmserve(args);
    EXPECT_NE(status, 0) << args << "\n" << out;
    EXPECT_NE(out.find(expect), std::string::npos) << args << "\n" << out;
    EXPECT_LT(out.size(), 300u) << args << "\n" << out;
  }
}

// `glmserve plan` takes serve's --kv-cache-dtype spellings and suggests the flag back: the FP8
// layout's bytes (53,940 a GLM-5.2 token), a clear refusal of what glmserve does not have.
TEST(VllmLaunch, PlanTakesServesKvCacheDtype) {
  const std::string plan = "plan --config " GLMS_SOURCE_DIR "/models/configs/glm-5.2.json --gpu h200 --gpus 8";
  const auto [fp8, fp8_status] = run_glmserve(plan + " --kv-cache-dtype fp8_e4m3");
  EXPECT_EQ(fp8_status, 0) << fp8;
  EXPECT_NE(fp8.find("fp8: 53.9 KB per token (53940 B)"), std::string::npos) << fp8;
  EXPECT_NE(fp8.find("--kv-cache-dtype fp8"), std::string::npos) << fp8;
  const auto [bf16, bf16_status] = run_glmserve(plan + " --kv-cache-dtype auto");
  EXPECT_EQ(bf16_status, 0) << bf16;
  EXPECT_NE(bf16.find("bf16: 95.2 KB per token (95232 B)"), std::string::npos) << bf16;
  EXPECT_EQ(bf16.find("--kv-cache-dtype"), std::string::npos) << bf16;
  const auto [bad, bad_status] = run_glmserve(plan + " --kv-cache-dtype fp16");
  EXPECT_NE(bad_status, 0);
  EXPECT_NE(bad.find("fp16 not in {bf16,auto,fp8,fp8_e4m3,fp8_ds_mla}"), std::string::npos) << bad;
}

// Slow or silent clients cannot hold the server: past --max-connections a connection gets a 503
// and is closed, and a request whose headers stall past --header-timeout is cut off.
TEST(ConnectionLimits, TooManyConnectionsAndStalledHeadersAreCutOff) {
  ServerProcess server(kBinary, {"serve", kModel, "--port", "0", "--max-connections", "2", "--header-timeout", "0.5"});
  const int first = connect_to(server.port()), second = connect_to(server.port());
  ASSERT_GE(first, 0);
  ASSERT_GE(second, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // both accepted
  const Response third = http(server.port(), "GET", "/health");
  EXPECT_EQ(third.status, 503) << third.body;
  EXPECT_NE(third.body.find("Too many open connections (2)"), std::string::npos) << third.body;
  // Half a request's headers, then nothing: the server closes the connection.
  send_all(first, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n");
  char byte;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(recv(first, &byte, 1, 0), 0);  // closed
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5.0);
  close(first);
  close(second);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(http(server.port(), "GET", "/health").status, 200);  // the slots are free again
  EXPECT_EQ(server.stop(SIGTERM, 30.0), 0);
}
