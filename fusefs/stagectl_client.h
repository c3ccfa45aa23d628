// The stagectl side of the mount's control channel: inspect and steer a running stagefs mount
// on this node (tools/stagectl.cc parses the command line and calls these); the daemon side is
// fusefs/stagectl_channel.h.
// The channel is the mount itself: each request is a read of an attribute
// (user.stagefs.status on the root, user.stagefs.prefetch / .evict on a file), so it reaches
// the daemon with the caller's credentials, a user may prefetch only what the mount lets
// them read, and the cache directory stays private (no socket to secure).
// Names are other users' bytes: the text output escapes what a terminal would act on
// (stage::escape_controls, as the daemon's log does); --json is ASCII, its strings escaped.
// Each function prints its result (stdout) and its errors (stderr, "stagectl: ...") and
// returns the exit status: 0 done, 1 a request failed or MOUNTPOINT is not a running stagefs.
#pragma once

#include <string>
#include <vector>

namespace stagefs::ctl {

// `stagectl status` (counters false) or `stagectl stats` (counters true).
int show_status(const std::string& mnt, bool counters, bool as_json);

enum class Request { prefetch, prefetch_no_wait, evict };
// `stagectl prefetch|evict MOUNTPOINT PATH...`: PATH relative to the mount point or absolute;
// a prefetched directory stands for every regular file below it (symlinks not followed). Exit
// status 1 when anything asked for was not done: a path or a file that failed, or a directory
// (named, or below one named) that could not be listed, each a result with its errno's text.
// So a prefetch of a directory the caller cannot list fails with the reason, never "ok"
// with nothing staged.
int send_requests(const std::string& mnt, const std::vector<std::string>& paths, Request request, bool as_json);

// A name as the text output shows it (controls escaped).
std::string shown(const std::string& name);

}  // namespace stagefs::ctl
