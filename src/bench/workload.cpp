#include "bench/workload.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <mutex>
#include <random>
#include <thread>

#include "bench/arrivals.h"
#include "core/error.h"

namespace glms::bench {

namespace {


// Ids worth sampling: in the vocabulary, not special, with a non-empty token string.
std::vector<int32_t> ordinary_ids(const text::Tokenizer& tok) {
  std::vector<int32_t> ids;
  const auto n = static_cast<int32_t>(tok.vocab_size());
  for (int32_t id = 0; id < n; ++id)
    if (!tok.is_special(id) && !tok.id_to_token(id).empty()) ids.push_back(id);
  if (ids.empty()) fail("bench: the tokenizer has no ordinary tokens to build prompts from");
  return ids;
}

void append_random(std::vector<int32_t>& ids, size_t target, const std::vector<int32_t>& pool, std::mt19937_64& rng) {
  std::uniform_int_distribution<size_t> pick(0, pool.size() - 1);
  while (ids.size() < target) ids.push_back(pool[pick(rng)]);
}

std::vector<int32_t> exact_ids_impl(const text::Tokenizer& tok, const std::vector<int32_t>& pool,
                                    const std::vector<int32_t>& prefix, int len, uint64_t seed) {
  if (len < static_cast<int>(prefix.size())) fail("bench: prompt shorter than its shared prefix");
  const size_t target = static_cast<size_t>(len);
  std::mt19937_64 rng(mix_seed(seed));
  std::vector<int32_t> cand = prefix;
  append_random(cand, target, pool, rng);
  // Decode, re-encode, then cut or pad the canonical ids back to the target length; repeat until
  // the text encodes to exactly `target` ids that start with the prefix. Each round only changes
  // the tail, so this settles in a few rounds; a stuck suffix is redrawn.
  for (int round = 0; round < 64; ++round) {
    const std::string text = tok.decode(cand);
    std::vector<int32_t> enc = tok.encode(text, false);
    const bool prefix_ok = enc.size() >= prefix.size() && std::equal(prefix.begin(), prefix.end(), enc.begin());
    if (prefix_ok && enc.size() == target) return enc;
    if (!prefix_ok || round % 16 == 15) {
      cand = prefix;
    } else {
      enc.resize(std::min(enc.size(), target));
      cand = std::move(enc);
    }
    append_random(cand, target, pool, rng);
  }
  fail("bench: could not make a prompt of exactly " + std::to_string(len) +
       " tokens with this tokenizer (decode/encode round trip does not settle)");
}

int draw_len(int mean, double ratio, std::mt19937_64& rng) {
  if (ratio <= 0) return mean;
  const int lo = std::max(1, static_cast<int>(mean * (1 - ratio)));
  const int hi = std::max(lo, static_cast<int>(mean * (1 + ratio)));
  return std::uniform_int_distribution<int>(lo, hi)(rng);
}

}  // namespace

void for_each_index(size_t count, unsigned threads, const std::function<void(size_t)>& fn) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  threads = static_cast<unsigned>(std::min<size_t>(threads, std::max<size_t>(count, 1)));
  std::vector<std::thread> workers;
  std::exception_ptr error;
  std::mutex error_mu;
  for (unsigned t = 0; t < threads; ++t)
    workers.emplace_back([&, t] {
      try {
        for (size_t i = t; i < count; i += threads) fn(i);
      } catch (...) {
        std::lock_guard lock(error_mu);
        if (!error) error = std::current_exception();
      }
    });
  for (auto& worker : workers) worker.join();
  if (error) std::rethrow_exception(error);
}

std::vector<int32_t> exact_ids(const text::Tokenizer& tok, const std::vector<int32_t>& prefix, int len, uint64_t seed) {
  return exact_ids_impl(tok, ordinary_ids(tok), prefix, len, seed);
}

std::vector<Prompt> make_prompts(const text::Tokenizer& tok, const WorkloadSpec& spec, size_t count, unsigned threads) {
  if (spec.input_len < 1) fail("--input-len must be >= 1");
  if (spec.output_len < 1) fail("--output-len must be >= 1");
  if (spec.range_ratio < 0 || spec.range_ratio >= 1) fail("--range-ratio must be in [0, 1)");
  if (spec.prefix_hit < 0 || spec.prefix_hit >= 1) fail("--prefix-hit must be in [0, 1)");
  if (spec.num_prefixes < 1) fail("--num-prefixes must be >= 1");
  const std::vector<int32_t> pool = ordinary_ids(tok);

  const int prefix_len = static_cast<int>(std::lround(spec.prefix_hit * spec.input_len));
  std::vector<std::vector<int32_t>> prefixes;
  if (prefix_len > 0)
    for (int g = 0; g < spec.num_prefixes; ++g)
      prefixes.push_back(exact_ids_impl(tok, pool, {}, prefix_len, spec.seed * 7919 + 0x9e3779b97f4a7c15ull + g));

  std::vector<Prompt> out(count);
  auto make_one = [&](size_t i) {
    std::mt19937_64 rng(mix_seed(spec.seed * 1000003 + i));
    Prompt& p = out[i];
    int len = draw_len(spec.input_len, spec.range_ratio, rng);
    p.output_len = draw_len(spec.output_len, spec.range_ratio, rng);
    std::vector<int32_t> prefix;
    if (!prefixes.empty()) {
      p.prefix_group = static_cast<int>(i % prefixes.size());
      prefix = prefixes[p.prefix_group];
      p.prefix_len = prefix_len;
      len = std::max(len, prefix_len + 1);
    }
    p.ids = exact_ids_impl(tok, pool, prefix, len, rng());
    p.text = tok.decode(p.ids);
  };
  for_each_index(count, threads, make_one);
  return out;
}

std::vector<Preset> presets() {
  std::vector<Preset> p;
  p.push_back({"agentic", "20k in / 1k out, 60% prefix-cache hit, sustained request-rate sweep", 20000, 1000, 0.6,
               {0.5, 1.0, 1.5, 2.0, 2.25, 2.4}, {}, 240, 8});
  p.push_back({"single-stream", "10k in / 1.5k out, one request at a time", 10000, 1500, 0.0, {}, {1}, 8, 1});
  p.push_back({"batch-sweep", "2048 in / 1024 out, batch (concurrency) 1..128", 2048, 1024, 0.0, {},
               {1, 2, 4, 8, 16, 32, 64, 128}, 0, -1});
  p.push_back({"interactivity", "8k in / 1k out, concurrency sweep: tok/s/GPU vs tok/s/user", 8192, 1024, 0.0, {},
               {1, 2, 4, 8, 16, 32, 64, 128, 256}, 0, -1});
  return p;
}

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const Preset& p : presets()) names.push_back(p.name);
  return names;
}

std::optional<Preset> find_preset(const std::string& name) {
  for (Preset& p : presets())
    if (p.name == name) return p;
  return std::nullopt;
}

}  // namespace glms::bench
