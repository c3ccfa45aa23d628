// One model of what a mount is doing, for every reader: the user.stagefs.stats and
// user.stagefs.status attributes (stagectl status/stats, --json), and the metrics file.
// Plain data, filled by the daemon (daemon.cc) from the core's, the group's and the cache's
// counters; to_json() is the only JSON writer (nlohmann-json).
#pragma once

#include <cstdint>
#include <string>

#include "fusefs/cache.h"

namespace stagefs {

struct MountStatus {
  std::string host, mountpoint, source, cache_dir, state, read_path;
  int rank = 0, ranks = 1, pid = 0;
  // core (this node)
  uint64_t opens = 0, cache_hits = 0, materializations = 0, source_fallbacks = 0, open_errors = 0;
  uint64_t verified = 0, verify_waits = 0, corrupt = 0, stale_opens = 0, denied = 0, prefetches = 0;
  // group (this node's view of the collective transfers)
  uint64_t transfers = 0, local_writes = 0, bytes_broadcast = 0, transfer_failures = 0, requests = 0;
  uint64_t batches = 0, batch_files = 0;  // of the transfers, directory batches; small files they published here
  uint64_t nested_batches = 0;  // of the batches, run nested in a single-file transfer
  uint64_t waiting = 0;
  // reads before the copy ends: opens answered during their copy; reads of theirs that waited
  // for chunks; chunks this node asked the source to send first
  uint64_t early_opens = 0, early_reads_waited = 0, chunks_wanted = 0;
  uint64_t room_waits = 0;  // opens that waited for room held by copies open on this node
  std::string current;  // the transfer in flight ("" if none)
  uint64_t current_done = 0, current_total = 0;
  double current_seconds = 0;
  CacheUsage cache;
};

// Never throws on file names that are not UTF-8 (their bad bytes become U+FFFD).
std::string to_json(const MountStatus& s);

}  // namespace stagefs
