// stagectl's channel into a mount: a request is a read of one of these extended attributes of
// a file, through the mount. It reaches the daemon with the caller's credentials (the kernel
// names them) and nothing else, no socket or pipe, has to be secured; the answer is the
// attribute's value ("ok") or the errno of the failure.
//
//   user.stagefs.prefetch          stage the file (as an open would, with its access check);
//                                  answered once the copy is in the cache, or failed
//   user.stagefs.prefetch.nowait   the same, answered at once (the copy goes on)
//   user.stagefs.evict             remove the file's copy from this node's cache (root or the
//                                  source file's owner; EBUSY while it is open on this node)
//   user.stagefs.cached            "yes" if this node's cache holds a current copy of the file,
//                                  else "no" (copies nothing; the access check of an open first:
//                                  stagectl prefetch asks it to count what was already cached)
//
// The status attributes on the root (user.stagefs.status, .stats, .state) are answered by the
// core's getxattr, not here. Nothing here knows FUSE: fuse_ops.cc parses the attribute name,
// runs the request and replies.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string_view>

#include "fusefs/core/core.h"

namespace stagefs {

enum class StagectlRequest : uint8_t { prefetch, prefetch_nowait, evict, cached };

// The request an attribute name stands for, if it is one.
std::optional<StagectlRequest> parse_stagectl_request(std::string_view attribute);
// Whether answering needs the caller's supplementary groups (the daemon checks access as an
// open would): prefetch and cached yes; evict no (root or the owner).
bool needs_caller_groups(StagectlRequest r);
// The attribute value of a request that succeeded (cached: "yes" or "no").
inline constexpr std::string_view kStagectlDone = "ok";

// Runs r on the file `id` of the core for `who`; done is called once with the attribute's
// value or the error, on this thread or later on the core's completion pool (a waiting
// prefetch holds no thread).
void run_stagectl_request(StageFsCore& core, uint64_t id, StagectlRequest r, const Caller& who,
                          std::function<void(const stage::Result<std::string>&)> done);

}  // namespace stagefs
