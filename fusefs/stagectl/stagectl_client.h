// The stagectl side of the mount's control channel: inspect and steer a running stagefs mount
// on this node (tools/stagectl.cc parses the command line and calls these); the daemon side is
// fusefs/core/stagectl_channel.h.
// The channel is the mount itself: each request is a read of an attribute
// (user.stagefs.status on the root, user.stagefs.prefetch / .evict on a file), so it reaches
// the daemon with the caller's credentials, a user may prefetch only what the mount lets
// them read, and the cache directory stays private (no socket to secure).
// Names are other users' bytes: the text output escapes what a terminal would act on
// (stage::escape_controls, as the daemon's log does); --json is ASCII, its strings escaped.
// Each function prints its result (stdout) and its errors (stderr, "stagectl: ...") and
// returns the exit status: 0 done, 1 a request failed or the path is not in a running stagefs
// mount, 2 usage. Paths are relative to the current directory, or absolute; the mount is the
// one they lie in (fusefs/stagectl/stagectl_mount.h, which also keeps the older MOUNTPOINT PATH... form).
#pragma once

#include <string>
#include <vector>

#include "bcast/text/progress.h"
#include "fusefs/stagectl/stagectl_mount.h"  // shown()

namespace stagefs::ctl {

struct Options {
  bool json = false;
  bool verbose = false;                                           // prefetch: list every file as it is done
  stage::ProgressWhen progress = stage::ProgressWhen::automatic;  // prefetch's progress line
};

// `stagectl status PATH` (counters false) or `stagectl stats PATH` (counters true): the mount
// PATH lies in.
int show_status(const std::string& path, bool counters, bool as_json);

// `stagectl prefetch [--no-wait] PATH...` (fusefs/stagectl/stagectl_prefetch.cc): a directory stands
// for every regular file below it (symlinks not followed); a progress line, then one summary.
int prefetch(const std::vector<std::string>& args, bool no_wait, const Options& o);

// `stagectl evict PATH...`: one line per file.
int evict(const std::vector<std::string>& args, bool as_json);

}  // namespace stagefs::ctl
