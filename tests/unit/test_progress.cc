// The progress line (bcast/text/progress.h): its text, and how often each mode writes, driven
// through a memory stream (no terminal, no clock waits: the pace rules that depend on time
// only ever hold a line back, and each test's updates come faster than any of them).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "bcast/text/progress.h"

namespace stage {
namespace {

// A FILE* that writes into a string (open_memstream).
class Captured {
 public:
  Captured() : f_(::open_memstream(&buf_, &len_)) {}
  ~Captured() {
    std::fclose(f_);
    std::free(buf_);
  }
  Captured(const Captured&) = delete;
  Captured& operator=(const Captured&) = delete;
  std::FILE* file() { return f_; }
  std::string text() {
    std::fflush(f_);
    return {buf_, len_};
  }

 private:
  char* buf_ = nullptr;
  size_t len_ = 0;
  std::FILE* f_;
};

TEST(ProgressText, BytesPercentRateAndEta) {
  EXPECT_EQ(human_bytes(0), "0 B");
  EXPECT_EQ(human_bytes(1536), "1.50 KiB");
  EXPECT_EQ(human_bytes(uint64_t{50} << 30), "50.00 GiB");
  EXPECT_EQ(duration_text(44.6), "45s");
  EXPECT_EQ(duration_text(157), "2m37s");
  EXPECT_EQ(duration_text(3900), "1h05m");
  // 1 GiB of 4 GiB in 10 s: 107 MB/s, 3 GiB left at that rate.
  EXPECT_EQ(progress_text(uint64_t{1} << 30, uint64_t{4} << 30, 10.0),
            "1.00 GiB / 4.00 GiB (25%), 107 MB/s, ETA 30s");
  // Done: no ETA. Nothing done yet: no rate, no ETA.
  EXPECT_EQ(progress_text(100 << 20, 100 << 20, 2.0), "100.00 MiB / 100.00 MiB (100%), 52 MB/s");
  EXPECT_EQ(progress_text(0, 100 << 20, 0.5), "0 B / 100.00 MiB (0%), 0 MB/s");
}

TEST(ProgressMode, TerminalLogAndChoice) {
  using W = ProgressWhen;
  using M = ProgressMode;
  EXPECT_EQ(progress_mode(W::automatic, false, true), M::in_place);
  EXPECT_EQ(progress_mode(W::automatic, false, false), M::off);   // a job's log: nothing unless asked
  EXPECT_EQ(progress_mode(W::automatic, true, false), M::lines);  // --verbose asks
  EXPECT_EQ(progress_mode(W::on, false, false), M::lines);
  EXPECT_EQ(progress_mode(W::on, false, true), M::in_place);
  EXPECT_EQ(progress_mode(W::off, true, true), M::off);
}

// On a terminal: one line rewritten in place, ended by one newline.
TEST(ProgressLine, InPlaceIsOneLine) {
  Captured out;
  ProgressLine line(ProgressMode::in_place, out.file());
  const uint64_t total = uint64_t{1} << 30;
  for (uint64_t done = 0; done <= total; done += total / 1000) line.update(done, total, "3/7 files, ");
  line.update(total, total, "7/7 files, ");
  line.finish();
  const std::string t = out.text();
  EXPECT_EQ(std::count(t.begin(), t.end(), '\n'), 1) << t;
  EXPECT_EQ(t.back(), '\n');
  EXPECT_EQ(t.front(), '\r');
  EXPECT_NE(t.find("7/7 files, 1.00 GiB / 1.00 GiB (100%)"), std::string::npos) << t;
  // Most updates are held back (at most 5 writes a second), never the last.
  EXPECT_LT(std::count(t.begin(), t.end(), '\r'), 100) << t;
}

// In a log: whole lines, one per tenth of the work at most: never a flood.
TEST(ProgressLine, LinesAreBounded) {
  Captured out;
  ProgressLine line(ProgressMode::lines, out.file());
  const uint64_t total = 5000;
  for (uint64_t done = 0; done <= total; ++done) line.update(done, total);
  line.finish();
  const std::string t = out.text();
  EXPECT_EQ(t.find('\r'), std::string::npos);
  EXPECT_EQ(std::count(t.begin(), t.end(), '\n'), 11) << t;  // 0%, 10%, ..., 100%
  EXPECT_NE(t.find("(100%)"), std::string::npos);
}

TEST(ProgressLine, OffWritesNothing) {
  Captured out;
  ProgressLine line(ProgressMode::off, out.file());
  line.update(5, 10);
  line.update(10, 10);
  line.finish();
  EXPECT_EQ(out.text(), "");
}

}  // namespace
}  // namespace stage
