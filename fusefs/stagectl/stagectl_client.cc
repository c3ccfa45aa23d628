#include "fusefs/stagectl/stagectl_client.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bcast/text/progress.h"
#include "bcast/text/text.h"
#include "fusefs/stagectl/stagectl_mount.h"

namespace stagefs::ctl {

namespace {

using nlohmann::json;

// The replay of the last job's profile, as the coordinator's node (rank 0) shows it.
void print_replay(const json& s) {
  if (!s.contains("replay") || !s["replay"].is_object()) {
    if (s.value("ranks", 1) > 1) std::printf("replay: shown on the coordinator's node (rank 0)\n");
    return;
  }
  const json& r = s["replay"];
  const std::string state = r.value("state", "?");
  const auto count = [&](const char* k) { return static_cast<unsigned long long>(r.value(k, uint64_t{0})); };
  const auto bytes = [&](const char* k) { return stage::human_bytes(r.value(k, uint64_t{0})); };
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
                stage::human_bytes(u.value("bytes", uint64_t{0})).c_str(),
                static_cast<unsigned long long>(u.value("files_unused", uint64_t{0})),
                stage::human_bytes(u.value("bytes_unused", uint64_t{0})).c_str());
  }
}

void print_status(const json& s) {
  // How reads of complete copies are served; files opened during their copy are read through
  // the daemon until closed (user guide: reads during a copy).
  const uint64_t early = s.value("opens_during_copy", uint64_t{0});
  const std::string during =
      early == 0 ? "" : "; " + std::to_string(early) + " open(s) during a copy read through the daemon";
  std::printf("%s: %s on %s (rank %d of %d), reads: %s%s\n", shown(s.value("mountpoint", "?")).c_str(),
              shown(s.value("state", "?")).c_str(), shown(s.value("host", "?")).c_str(), s.value("rank", 0),
              s.value("ranks", 1), shown(s.value("read_path", "?")).c_str(), during.c_str());
  const json& c = s["cache"];
  const uint64_t limit = c.value("limit", uint64_t{0});
  std::printf("cache %s: %s in %llu file(s), limit %s, %llu eviction(s)\n",
              shown(c.value("dir", "?")).c_str(), stage::human_bytes(c.value("bytes", uint64_t{0})).c_str(),
              static_cast<unsigned long long>(c.value("files", uint64_t{0})),
              limit ? stage::human_bytes(limit).c_str() : "none",
              static_cast<unsigned long long>(c.value("evictions", uint64_t{0})));
  // What open files hold (never evicted): what an open that waits for room waits for.
  std::printf(
      "open: %s in %llu cached file(s) held open on this node (not evictable); %llu open(s) waited for "
      "room\n",
      stage::human_bytes(c.value("pinned_bytes", uint64_t{0})).c_str(),
      static_cast<unsigned long long>(c.value("pinned_files", uint64_t{0})),
      static_cast<unsigned long long>(s.value("room_waits", uint64_t{0})));
  print_replay(s);
  if (s.contains("transfer") && s["transfer"].is_object() && s["transfer"].value("hidden", false)) {
    std::printf("transfer: one in flight (of a file you may not read: not named)\n");
  } else if (s.contains("transfer") && s["transfer"].is_object()) {
    const json& t = s["transfer"];
    const double eta = t.value("eta_seconds", -1.0);
    std::printf("transfer: %s, %s of %s, %.1f MB/s, ETA %s\n", shown(t.value("path", "?")).c_str(),
                stage::human_bytes(t.value("bytes_done", uint64_t{0})).c_str(),
                stage::human_bytes(t.value("bytes_total", uint64_t{0})).c_str(),
                t.value("bytes_per_second", 0.0) / 1e6, eta >= 0 ? stage::duration_text(eta).c_str() : "-");
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

}  // namespace

int show_status(const std::string& path, bool counters, bool as_json) {
  std::string why;
  const auto mnt = mount_root(path, &why);
  if (!mnt) {
    std::fprintf(stderr, "stagectl: %s: %s\n", shown(path).c_str(), shown(why).c_str());
    return 1;
  }
  json s;
  if (const int rc = read_status(*mnt, s); rc != 0) return rc;
  if (as_json)
    std::puts(dump(s).c_str());
  else if (counters)
    print_stats(s);
  else
    print_status(s);
  return 0;
}

int evict(const std::vector<std::string>& args, bool as_json) {
  const Targets targets = resolve_targets(args);
  if (targets.status != 0) return targets.status;
  json results = json::array();
  int rc = 0;
  for (const auto& t : targets.targets) {
    std::string v;
    const int err = get_attr(t.path, "user.stagefs.evict", v);
    if (err == 0) {
      results.push_back({{"path", t.path}, {"ok", true}});
      if (!as_json) std::printf("evicted %s\n", shown(t.path).c_str());
    } else {
      rc = 1;
      results.push_back({{"path", t.path}, {"ok", false}, {"error", std::strerror(err)}});
      if (!as_json) std::fprintf(stderr, "stagectl: %s: %s\n", shown(t.path).c_str(), std::strerror(err));
    }
  }
  // Paths as typed may be any bytes: shown with U+FFFD, never an abort.
  if (as_json) std::puts(dump(json{{"results", results}, {"ok", rc == 0}}).c_str());
  return rc;
}

}  // namespace stagefs::ctl
