// Encoding throughput of a tokenizer.json over text files (warm word cache, one thread).
// Usage: tokenizer_encode TOKENIZER FILE... ; prints one JSON object.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "text/tokenizer.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s TOKENIZER FILE...\n", argv[0]);
    return 2;
  }
  const glms::text::Tokenizer tokenizer = glms::text::Tokenizer::load(argv[1]);
  std::vector<std::string> texts;
  size_t bytes = 0;
  for (int i = 2; i < argc; ++i) {
    std::ifstream in(argv[i], std::ios::binary);
    std::stringstream buffer;
    buffer << in.rdbuf();
    texts.push_back(buffer.str());
    bytes += texts.back().size();
  }
  size_t tokens = 0;
  for (const auto& text : texts) tokens += tokenizer.encode(text).size();  // warms the word cache
  const int rounds = 20;
  const auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < rounds; ++r)
    for (const auto& text : texts) tokens += tokenizer.encode(text).size();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("{\"bytes\": %zu, \"rounds\": %d, \"mb_per_s\": %.2f, \"tokens_per_round\": %zu}\n", bytes, rounds,
              static_cast<double>(bytes) * rounds / seconds / 1e6, tokens / (rounds + 1));
  return 0;
}
