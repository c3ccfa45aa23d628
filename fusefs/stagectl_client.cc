#include "fusefs/stagectl_client.h"

#include <sys/stat.h>
#include <sys/xattr.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bcast/text.h"

namespace stagefs::ctl {

std::string shown(const std::string& name) {
  return stage::escape_controls(name);
}

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The attribute's value, or an errno.
int get_attr(const std::string& path, const char* name, std::string& out) {
  std::vector<char> buf(1 << 16);
  for (;;) {
    const ssize_t n = ::getxattr(path.c_str(), name, buf.data(), buf.size());
    if (n >= 0) {
      out.assign(buf.data(), static_cast<size_t>(n));
      return 0;
    }
    if (errno == ERANGE && buf.size() < (1U << 24)) {
      buf.resize(buf.size() * 4);
      continue;
    }
    return errno;
  }
}

// JSON for the output: ASCII only (every control character and every non-ASCII character
// as \uXXXX, so that nothing in it acts on a terminal), bytes that are not UTF-8 as U+FFFD.
std::string dump(const json& j) {
  return j.dump(2, ' ', true, json::error_handler_t::replace);
}

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", b, units[u]);
  return buf;
}

int read_status(const std::string& mnt, json& out) {
  std::string text;
  if (const int err = get_attr(mnt, "user.stagefs.status", text); err != 0) {
    std::fprintf(stderr, "stagectl: %s: not a running stagefs mount (%s)\n", shown(mnt).c_str(),
                 err == ENODATA || err == ENOTSUP ? "no stagefs status attribute" : std::strerror(err));
    return 1;
  }
  out = json::parse(text, nullptr, false);
  if (out.is_discarded()) {
    std::fprintf(stderr, "stagectl: %s: unreadable status\n", shown(mnt).c_str());
    return 1;
  }
  return 0;
}

// The replay of the last job's profile, as the coordinator's node (rank 0) shows it.
void print_replay(const json& s) {
  if (!s.contains("replay") || !s["replay"].is_object()) {
    if (s.value("ranks", 1) > 1) std::printf("replay: shown on the coordinator's node (rank 0)\n");
    return;
  }
  const json& r = s["replay"];
  const std::string state = r.value("state", "?");
  const auto count = [&](const char* k) { return static_cast<unsigned long long>(r.value(k, uint64_t{0})); };
  const auto bytes = [&](const char* k) { return human_bytes(static_cast<double>(r.value(k, uint64_t{0}))); };
  if (state == "off") {
    std::printf("replay: off\n");
  } else if (state == "none") {
    std::printf("replay: no profile yet (%s): this job's reads make one when it ends\n",
                shown(r.value("profile", "?")).c_str());
  } else if (state == "refused") {
    std::printf("replay: profile refused: %s\n", shown(r.value("profile", "?")).c_str());
  } else {
    std::printf("replay: %s, %llu of %llu file(s) staged ahead (%s of %s), %llu skipped; profile %s\n",
                shown(state).c_str(), count("files_done"), count("files_queued"), bytes("bytes_done").c_str(),
                bytes("bytes_queued").c_str(), count("files_skipped"),
                shown(r.value("profile", "?")).c_str());
  }
  if (r.contains("used") && r["used"].is_object()) {
    const json& u = r["used"];
    std::printf("replay: the job opened %llu of the files staged ahead (%s); %llu it did not (%s)\n",
                static_cast<unsigned long long>(u.value("files", uint64_t{0})),
                human_bytes(static_cast<double>(u.value("bytes", uint64_t{0}))).c_str(),
                static_cast<unsigned long long>(u.value("files_unused", uint64_t{0})),
                human_bytes(static_cast<double>(u.value("bytes_unused", uint64_t{0}))).c_str());
  }
}

void print_status(const json& s) {
  std::printf("%s: %s on %s (rank %d of %d), reads: %s\n", shown(s.value("mountpoint", "?")).c_str(),
              shown(s.value("state", "?")).c_str(), shown(s.value("host", "?")).c_str(), s.value("rank", 0),
              s.value("ranks", 1), shown(s.value("read_path", "?")).c_str());
  const json& c = s["cache"];
  const uint64_t limit = c.value("limit", uint64_t{0});
  std::printf("cache %s: %s in %llu file(s), limit %s, %llu eviction(s)\n",
              shown(c.value("dir", "?")).c_str(),
              human_bytes(static_cast<double>(c.value("bytes", uint64_t{0}))).c_str(),
              static_cast<unsigned long long>(c.value("files", uint64_t{0})),
              limit ? human_bytes(static_cast<double>(limit)).c_str() : "none",
              static_cast<unsigned long long>(c.value("evictions", uint64_t{0})));
  // What open files hold (never evicted): what an open that waits for room waits for.
  std::printf("open: %s in %llu cached file(s) held open on this node (not evictable); %llu open(s) waited for room\n",
              human_bytes(static_cast<double>(c.value("pinned_bytes", uint64_t{0}))).c_str(),
              static_cast<unsigned long long>(c.value("pinned_files", uint64_t{0})),
              static_cast<unsigned long long>(s.value("room_waits", uint64_t{0})));
  print_replay(s);
  if (s.contains("transfer") && s["transfer"].is_object() && s["transfer"].value("hidden", false)) {
    std::printf("transfer: one in flight (of a file you may not read: not named)\n");
  } else if (s.contains("transfer") && s["transfer"].is_object()) {
    const json& t = s["transfer"];
    const double eta = t.value("eta_seconds", -1.0);
    std::printf("transfer: %s, %s of %s, %.1f MB/s, ETA %s\n", shown(t.value("path", "?")).c_str(),
                human_bytes(t.value("bytes_done", 0.0)).c_str(),
                human_bytes(t.value("bytes_total", 0.0)).c_str(), t.value("bytes_per_second", 0.0) / 1e6,
                eta >= 0 ? (std::to_string(static_cast<int>(eta + 0.5)) + " s").c_str() : "-");
  } else {
    std::printf("transfer: none in flight; %llu file(s) waited for\n",
                static_cast<unsigned long long>(s.value("waiting", uint64_t{0})));
  }
}

void print_stats(const json& s) {
  for (const char* k : {"opens", "cache_hits", "cache_misses", "materializations", "prefetches", "transfers",
                        "batches", "nested_batches", "batch_files", "local_writes", "bytes_broadcast", "transfer_failures", "open_errors", "source_fallbacks",
                        "verified", "corrupt", "stale_opens", "denied", "requests", "waiting", "room_waits"})
    std::printf("%-18s %llu\n", k, static_cast<unsigned long long>(s.value(k, uint64_t{0})));
  for (const char* k : {"evictions", "unsynced", "synced_later"})
    std::printf("%-18s %llu\n", k, static_cast<unsigned long long>(s["cache"].value(k, uint64_t{0})));
  if (s.contains("replay") && s["replay"].is_object())
    for (const char* k :
         {"files", "files_queued", "bytes_queued", "files_done", "bytes_done", "files_skipped"})
      std::printf("replay_%-11s %llu\n", k,
                  static_cast<unsigned long long>(s["replay"].value(k, uint64_t{0})));
}

// Every regular file at or below path (symlinks not followed), or the error.
void expand(const std::string& path, std::vector<std::string>& files, json& results) {
  std::error_code ec;
  const auto st = fs::symlink_status(path, ec);
  if (ec) {
    results.push_back({{"path", path}, {"ok", false}, {"error", ec.message()}});
    return;
  }
  if (fs::is_directory(st)) {
    for (auto it = fs::recursive_directory_iterator(path, fs::directory_options::skip_permission_denied, ec);
         !ec && it != fs::recursive_directory_iterator(); it.increment(ec))
      if (it->is_regular_file(ec) && !it->is_symlink(ec)) files.push_back(it->path().string());
    if (ec) results.push_back({{"path", path}, {"ok", false}, {"error", ec.message()}});
  } else if (fs::is_regular_file(st)) {
    files.push_back(path);
  } else {
    results.push_back({{"path", path}, {"ok", false}, {"error", "not a regular file or directory"}});
  }
}

std::string under(const std::string& mnt, const std::string& p) {
  return p.empty() || p[0] == '/' ? p : (fs::path(mnt) / p).string();
}

}  // namespace

int show_status(const std::string& mnt, bool counters, bool as_json) {
  json s;
  if (const int rc = read_status(mnt, s); rc != 0) return rc;
  if (as_json)
    std::puts(dump(s).c_str());
  else if (counters)
    print_stats(s);
  else
    print_status(s);
  return 0;
}

int send_requests(const std::string& mnt, const std::vector<std::string>& paths, Request request, bool as_json) {
  json s;
  if (const int rc = read_status(mnt, s); rc != 0) return rc;
  const bool evict = request == Request::evict;
  const bool no_wait = request == Request::prefetch_no_wait;
  json results = json::array();
  std::vector<std::string> files;
  if (!evict) {
    for (const auto& p : paths) expand(under(mnt, p), files, results);
  } else {
    for (const auto& p : paths) files.push_back(under(mnt, p));
  }
  const char* attr = evict ? "user.stagefs.evict" : no_wait ? "user.stagefs.prefetch.nowait" : "user.stagefs.prefetch";
  for (const auto& f : files) {
    std::string v;
    const int err = get_attr(f, attr, v);
    if (err == 0)
      results.push_back({{"path", f}, {"ok", true}});
    else
      results.push_back({{"path", f}, {"ok", false}, {"error", std::strerror(err)}});
  }
  int rc = 0;
  for (const auto& r : results)
    if (!r.value("ok", false)) rc = 1;
  if (as_json) {
    // Paths as typed may be any bytes: shown with U+FFFD, never an abort.
    std::puts(dump(json{{"results", results}, {"ok", rc == 0}}).c_str());
  } else {
    const char* verb = evict ? "evicted" : no_wait ? "queued" : "prefetched";
    for (const auto& r : results) {
      if (r.value("ok", false))
        std::printf("%s %s\n", verb, shown(r.value("path", "")).c_str());
      else
        std::fprintf(stderr, "stagectl: %s: %s\n", shown(r.value("path", "")).c_str(),
                     shown(r.value("error", "")).c_str());
    }
  }
  return rc;
}

}  // namespace stagefs::ctl
