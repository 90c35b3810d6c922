// Bearer authentication: static API keys (--api-key, any of several) and HS256 JWTs signed with
// --jwt-secret (signature, alg, exp and nbf checked). With neither configured, every request
// is allowed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "server/api_error.h"

namespace glms::server {

struct AuthResult {
  bool ok = false;
  std::string identity;  // "key:<index>" or "jwt:<sub>" for per-client limits; empty if open
  ApiError error;        // 401 when !ok
};

class Authenticator {
 public:
  Authenticator(std::vector<std::string> api_keys, std::string jwt_secret);
  bool enabled() const { return !keys_.empty() || !jwt_secret_.empty(); }
  // `authorization` is the raw Authorization header value (may be empty); `now` is Unix time.
  AuthResult check(const std::string& authorization, int64_t now) const;

 private:
  std::vector<std::string> keys_;
  std::string jwt_secret_;
};

// Makes an HS256 JWT (for tests and docs examples). `claims_json` is the payload object.
std::string make_hs256_jwt(const std::string& secret, const std::string& claims_json);

}  // namespace glms::server
