// libFuzzer target: Bearer authentication. Any Authorization header is either accepted or refused
// with a 401 and a message; a token the input's claims make (signed with the right secret) is
// judged by its exp / nbf alone.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <climits>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "server/auth.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const glms::server::Authenticator auth({"sk-key"}, "secret");
  const std::string input(reinterpret_cast<const char*>(data), size);
  for (const std::string& header : {input, "Bearer " + input}) {
    const glms::server::AuthResult r = auth.check(header, 1700000000);
    if (!r.ok && (r.error.status != 401 || r.error.message.empty())) std::abort();
  }
  // Claims with a repeated name are refused by libjwt (RFC 7519 allows refusing them): the
  // property below is for claims without.
  size_t top_level_keys = 0;
  const nlohmann::json claims = nlohmann::json::parse(
      input, [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json&) {
        if (depth == 1 && event == nlohmann::json::parse_event_t::key) ++top_level_keys;
        return true;
      }, false);
  // libjwt's JSON reader also refuses integers beyond int64 (nlohmann reads those up to 2^64 as
  // unsigned, larger ones as floats): the property holds for claims whose numbers are all int64.
  bool plain_numbers = true;
  std::function<void(const nlohmann::json&)> scan = [&](const nlohmann::json& v) {
    if (v.is_number_float()) plain_numbers = false;
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) plain_numbers = false;
    if (v.is_structured())
      for (const auto& item : v) scan(item);
  };
  scan(claims);
  if (claims.is_object() && claims.size() == top_level_keys && plain_numbers) {
    const glms::server::AuthResult r = auth.check("Bearer " + glms::server::make_hs256_jwt("secret", input), 1700000000);
    const bool expired = claims.contains("exp") && !(claims["exp"].is_number() && claims["exp"].get<double>() > 1700000000);
    const bool early = claims.contains("nbf") && !(claims["nbf"].is_number() && claims["nbf"].get<double>() <= 1700000000);
    if (r.ok == (expired || early)) std::abort();
  }
  return 0;
}
