#include "server/auth.h"

#include <jwt.h>
#include <openssl/crypto.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <memory>

namespace glms::server {

namespace {

bool equal_constant_time(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

AuthResult deny(const std::string& message) {
  AuthResult r;
  r.error = ApiError{401, message, "", 0.0};
  return r;
}

struct JwtFree {
  void operator()(jwt_t* j) const { jwt_free(j); }
};

}  // namespace

Authenticator::Authenticator(std::vector<std::string> api_keys, std::string jwt_secret)
    : keys_(std::move(api_keys)), jwt_secret_(std::move(jwt_secret)) {}

AuthResult Authenticator::check(const std::string& authorization, int64_t now) const {
  if (!enabled()) return AuthResult{true, "", {}};
  static const std::string kBearer = "Bearer ";
  if (authorization.empty()) return deny("Missing API key: send 'Authorization: Bearer <key>'.");
  if (authorization.size() <= kBearer.size() || authorization.compare(0, kBearer.size(), kBearer) != 0)
    return deny("Invalid Authorization header: expected 'Bearer <key>'.");
  const std::string token = authorization.substr(kBearer.size());
  bool matched = false;
  size_t index = 0;
  for (size_t i = 0; i < keys_.size(); ++i) {
    if (equal_constant_time(token, keys_[i]) && !matched) {
      matched = true;
      index = i;
    }
  }
  if (matched) return AuthResult{true, "key:" + std::to_string(index), {}};
  if (jwt_secret_.empty()) return deny("Incorrect API key provided.");

  // Only compact JWS with three parts can be a JWT; anything else is a wrong key.
  if (std::count(token.begin(), token.end(), '.') != 2)
    return deny(keys_.empty() ? "Invalid token." : "Incorrect API key provided.");
  jwt_t* raw = nullptr;
  const int rc = jwt_decode(&raw, token.c_str(), reinterpret_cast<const unsigned char*>(jwt_secret_.data()),
                            static_cast<int>(jwt_secret_.size()));
  std::unique_ptr<jwt_t, JwtFree> jwt(raw);
  if (rc != 0 || !jwt) return deny("Invalid token: bad signature or malformed JWT.");
  if (jwt_get_alg(jwt.get()) != JWT_ALG_HS256) return deny("Invalid token: only HS256 tokens are accepted.");
  // exp and nbf are NumericDates (RFC 7519); present but not a number, the token is refused
  // (libjwt's integer getter reads such a claim as 0, which would make nbf always pass).
  for (const char* claim : {"exp", "nbf"}) {
    char* raw_value = jwt_get_grants_json(jwt.get(), claim);
    if (!raw_value) continue;
    const std::string text(raw_value);
    std::free(raw_value);
    char* end = nullptr;
    const double value = std::strtod(text.c_str(), &end);
    if (text.empty() || *end != '\0' || !std::isfinite(value))
      return deny(std::string("Invalid token: ") + claim + " must be a number of seconds.");
    if (std::string(claim) == "exp" && value <= static_cast<double>(now)) return deny("Invalid token: expired.");
    if (std::string(claim) == "nbf" && value > static_cast<double>(now)) return deny("Invalid token: not valid yet (nbf).");
  }
  const char* sub = jwt_get_grant(jwt.get(), "sub");
  return AuthResult{true, std::string("jwt:") + (sub ? sub : ""), {}};
}

std::string make_hs256_jwt(const std::string& secret, const std::string& claims_json) {
  jwt_t* raw = nullptr;
  if (jwt_new(&raw) != 0) return {};
  std::unique_ptr<jwt_t, JwtFree> jwt(raw);
  if (jwt_add_grants_json(jwt.get(), claims_json.c_str()) != 0) return {};
  if (jwt_set_alg(jwt.get(), JWT_ALG_HS256, reinterpret_cast<const unsigned char*>(secret.data()),
                  static_cast<int>(secret.size())) != 0)
    return {};
  char* encoded = jwt_encode_str(jwt.get());
  if (!encoded) return {};
  std::string out(encoded);
  free(encoded);
  return out;
}

}  // namespace glms::server
