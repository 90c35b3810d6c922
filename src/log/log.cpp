#include "log/log.h"

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <mutex>

#include "core/error.h"

namespace glms::log {

namespace {

struct State {
  std::mutex mutex;
  std::shared_ptr<spdlog::logger> logger;
  Format format = Format::kText;
};

State& state() {
  static State s;
  return s;
}

spdlog::level::level_enum spdlog_level(Level level) {
  switch (level) {
    case Level::kTrace: return spdlog::level::trace;
    case Level::kDebug: return spdlog::level::debug;
    case Level::kInfo: return spdlog::level::info;
    case Level::kWarning: return spdlog::level::warn;
    case Level::kError: return spdlog::level::err;
    case Level::kOff: return spdlog::level::off;
  }
  return spdlog::level::info;
}

// The logger of the current configuration, made at first use with the defaults.
std::shared_ptr<spdlog::logger> logger_locked(State& s) {
  if (!s.logger) {
    s.logger = std::make_shared<spdlog::logger>("glmserve", std::make_shared<spdlog::sinks::stderr_sink_mt>());
    s.logger->set_pattern("%Y-%m-%d %H:%M:%S.%e %-5!l %v");
    s.logger->set_level(spdlog::level::info);
  }
  return s.logger;
}

}  // namespace

Level parse_level(const std::string& name) {
  if (name == "trace") return Level::kTrace;
  if (name == "debug") return Level::kDebug;
  if (name == "info") return Level::kInfo;
  if (name == "warning" || name == "warn") return Level::kWarning;
  if (name == "error") return Level::kError;
  if (name == "off") return Level::kOff;
  fail("--log-level '" + name + "': use trace, debug, info, warning, error or off");
}

Format parse_format(const std::string& name) {
  if (name == "text") return Format::kText;
  if (name == "json") return Format::kJson;
  fail("--log-format '" + name + "': use text or json");
}

void configure(Level level, Format format, std::ostream* sink) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  spdlog::sink_ptr out;
  if (sink) out = std::make_shared<spdlog::sinks::ostream_sink_mt>(*sink, /*force_flush=*/true);
  else out = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  s.logger = std::make_shared<spdlog::logger>("glmserve", out);
  // JSON: the message is escaped by write(); time in UTC with milliseconds.
  if (format == Format::kJson)
    s.logger->set_pattern("{\"time\":\"%Y-%m-%dT%H:%M:%S.%eZ\",\"level\":\"%l\",\"msg\":\"%v\"}", spdlog::pattern_time_type::utc);
  else
    s.logger->set_pattern("%Y-%m-%d %H:%M:%S.%e %-5!l %v");
  s.logger->set_level(spdlog_level(level));
  s.logger->flush_on(spdlog::level::trace);
  s.format = format;
}

bool enabled(Level level) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  return logger_locked(s)->should_log(spdlog_level(level));
}

void write(Level level, std::string_view message) {
  State& s = state();
  std::shared_ptr<spdlog::logger> logger;
  Format format;
  {
    std::lock_guard lock(s.mutex);
    logger = logger_locked(s);
    format = s.format;
  }
  if (!logger->should_log(spdlog_level(level))) return;
  if (format == Format::kJson) logger->log(spdlog_level(level), "{}", json_escape(message));
  else logger->log(spdlog_level(level), "{}", message);
}

std::string json_escape(std::string_view text) {
  const std::string quoted =
      nlohmann::json(std::string(text)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return quoted.substr(1, quoted.size() - 2);
}

}  // namespace glms::log
