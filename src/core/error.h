// Errors: every failure the user can cause is a glms::Error with a message that says what
// went wrong, where (file, tensor, field), and what to do. Internal invariants use GLMS_CHECK.
#pragma once

#include <stdexcept>
#include <string>

namespace glms {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

[[noreturn]] void fail(const std::string& message);

}  // namespace glms

#define GLMS_CHECK(cond, msg)                                          \
  do {                                                                 \
    if (!(cond)) ::glms::fail(std::string(__FILE__ ":") +              \
                              std::to_string(__LINE__) + ": " + (msg)); \
  } while (0)
