// parse_readable_count: vLLM's human-readable numbers (k = 1000, K = 1024) and byte sizes.
#include <gtest/gtest.h>

#include "core/error.h"
#include "core/readable_number.h"

using glms::parse_readable_count;

TEST(ReadableNumber, PlainAndSuffixedCounts) {
  EXPECT_EQ(parse_readable_count("8192", "--max-model-len"), 8192);
  EXPECT_EQ(parse_readable_count("8k", "--max-model-len"), 8000);
  EXPECT_EQ(parse_readable_count("8K", "--max-model-len"), 8192);
  EXPECT_EQ(parse_readable_count("25.6k", "--max-model-len"), 25600);
  EXPECT_EQ(parse_readable_count("1m", "x"), 1000000);
  EXPECT_EQ(parse_readable_count("1M", "x"), 1 << 20);
}

TEST(ReadableNumber, ByteSizes) {
  EXPECT_EQ(parse_readable_count("2G", "--kv-cache-memory"), int64_t{2} << 30);
  EXPECT_EQ(parse_readable_count("2GiB", "--kv-cache-memory"), int64_t{2} << 30);
  EXPECT_EQ(parse_readable_count("2GB", "--kv-cache-memory"), 2000000000);
  EXPECT_EQ(parse_readable_count("512MiB", "--kv-cache-memory"), int64_t{512} << 20);
  EXPECT_EQ(parse_readable_count("1.5T", "x"), int64_t{3} << 39);
}

TEST(ReadableNumber, BadInputNamesTheFlagAndTheForms) {
  for (const char* bad : {"", "abc", "8x", "1.5", "8kk", "-3", "1e3", "0.3k7", "99999999999T"}) {
    try {
      parse_readable_count(bad, "--max-model-len");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const glms::Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("--max-model-len"), std::string::npos) << what;
      EXPECT_NE(what.find("8K = 8192"), std::string::npos) << what;
    }
  }
}
