// NodeCopies (copies.h): the cache room's answers to an open, and its admission for the group.
#include "fusefs/cache/copies.h"

#include <cerrno>

#include "bcast/io/store.h"
#include "fusefs/base/batch_rules.h"
#include "fusefs/base/log.h"
#include "fusefs/cache/cache.h"

namespace stagefs {

namespace {
std::string_view name_of(const std::string& rel) {
  return std::string_view(rel).substr(rel.rfind('/') + 1);
}
}  // namespace

NodeCopies::NodeCopies(NodeCache& cache, Config cfg, CopyReader& reader)
    : cache_(cache),
      cfg_(cfg),
      checker_(cache_, CopyChecker::Config{cfg_.verify_cache, cfg_.verify_threads}, counters_, reader),
      room_waits_(cache_, cfg_.space_wait, counters_.room_waits) {}

NodeCopies::~NodeCopies() {
  stop();
}

void NodeCopies::stop() {
  checker_.stop();
  room_waits_.stop();
}

NodeCopies::Answer NodeCopies::ask(const Open& o, Again again) {
  if (!o.publishing)
    if (auto own = own_copy(o, again)) return std::move(*own);
  if (auto alive = cache_.alive(); !alive) {
    log_error("{}", alive.error().message);
    Answer a;
    a.kind = Answer::failed;
    a.error = alive.error();
    return a;
  }
  // Batches copy every name of a small file as their own: only larger files are shared.
  if (o.src.st_nlink > 1 && !o.small) return linked_copy(o, again);
  return Answer{};
}

std::optional<NodeCopies::Answer> NodeCopies::own_copy(const Open& o, const Again& again) {
  // Serve the copy, wait for its CRC read-back (a copy from an earlier mount; the open asks
  // again when that read ended, its own or another open's of the same copy), or miss.
  auto c = checker_.ask(o.rel, o.src, o.checked,
                        [again](stage::Status outcome) { again(std::move(outcome), true); });
  Answer a;
  switch (c.kind) {
    case CopyChecker::Answer::verify:
      a.kind = Answer::check_first;
      return a;
    case CopyChecker::Answer::stopping:
      a.kind = Answer::stopping;
      a.error = stage::sys_error(ESHUTDOWN, "open (the mount is stopping)", o.rel);
      return a;
    case CopyChecker::Answer::serve:
      cache_.touch(o.rel, c.fd.get());
      note_linked_copy(o.rel, o.src);
      a.kind = Answer::serve;
      a.fd = std::move(c.fd);
      return a;
    case CopyChecker::Answer::miss:
      break;
  }
  return std::nullopt;
}

NodeCopies::Answer NodeCopies::linked_copy(const Open& o, const Again& again) {
  const LinkedCopies::Key key = LinkedCopies::key_of(o.src);
  auto wait_for_other = [&] { return std::function<void()>([again] { again({}, false); }); };
  Answer a;
  for (;;) {
    const auto l = links_.ask(key, o.rel, wait_for_other);
    if (l.kind == LinkedCopies::Answer::waiting) {
      a.kind = Answer::other_name_running;
      return a;
    }
    if (l.kind == LinkedCopies::Answer::same_name) return a;  // the materializer merges the two
    if (l.kind == LinkedCopies::Answer::materialize) break;
    // That name's copy, if it is still the same version (its path may name another file now)
    // and was checked in this mount.
    if (auto fd = checker_.open_verified(l.other, o.src, false, /*may_read_back=*/false)) {
      cache_.touch(l.other, fd->get());
      a.kind = Answer::serve;
      a.fd = std::move(fd.value());
      a.other = l.other;
      return a;
    }
    links_.forget(key, l.other);
  }
  a.makes_linked = true;  // the others wait for a whole copy
  return a;
}

std::vector<std::function<void()>> NodeCopies::made_linked(const struct stat& src, const std::string& rel,
                                                           bool made) {
  return links_.materialized(LinkedCopies::key_of(src), rel, made);
}

void NodeCopies::note_linked_copy(const std::string& rel, const struct stat& src) {
  if (src.st_nlink > 1 && !batch_eligible(src, name_of(rel), cfg_.small_file_size))
    links_.served(LinkedCopies::key_of(src), rel);
}

stage::Result<stage::Fd> NodeCopies::open_trusted(const std::string& rel, const struct stat& src,
                                                  struct stat& copy_st) {
  auto fd = checker_.open_trusted(rel, src, copy_st);
  if (!fd) return fd;
  cache_.touch(rel, fd->get(), &copy_st);
  note_linked_copy(rel, src);
  return fd;
}

stage::Result<stage::Fd> NodeCopies::open_made(const std::string& rel, const struct stat& src,
                                               bool just_made) {
  return checker_.open_verified(rel, src, just_made);
}

uint64_t NodeCopies::space_epoch() const {
  return cache_.space_epoch();
}

void NodeCopies::await_room(const std::string& rel, const struct stat& src, Clock::time_point deadline,
                            uint64_t space_epoch, const stage::Error& why, RoomWaits::Answer answer) {
  // The bytes a copy of the source takes in the cache (NodeCache's accounting).
  const uint64_t need = stage::allocated_from_stat(src) + cache_.copy_overhead();
  room_waits_.await(rel, need, deadline, space_epoch, why, std::move(answer));
}

void NodeCopies::pin(const std::string& rel) {
  cache_.pin(rel);
}

void NodeCopies::unpin(const std::string& rel) {
  cache_.unpin(rel);
}

void NodeCopies::copies_made(const std::vector<struct stat>& copies) {
  checker_.copies_made(copies);
}

stage::Status NodeCopies::before_transfer(const std::string& rel, bool may_evict) {
  return cache_.admit_transfer(cfg_.source_root, rel, may_evict);
}

void NodeCopies::after_transfer(const std::string& rel, bool /*ok*/) {
  cache_.transfer_done(rel);
}

void NodeCopies::before_batch(const std::string& dir, const stage::SelectionSlice& slice, bool may_evict) {
  cache_.admit_batch(cfg_.source_root, dir, cfg_.small_file_size, slice, may_evict);
}

void NodeCopies::after_batch(const std::string& dir, const std::vector<std::string>& published, bool /*ok*/) {
  checker_.copies_made(cache_.batch_done(dir, published));
}

}  // namespace stagefs
