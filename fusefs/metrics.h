// --metrics-file: the mount's counters in the Prometheus text format, rewritten atomically
// (temporary file + rename) every interval seconds by a thread of its own, for
// node_exporter's textfile collector. The exposition is prometheus-cpp's (a registry and its
// TextSerializer); counters are fed with the increase since the last write, from the same
// MountStatus the JSON attributes show. Every series carries the label mountpoint.
// Thread-safe: observe_transfer() from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "fusefs/status.h"

namespace stagefs {

class MetricsFile {
 public:
  MetricsFile(std::string path, double interval_s, const std::string& mountpoint,
              std::function<MountStatus()> snapshot);
  ~MetricsFile();  // writes a last time, then stops
  MetricsFile(const MetricsFile&) = delete;
  MetricsFile& operator=(const MetricsFile&) = delete;

  void observe_transfer(double seconds, bool ok);
  bool write_now();  // false (and one warning) when the file cannot be written

 private:
  struct Impl;
  void loop();
  std::unique_ptr<Impl> impl_;
  std::string path_;
  std::chrono::duration<double> interval_;
  std::function<MountStatus()> snapshot_;
  std::mutex m_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool warned_ = false;
  std::thread thread_;
};

}  // namespace stagefs
