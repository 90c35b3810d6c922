#include "server/cors.h"

#include <algorithm>
#include <cctype>

namespace glms::server {

namespace {

bool contains(const std::vector<std::string>& list, const std::string& item) {
  return std::find(list.begin(), list.end(), item) != list.end();
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string trimmed(const std::string& s) {
  const size_t begin = s.find_first_not_of(" \t"), end = s.find_last_not_of(" \t");
  return begin == std::string::npos ? "" : s.substr(begin, end - begin + 1);
}

std::string joined(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

}  // namespace

CorsPolicy::CorsPolicy(CorsConfig config) : config_(std::move(config)) {
  any_origin_ = contains(config_.origins, "*");
  any_method_ = contains(config_.methods, "*");
  any_header_ = contains(config_.headers, "*");
  for (std::string& header : config_.headers) header = lower(header);
}

bool CorsPolicy::is_preflight(const HttpRequest& request) {
  return request.method == "OPTIONS" && !request.header("origin").empty() &&
         !request.header("access-control-request-method").empty();
}

bool CorsPolicy::origin_allowed(const std::string& origin) const {
  return enabled() && !origin.empty() && (any_origin_ || contains(config_.origins, origin));
}

// "*" where any origin may read without credentials; else the origin itself, which varies.
std::vector<std::pair<std::string, std::string>> CorsPolicy::origin_headers(const std::string& origin) const {
  std::vector<std::pair<std::string, std::string>> headers;
  if (any_origin_ && !config_.credentials) {
    headers.emplace_back("Access-Control-Allow-Origin", "*");
  } else {
    headers.emplace_back("Access-Control-Allow-Origin", origin);
    headers.emplace_back("Vary", "Origin");
  }
  if (config_.credentials) headers.emplace_back("Access-Control-Allow-Credentials", "true");
  return headers;
}

HttpResponse CorsPolicy::preflight(const HttpRequest& request) const {
  const std::string origin = request.header("origin");
  const std::string method = request.header("access-control-request-method");
  std::vector<std::string> refused;
  if (!origin_allowed(origin)) refused.push_back("origin");
  if (!any_method_ && !contains(config_.methods, method)) refused.push_back("method");
  const std::string asked_headers = request.header("access-control-request-headers");
  if (!any_header_) {
    static const std::vector<std::string> kSafelisted = {"accept", "accept-language", "content-language", "content-type"};
    size_t at = 0;
    while (at <= asked_headers.size()) {
      const size_t comma = std::min(asked_headers.find(',', at), asked_headers.size());
      const std::string header = lower(trimmed(asked_headers.substr(at, comma - at)));
      if (!header.empty() && !contains(config_.headers, header) && !contains(kSafelisted, header)) {
        refused.push_back("headers");
        break;
      }
      at = comma + 1;
    }
  }
  HttpResponse response;
  response.content_type = "text/plain; charset=utf-8";
  if (!refused.empty()) {
    response.status = 400;
    response.body = "Disallowed CORS " + joined(refused);
    return response;
  }
  response.body = "OK";
  response.headers = origin_headers(origin);
  response.headers.emplace_back("Access-Control-Allow-Methods",
                                any_method_ ? "DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT" : joined(config_.methods));
  const std::string allowed_headers = any_header_ ? asked_headers : joined(config_.headers);
  if (!allowed_headers.empty()) response.headers.emplace_back("Access-Control-Allow-Headers", allowed_headers);
  response.headers.emplace_back("Access-Control-Max-Age", "600");
  return response;
}

std::shared_ptr<Responder> CorsPolicy::wrap(const std::string& origin, std::shared_ptr<Responder> responder) const {
  if (!origin_allowed(origin)) return responder;
  return std::make_shared<HeaderAddingResponder>(std::move(responder), origin_headers(origin));
}

}  // namespace glms::server
