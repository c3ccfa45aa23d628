// --metrics-file: the mount's counters in the Prometheus text format, rewritten atomically
// (temporary file + rename) every interval seconds by a thread of its own, for
// node_exporter's textfile collector. The exposition is prometheus-cpp's (a registry and its
// TextSerializer); counters are fed with the increase since the last write, from the same
// MountStatus the JSON attributes show. Every series carries the label mountpoint.
//
// PATH may lie in a directory other users write to (a sticky /tmp, /var/tmp). The temporary
// file gets a random name, created with O_CREAT|O_EXCL (never through a symlink, never a
// file a user made) beside PATH and renamed over it: what a user plants under any name
// cannot stop the writes, and a symlink planted at PATH itself is replaced, not followed.
// A write that fails is logged (the first at once, then at most one warning per 10 minutes
// with the count held back; the recovery after a logged failure), and PATH, if it is still
// the daemon's own regular file, is removed: a collector then sees the series vanish instead
// of the last values (stagefs_up 1) of a mount that no longer updates them.
// Thread-safe: observe_transfer() from any thread; write_now() from one thread at a time.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "fusefs/base/log.h"
#include "fusefs/edge/status.h"

namespace stagefs {

class MetricsFile {
 public:
  MetricsFile(std::string path, double interval_s, const std::string& mountpoint,
              std::function<MountStatus()> snapshot);
  ~MetricsFile();  // writes a last time, then stops
  MetricsFile(const MetricsFile&) = delete;
  MetricsFile& operator=(const MetricsFile&) = delete;

  void observe_transfer(double seconds, bool ok);
  bool write_now();  // false (logged, PATH removed) when the file cannot be written

 private:
  struct Impl;
  void loop();
  // Writes text to a new temporary file beside path_ and renames it over path_: 0 or an errno.
  [[nodiscard]] int replace_file(const std::string& text) const;
  // Removes path_ if it is a regular file of this process's user: true if it did.
  [[nodiscard]] bool remove_stale() const;
  std::unique_ptr<Impl> impl_;
  std::string path_;
  std::chrono::duration<double> interval_;
  std::function<MountStatus()> snapshot_;
  std::mutex m_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool failure_logged_ = false;  // the last write failed and said so (write_now's thread only)
  LogLimits warnings_{1, std::chrono::minutes(10)};  // one failed write said per 10 minutes
  std::thread thread_;
};

}  // namespace stagefs
