// Errors the HTTP API reports, in OpenAI's shape as vLLM serves it:
//   {"error": {"message": "...", "type": "BadRequestError", "param": "temperature", "code": 400}}
// Every handler failure becomes an ApiError; nothing else reaches the client.
#pragma once

#include <string>
#include <utility>

namespace glms::server {

struct ApiError {
  int status = 400;
  std::string message;
  std::string param;          // the offending request field, or empty (serialised as null)
  double retry_after = 0.0;   // seconds; > 0 adds a Retry-After header (429, 503)

  // The "type" member: vLLM's names (BadRequestError, NotFoundError, ...), by status.
  std::string type() const;
};

// Throwable wrapper so deep parsing code can bail out with one statement.
struct ApiException {
  ApiError error;
};

[[noreturn]] inline void throw_api(int status, std::string message, std::string param = {}) {
  throw ApiException{ApiError{status, std::move(message), std::move(param), 0.0}};
}
[[noreturn]] inline void bad_request(std::string message, std::string param = {}) {
  throw_api(400, std::move(message), std::move(param));
}

// The JSON body for `error` (one line, no trailing newline).
std::string error_body(const ApiError& error);

}  // namespace glms::server
