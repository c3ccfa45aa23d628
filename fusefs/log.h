// The daemon's log, written for a root process whose log lines carry names users chose and
// whose warnings users can trigger at will.
// - escaping_sink(): control characters in a message (a newline in a file name would forge a
//   log line of its own; an escape sequence would rewrite a terminal) and bytes that are not
//   UTF-8 are written as \xNN (escape_controls).
//   A line that cannot be written (EPIPE: stderr is a pipe whose reader went away; the
//   daemon ignores SIGPIPE) is dropped and the next one tried: logging never ends the daemon.
// - WarnBudget: at most `burst` warnings per window from a source users control (failed
//   requests); the next window's first warning is preceded by how many were held back.
// Both are thread-safe; neither needs FUSE or MPI.
#pragma once

#include <spdlog/sinks/sink.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "bcast/text.h"

namespace stagefs {

// What a terminal would act on, and bytes that are not UTF-8, written as \xNN (bcast/text.h):
// one escaping for the log and for stagectl.
using stage::escape_controls;

// An stderr-like sink (formatted by spdlog's pattern) that escapes each message's payload.
std::shared_ptr<spdlog::sinks::sink> escaping_sink(std::FILE* out = stderr);

class WarnBudget {
 public:
  using Clock = std::chrono::steady_clock;
  WarnBudget(unsigned burst, Clock::duration window) : burst_(burst), window_(window) {}
  // True: log this warning. When it opens a new window after warnings were held back,
  // held_back says how many (log that first); otherwise 0.
  bool allow(Clock::time_point now, uint64_t& held_back);

 private:
  std::mutex m_;
  const unsigned burst_;
  const Clock::duration window_;
  Clock::time_point start_{};
  unsigned used_ = 0;
  uint64_t dropped_ = 0;
};

}  // namespace stagefs
