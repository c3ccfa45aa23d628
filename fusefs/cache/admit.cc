// NodeCache's admission: the room a transfer or a batch needs, made on every node before it
// starts, and the index updated after it (cache.h, "admission"). The group calls these from
// its service thread through NodeCopies (cache/copies.h, its Admission), one transfer at a time; they take
// the index lock (NodeCache::m_) only inside the calls they make (make_room, keep_current...), never across a
// look at the source.
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include "bcast/io/source.h"
#include "fusefs/base/beneath.h"
#include "fusefs/base/log.h"
#include "fusefs/cache/cache.h"

namespace stagefs {

// An outdated copy goes first (its space counts as free), then least recently used copies
// until the new one fits (make_room). No room under the limit (copies held open, or a copy
// larger than the whole limit): the error makes this node relay the transfer without writing
// (Admission::before_transfer), so one node's full cache does not fail the copy on the
// others; a filesystem without room is left to the engine's collective free-space check.
stage::Status NodeCache::admit_transfer(int source_root, const std::string& rel, bool may_evict) {
  auto fd = open_beneath(source_root, rel, O_PATH);
  struct stat st {};
  if (!fd || ::fstat(fd->get(), &st) != 0) return {};
  if (remove_stale(rel, st)) spdlog::debug("removed the outdated cached copy of {}", rel);
  set_pending_overhead(copy_overhead());
  auto room = make_room(rel, stage::allocated_from_stat(st) + copy_overhead(), may_evict);
  if (!room) {
    if (may_evict)
      log_warn("{}", room.error().message);
    else
      log_info("{}", room.error().message);
  }
  return room;
}

// The same for the files of one slice of a batch (what the engine's scan takes: a slice of a
// huge directory does not look at every name), with one make_room for the batch.
void NodeCache::admit_batch(int source_root, const std::string& dir, uint64_t max_size,
                            const stage::SelectionSlice& slice, bool may_evict) {
  auto dfd = open_beneath(source_root, dir, O_RDONLY | O_DIRECTORY);
  if (!dfd) return;
  uint64_t need = 0, files = 0;
  const bool cached_dir = has_dir(dir);  // if not, no copy to look for (a first batch)
  (void)for_each_small_file(dfd->get(), dir, max_size, slice,
                            [&](const std::string& name, const struct stat& st) {
                              if (!cached_dir || !keep_current(stage::join_path(dir, name), st)) {
                                need += stage::allocated_from_stat(st) + copy_overhead();
                                ++files;
                              }
                            });
  set_pending_overhead(files * copy_overhead());
  // A prefetch (no open asked for it) does not evict: the engine's free-space check refuses
  // it on every node when it does not fit in what the limit and the filesystem leave.
  if (need == 0 || !may_evict) return;
  if (auto room = make_room(dir.empty() ? "/" : dir, need); !room)
    log_error("{}", room.error().message);  // the engine's free-space check then refuses it
}

void NodeCache::transfer_done(const std::string& rel) {
  set_pending_overhead(0);
  added(rel);
}

std::vector<struct stat> NodeCache::batch_done(const std::string& dir,
                                               const std::vector<std::string>& published) {
  set_pending_overhead(0);
  return added_in(dir, published);
}

}  // namespace stagefs
