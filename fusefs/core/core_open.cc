// StageFsCore's opens (core.h): the open chain, top-down in the order an open goes through it,
// then the reads of a handle opened during its copy, and the release of a handle.
//
// Threads: open_async() and check_open() run on the caller's thread (a FUSE worker, or the one
// that serves stagectl); every later step of the chain runs on the core's completion pool,
// posted there by the cache room's or the materializer's callback (which run on their own
// threads and must be quick).
#include <fcntl.h>
#include <unistd.h>

#include <future>

#include "bcast/io/store.h"
#include "fusefs/base/batch_rules.h"
#include "fusefs/base/beneath.h"
#include "fusefs/base/log.h"
#include "fusefs/cache/cache.h"
#include "fusefs/core/core.h"
#include "fusefs/core/live.h"

namespace stagefs {

using stage::Result;

namespace {
// The group stalled (timed out, or its data path broke): --on-stall source may read the source.
bool stalled(const std::error_code& ec) {
  return ec == stage::make_error_code(stage::Errc::timed_out) ||
         ec == stage::make_error_code(stage::Errc::comm_broken);
}
}  // namespace

void StageFsCore::open_async(uint64_t id, int flags, const Caller& who, OpenDone done) {
  auto slot = handles_.take(who.uid, true);
  if (!slot) {
    ++counters_.open_errors;
    return done(slot.error());
  }
  // The slot goes with the handle, or back when the open fails.
  check_open(
      id, flags, who,
      [slot = std::make_shared<HandleLimits::Slot>(std::move(*slot)),
       done = std::move(done)](Result<OpenFile> r) {
        if (r) r->slot = std::move(*slot);
        done(std::move(r));
      },
      cfg_.read_during_copy);
}

Result<OpenFile> StageFsCore::open(uint64_t id, int flags, const Caller& who) {
  auto p = std::make_shared<std::promise<Result<OpenFile>>>();
  auto f = p->get_future();
  open_async(id, flags, who, [p](Result<OpenFile> r) { p->set_value(std::move(r)); });
  return f.get();
}

void StageFsCore::check_open(uint64_t id, int flags, const Caller& who, OpenDone done_, bool live_ok,
                             bool background) {
  ++counters_.opens;
  // Every copy handed out is pinned (not evicted) until its handle is released.
  auto pinned = std::make_shared<std::string>();
  OpenDone done = [this, pinned, done_ = std::move(done_)](Result<OpenFile> r) {
    if (r && !r->from_source && !pinned->empty()) {
      if (r->pinned.empty()) r->pinned = *pinned;  // set: another name's copy (hard links)
      copies_.pin(r->pinned);
    }
    done_(std::move(r));
  };
  if ((flags & O_ACCMODE) != O_RDONLY || (flags & (O_TRUNC | O_APPEND | O_CREAT)) != 0)
    return done(read_only("open for writing"));
  auto info = nodes_.info(id);
  if (!info) return done(info.error());
  const std::string rel = std::move(info->rel);
  *pinned = rel;
  auto src = check_source(rel, info->version, who);
  if (!src) return done(src.error());
  if (has_temp_component(rel)) return done(open_temp_name(rel, info->version));
  if (open_observer_ && !background) open_observer_(rel);
  // A copy verified in this mount: answer here. Anything slower goes to the completion pool.
  struct stat cst {};
  if (auto fd = copies_.open_trusted(rel, *src, cst)) {
    ++counters_.cache_hits;
    return done(OpenFile{std::move(fd.value()), true, false, {}, {}, {}});
  }
  Pending p{rel, *src, Ask{Want{who.uid, background}, false, live_ok, 0}, std::move(done)};
  post([this, p = std::move(p)]() mutable { ask_cache(std::move(p), false); });
}

Result<struct stat> StageFsCore::check_source(const std::string& rel, const stage::FileMeta& version,
                                              const Caller& who) {
  // One resolution of the path, as the caller, for the access check, the type and the version
  // below. A cache hit is checked the same way: access is the source's at every open.
  auto src_fd = open_as_caller(rel, O_PATH, R_OK, who);
  if (!src_fd) return src_fd.error();
  struct stat st {};
  if (::fstat(src_fd->get(), &st) != 0) return stage::sys_error(errno, "stat source", rel);
  if (!S_ISREG(st.st_mode)) return stage::stage_error(stage::Errc::unsupported, "open", rel);
  if (stage::meta_from_stat(st) != version) {
    // This id names an older version: ESTALE makes the kernel look the name up again.
    ++counters_.stale_opens;
    return stage::sys_error(ESTALE, "open (the source changed since it was looked up)", rel);
  }
  return st;
}

// A path named like a copy's temporary file is never copied into the cache: reads go to the
// source (has_temp_component says why).
Result<OpenFile> StageFsCore::open_temp_name(const std::string& rel, const stage::FileMeta& version) {
  struct stat now {};
  auto fd = open_regular_beneath(root_.get(), rel, now);
  if (!fd) return fd.error();
  if (!stage::same_version(stage::meta_from_stat(now), version, cfg_.source_version))
    return stage::sys_error(ESTALE, "open (the source changed since it was looked up)", rel);
  return OpenFile{std::move(fd.value()), false, true, {}, {}, {}};
}

void StageFsCore::ask_cache(Pending p, bool checked) {
  p.ask.since = mat_.epoch();  // before the look into the cache
  // The batch's own rule (batch_rules.h, beneath.h), so an open asks for a batch only if it
  // holds rel.
  p.ask.small =
      batch_eligible(p.src, std::string_view(p.rel).substr(p.rel.rfind('/') + 1), cfg_.small_file_size) &&
      !has_access_acl_beneath(root_.get(), p.rel);
  // A copy that its directory's batch is publishing on this node right now (a walk runs
  // batches ahead of the readers): the batch vouches for it when it ends; no CRC read-back.
  const NodeCopies::Open o{p.rel, p.src, p.ask.small, p.ask.small && mat_.batch_running(p.rel), checked};
  // When a read-back or another name's transfer this open waits for has ended: ask again.
  auto again = [this, p](stage::Status outcome, bool checked_now) mutable {
    post([this, p = std::move(p), outcome = std::move(outcome), checked_now]() mutable {
      if (!outcome && outcome.error().to_errno() == ESHUTDOWN) {
        ++counters_.open_errors;
        return p.done(outcome.error());
      }
      ask_cache(std::move(p), checked_now);
    });
  };
  auto a = copies_.ask(o, std::move(again));
  switch (a.kind) {
    case NodeCopies::Answer::check_first:
    case NodeCopies::Answer::other_name_running:
      return;
    case NodeCopies::Answer::stopping:
    case NodeCopies::Answer::failed:
      ++counters_.open_errors;
      return p.done(a.error);
    case NodeCopies::Answer::serve:
      ++counters_.cache_hits;
      return p.done(OpenFile{std::move(a.fd), true, false, a.other, {}, {}});
    case NodeCopies::Answer::miss:
      break;
  }
  if (a.makes_linked) make_linked_copy(p);
  ++counters_.materializations;
  materialize(std::move(p));
}

void StageFsCore::make_linked_copy(Pending& p) {
  p.ask.live_ok = false;  // the others wait for a whole copy
  p.done = [this, rel = p.rel, src = p.src, inner = std::move(p.done)](Result<OpenFile> r) mutable {
    auto waiters = copies_.made_linked(src, rel, r && !r->from_source && !r->live);
    inner(std::move(r));
    for (auto& w : waiters) w();  // each posts its open's next question
  };
}

void StageFsCore::materialize(Pending p) {
  const uint64_t space_epoch = copies_.space_epoch();  // before the transfer decides on room
  const std::string rel = p.rel;
  const Ask ask = p.ask;
  // Exactly one of `then` and `on_live` is called: it takes the open.
  auto shared = std::make_shared<Pending>(std::move(p));
  auto then = [this, shared, space_epoch](stage::Status outcome) {
    post([this, p = std::move(*shared), space_epoch, outcome = std::move(outcome)]() mutable {
      materialized(std::move(p), outcome, space_epoch);
    });
  };
  if (ask.small) return mat_.materialize_small_async(rel, ask.since, ask.want, std::move(then));
  if (!ask.live_ok) return mat_.materialize_async(rel, ask.want, std::move(then));
  auto on_live = [this, shared](std::shared_ptr<LiveCopy> live) {
    post([this, p = std::move(*shared), live = std::move(live)]() mutable {
      open_live(std::move(p), std::move(live));
    });
  };
  mat_.materialize_live_async(rel, ask.want, std::move(then), std::move(on_live));
}

void StageFsCore::materialized(Pending p, const stage::Status& outcome, uint64_t space_epoch) {
  if (!p.ask.small && !outcome.ok() && outcome.error().to_errno() == ENOSPC)
    return wait_for_room(std::move(p), space_epoch, outcome.error());
  if (p.ask.small) return batch_ended(std::move(p), outcome);
  p.done(open_materialized(p.rel, p.src, outcome));
}

void StageFsCore::batch_ended(Pending p, const stage::Status& outcome) {
  if (!outcome.ok() && (outcome.error().to_errno() == ESHUTDOWN || stalled(outcome.error().code)))
    return p.done(open_materialized(p.rel, p.src, outcome));
  if (outcome.ok()) {
    if (auto fd = copies_.open_made(p.rel, p.src, true))
      return p.done(OpenFile{std::move(fd.value()), false, false, {}, {}, {}});
    // The batch succeeded without a current copy of rel: the file changed since this open
    // looked at it (ESTALE: the kernel looks the name up again and opens the new version), or
    // it was not in the batch (grew, appeared after the listing, or the slice of its
    // directory that answered this open began with another file): alone.
    if (auto now = stat_rel(p.rel); now && stage::meta_from_stat(*now) != stage::meta_from_stat(p.src)) {
      ++counters_.stale_opens;
      ++counters_.open_errors;
      return p.done(
          stage::sys_error(ESTALE, "open (the source changed while its directory was staged)", p.rel));
    }
  }
  // The batch failed (twice): one bad file (a pseudo file, one that keeps changing) fails the
  // whole stream. This file alone then: it gets its own outcome, as before.
  p.ask.small = false;
  p.ask.since = 0;
  p.space_deadline = {};
  materialize(std::move(p));
}

void StageFsCore::wait_for_room(Pending p, uint64_t space_epoch, const stage::Error& why) {
  const std::string rel = p.rel;
  const struct stat src = p.src;
  const Clock::time_point deadline = p.space_deadline;
  // Room now: a new copy (its admission makes the room), still bound by the first deadline.
  auto answer = [this, p = std::move(p)](stage::Status fits, Clock::time_point first) mutable {
    if (!fits) {
      ++counters_.open_errors;
      return p.done(fits.error());
    }
    p.space_deadline = first;
    post([this, p = std::move(p)]() mutable { materialize(std::move(p)); });
  };
  copies_.await_room(rel, src, deadline, space_epoch, why, std::move(answer));
}

void StageFsCore::open_live(Pending p, std::shared_ptr<LiveCopy> live) {
  // The same version (the device number is this node's own on a network filesystem).
  if (!stage::same_version(live->source(), stage::meta_from_stat(p.src), cfg_.source_version)) {
    // The transfer copies a newer version than this open looked up.
    ++counters_.stale_opens;
    ++counters_.open_errors;
    return p.done(stage::sys_error(ESTALE, "open (the source changed while it was being staged)", p.rel));
  }
  ++counters_.opens_during_copy;
  OpenFile f;
  f.live = std::move(live);
  if (cfg_.on_stall == StallPolicy::source) {  // the version being copied, for a stall
    struct stat now {};
    auto fd = open_regular_beneath(root_.get(), p.rel, now);
    if (fd &&
        stage::same_version(stage::meta_from_stat(now), stage::meta_from_stat(p.src), cfg_.source_version))
      f.fd = std::move(fd.value());
  }
  p.done(std::move(f));
}

Result<OpenFile> StageFsCore::open_materialized(const std::string& rel, const struct stat& src,
                                                const stage::Status& done) {
  if (auto fd = copies_.open_made(rel, src, done.ok()))
    return OpenFile{std::move(fd.value()), false, false, {}, {}, {}};
  if (!done && stalled(done.error().code) && cfg_.on_stall == StallPolicy::source) {
    // Only the version this open was decided on (its access check and its node id).
    struct stat now {};
    auto fd = open_regular_beneath(root_.get(), rel, now);
    if (fd &&
        stage::same_version(stage::meta_from_stat(now), stage::meta_from_stat(src), cfg_.source_version)) {
      ++counters_.source_fallbacks;
      log_warn("{}: mount group stalled: reading {} from the shared source", stage::host_name(), rel);
      return OpenFile{std::move(fd.value()), false, true, {}, {}, {}};
    }
  }
  ++counters_.open_errors;
  if (!done) return done.error();
  return stage::stage_error(stage::Errc::checksum_mismatch, "no valid copy after materializing", rel);
}

void StageFsCore::read_live(const std::shared_ptr<LiveCopy>& live, int source_fd, uint64_t off, size_t size,
                            std::function<void(stage::Result<std::string>)> done) {
  // A range that is here is read on the caller's thread; one that waits is read on the
  // completion pool once its chunks are written (not on the engine's writer thread).
  auto finish = [this, live, source_fd, off, size](std::error_code ec) -> Result<std::string> {
    if (!ec) {
      auto r = live->read(off, size);
      if (r) return r;
      ec = r.error().code;  // the copy failed after the range was found here
    }
    if (!stalled(ec) || source_fd < 0) return stage::sys_error(EIO, "read of a copy that failed");
    // --on-stall source: the source, if it is still the version this handle opened.
    struct stat now {};
    if (::fstat(source_fd, &now) != 0 ||
        !stage::same_version(stage::meta_from_stat(now), live->source(), cfg_.source_version))
      return stage::sys_error(EIO, "read after a stall (the source changed too)");
    if (live->first_fallback()) {
      ++counters_.source_fallbacks;
      log_warn(
          "{}: mount group stalled: reading the rest of a file opened during its copy from the shared source",
          stage::host_name());
    }
    std::string buf(size, '\0');
    const ssize_t n = stage::pread_full(source_fd, buf.data(), size, off);
    if (n < 0) return stage::sys_error(static_cast<int>(-n), "read of the source after a stall");
    buf.resize(static_cast<size_t>(n));
    return buf;
  };
  auto shared = std::make_shared<std::function<void(stage::Result<std::string>)>>(std::move(done));
  auto now = live->await(off, size, [this, finish, shared](std::error_code ec) {
    post([finish, shared, ec] { (*shared)(finish(ec)); });
  });
  if (now) (*shared)(finish(*now));
}

void StageFsCore::copies_made(const std::vector<struct stat>& copies) {
  copies_.copies_made(copies);
}

void StageFsCore::release(const std::string& pinned) {
  if (!pinned.empty()) copies_.unpin(pinned);
}

}  // namespace stagefs
