// Authentication (API keys, HS256 JWTs) and the token-bucket rate limiter.
#include <gtest/gtest.h>

#include <string>

#include "server/auth.h"
#include "server/rate_limit.h"

using namespace glms::server;

namespace {

constexpr int64_t kNow = 1'800'000'000;

std::string b64url(const std::string& in) {
  static const char* table = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  std::string out;
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    const uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8) | uint8_t(in[i + 2]);
    for (int k = 3; k >= 0; --k) out += table[(v >> (6 * k)) & 63];
  }
  if (in.size() - i == 1) {
    const uint32_t v = uint8_t(in[i]) << 16;
    out += table[(v >> 18) & 63];
    out += table[(v >> 12) & 63];
  } else if (in.size() - i == 2) {
    const uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8);
    out += table[(v >> 18) & 63];
    out += table[(v >> 12) & 63];
    out += table[(v >> 6) & 63];
  }
  return out;
}

}  // namespace

TEST(Auth, OpenWhenNothingConfigured) {
  Authenticator auth({}, "");
  EXPECT_FALSE(auth.enabled());
  EXPECT_TRUE(auth.check("", kNow).ok);
  EXPECT_TRUE(auth.check("Bearer whatever", kNow).ok);
}

TEST(Auth, ApiKeys) {
  Authenticator auth({"key-one", "key-two"}, "");
  EXPECT_TRUE(auth.check("Bearer key-one", kNow).ok);
  const AuthResult second = auth.check("Bearer key-two", kNow);
  EXPECT_TRUE(second.ok);
  EXPECT_EQ(second.identity, "key:1");
  for (const char* bad : {"", "Bearer", "Bearer ", "Bearer key-on", "Bearer key-one2", "Basic key-one", "key-one",
                          "bearer key-one"}) {
    const AuthResult r = auth.check(bad, kNow);
    EXPECT_FALSE(r.ok) << bad;
    EXPECT_EQ(r.error.status, 401) << bad;
    EXPECT_FALSE(r.error.message.empty());
  }
}

TEST(Auth, JwtHs256) {
  const std::string secret = "s3cret-s3cret-s3cret-s3cret-0123";
  Authenticator auth({}, secret);
  const std::string valid = make_hs256_jwt(secret, R"({"sub": "alice", "exp": 1900000000})");
  ASSERT_FALSE(valid.empty());
  const AuthResult ok = auth.check("Bearer " + valid, kNow);
  EXPECT_TRUE(ok.ok) << ok.error.message;
  EXPECT_EQ(ok.identity, "jwt:alice");
  EXPECT_TRUE(auth.check("Bearer " + make_hs256_jwt(secret, R"({"sub": "no-exp"})"), kNow).ok);

  const AuthResult expired = auth.check("Bearer " + make_hs256_jwt(secret, R"({"exp": 1700000000})"), kNow);
  EXPECT_FALSE(expired.ok);
  EXPECT_NE(expired.error.message.find("expired"), std::string::npos);
  const AuthResult early = auth.check("Bearer " + make_hs256_jwt(secret, R"({"nbf": 1900000000})"), kNow);
  EXPECT_FALSE(early.ok);
  EXPECT_NE(early.error.message.find("nbf"), std::string::npos);
  // exp and nbf that are not numbers refuse the token (found by fuzz/fuzz_jwt: a string nbf passed).
  for (const char* claims : {R"({"nbf": "alice"})", R"({"exp": "soon"})", R"({"exp": null})", R"({"nbf": [1]})"}) {
    const AuthResult bad = auth.check("Bearer " + make_hs256_jwt(secret, claims), kNow);
    EXPECT_FALSE(bad.ok) << claims;
    EXPECT_NE(bad.error.message.find("must be a number"), std::string::npos) << claims << ": " << bad.error.message;
  }
  EXPECT_TRUE(auth.check("Bearer " + make_hs256_jwt(secret, R"({"nbf": 1700000000.5, "exp": 1900000000})"), kNow).ok);

  const std::string other = make_hs256_jwt("another-secret-another-secret-00", R"({"sub": "mallory"})");
  EXPECT_FALSE(auth.check("Bearer " + other, kNow).ok);
  std::string tampered = valid;
  tampered[tampered.size() / 2] = tampered[tampered.size() / 2] == 'A' ? 'B' : 'A';
  EXPECT_FALSE(auth.check("Bearer " + tampered, kNow).ok);
  EXPECT_FALSE(auth.check("Bearer a.b.c", kNow).ok);
  EXPECT_FALSE(auth.check("Bearer not-a-jwt", kNow).ok);

  // alg "none" (unsigned) and a payload re-signed under another header are refused.
  const std::string none = b64url(R"({"alg":"none","typ":"JWT"})") + "." + b64url(R"({"sub":"x"})") + ".";
  EXPECT_FALSE(auth.check("Bearer " + none, kNow).ok);
  const std::string payload = valid.substr(valid.find('.'));
  const std::string hs512 = b64url(R"({"alg":"HS512","typ":"JWT"})") + payload;
  EXPECT_FALSE(auth.check("Bearer " + hs512, kNow).ok);
}

TEST(Auth, KeysAndJwtTogether) {
  const std::string secret = "jwt-secret-jwt-secret-jwt-secret";
  Authenticator auth({"k"}, secret);
  EXPECT_TRUE(auth.check("Bearer k", kNow).ok);
  EXPECT_TRUE(auth.check("Bearer " + make_hs256_jwt(secret, R"({"sub": "b"})"), kNow).ok);
  EXPECT_FALSE(auth.check("Bearer j", kNow).ok);
}

TEST(RateLimiter, BurstThenRefill) {
  RateLimiter limiter(2.0, 3.0);  // 2 per second, bursts of 3
  EXPECT_EQ(limiter.acquire("a", 100.0), 0.0);
  EXPECT_EQ(limiter.acquire("a", 100.0), 0.0);
  EXPECT_EQ(limiter.acquire("a", 100.0), 0.0);
  const double wait = limiter.acquire("a", 100.0);
  EXPECT_NEAR(wait, 0.5, 1e-9);
  EXPECT_EQ(limiter.acquire("b", 100.0), 0.0);  // keys are independent
  EXPECT_GT(limiter.acquire("a", 100.25), 0.0);
  EXPECT_EQ(limiter.acquire("a", 100.5), 0.0);  // one token refilled
  EXPECT_GT(limiter.acquire("a", 100.5), 0.0);
  EXPECT_EQ(limiter.acquire("a", 200.0), 0.0);  // refilled up to the burst, not beyond
  EXPECT_EQ(limiter.acquire("a", 200.0), 0.0);
  EXPECT_EQ(limiter.acquire("a", 200.0), 0.0);
  EXPECT_GT(limiter.acquire("a", 200.0), 0.0);
}

TEST(RateLimiter, DisabledAndPruned) {
  RateLimiter off(0.0, 0.0);
  EXPECT_FALSE(off.enabled());
  for (int i = 0; i < 100; ++i) EXPECT_EQ(off.acquire("x", 0.0), 0.0);
  RateLimiter limiter(1.0, 0.0);  // burst defaults to max(1, rate)
  EXPECT_EQ(limiter.acquire("x", 0.0), 0.0);
  EXPECT_GT(limiter.acquire("x", 0.0), 0.0);
  for (int i = 0; i < 50; ++i) limiter.acquire("k" + std::to_string(i), 1.0);
  limiter.acquire("late", 1000.0);  // a minute later, full buckets are dropped
  EXPECT_LE(limiter.tracked_keys(), 2u);
}
