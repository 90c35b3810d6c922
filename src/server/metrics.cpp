#include "server/metrics.h"

#include <algorithm>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace glms::server {

namespace {

std::string num(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (std::isnan(v)) return "NaN";
  // The shortest form that reads back as the same double (0.04, not 0.040000000000000001).
  char buf[64];
  for (int precision = 15; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

void head(std::string& out, const std::string& name, const char* type, const char* help) {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

void sample(std::string& out, const std::string& name, const std::string& labels, double value) {
  out += name;
  if (!labels.empty()) out += "{" + labels + "}";
  out += " " + num(value) + "\n";
}

// vLLM's buckets.
std::vector<double> ttft_buckets() {
  return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
          20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
}
std::vector<double> itl_buckets() {
  return {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0};
}
std::vector<double> e2e_buckets() {
  return {0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
          960.0, 1920.0, 7680.0};
}
std::vector<double> tpot_buckets() { return itl_buckets(); }  // vLLM's time_per_output_token buckets
std::vector<double> token_buckets() {
  return {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000};
}

struct ProcessStats {
  double resident_bytes = 0, virtual_bytes = 0, cpu_seconds = 0, start_time = 0, open_fds = 0;
};

ProcessStats read_process_stats() {
  ProcessStats p;
  const long page = sysconf(_SC_PAGESIZE);
  const long ticks = sysconf(_SC_CLK_TCK);
  std::ifstream statm("/proc/self/statm");
  double size = 0, resident = 0;
  if (statm >> size >> resident) {
    p.virtual_bytes = size * page;
    p.resident_bytes = resident * page;
  }
  std::ifstream stat_file("/proc/self/stat");
  std::string stat((std::istreambuf_iterator<char>(stat_file)), std::istreambuf_iterator<char>());
  const size_t close = stat.rfind(')');
  if (close != std::string::npos) {
    std::istringstream fields(stat.substr(close + 2));
    std::vector<std::string> f;
    std::string x;
    while (fields >> x) f.push_back(x);
    // After the command: state(0) ... utime(11) stime(12) ... starttime(19).
    if (f.size() > 19) {
      p.cpu_seconds = (std::stod(f[11]) + std::stod(f[12])) / ticks;
      std::ifstream uptime_file("/proc/stat");
      std::string key;
      double btime = 0;
      while (uptime_file >> key) {
        if (key == "btime") {
          uptime_file >> btime;
          break;
        }
      }
      p.start_time = btime + std::stod(f[19]) / ticks;
    }
  }
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec); !ec && it != std::filesystem::directory_iterator();
       it.increment(ec))
    p.open_fds += 1;
  return p;
}

// What each rank allocated at start-up (weights, KV cache) and each visible GPU's memory now;
// `labels`: the model's. Weights are counted where a rank allocates them (the GPU's); the CPU
// reads them mapped from the checkpoint's files and counts none.
void render_memory(std::string& out, const std::string& labels, const BackendStats& s) {
  if (std::any_of(s.rank_memory.begin(), s.rank_memory.end(), [](const RankMemory& m) { return m.weight_bytes > 0; })) {
    head(out, "glmserve:model_weights_bytes", "gauge", "Bytes of model weights each rank of the layout holds.");
    for (size_t r = 0; r < s.rank_memory.size(); ++r)
      sample(out, "glmserve:model_weights_bytes", labels + ",rank=\"" + std::to_string(r) + "\"",
             static_cast<double>(s.rank_memory[r].weight_bytes));
  }
  if (!s.rank_memory.empty()) {
    head(out, "glmserve:kv_cache_bytes", "gauge", "Bytes of KV cache each rank of the layout holds.");
    for (size_t r = 0; r < s.rank_memory.size(); ++r)
      sample(out, "glmserve:kv_cache_bytes", labels + ",rank=\"" + std::to_string(r) + "\"",
             static_cast<double>(s.rank_memory[r].cache_bytes));
  }
  if (!s.device_memory.empty()) {
    head(out, "glmserve:gpu_memory_used_bytes", "gauge", "GPU memory in use (every process), as the driver reports it.");
    for (const DeviceMemory& d : s.device_memory)
      sample(out, "glmserve:gpu_memory_used_bytes", labels + ",gpu=\"" + std::to_string(d.device) + "\"",
             static_cast<double>(d.used_bytes));
    head(out, "glmserve:gpu_memory_total_bytes", "gauge", "GPU memory in all, as the driver reports it.");
    for (const DeviceMemory& d : s.device_memory)
      sample(out, "glmserve:gpu_memory_total_bytes", labels + ",gpu=\"" + std::to_string(d.device) + "\"",
             static_cast<double>(d.total_bytes));
  }
}

}  // namespace

std::string escape_label(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), buckets_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  for (size_t i = 0; i <= bounds_.size(); ++i) buckets_[i].store(0);
}

void Histogram::observe(double value) {
  size_t i = 0;
  while (i < bounds_.size() && value > bounds_[i]) ++i;
  buckets_[i].fetch_add(1);
  count_.fetch_add(1);
  double old = sum_.load();
  while (!sum_.compare_exchange_weak(old, old + value)) {
  }
}

void Histogram::render(std::string& out, const std::string& name, const std::string& labels) const {
  const std::string sep = labels.empty() ? "" : labels + ",";
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cumulative += buckets_[i].load();
    const std::string le = i < bounds_.size() ? num(bounds_[i]) : "+Inf";
    out += name + "_bucket{" + sep + "le=\"" + le + "\"} " + std::to_string(cumulative) + "\n";
  }
  sample(out, name + "_sum", labels, sum_.load());
  // _count equals the +Inf bucket by construction (a racing observe may land in between).
  out += name + "_count";
  if (!labels.empty()) out += "{" + labels + "}";
  out += " " + std::to_string(cumulative) + "\n";
}

ServerMetrics::ServerMetrics(std::string model_name)
    : time_to_first_token(ttft_buckets()),
      inter_token_latency(itl_buckets()),
      e2e_request_latency(e2e_buckets()),
      request_prompt_tokens(token_buckets()),
      request_generation_tokens(token_buckets()),
      request_queue_time(e2e_buckets()),
      request_prefill_time(e2e_buckets()),
      request_decode_time(e2e_buckets()),
      request_inference_time(e2e_buckets()),
      request_time_per_output_token(tpot_buckets()),
      labels_("model_name=\"" + escape_label(model_name) + "\"") {}

void ServerMetrics::count_finished(const std::string& finish_reason) {
  std::lock_guard lock(mu_);
  ++finished_[finish_reason];
}

void ServerMetrics::count_http(int status, const std::string& handler, const std::string& method) {
  std::lock_guard lock(mu_);
  ++http_[{handler, method, status}];
}

void ServerMetrics::observe_request_phases(const engine::RequestOutput& out) {
  request_queue_time.observe(out.queued_seconds);
  request_prefill_time.observe(out.prefill_seconds);
  request_decode_time.observe(out.decode_seconds);
  request_inference_time.observe(out.inference_seconds);
  if (out.completion_tokens > 1)
    request_time_per_output_token.observe(out.decode_seconds / static_cast<double>(out.completion_tokens - 1));
}

std::string ServerMetrics::render(const BackendStats& s, bool also_vllm_names) const {
  std::string out = render_prefixed(s);
  if (also_vllm_names) {
    // The same lines under vLLM's prefix: names only (HELP, TYPE and samples).
    std::string copy;
    size_t at = 0;
    while (at < out.size()) {
      const size_t end = out.find('\n', at);
      std::string line = out.substr(at, end - at);
      for (size_t p = line.find("glmserve:"); p != std::string::npos; p = line.find("glmserve:", p + 5))
        line.replace(p, 9, "vllm:");
      copy += line + "\n";
      at = end == std::string::npos ? out.size() : end + 1;
    }
    out += copy;
  }
  const ProcessStats p = read_process_stats();
  auto process = [&](const char* name, const char* type, const char* help, double v) {
    head(out, name, type, help);
    sample(out, name, "", v);
  };
  process("process_resident_memory_bytes", "gauge", "Resident memory size in bytes.", p.resident_bytes);
  process("process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.", p.virtual_bytes);
  process("process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds.", p.cpu_seconds);
  process("process_start_time_seconds", "gauge", "Start time of the process since unix epoch in seconds.",
          p.start_time);
  process("process_open_fds", "gauge", "Number of open file descriptors.", p.open_fds);
  return out;
}

std::string ServerMetrics::render_prefixed(const BackendStats& s) const {
  std::string out;
  const std::string& l = labels_;
  auto gauge = [&](const char* name, const char* help, double v) {
    head(out, std::string("glmserve:") + name, "gauge", help);
    sample(out, std::string("glmserve:") + name, l, v);
  };
  auto counter = [&](const char* name, const char* help, double v) {
    head(out, std::string("glmserve:") + name, "counter", help);
    sample(out, std::string("glmserve:") + name, l, v);
  };
  auto histogram = [&](const char* name, const char* help, const Histogram& h) {
    head(out, std::string("glmserve:") + name, "histogram", help);
    h.render(out, std::string("glmserve:") + name, l);
  };
  gauge("num_requests_running", "Number of requests in model execution batches.", s.num_running);
  gauge("num_requests_waiting", "Number of requests waiting to be processed.", s.num_waiting);
  gauge("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", s.kv_cache_usage);
  if (!s.kv_cache_usage_by_rank.empty()) {
    head(out, "glmserve:kv_cache_usage_perc_by_rank", "gauge", "KV-cache usage of each data-parallel rank's pool.");
    for (size_t r = 0; r < s.kv_cache_usage_by_rank.size(); ++r)
      sample(out, "glmserve:kv_cache_usage_perc_by_rank", l + ",dp_rank=\"" + std::to_string(r) + "\"",
             s.kv_cache_usage_by_rank[r]);
  }
  gauge("kv_cache_num_blocks", "Blocks in the KV-cache pool.", s.num_blocks);
  gauge("kv_cache_free_blocks", "Blocks free or holding only evictable cached prefixes.", s.num_free_blocks);
  counter("prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.",
          static_cast<double>(s.prefix_cache_queries));
  counter("prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.",
          static_cast<double>(s.prefix_cache_hits));
  counter("num_preemptions_total", "Cumulative number of preemptions from the engine.",
          static_cast<double>(s.num_preemptions));
  counter("prompt_tokens_total", "Number of prefill tokens processed.", static_cast<double>(s.prompt_tokens_total));
  counter("generation_tokens_total", "Number of generation tokens processed.",
          static_cast<double>(s.generation_tokens_total));
  if (!s.spec_accepted_per_position.empty()) {  // speculative decoding is on
    counter("spec_decode_num_drafts_total", "Number of spec decoding drafts (verification steps).",
            static_cast<double>(s.spec_drafts));
    counter("spec_decode_num_draft_tokens_total", "Number of draft tokens.", static_cast<double>(s.spec_draft_tokens));
    counter("spec_decode_num_accepted_tokens_total", "Number of accepted tokens.",
            static_cast<double>(s.spec_accepted_tokens));
    head(out, "glmserve:spec_decode_num_accepted_tokens_per_pos", "counter", "Accepted tokens per draft position.");
    for (size_t i = 0; i < s.spec_accepted_per_position.size(); ++i)
      sample(out, "glmserve:spec_decode_num_accepted_tokens_per_pos", l + ",position=\"" + std::to_string(i) + "\"",
             static_cast<double>(s.spec_accepted_per_position[i]));
  }
  {
    std::lock_guard lock(mu_);
    head(out, "glmserve:request_success_total", "counter", "Count of finished requests by finish reason.");
    std::map<std::string, int64_t> finished = finished_;
    for (const char* reason : {"stop", "length", "abort"}) finished.try_emplace(reason, 0);
    for (const auto& [reason, n] : finished)
      sample(out, "glmserve:request_success_total", l + ",finished_reason=\"" + escape_label(reason) + "\"",
             static_cast<double>(n));
    head(out, "glmserve:http_requests_total", "counter", "HTTP responses by handler, method and status code.");
    for (const auto& [key, n] : http_) {
      const auto& [handler, method, status] = key;
      sample(out, "glmserve:http_requests_total",
             "handler=\"" + escape_label(handler) + "\",method=\"" + escape_label(method) + "\",status=\"" +
                 std::to_string(status) + "\"",
             static_cast<double>(n));
    }
  }
  histogram("time_to_first_token_seconds", "Histogram of time to first token in seconds.", time_to_first_token);
  histogram("inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", inter_token_latency);
  histogram("e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", e2e_request_latency);
  histogram("request_prompt_tokens", "Number of prefill tokens processed per request.", request_prompt_tokens);
  histogram("request_generation_tokens", "Number of generation tokens processed per request.",
            request_generation_tokens);
  histogram("request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", request_queue_time);
  histogram("request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.",
            request_prefill_time);
  histogram("request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", request_decode_time);
  histogram("request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.",
            request_inference_time);
  histogram("time_per_output_token_seconds", "Histogram of time per output token (decode time / tokens after the first).",
            request_time_per_output_token);
  if (!s.iteration_tokens.empty()) {
    head(out, "glmserve:iteration_tokens_total", "histogram", "Histogram of number of tokens per engine_step.");
    const std::string sep = l + ",";
    int64_t cumulative = 0;
    for (size_t i = 0; i < s.iteration_tokens.size(); ++i) {
      cumulative += s.iteration_tokens[i];
      const std::string le = i < s.iteration_token_buckets.size() ? num(s.iteration_token_buckets[i]) : "+Inf";
      out += "glmserve:iteration_tokens_total_bucket{" + sep + "le=\"" + le + "\"} " + std::to_string(cumulative) + "\n";
    }
    sample(out, "glmserve:iteration_tokens_total_sum", l, static_cast<double>(s.iteration_tokens_sum));
    sample(out, "glmserve:iteration_tokens_total_count", l, static_cast<double>(cumulative));
  }
  if (s.block_size > 0) {
    head(out, "glmserve:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig");
    sample(out, "glmserve:cache_config_info",
           "block_size=\"" + std::to_string(s.block_size) + "\",cache_dtype=\"" + escape_label(s.cache_dtype) +
               "\",enable_prefix_caching=\"" +
               (s.prefix_caching ? "True" : "False") + "\",gpu_memory_utilization=\"" + num(s.gpu_memory_utilization) +
               "\",num_gpu_blocks=\"" + std::to_string(s.num_blocks) + "\"",
           1.0);
  }
  render_memory(out, l, s);
  return out;
}

}  // namespace glms::server
