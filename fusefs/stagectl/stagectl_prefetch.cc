// stagectl prefetch: every file named (a directory: every regular file below it, symlinks not
// followed), in path order. Each is first asked whether this node already holds a current copy
// (user.stagefs.cached: one attribute read, with the access check of an open); then each
// other one is prefetched in turn (user.stagefs.prefetch returns once the file is on every
// node; .nowait once it is queued). Meanwhile a progress line (bcast/text/progress.h) counts files
// and bytes done, the copy in flight included (its bytes_done in the mount's status, polled by
// a thread of its own), and one summary ends the run: files, bytes, copied (or queued),
// already cached, failed. --verbose lists each file as it is done; failures are listed on
// stderr (the first 10 without --verbose); --json prints every file's outcome and the counts.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <thread>

#include "fusefs/stagectl/stagectl_client.h"
#include "fusefs/stagectl/stagectl_mount.h"

namespace stagefs::ctl {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

struct File {
  std::string mount, path;
  uint64_t size = 0;
};

struct Outcome {
  std::string path;
  bool ok = false;
  bool cached = false;
  std::string error;
};

// The regular files in directory dir and below (symlinks not followed). A directory that
// cannot be listed (one the caller may not read, say) is a failed outcome of its own: nothing
// in it was staged, and the caller is told so rather than seeing fewer files.
void expand_dir(const std::string& mount, const fs::path& dir, std::vector<File>& files,
                std::vector<Outcome>& failed) {
  std::error_code ec;
  std::vector<fs::path> subdirs;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    std::error_code eec;
    const auto st = it->symlink_status(eec);
    if (eec) continue;  // gone since the listing
    if (fs::is_directory(st)) {
      subdirs.push_back(it->path());
    } else if (fs::is_regular_file(st)) {
      std::error_code size_ec;
      const auto n = fs::file_size(it->path(), size_ec);
      files.push_back({mount, it->path().string(), size_ec ? 0 : n});
    }
  }
  if (ec) failed.push_back({dir.string(), false, false, ec.message()});
  for (const auto& d : subdirs) expand_dir(mount, d, files, failed);
}

// Every regular file at or below t.path (symlinks not followed), or the error.
void expand(const Target& t, std::vector<File>& files, std::vector<Outcome>& failed) {
  std::error_code ec;
  const auto st = fs::symlink_status(t.path, ec);
  if (ec) {
    failed.push_back({t.path, false, false, ec.message()});
  } else if (fs::is_directory(st)) {
    expand_dir(t.mount, t.path, files, failed);
  } else if (fs::is_regular_file(st)) {
    std::error_code size_ec;
    const auto n = fs::file_size(t.path, size_ec);
    files.push_back({t.mount, t.path, size_ec ? 0 : n});
  } else {
    failed.push_back({t.path, false, false, "not a regular file or directory"});
  }
}

// The progress line of the prefetches, drawn by a thread of its own: the main thread is
// blocked in each request, and a large file's copy moves meanwhile (the mount's status says
// how far: its transfer's bytes_done).
class Progress {
 public:
  Progress(stage::ProgressMode mode, uint64_t files, uint64_t bytes)
      : line_(mode), files_(files), bytes_(bytes) {
    if (mode != stage::ProgressMode::off) thread_ = std::thread([this] { loop(); });
  }
  ~Progress() {
    {
      std::lock_guard lk(m_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  void begin(const File& f) {
    std::lock_guard lk(m_);
    current_ = f;
    current_rel_ = fs::path(f.path).lexically_relative(f.mount).string();
  }
  void end(uint64_t size) {
    std::lock_guard lk(m_);
    ++files_done_;
    bytes_done_ += size;
    current_ = {};
  }

 private:
  // Bytes of f's copy done so far, if the mount's transfer in flight is f's.
  static uint64_t in_flight(const File& f, const std::string& rel) {
    std::string text;
    if (f.path.empty() || get_attr(f.mount, "user.stagefs.status", text) != 0) return 0;
    const json s = json::parse(text, nullptr, false);
    if (s.is_discarded() || !s.contains("transfer") || !s["transfer"].is_object()) return 0;
    const json& t = s["transfer"];
    if (!t["path"].is_string() || t["path"].get<std::string>() != rel) return 0;
    return std::min(f.size, t.value("bytes_done", uint64_t{0}));
  }
  void loop() {
    const auto pace = line_.mode() == stage::ProgressMode::in_place ? std::chrono::milliseconds(200)
                                                                    : std::chrono::milliseconds(1000);
    std::unique_lock lk(m_);
    while (!stop_) {
      cv_.wait_for(lk, pace, [this] { return stop_; });
      if (stop_) break;
      const File f = current_;
      const std::string rel = current_rel_;
      const uint64_t files = files_done_, bytes = bytes_done_;
      lk.unlock();
      const uint64_t extra = in_flight(f, rel);
      const std::string prefix = std::to_string(files) + "/" + std::to_string(files_) + " files, ";
      line_.update(std::min(bytes + extra, bytes_), bytes_, prefix);
      lk.lock();
    }
    line_.update(bytes_done_, bytes_,
                 std::to_string(files_done_) + "/" + std::to_string(files_) + " files, ");
    line_.finish();
  }
  stage::ProgressLine line_;  // the drawing thread's
  const uint64_t files_, bytes_;
  std::mutex m_;
  std::condition_variable cv_;
  bool stop_ = false;
  uint64_t files_done_ = 0, bytes_done_ = 0;
  File current_;
  std::string current_rel_;
  std::thread thread_;
};

struct Counts {
  uint64_t files = 0, bytes = 0, done = 0, done_bytes = 0, cached = 0, failed = 0;
};

void print_text(const std::vector<Outcome>& failures, const Counts& n, bool no_wait, bool verbose,
                double secs) {
  const size_t shown_max = verbose ? failures.size() : 10;
  for (size_t i = 0; i < failures.size() && i < shown_max; ++i)
    std::fprintf(stderr, "stagectl: %s: %s\n", shown(failures[i].path).c_str(),
                 shown(failures[i].error).c_str());
  if (failures.size() > shown_max)
    std::fprintf(stderr, "stagectl: ... and %zu more failed (--verbose or --json lists every one)\n",
                 failures.size() - shown_max);
  std::printf("prefetch%s: %llu file(s), %s: %llu %s, %llu already cached, %llu failed",
              no_wait ? " --no-wait" : "", static_cast<unsigned long long>(n.files),
              stage::human_bytes(n.bytes).c_str(), static_cast<unsigned long long>(n.done),
              no_wait ? "queued" : "copied", static_cast<unsigned long long>(n.cached),
              static_cast<unsigned long long>(n.failed));
  if (!no_wait && n.done > 0)
    std::printf(" (%s in %s)", stage::human_bytes(n.done_bytes).c_str(), stage::duration_text(secs).c_str());
  std::printf("\n");
}

void print_json(std::vector<Outcome> results, const Counts& n, bool no_wait, double secs) {
  std::sort(results.begin(), results.end(),
            [](const Outcome& a, const Outcome& b) { return a.path < b.path; });
  json list = json::array();
  for (const auto& r : results) {
    json j{{"path", r.path}, {"ok", r.ok}};
    if (r.ok)
      j["cached"] = r.cached;
    else
      j["error"] = r.error;
    list.push_back(std::move(j));
  }
  json out{{"results", std::move(list)},
           {"ok", n.failed == 0},
           {"files", n.files},
           {"bytes", n.bytes},
           {no_wait ? "queued" : "copied", n.done},
           {"cached", n.cached},
           {"failed", n.failed}};
  if (!no_wait) out["seconds"] = secs;
  std::puts(dump(out).c_str());
}

}  // namespace

int prefetch(const std::vector<std::string>& args, bool no_wait, const Options& o) {
  const auto t0 = Clock::now();
  const Targets targets = resolve_targets(args);
  if (targets.status != 0) return targets.status;
  std::vector<File> files;
  std::vector<Outcome> results;
  for (const auto& t : targets.targets) expand(t, files, results);
  std::sort(files.begin(), files.end(), [](const File& a, const File& b) { return a.path < b.path; });
  files.erase(
      std::unique(files.begin(), files.end(), [](const File& a, const File& b) { return a.path == b.path; }),
      files.end());
  const bool list = o.verbose && !o.json;
  Counts n;
  n.files = files.size() + results.size();
  std::vector<File> todo;
  uint64_t todo_bytes = 0;
  for (const auto& f : files) {
    n.bytes += f.size;
    std::string v;
    const int err = get_attr(f.path, "user.stagefs.cached", v);
    if (err == 0 && v == "yes") {
      results.push_back({f.path, true, true, {}});
      ++n.cached;
      if (list) std::printf("cached %s\n", shown(f.path).c_str());
    } else if (err == 0 || err == ENODATA || err == ENOTSUP) {  // "no", or a daemon that does not say
      todo.push_back(f);
      todo_bytes += f.size;
    } else {
      results.push_back({f.path, false, false, std::strerror(err)});
    }
  }
  {
    // With --verbose on a terminal the list is the progress: a line drawn in place would mix with it.
    auto mode = no_wait || o.json || todo.empty()
                    ? stage::ProgressMode::off
                    : stage::progress_mode(o.progress, false, ::isatty(STDERR_FILENO) != 0);
    if (list && mode == stage::ProgressMode::in_place) mode = stage::ProgressMode::off;
    Progress progress(mode, todo.size(), todo_bytes);
    const char* attr = no_wait ? "user.stagefs.prefetch.nowait" : "user.stagefs.prefetch";
    for (const auto& f : todo) {
      progress.begin(f);
      std::string v;
      const int err = get_attr(f.path, attr, v);
      progress.end(f.size);
      if (err != 0) {
        results.push_back({f.path, false, false, std::strerror(err)});
        continue;
      }
      results.push_back({f.path, true, false, {}});
      ++n.done;
      n.done_bytes += f.size;
      if (list) std::printf("%s %s\n", no_wait ? "queued" : "copied", shown(f.path).c_str());
    }
  }
  std::vector<Outcome> failures;
  for (const auto& r : results)
    if (!r.ok) failures.push_back(r);
  n.failed = failures.size();
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  if (o.json)
    print_json(std::move(results), n, no_wait, secs);
  else
    print_text(failures, n, no_wait, o.verbose, secs);
  return n.failed == 0 ? 0 : 1;
}

}  // namespace stagefs::ctl
