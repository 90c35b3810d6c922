// Browsers' cross-origin requests (server/cors.h) as Starlette's CORSMiddleware answers them for
// vLLM: preflights before authentication, the allow-origin header on every answer (streams too) to
// an allowed origin, nothing for others, and nothing at all unless origins are given.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "server/cors.h"
#include "service_fixture.h"

using namespace glms;
using glms::test::Fixture;
using nlohmann::json;

namespace {

std::string header(const server::HttpResponse& r, const std::string& name) {
  for (const auto& [key, value] : r.headers)
    if (key == name) return value;
  return "";
}

server::ServiceConfig with_cors(std::vector<std::string> origins) {
  server::ServiceConfig c;
  c.cors.origins = std::move(origins);
  c.api_keys = {"sk-1"};
  return c;
}

}  // namespace

TEST(Cors, APreflightIsAnsweredBeforeAuthentication) {
  Fixture f(with_cors({"https://app.example"}));
  const auto ok = f.call("OPTIONS", "/v1/chat/completions", "",
                         {{"origin", "https://app.example"}, {"access-control-request-method", "POST"},
                          {"access-control-request-headers", "authorization, content-type"}});
  EXPECT_EQ(ok->response.status, 200);
  EXPECT_EQ(header(ok->response, "Access-Control-Allow-Origin"), "https://app.example");
  EXPECT_EQ(header(ok->response, "Vary"), "Origin");
  EXPECT_EQ(header(ok->response, "Access-Control-Allow-Headers"), "authorization, content-type");
  EXPECT_NE(header(ok->response, "Access-Control-Allow-Methods").find("POST"), std::string::npos);
  EXPECT_EQ(header(ok->response, "Access-Control-Max-Age"), "600");
  const auto other = f.call("OPTIONS", "/v1/chat/completions", "",
                            {{"origin", "https://evil.example"}, {"access-control-request-method", "POST"}});
  EXPECT_EQ(other->response.status, 400);
  EXPECT_EQ(other->response.body, "Disallowed CORS origin");
  EXPECT_EQ(header(other->response, "Access-Control-Allow-Origin"), "");
}

TEST(Cors, AnswersToAnAllowedOriginCarryItWholeOrStreamed) {
  Fixture f(with_cors({"*"}));
  f.say("Hello there");
  const std::map<std::string, std::string> browser = {{"origin", "https://any.example"}, {"authorization", "Bearer sk-1"}};
  json body = glms::test::chat("hi");
  const auto whole = f.call("POST", "/v1/chat/completions", body.dump(), browser);
  EXPECT_EQ(whole->response.status, 200);
  EXPECT_EQ(header(whole->response, "Access-Control-Allow-Origin"), "*");
  body["stream"] = true;
  const auto streamed = f.call("POST", "/v1/chat/completions", body.dump(), browser);
  EXPECT_TRUE(streamed->streaming);
  EXPECT_EQ(header(streamed->response, "Access-Control-Allow-Origin"), "*");
  // Errors too, so that the page can read them.
  const auto unauthorized = f.call("GET", "/v1/models", "", {{"origin", "https://any.example"}});
  EXPECT_EQ(unauthorized->response.status, 401);
  EXPECT_EQ(header(unauthorized->response, "Access-Control-Allow-Origin"), "*");
  // No Origin header (not a browser): no CORS headers.
  const auto plain = f.call("GET", "/v1/models", "", {{"authorization", "Bearer sk-1"}});
  EXPECT_EQ(header(plain->response, "Access-Control-Allow-Origin"), "");
}

TEST(Cors, OffUnlessOriginsAreGiven) {
  Fixture f(with_cors({}));
  const auto preflight = f.call("OPTIONS", "/v1/chat/completions", "",
                                {{"origin", "https://app.example"}, {"access-control-request-method", "POST"}});
  EXPECT_NE(preflight->response.status, 200);  // not answered as a preflight (401 here: no key)
  EXPECT_EQ(header(preflight->response, "Access-Control-Allow-Origin"), "");
  const auto models = f.call("GET", "/v1/models", "", {{"origin", "https://app.example"}, {"authorization", "Bearer sk-1"}});
  EXPECT_EQ(models->response.status, 200);
  EXPECT_EQ(header(models->response, "Access-Control-Allow-Origin"), "");
}

TEST(Cors, MethodsHeadersAndCredentialsAreCheckedAsGiven) {
  server::CorsConfig config;
  config.origins = {"*"};
  config.methods = {"GET", "POST"};
  config.headers = {"Authorization"};
  config.credentials = true;
  const server::CorsPolicy policy(config);
  server::HttpRequest preflight;
  preflight.method = "OPTIONS";
  preflight.headers = {{"origin", "https://a.example"},
                       {"access-control-request-method", "POST"},
                       {"access-control-request-headers", "authorization, Content-Type"}};  // content-type: safelisted
  server::HttpResponse ok = policy.preflight(preflight);
  EXPECT_EQ(ok.status, 200);
  // With credentials the origin is echoed, never "*".
  EXPECT_EQ(header(ok, "Access-Control-Allow-Origin"), "https://a.example");
  EXPECT_EQ(header(ok, "Access-Control-Allow-Credentials"), "true");
  EXPECT_EQ(header(ok, "Access-Control-Allow-Methods"), "GET, POST");
  EXPECT_EQ(header(ok, "Access-Control-Allow-Headers"), "authorization");
  preflight.headers["access-control-request-method"] = "DELETE";
  preflight.headers["access-control-request-headers"] = "x-custom";
  const server::HttpResponse refused = policy.preflight(preflight);
  EXPECT_EQ(refused.status, 400);
  EXPECT_EQ(refused.body, "Disallowed CORS method, headers");
}
