#include "fusefs/core/stagectl_channel.h"

namespace stagefs {

std::optional<StagectlRequest> parse_stagectl_request(std::string_view attribute) {
  if (attribute == "user.stagefs.prefetch") return StagectlRequest::prefetch;
  if (attribute == "user.stagefs.prefetch.nowait") return StagectlRequest::prefetch_nowait;
  if (attribute == "user.stagefs.evict") return StagectlRequest::evict;
  if (attribute == "user.stagefs.cached") return StagectlRequest::cached;
  return std::nullopt;
}

bool needs_caller_groups(StagectlRequest r) {
  return r != StagectlRequest::evict;
}

void run_stagectl_request(StageFsCore& core, uint64_t id, StagectlRequest r, const Caller& who,
                          std::function<void(const stage::Result<std::string>&)> done) {
  auto answer = [&done](const stage::Status& st) {
    if (!st) return done(st.error());
    done(std::string(kStagectlDone));
  };
  switch (r) {
    case StagectlRequest::prefetch:
      return core.prefetch_async(id, who, [done = std::move(done)](const stage::Status& st) {
        if (!st) return done(st.error());
        done(std::string(kStagectlDone));
      });
    case StagectlRequest::prefetch_nowait:
      core.prefetch_async(id, who, [](const stage::Status&) {});
      return answer({});
    case StagectlRequest::evict:
      return answer(core.evict(id, who));
    case StagectlRequest::cached: {
      auto has = core.has_copy(id, who);
      if (!has) return done(has.error());
      return done(std::string(*has ? "yes" : "no"));
    }
  }
}

}  // namespace stagefs
