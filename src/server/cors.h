// Cross-origin requests from browsers (CORS), as Starlette's CORSMiddleware answers them for vLLM:
// a preflight (OPTIONS with Access-Control-Request-Method) is answered before authentication, and
// every other answer to an allowed Origin carries Access-Control-Allow-Origin. Off unless origins
// are given (serve --allowed-origins).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "server/http_types.h"

namespace glms::server {

struct CorsConfig {
  std::vector<std::string> origins;  // "*" for any; empty: CORS off
  std::vector<std::string> methods = {"*"};
  std::vector<std::string> headers = {"*"};  // request headers a preflight may name
  bool credentials = false;
};

class CorsPolicy {
 public:
  explicit CorsPolicy(CorsConfig config);

  bool enabled() const { return !config_.origins.empty(); }
  static bool is_preflight(const HttpRequest& request);
  // The answer to a preflight: 200 with what may be sent, or 400 naming what is not allowed.
  HttpResponse preflight(const HttpRequest& request) const;
  // `responder` answering with the headers an answer to `origin` carries (itself where the origin
  // is not allowed or none was sent).
  std::shared_ptr<Responder> wrap(const std::string& origin, std::shared_ptr<Responder> responder) const;

 private:
  bool origin_allowed(const std::string& origin) const;
  std::vector<std::pair<std::string, std::string>> origin_headers(const std::string& origin) const;

  CorsConfig config_;
  bool any_origin_ = false, any_method_ = false, any_header_ = false;
};

}  // namespace glms::server
