// Prepare: before any data moves, every writer checks its free space and creates its
// temporary files, every rank allocates its chunk buffers, and an allreduce of the status
// stops every rank here if one cannot.
#include <algorithm>

#include "bcast/transfer/transfer.h"

namespace stage::engine {

namespace {

// What a copy will occupy: its size in 4 KiB blocks, or less for a sparse file, since holes
// stay holes (a sparse 4.5 GiB file with 1 MiB of data needs about 1 MiB). The source rank
// looked at every sparse file's data extents (scan_sparse_files): `allocated` is then what its
// data takes in 4 KiB blocks, rounded out, and its extent map, or more if the source says it
// allocates more. So a source that allocates less than its copy will take (one that
// compresses, or has smaller blocks) does not get less room than the copy needs. Holes stay
// holes within a chunk too (copy_writer.cc), so the estimate holds however the data is spread.
// A source filesystem that reports no blocks for a non-empty file (some FUSE and object-store
// mounts) gets the size. The inode and the origin record are the store's to count (the
// mount's cache does: its copy overhead).
uint64_t expected_disk_bytes(const Entry& e) {
  if (e.type != EntryType::file) return 0;
  constexpr uint64_t kBlock = 4096;
  const uint64_t whole = (e.meta.size + kBlock - 1) / kBlock * kBlock;
  return e.allocated == 0 ? whole : std::min(whole, e.allocated);
}

}  // namespace

void Transfer::check_space() {
  uint64_t want = 0;
  for (size_t i = 0; i < m_.entries.size(); ++i)
    if (need_local_[i] != 0) want += expected_disk_bytes(m_.entries[i]);
  if (want == 0) return;
  auto free_bytes = store_.free_bytes(m_.tree ? join_path(ep_.dest, "x") : ep_.dest);
  if (!free_bytes) {
    fail_local(free_bytes.error());
  } else if (*free_bytes < want) {
    Error e = sys_error(ENOSPC, "not enough free space for", ep_.dest);
    e.message += " (need " + std::to_string(want) + " bytes, " + std::to_string(*free_bytes) + " free)";
    fail_local(e);
  }
}

// Every rank relays, so every rank needs the chunk buffers: allocated before the agreement,
// so a rank short of memory stops the job here rather than stalling it mid-stream. False: it
// could not (a local failure, which the agreement then sees).
bool Transfer::allocate_buffers() {
  uint64_t stream = 0;
  for (size_t i = 0; i < m_.entries.size(); ++i)
    if (need_any_[i] != 0 && m_.entries[i].type == EntryType::file) stream += streamed_bytes(m_.entries[i]);
  const uint64_t bufsize = std::min<uint64_t>(m_.chunk_size, std::max<uint64_t>(stream, 1));
  // A stream of one chunk (a batch of small files, a small file) needs one buffer, not
  // pipeline_depth buffers of its whole size (each one freshly mapped and zeroed).
  const int nbufs = chunk_count(stream, m_.chunk_size) <= 1 ? 1 : std::max(2, opt_.pipeline_depth);
  for (int k = 0; k < nbufs && stream > 0; ++k) {
    auto b = std::make_unique<Buffer>();
    b->mem = ChunkBuffer::make(bufsize);
    if (!b->mem) {
      fail_local(sys_error(ENOMEM, "allocate a chunk buffer of " + std::to_string(bufsize) + " bytes"));
      return false;
    }
    buffers_.push_back(std::move(b));
  }
  return true;
}

Status Transfer::prepare() {
  const size_t n = m_.entries.size();
  txn_.resize(n);
  file_crc_.assign(n, 0);
  finished_.assign(n, 0);
  if (ep_.writer && !local_err_) {
    check_space();
    for (size_t i = 0; i < n && !local_err_; ++i) {
      if (need_local_[i] == 0) continue;
      auto t = store_.begin(dest_of(i));
      if (!t)
        fail_local(t.error());
      else
        txn_[i] = std::move(t.value());
    }
  }
  if (!local_err_) allocate_buffers();
  auto any = allreduce_max(comm_, local_err_ ? 1 : 0);
  if (!any) return any.error();
  if (*any != 0) return Error{make_error_code(Errc::peer_failed), "a node could not prepare its destination"};
  return {};
}

}  // namespace stage::engine
