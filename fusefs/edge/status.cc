#include "fusefs/edge/status.h"

#include <sys/xattr.h>

#include <cerrno>
#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "fusefs/core/core.h"

namespace stagefs {

void MountStatus::hide_current() {
  if (current.empty()) return;
  current.clear();
  current_done = current_total = 0;
  current_seconds = 0;
  current_hidden = true;
}

std::string current_source(const std::string& current) {
  if (current == "/") return {};
  if (!current.empty() && current.back() == '/') return current.substr(0, current.size() - 1);
  return current;
}

void show_to(MountStatus& s, const StageFsCore& core, const Caller& who) {
  if (!s.current.empty() && !core.may_read(current_source(s.current), who)) s.hide_current();
}

std::string to_json(const MountStatus& s) {
  nlohmann::json j;
  j["host"] = s.host;
  j["rank"] = s.rank;
  j["ranks"] = s.ranks;
  j["pid"] = s.pid;
  j["state"] = s.state;
  j["mountpoint"] = s.mountpoint;
  j["source"] = s.source;
  j["read_path"] = s.read_path;
  j["opens"] = s.opens;
  j["cache_hits"] = s.cache_hits;
  j["cache_misses"] = s.materializations;
  j["materializations"] = s.materializations;
  j["source_fallbacks"] = s.source_fallbacks;
  j["open_errors"] = s.open_errors;
  j["verified"] = s.verified;
  j["verify_waits"] = s.verify_waits;
  j["corrupt"] = s.corrupt;
  j["stale_opens"] = s.stale_opens;
  j["denied"] = s.denied;
  j["prefetches"] = s.prefetches;
  j["transfers"] = s.transfers;
  j["batches"] = s.batches;
  j["nested_batches"] = s.nested_batches;
  j["nested_files"] = s.nested_files;
  j["batch_files"] = s.batch_files;
  j["local_writes"] = s.local_writes;
  j["bytes_broadcast"] = s.bytes_broadcast;
  j["chunks_broadcast"] = s.chunks_broadcast;
  j["nothing_to_copy"] = s.nothing_to_copy;
  j["budget_stops"] = s.budget_stops;
  j["bytes_from_source"] = s.bytes_from_source;
  j["bytes_from_seeds"] = s.bytes_from_seeds;
  j["seeded_here"] = s.seeded_here;
  j["feed_retries"] = s.feed_retries;
  j["transfer_failures"] = s.transfer_failures;
  j["requests"] = s.requests;
  j["waiting"] = s.waiting;
  j["opens_during_copy"] = s.opens_during_copy;
  j["room_waits"] = s.room_waits;
  j["reads_waited_during_copy"] = s.reads_waited_during_copy;
  j["chunks_wanted"] = s.chunks_wanted;
  j["cache"] = {{"dir", s.cache_dir},          {"bytes", s.cache.bytes},
                {"limit", s.cache.limit},      {"files", s.cache.files},
                {"evictions", s.cache.evictions}, {"evicted_bytes", s.cache.evicted_bytes},
                {"unsynced", s.cache.unsynced},   {"synced_later", s.cache.synced_later},
                {"pinned_bytes", s.cache.pinned_bytes}, {"pinned_files", s.cache.pinned_files}};
  if (s.replay) {
    const ReplayStats& r = *s.replay;
    j["replay"] = {{"state", r.state},
                   {"profile", r.note},
                   {"files", r.files},
                   {"files_queued", r.files_queued},
                   {"bytes_queued", r.bytes_queued},
                   {"files_done", r.files_done},
                   {"bytes_done", r.bytes_done},
                   {"files_skipped", r.files_skipped}};
    if (r.accounted)
      j["replay"]["used"] = {{"files", r.files_used},
                             {"bytes", r.bytes_used},
                             {"files_unused", r.files_unused},
                             {"bytes_unused", r.bytes_unused}};
  } else {
    j["replay"] = nullptr;
  }
  if (s.current_hidden) {
    j["transfer"] = {{"path", nullptr}, {"hidden", true}};
  } else if (!s.current.empty()) {
    const double rate = s.current_seconds > 0 ? static_cast<double>(s.current_done) / s.current_seconds : 0;
    const double eta = rate > 0 ? static_cast<double>(s.current_total - s.current_done) / rate : -1;
    j["transfer"] = {{"path", s.current},     {"bytes_done", s.current_done}, {"bytes_total", s.current_total},
                     {"seconds", s.current_seconds}, {"bytes_per_second", rate},     {"eta_seconds", eta}};
  } else {
    j["transfer"] = nullptr;
  }
  // File names are bytes, not necessarily UTF-8: such a name is shown with U+FFFD where its
  // bytes are not UTF-8, rather than failing the whole status (strict mode throws).
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string read_state(const std::string& mountpoint) {
  char buf[64] = {};
  const ssize_t n = ::getxattr(mountpoint.c_str(), "user.stagefs.state", buf, sizeof buf - 1);
  if (n > 0) return std::string(buf, static_cast<size_t>(n));
  if (n < 0 && errno == ENOTCONN) return "stale mount (daemon gone)";
  return "not mounted";
}

std::string wait_until_ready(const std::string& mountpoint, double timeout_s,
                             const std::function<std::string()>& give_up) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  auto pause = std::chrono::milliseconds(10);
  for (;;) {
    const std::string state = read_state(mountpoint);
    if (state == "ready") return {};
    if (state == "broken" || state == "stopping" || state.starts_with("stale")) return state;
    if (give_up)
      if (std::string why = give_up(); !why.empty()) return why;
    if (Clock::now() >= deadline) return state;
    std::this_thread::sleep_for(pause);  // polling a CLI, backing off to 200 ms
    pause = std::min(pause * 2, std::chrono::milliseconds(200));
  }
}

}  // namespace stagefs
