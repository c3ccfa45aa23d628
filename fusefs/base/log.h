// The daemon's log, written for a root process whose log lines carry names users chose and
// most of whose lines users can repeat at will (a user rewriting a file while reopening it
// makes a transfer fail each time, on every rank).
// - escaping_sink(): control characters in a message (a newline in a file name would forge a
//   log line of its own; an escape sequence would rewrite a terminal) and bytes that are not
//   UTF-8 are written as \xNN (escape_controls).
//   A line that cannot be written (EPIPE: stderr is a pipe whose reader went away; the
//   daemon ignores SIGPIPE) is dropped and the next one tried: logging never ends the daemon.
// - LogLimits: every line is rate-limited by its cause: at most `burst` lines per cause per
//   window. The next line of a cause that had lines held back says how many; a cause that
//   went quiet is reported by held_back_report(), which the daemon calls on an interval and
//   at its end. One mechanism for the whole daemon: log_info/log_warn/log_error take the call
//   site as the cause (the format string's text names it in the reports); log_limited()
//   takes an explicit one (failed requests: their errno). Debug lines are not limited.
// All thread-safe; none needs FUSE or MPI.
#pragma once

#include <spdlog/sinks/sink.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <source_location>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "bcast/text/text.h"

namespace stagefs {

// What a terminal would act on, and bytes that are not UTF-8, written as \xNN (bcast/text/text.h):
// one escaping for the log and for stagectl.
using stage::escape_controls;

// An stderr-like sink (formatted by spdlog's pattern) that escapes each message's payload.
std::shared_ptr<spdlog::sinks::sink> escaping_sink(std::FILE* out = stderr);

class LogLimits {
 public:
  using Clock = std::chrono::steady_clock;
  LogLimits(unsigned burst, Clock::duration window) : burst_(burst), window_(window) {}
  // A line of `cause` at `now`: true if it may be logged. Then held_back is how many lines of
  // that cause were not logged before it (0: none), for the line to say so. `shown` names the
  // cause in reports (kept from its first line).
  bool allow(std::string_view cause, std::string_view shown, Clock::time_point now, uint64_t& held_back);
  struct Held {
    std::string shown;
    uint64_t lines = 0;
  };
  // The causes whose window ended (every cause, if `all`) with lines held back, and how many:
  // reported once (forgotten here).
  std::vector<Held> quiet(Clock::time_point now, bool all = false);
  [[nodiscard]] Clock::duration window() const { return window_; }
  [[nodiscard]] unsigned burst() const { return burst_; }

 private:
  struct Budget {
    std::string shown;
    Clock::time_point start{};
    unsigned used = 0;
    uint64_t held = 0;
  };
  std::mutex m_;
  const unsigned burst_;
  const Clock::duration window_;
  std::map<std::string, Budget, std::less<>> by_cause_;
};

// The daemon's limits: 20 lines per cause per minute.
LogLimits& log_limits();
// Logs `message` at `level` if the cause's budget allows it (with the count held back before
// it). Debug lines go straight through.
void log_limited(spdlog::level::level_enum level, std::string_view cause, std::string_view shown,
                 const std::string& message);
// Logs, at info, how many lines each quiet cause held back (see LogLimits::quiet).
void held_back_report(bool all = false);

// A format string and where it is written: the cause of a log_info/log_warn/log_error line.
template <class... Args>
struct LogSite {
  spdlog::format_string_t<Args...> fmt;
  std::source_location where;
  template <class S>
  consteval LogSite(const S& s, std::source_location w = std::source_location::current())  // NOLINT: implicit
      : fmt(s), where(w) {}
  [[nodiscard]] std::string cause() const {
    return std::string(where.file_name()) + ":" + std::to_string(where.line());
  }
  [[nodiscard]] std::string_view text() const {
    const fmt::string_view v(fmt);
    return {v.data(), v.size()};
  }
};

// How a report names a call site: its format string with the fields as "...", and where it is
// ("materialize ... failed: ... (fusefs/group/group.cc:355)").
std::string site_name(std::string_view fmt, std::string_view file, unsigned line);

template <class... Args>
void log_at(spdlog::level::level_enum level, const LogSite<Args...>& site, Args&&... args) {
  if (!spdlog::should_log(level)) return;
  log_limited(level, site.cause(), site_name(site.text(), site.where.file_name(), site.where.line()),
              fmt::format(site.fmt, std::forward<Args>(args)...));
}
template <class... Args>
void log_info(LogSite<std::type_identity_t<Args>...> site, Args&&... args) {
  log_at(spdlog::level::info, site, std::forward<Args>(args)...);
}
template <class... Args>
void log_warn(LogSite<std::type_identity_t<Args>...> site, Args&&... args) {
  log_at(spdlog::level::warn, site, std::forward<Args>(args)...);
}
template <class... Args>
void log_error(LogSite<std::type_identity_t<Args>...> site, Args&&... args) {
  log_at(spdlog::level::err, site, std::forward<Args>(args)...);
}

}  // namespace stagefs
