// Human and machine reports of a transfer (mpi-stage's timing table, JSON), and the progress
// line shown on a terminal. Used by stage-bcast (bcast/job.h); not thread-safe.
#pragma once

#include <chrono>
#include <string>

#include "bcast/engine.h"

namespace stage {

std::string report_table(const StageReport& r, const std::string& source, const std::string& dest);
std::string report_json(const StageReport& r, const std::string& source, const std::string& dest, int ranks);
std::string json_escape(const std::string& s);
std::string human_bytes(uint64_t bytes);

class ProgressLine {
 public:
  explicit ProgressLine(bool enabled) : enabled_(enabled), t0_(std::chrono::steady_clock::now()) {}
  void update(uint64_t done, uint64_t total);
  void done();

 private:
  bool enabled_;
  bool shown_ = false;
  std::chrono::steady_clock::time_point t0_;
  std::chrono::steady_clock::time_point last_{};
};

}  // namespace stage
