// The log's two formats and its level filter, read back from a stream sink.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "core/error.h"
#include "log/log.h"

using namespace glms;

namespace {
std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}
}  // namespace

TEST(Log, TextLinesHaveATimestampAndALevelAndTheFilterHolds) {
  std::ostringstream out;
  log::configure(log::Level::kInfo, log::Format::kText, &out);
  log::debug("not shown");
  log::info("engine ready");
  log::warning("cache small");
  const auto lines = lines_of(out.str());
  ASSERT_EQ(lines.size(), 2u) << out.str();
  EXPECT_TRUE(std::regex_match(lines[0], std::regex(R"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} info  engine ready)")))
      << lines[0];
  EXPECT_NE(lines[1].find("warn"), std::string::npos) << lines[1];
  EXPECT_FALSE(log::enabled(log::Level::kDebug));
  EXPECT_TRUE(log::enabled(log::Level::kError));
  log::configure(log::Level::kInfo, log::Format::kText);
}

TEST(Log, JsonLinesParseAndKeepTheMessageExactly) {
  std::ostringstream out;
  log::configure(log::Level::kDebug, log::Format::kJson, &out);
  const std::string tricky = "POST /v1/chat \"quoted\" back\\slash\ttab\nnewline \x01";
  log::debug(tricky);
  log::error("failed");
  const auto lines = lines_of(out.str());
  ASSERT_EQ(lines.size(), 2u) << out.str();
  const auto first = nlohmann::json::parse(lines[0]);
  EXPECT_EQ(first["msg"], tricky);
  EXPECT_EQ(first["level"], "debug");
  EXPECT_TRUE(std::regex_match(first["time"].get<std::string>(), std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z)")));
  EXPECT_EQ(nlohmann::json::parse(lines[1])["level"], "error");
  log::configure(log::Level::kInfo, log::Format::kText);
}

TEST(Log, LevelAndFormatNamesAreCheckedWithTheChoices) {
  EXPECT_EQ(log::parse_level("warn"), log::Level::kWarning);
  EXPECT_EQ(log::parse_format("json"), log::Format::kJson);
  try {
    log::parse_level("loud");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("trace, debug, info, warning, error or off"), std::string::npos);
  }
  EXPECT_THROW(log::parse_format("xml"), Error);
}
