#include "fusefs/base/log.h"

#include <spdlog/details/log_msg.h>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/base_sink.h>

#include <utility>

namespace stagefs {

namespace {

class EscapingSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit EscapingSink(std::FILE* out) : out_(out) {}

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    const std::string payload = escape_controls(std::string_view(msg.payload.data(), msg.payload.size()));
    spdlog::details::log_msg escaped = msg;
    escaped.payload = spdlog::string_view_t(payload.data(), payload.size());
    spdlog::memory_buf_t line;
    formatter_->format(escaped, line);
    std::fwrite(line.data(), 1, line.size(), out_);
    std::fflush(out_);  // as spdlog's stderr sink: a line is out before a crash
  }
  void flush_() override { std::fflush(out_); }

 private:
  std::FILE* out_;
};

}  // namespace

std::shared_ptr<spdlog::sinks::sink> escaping_sink(std::FILE* out) {
  return std::make_shared<EscapingSink>(out);
}

bool LogLimits::allow(std::string_view cause, std::string_view shown, Clock::time_point now,
                      uint64_t& held_back) {
  std::lock_guard lk(m_);
  auto it = by_cause_.find(cause);
  if (it == by_cause_.end()) it = by_cause_.emplace(std::string(cause), Budget{std::string(shown)}).first;
  Budget& b = it->second;
  held_back = 0;
  if (b.used == 0 || now - b.start >= window_) {  // a new window
    held_back = std::exchange(b.held, 0);
    b.start = now;
    b.used = 0;
  }
  if (b.used >= burst_) {
    ++b.held;
    return false;
  }
  ++b.used;
  return true;
}

std::vector<LogLimits::Held> LogLimits::quiet(Clock::time_point now, bool all) {
  std::vector<Held> out;
  std::lock_guard lk(m_);
  for (auto& [cause, b] : by_cause_)
    if (b.held > 0 && (all || now - b.start >= window_)) {
      out.push_back(Held{b.shown, std::exchange(b.held, 0)});
      b.used = 0;  // its next line opens a new window
    }
  return out;
}

LogLimits& log_limits() {
  static LogLimits limits(20, std::chrono::minutes(1));
  return limits;
}

void log_limited(spdlog::level::level_enum level, std::string_view cause, std::string_view shown,
                 const std::string& message) {
  if (level <= spdlog::level::debug) return spdlog::log(level, "{}", message);
  uint64_t held = 0;
  if (!log_limits().allow(cause, shown, LogLimits::Clock::now(), held)) return;
  if (held == 0) return spdlog::log(level, "{}", message);
  spdlog::log(level, "{} ({} more line(s) like this one were not logged before it)", message, held);
}

std::string site_name(std::string_view fmt, std::string_view file, unsigned line) {
  std::string out;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] == '{' && i + 1 < fmt.size() && fmt[i + 1] != '{') {
      const size_t end = fmt.find('}', i);
      if (end != std::string_view::npos) {
        out += "...";
        i = end;
        continue;
      }
    }
    out += fmt[i];
  }
  const size_t room = file.rfind("fusefs/");  // the path as the source tree names it
  return out + " (" + std::string(room == std::string_view::npos ? file : file.substr(room)) + ":" +
         std::to_string(line) + ")";
}

void held_back_report(bool all) {
  const auto window = std::chrono::duration_cast<std::chrono::seconds>(log_limits().window()).count();
  for (const auto& h : log_limits().quiet(LogLimits::Clock::now(), all))
    spdlog::info("{} more line(s) like \"{}\" were not logged (at most {} per cause per {} s)", h.lines,
                 h.shown, log_limits().burst(), window);
}

}  // namespace stagefs
