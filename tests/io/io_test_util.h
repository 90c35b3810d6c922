// Shared helpers of the io tests: a per-test temp folder, raw safetensors bytes, and a check
// that a call throws glms::Error whose message contains given fragments.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"

namespace glms::io::testing {

// A fresh folder under the system temp dir, removed when the object dies.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = std::string("glms_io_") + (info ? info->test_suite_name() : "x") + "_" +
                       (info ? info->name() : "y") + "_" + std::to_string(::getpid());
    for (char& ch : name)
      if (ch == '/') ch = '_';
    path_ = std::filesystem::temp_directory_path() / name;
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

// 8-byte little-endian header length + header text + data.
inline std::string raw_safetensors(const std::string& header, const std::string& data = "",
                                   int64_t length_override = -1) {
  const uint64_t n = length_override >= 0 ? static_cast<uint64_t>(length_override) : header.size();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

inline void write_file(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Fails the test unless `fn` throws glms::Error containing every fragment; returns the message.
inline std::string expect_error(const std::function<void()>& fn,
                                const std::vector<std::string>& fragments) {
  try {
    fn();
  } catch (const glms::Error& e) {
    const std::string message = e.what();
    for (const auto& fragment : fragments)
      EXPECT_NE(message.find(fragment), std::string::npos)
          << "message lacks '" << fragment << "': " << message;
    return message;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a non-glms exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "did not throw; expected an error containing '"
                << (fragments.empty() ? "" : fragments[0]) << "'";
  return "";
}

}  // namespace glms::io::testing
