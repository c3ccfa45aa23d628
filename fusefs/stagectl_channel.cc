#include "fusefs/stagectl_channel.h"

namespace stagefs {

std::optional<StagectlRequest> parse_stagectl_request(std::string_view attribute) {
  if (attribute == "user.stagefs.prefetch") return StagectlRequest::prefetch;
  if (attribute == "user.stagefs.prefetch.nowait") return StagectlRequest::prefetch_nowait;
  if (attribute == "user.stagefs.evict") return StagectlRequest::evict;
  return std::nullopt;
}

bool needs_caller_groups(StagectlRequest r) {
  return r != StagectlRequest::evict;
}

void run_stagectl_request(StageFsCore& core, uint64_t id, StagectlRequest r, const Caller& who,
                          std::function<void(const stage::Status&)> done) {
  switch (r) {
    case StagectlRequest::prefetch:
      return core.prefetch_async(id, who, std::move(done));
    case StagectlRequest::prefetch_nowait:
      core.prefetch_async(id, who, [](const stage::Status&) {});
      return done({});
    case StagectlRequest::evict:
      return done(core.evict(id, who));
  }
}

}  // namespace stagefs
