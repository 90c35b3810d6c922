// MTP speculative decoding must give exactly the plain greedy tokens, for every draft depth,
// on a trained model (drafts often accepted) and a random one (drafts almost never accepted);
// sampled speculation is seeded and accounts its drafts (its distribution is tested on the
// rejection sampler itself in test_sampler.cpp).
#include <gtest/gtest.h>

#include "core/error.h"
#include "engine/generator.h"
#include "io/safetensors.h"

using namespace glms;

namespace {

std::vector<int32_t> golden_prompt(const std::string& dir, size_t length) {
  const io::Checkpoint golden = io::Checkpoint::open(std::string(GLMS_SOURCE_DIR) + "/" + dir + "/golden.safetensors");
  const auto ids = io::read_i64(golden.get("prompt_ids"));
  return std::vector<int32_t>(ids.begin(), ids.begin() + std::min(length, ids.size()));
}

engine::GenerateResult run(const model::Glm5Model& model, const std::vector<int32_t>& prompt, int steps, int tokens,
                           float temperature = 0.0f, uint64_t seed = 0) {
  engine::GenerateOptions options;
  options.max_tokens = tokens;
  options.sampling.temperature = temperature;
  options.sampling.seed = seed;
  options.ignore_eos = true;
  options.block_size = 16;
  options.prefill_chunk = 37;
  options.speculative_steps = steps;
  return engine::generate(model, prompt, options);
}

}  // namespace

class Speculative : public ::testing::TestWithParam<std::string> {};

TEST_P(Speculative, GreedyOutputEqualsPlainDecodingForEveryDepth) {
  const std::string dir = GetParam();
  const model::Glm5Model model(model::load_weights(std::string(GLMS_SOURCE_DIR) + "/" + dir));
  ASSERT_EQ(model.num_mtp_layers(), 1);
  for (size_t prompt_length : {1u, 9u, 120u}) {
    const auto prompt = golden_prompt(dir, prompt_length);
    const auto plain = run(model, prompt, 0, 40);
    for (int steps = 1; steps <= 4; ++steps) {
      const auto spec = run(model, prompt, steps, 40);
      EXPECT_EQ(spec.output_ids, plain.output_ids) << dir << " prompt " << prompt_length << " K=" << steps;
      const auto& s = spec.speculative;
      EXPECT_EQ(s.drafted, s.steps * steps);
      EXPECT_LE(s.accepted, s.drafted);
      for (int i = 1; i < steps; ++i) EXPECT_LE(s.accepted_per_position[i], s.accepted_per_position[i - 1]);
      EXPECT_GE(static_cast<int64_t>(spec.output_ids.size()), s.steps);  // at least one token per step
      std::printf("[ spec     ] %s prompt %zu K=%d: acceptance length %.2f over %lld steps\n", dir.c_str(),
                  prompt_length, steps, s.acceptance_length(), static_cast<long long>(s.steps));
    }
  }
}

TEST(SpeculativeSampled, SeededAndAccountedOnTheBundledModel) {
  const model::Glm5Model model(model::load_weights(std::string(GLMS_SOURCE_DIR) + "/models/glm5-tiny-code"));
  const auto prompt = golden_prompt("models/glm5-tiny-code", 40);
  const auto a = run(model, prompt, 3, 48, 0.8f, 7), b = run(model, prompt, 3, 48, 0.8f, 7);
  const auto c = run(model, prompt, 3, 48, 0.8f, 8);
  EXPECT_EQ(a.output_ids, b.output_ids) << "same seed, same tokens";
  EXPECT_NE(a.output_ids, c.output_ids) << "another seed, other tokens";
  EXPECT_EQ(a.output_ids.size(), 48u);
  const auto& s = a.speculative;
  EXPECT_EQ(s.drafted, 3 * s.steps);
  // The first token comes from the prefill, each step emits its accepted drafts and one more;
  // the last step may stop early at max_tokens (losing at most K).
  const int64_t emitted = static_cast<int64_t>(a.output_ids.size());
  EXPECT_LE(emitted, 1 + s.steps + s.accepted);
  EXPECT_GE(emitted, 1 + s.steps + s.accepted - 3);
  EXPECT_GT(s.acceptance_length(), 1.2) << "the trained MTP layer's samples are often the target's";
  std::printf("[ spec     ] sampled at temperature 0.8, K=3: acceptance length %.2f\n", s.acceptance_length());
}

TEST(SpeculativeErrors, NeedsAnMtpLayer) {
  const model::Glm5Model model(model::load_weights(std::string(GLMS_SOURCE_DIR) + "/tests/golden/glm5-random"));
  engine::GenerateOptions options;
  options.sampling.temperature = 0.0f;
  options.speculative_steps = 2;
  EXPECT_THROW(engine::generate(model, {1, 2, 3}, options), Error) << "glm5-random has no MTP layer";
}

INSTANTIATE_TEST_SUITE_P(Models, Speculative, ::testing::Values("models/glm5-tiny-code", "tests/golden/glm52-random"),
                         [](const auto& info) {
                           return info.param == "models/glm5-tiny-code" ? std::string("tiny") : std::string("random");
                         });
