// One model of what a mount is doing, for every reader: the user.stagefs.stats and
// user.stagefs.status attributes (stagectl status/stats, --json), and the metrics file.
// Plain data, filled by the daemon (daemon.cc) from the core's, the group's and the cache's
// counters; to_json() is the only JSON writer (nlohmann-json).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "fusefs/cache/cache.h"
#include "fusefs/profile/replay.h"

namespace stagefs {

struct MountStatus {
  std::string host, mountpoint, source, cache_dir, state, read_path;
  int rank = 0, ranks = 1, pid = 0;
  // core (this node)
  uint64_t opens = 0, cache_hits = 0, materializations = 0, source_fallbacks = 0, open_errors = 0;
  uint64_t verified = 0, verify_waits = 0, corrupt = 0, stale_opens = 0, denied = 0, prefetches = 0;
  // group (this node's view of the collective transfers)
  uint64_t transfers = 0, local_writes = 0, bytes_broadcast = 0, transfer_failures = 0, requests = 0;
  uint64_t nothing_to_copy = 0;   // transfers that found every node's copy current (moved nothing)
  uint64_t chunks_broadcast = 0;  // chunks the transfers moved (a sparse file's holes are none)
  uint64_t budget_stops = 0;      // coordinator's node: walks and batch sequences stopped at their budget
  uint64_t batches = 0, batch_files = 0;  // of the transfers, directory batches; small files they published here
  uint64_t nested_batches = 0;  // of the batches, run nested in a single-file transfer
  uint64_t nested_files = 0;    // single-file transfers run nested in a background one
  // where the transfers' bytes were read: the shared source, or a node's cached copy (a
  // seed); transfers this node's cache fed
  uint64_t bytes_from_source = 0, bytes_from_seeds = 0, seeded_here = 0;
  // feeds that failed on a seed's side and were replaced within their transfer (no open saw it)
  uint64_t feed_retries = 0;
  uint64_t waiting = 0;
  // reads before the copy ends: opens answered during their copy; reads of theirs that waited
  // for chunks; chunks this node asked the source to send first
  uint64_t opens_during_copy = 0, reads_waited_during_copy = 0, chunks_wanted = 0;
  uint64_t room_waits = 0;  // opens that waited for room held by copies open on this node
  std::string current;  // the transfer in flight ("" if none): a file, or "DIR/" for a batch
  uint64_t current_done = 0, current_total = 0;
  double current_seconds = 0;
  bool current_hidden = false;  // a transfer runs that this reader may not see: hide_current()
  CacheUsage cache;
  // The replay of the last job's profile: on the coordinator's node (rank 0) only.
  std::optional<ReplayStats> replay;

  // For a reader who may not read what is in flight: only that a transfer runs is kept. Its
  // name goes (a path inside a directory they cannot enter) and so do its bytes and times:
  // a file's exact size, or its size from rate and time, can name it as well as its path.
  void hide_current();
};

// The source path (relative, "" for SOURCE_DIR) that a transfer shown as `current` copies:
// the file, or the directory of a batch ("DIR/", "/" for SOURCE_DIR's own small files).
std::string current_source(const std::string& current);

class StageFsCore;
struct Caller;
// s as `who` may see it (any user may read the status attributes): the transfer in flight
// stays named only if who could read its source through the mount (StageFsCore::may_read);
// otherwise hide_current().
void show_to(MountStatus& s, const StageFsCore& core, const Caller& who);

// Never throws on file names that are not UTF-8 (their bad bytes become U+FFFD). A hidden
// transfer is {"path": null, "hidden": true}.
std::string to_json(const MountStatus& s);

// ---- The reader's side, on the node where it runs (stagefs --wait, stagefs run).
// The mount's state attribute: "mounting", "ready", "broken", "stopping"; or, when it cannot
// be read, why: "not mounted", "stale mount (daemon gone)".
std::string read_state(const std::string& mountpoint);
// Polls read_state() (backing off from 10 to 200 ms) until the mount is ready (returns ""),
// broken or stopping, timeout_s has passed, or give_up (called between polls) returns a
// reason; returns why it is not ready. Thread-safe.
std::string wait_until_ready(const std::string& mountpoint, double timeout_s,
                             const std::function<std::string()>& give_up = {});

}  // namespace stagefs
