#include "bcast/text/progress.h"

#include <algorithm>
#include <cmath>
#include <iterator>

namespace stage {

std::string human_bytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  size_t u = 0;
  while (v >= 1024.0 && u + 1 < std::size(units)) {
    v /= 1024.0;
    ++u;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", v, units[u]);
  return buf;
}

std::string duration_text(double seconds) {
  const auto s = static_cast<long long>(std::llround(std::max(0.0, seconds)));
  char buf[64];
  if (s < 60)
    std::snprintf(buf, sizeof buf, "%llds", s);
  else if (s < 3600)
    std::snprintf(buf, sizeof buf, "%lldm%02llds", s / 60, s % 60);
  else
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", s / 3600, s / 60 % 60);
  return buf;
}

std::string progress_text(uint64_t done, uint64_t total, double seconds) {
  const double pct = total ? 100.0 * static_cast<double>(done) / static_cast<double>(total) : 100.0;
  const double rate = seconds > 0 ? static_cast<double>(done) / seconds : 0.0;  // bytes/s
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s / %s (%.0f%%), %.0f MB/s", human_bytes(done).c_str(),
                human_bytes(total).c_str(), std::floor(pct), rate / 1e6);
  std::string out = buf;
  if (done < total && rate > 0) out += ", ETA " + duration_text(static_cast<double>(total - done) / rate);
  return out;
}

ProgressMode progress_mode(ProgressWhen when, bool verbose, bool terminal) {
  if (when == ProgressWhen::off) return ProgressMode::off;
  if (terminal) return ProgressMode::in_place;
  return when == ProgressWhen::on || verbose ? ProgressMode::lines : ProgressMode::off;
}

ProgressLine::ProgressLine(ProgressMode mode, std::FILE* out) : mode_(mode), out_(out), t0_(Clock::now()) {}

void ProgressLine::update(uint64_t done, uint64_t total, std::string_view prefix) {
  if (mode_ == ProgressMode::off) return;
  const auto now = Clock::now();
  const bool last = done >= total;
  if (mode_ == ProgressMode::in_place) {
    if (!last && shown_ && now - last_ < std::chrono::milliseconds(200)) return;
  } else {
    const int tenth = total ? static_cast<int>(10 * std::min(done, total) / total) : 10;
    if (tenth <= last_tenth_ && now - last_ < std::chrono::minutes(1)) return;
    last_tenth_ = tenth;
  }
  last_ = now;
  const std::string text =
      std::string(prefix) + progress_text(done, total, std::chrono::duration<double>(now - t0_).count());
  if (mode_ == ProgressMode::in_place) {
    // Padded: a shorter line must cover what a longer one left on the terminal.
    std::fprintf(out_, "\r  %-70s", text.c_str());
    shown_ = true;
  } else {
    std::fprintf(out_, "  %s\n", text.c_str());
  }
  std::fflush(out_);
}

void ProgressLine::finish() {
  if (shown_) {
    std::fputc('\n', out_);
    std::fflush(out_);
  }
  shown_ = false;
  last_tenth_ = -1;
}

}  // namespace stage
