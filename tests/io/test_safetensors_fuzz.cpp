// Replays the fuzz seed corpus and seeded random mutations of it through
// SafetensorsFile::from_memory: every input must parse or throw glms::Error, and parsed tensors
// must lie inside the input.
#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>

#include "io/safetensors.h"
#include "io_test_util.h"

namespace glms::io {
namespace {

using nlohmann::json;

const std::filesystem::path kCorpus = std::filesystem::path(GLMS_SOURCE_DIR) / "fuzz/corpus/safetensors_header";

std::vector<std::pair<std::string, std::string>> load_corpus() {
  std::vector<std::pair<std::string, std::string>> out;
  // The named seeds (valid_* parse, invalid_* do not); what fuzzing added is replayed by
  // fuzz_replay.safetensors_header.
  for (const auto& entry : std::filesystem::directory_iterator(kCorpus)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("valid_", 0) == 0 || name.rfind("invalid_", 0) == 0) out.emplace_back(name, testing::read_file(entry.path()));
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Returns true when the input parsed; fails the test on anything but glms::Error.
bool check_input(const std::string& bytes, const std::string& label) {
  // An exactly sized heap copy, so sanitizer builds catch reads past the end.
  std::unique_ptr<std::byte[]> copy(new std::byte[bytes.size() + 1]);
  std::memcpy(copy.get(), bytes.data(), bytes.size());
  try {
    auto file = SafetensorsFile::from_memory(copy.get(), bytes.size(), label);
    for (const auto& t : file->tensors()) {
      EXPECT_TRUE(t.nbytes == 0 || (t.data >= copy.get() && t.data + t.nbytes <= copy.get() + bytes.size()))
          << label << ": tensor " << t.name << " outside the input";
      EXPECT_EQ(static_cast<size_t>(t.numel()) * dtype_size(t.dtype), t.nbytes) << label;
    }
    return true;
  } catch (const glms::Error& e) {
    EXPECT_NE(std::string(e.what()).find(label), std::string::npos) << e.what();
    return false;
  } catch (const std::exception& e) {
    ADD_FAILURE() << label << ": threw a non-glms exception: " << e.what();
  } catch (...) {
    ADD_FAILURE() << label << ": threw a non-standard exception";
  }
  return false;
}

TEST(SafetensorsFuzzReplay, SeedCorpus) {
  const auto corpus = load_corpus();
  ASSERT_GE(corpus.size(), 8u) << kCorpus;
  for (const auto& [name, bytes] : corpus) {
    const bool parsed = check_input(bytes, name);
    EXPECT_EQ(parsed, name.rfind("valid_", 0) == 0) << name;
  }
}

std::string with_length(const std::string& header, const std::string& data) {
  return testing::raw_safetensors(header, data);
}

json random_value(std::mt19937_64& rng) {
  switch (rng() % 12) {
    case 0: return nullptr;
    case 1: return static_cast<int64_t>(rng());
    case 2: return -static_cast<int64_t>(rng() % 10);
    case 3: return rng() % 40;
    case 4: return std::numeric_limits<uint64_t>::max() - rng() % 3;
    case 5: return 2.5;
    case 6: return "F32";
    case 7: return json::array({rng() % 8, rng() % 64});
    case 8: return json::array({rng() % 1000, rng() % 1000, rng() % 1000});
    case 9: return json::object({{"k", rng() % 2 ? json("v") : json(1)}});
    case 10: return std::string(1 + rng() % 5, static_cast<char>('A' + rng() % 26));
    default: return json::array();
  }
}

// Replaces one random leaf or member of `value` with a random value.
void mutate_json(json& value, std::mt19937_64& rng, int depth = 0) {
  if ((!value.is_structured() || value.empty() || rng() % 4 == 0) && depth > 0) {
    value = random_value(rng);
    return;
  }
  if (value.is_object() && !value.empty()) {
    auto it = value.begin();
    std::advance(it, rng() % value.size());
    if (rng() % 8 == 0) value.erase(it);
    else mutate_json(*it, rng, depth + 1);
  } else if (value.is_array() && !value.empty()) {
    mutate_json(value[rng() % value.size()], rng, depth + 1);
  } else {
    value = random_value(rng);
  }
}

TEST(SafetensorsFuzzReplay, SeededMutations) {
  std::mt19937_64 rng(20261129);
  std::vector<std::pair<json, std::string>> valid;  // parsed header, data region
  std::vector<std::string> seeds;
  for (const auto& [name, bytes] : load_corpus()) {
    seeds.push_back(bytes);
    if (name.rfind("valid_", 0) != 0) continue;
    uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    valid.emplace_back(json::parse(bytes.substr(8, n)), bytes.substr(8 + n));
  }
  ASSERT_FALSE(valid.empty());
  int parsed = 0, total = 0;
  // Structural mutations: valid headers with one field replaced.
  for (int i = 0; i < 3000; ++i) {
    auto [header, data] = valid[rng() % valid.size()];
    const int edits = 1 + static_cast<int>(rng() % 3);
    for (int e = 0; e < edits; ++e) mutate_json(header, rng);
    if (rng() % 4 == 0) data.resize(rng() % (data.size() + 1));
    parsed += check_input(with_length(header.dump(), data), "mut" + std::to_string(i));
    ++total;
  }
  // Byte mutations: flips, truncation, length field changes, on any seed.
  for (int i = 0; i < 3000; ++i) {
    std::string bytes = seeds[rng() % seeds.size()];
    switch (rng() % 4) {
      case 0:
        for (int k = 0; k < 4 && !bytes.empty(); ++k) bytes[rng() % bytes.size()] ^= static_cast<char>(1 << (rng() % 8));
        break;
      case 1: bytes.resize(rng() % (bytes.size() + 1)); break;
      case 2:
        if (bytes.size() >= 8) bytes[rng() % 8] = static_cast<char>(rng());
        break;
      default:
        if (bytes.size() > 8) bytes.insert(8 + rng() % (bytes.size() - 8), 1, "{}[]\",:0-9e.\\"[rng() % 14]);
    }
    parsed += check_input(bytes, "byte" + std::to_string(i));
    ++total;
  }
  RecordProperty("parsed", parsed);
  // Some mutants must still parse, so the test exercises the success path too.
  EXPECT_GT(parsed, 0);
  EXPECT_LT(parsed, total);
}

}  // namespace
}  // namespace glms::io
