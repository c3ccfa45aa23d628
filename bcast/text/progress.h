// How long work shows its progress to a person: stage-bcast's copy on its source rank, and
// stagectl prefetch. One line on stderr, in one of three modes:
//   in_place  a terminal: the line is rewritten in place ('\r') at most 5 times a second and
//             ended with a newline when the work ends (as rsync --progress or curl do)
//   lines     a log (a job's output file, srun's pipes): a whole line each time another tenth
//             of the work is done, or a minute passed, whichever comes first: at most 11
//             lines plus one a minute, never a flood
//   off
// --progress auto|on|off chooses (progress_mode): auto is in_place on a terminal, lines in a
// log when --verbose asks for detail, else off; on is in_place on a terminal, else lines.
// The line: "  1.20 GiB / 50.00 GiB (2%), 310 MB/s, ETA 2m37s", after a prefix the caller gives
// (stagectl: "412/5000 files, "). The rate is the average since the start.
// Pure text functions plus one small class; no dependencies (stagectl links it). Not
// thread-safe: one thread owns a ProgressLine.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace stage {

// "1.20 GiB" (B, KiB, MiB, GiB, TiB; two decimals above bytes).
std::string human_bytes(uint64_t bytes);
// A duration for people: "45s", "2m37s", "1h05m".
std::string duration_text(double seconds);
// "1.20 GiB / 50.00 GiB (2%), 310 MB/s, ETA 2m37s" (no ETA before anything was done, nor
// once done == total).
std::string progress_text(uint64_t done, uint64_t total, double seconds);

enum class ProgressWhen { automatic, on, off };  // --progress auto|on|off
enum class ProgressMode { off, in_place, lines };
ProgressMode progress_mode(ProgressWhen when, bool verbose, bool terminal);

class ProgressLine {
 public:
  using Clock = std::chrono::steady_clock;
  explicit ProgressLine(ProgressMode mode, std::FILE* out = stderr);
  // done of total bytes; prefix goes before the figures. Shown if the mode's pace allows (the
  // last update, done == total, always is).
  void update(uint64_t done, uint64_t total, std::string_view prefix = {});
  // Ends the line (in_place: a newline after the last update). Further updates start anew.
  void finish();
  [[nodiscard]] ProgressMode mode() const { return mode_; }

 private:
  ProgressMode mode_;
  std::FILE* out_;
  Clock::time_point t0_;
  Clock::time_point last_{};
  int last_tenth_ = -1;  // lines: the tenth of the work shown last
  bool shown_ = false;   // in_place: a line is on the terminal, not yet ended
};

}  // namespace stage
