// The load generator: sends streaming OpenAI-compatible requests over HTTP/1.1 (Boost.Beast on
// one io_context thread, any number of concurrent SSE streams, keep-alive connection reuse) on
// an open-loop schedule (gamma/Poisson arrivals) and/or under a concurrency cap (closed loop),
// and times every SSE event for TTFT and inter-token latency. Every scheduled request ends as
// exactly one RequestRecord, successful or failed with its error; none is dropped.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench/resilience.h"

namespace glms::bench {

// http://host[:port][/prefix] (https is not supported: put the bench next to the server or
// behind a plain-HTTP tunnel). Throws glms::Error on anything else.
struct Endpoint {
  std::string host, port = "80", base_path;  // base_path: "" or "/prefix" without trailing slash
};
Endpoint parse_base_url(const std::string& url);

// One request to send: the JSON body and the lengths the workload asked for.
struct RequestTemplate {
  std::string body;
  int prompt_tokens = 0;
  int output_tokens = 0;
};

// The outcome of one scheduled request. Times are seconds from the start of the level.
struct RequestRecord {
  size_t template_index = 0;
  double scheduled_s = 0;  // planned send time (0 for closed-loop requests)
  double start_s = 0;      // first attempt sent (or rejected)
  double end_s = 0;        // last byte of the last attempt
  bool success = false;
  std::string error;       // why it failed; empty on success
  int http_status = 0;
  int attempts = 0;        // sends made (0: rejected by the circuit breaker, never sent)
  double ttft_s = 0;       // first token-bearing event after the final attempt's send (from start_s)
  std::vector<double> itl_s;  // gaps between successive token-bearing events
  int token_events = 0;
  bool has_usage = false;
  int prompt_tokens = 0, completion_tokens = 0, cached_tokens = -1;  // from usage
  std::string text;        // generated text (to count tokens when the server sends no usage)
  int expected_prompt_tokens = 0, expected_output_tokens = 0;
  std::string request_id;  // its X-Request-Id (ClientOptions::request_id_prefix), the same for every attempt
};

struct ClientOptions {
  Endpoint endpoint;
  std::string path = "/v1/completions";  // appended to endpoint.base_path
  std::string api_key;                    // sent as "Authorization: Bearer <key>" when not empty
  double timeout_s = 3600;                // per attempt, connect to last byte
  RetryPolicy retry;
  // vLLM's --request-id-prefix: each request carries X-Request-Id, this prefix and its number in
  // the run (empty: no header). The count is shared by the copies of these options.
  std::string request_id_prefix;
  std::shared_ptr<std::atomic<uint64_t>> requests_sent = std::make_shared<std::atomic<uint64_t>>(0);
};

// How one level sends its requests. Request i uses templates[i % templates.size()].
struct LoadSpec {
  double request_rate = 0;  // requests/s; <= 0 or inf: no pacing (closed loop)
  double burstiness = 1;
  int max_concurrency = 0;  // 0: unlimited
  size_t num_requests = 0;  // used when duration_s <= 0
  double duration_s = 0;    // > 0: keep starting requests for this long; in-flight ones finish
  uint64_t seed = 0;
};

struct Progress {
  size_t planned = 0;  // 0 when running for a duration
  size_t started = 0, finished = 0, failed = 0, in_flight = 0;
  long long output_tokens = 0;  // token-bearing events so far (an estimate for the live line)
  double elapsed_s = 0, duration_s = 0;
};

struct LevelResult {
  std::vector<RequestRecord> records;  // in start order
  double duration_s = 0;               // level start to last request end
  int breaker_opened = 0;
};

// Runs one level to completion on the calling thread. `breaker` carries its state across levels.
// `on_progress` (may be empty) is called about every `progress_interval_s` and once at the end.
LevelResult run_level(const ClientOptions& client, const LoadSpec& load, const std::vector<RequestTemplate>& templates,
                      CircuitBreaker& breaker, const std::function<void(const Progress&)>& on_progress = {},
                      double progress_interval_s = 0.5);

// An error answer's message: OpenAI's error.message, a bare error or message, else the body's start.
std::string error_message_from_body(const std::string& body);

struct HttpReply {
  int status = 0;
  std::string body;
};

// A GET or POST (empty body) of base_path + path: its status and body. Throws glms::Error when
// the server cannot be reached or does not answer.
HttpReply http_call(const ClientOptions& client, bool post, const std::string& path, double timeout_s = 10);
// GET base_path + path; returns the body of a 200 answer. Throws glms::Error otherwise.
std::string http_get(const ClientOptions& client, const std::string& path, double timeout_s = 10);

}  // namespace glms::bench
