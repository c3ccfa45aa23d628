// The broadcast engine: stage one file or one directory tree from the source rank onto every
// node's local store, with one read of the source.
//
//   1. Metadata   the source rank scans the source and broadcasts the manifest (or its error)
//                 with its own chunk size, which every rank then uses.
//   2. Decide     each writer compares its local copy with the manifest (size+mtime, CRC, or
//                 always) and creates directories and symlinks; an allreduce tells everyone
//                 which files any node needs. If none: done, nothing read or sent. With
//                 seeding on (StageOptions::seed_from_copies), a second allreduce picks a seed:
//                 the lowest rank whose copies of every needed file are current. The seed,
//                 not the source rank, then reads (its own copies) and roots the broadcast.
//   3. Prepare    writers check free space and create their temporary files; an allreduce of
//                 the status stops every rank before any data moves if one node cannot write.
//   4. Copy       a pipeline of a few chunk buffers: the source's reader thread reads chunk
//                 i+1 (computing its CRC) while the MPI thread broadcasts chunk i and each
//                 writer thread verifies and writes chunk i-1. Holes are sent as a flag. One
//                 chunk loop on the MPI thread moves the chunks through a strategy: on the
//                 chain or tree (the default) all chunks flow through one pipelined stream
//                 (ChunkStream), so the broadcasts overlap too; with mpi, one collective each.
//   5. Finish     fsync, optional post-validation (size, or re-read CRC), then an allreduce of
//                 [source failed, this node failed]. A node publishes (rename) only if the
//                 source stayed unchanged and its own copy verified; a final allreduce gives
//                 every rank the same overall outcome. With a seed, "source unchanged" means
//                 both: the seed's copies stayed the same copies (same_copy: device, inode,
//                 size, mtime) while it read them, and the source rank found the source's
//                 metadata unchanged after the stream (with --pre-validate checksum, the
//                 seed's file CRCs must also equal the source's, which every rank knows from
//                 pre-validation).
//   Fallback      a seed that fails to feed (its copy changed, a short or failed read, a chunk
//                 or file that does not read back to its recorded CRC) fails nothing: every
//                 rank learns it from the trailer, and the copy phase runs again into the same
//                 temporary files, fed by the next lowest seed that proves its copy, else the
//                 source rank (at most kMaxSeedAttempts seeds, then the source). Only a
//                 failure of the source itself fails the transfer.
//
// stage_transfer() is COLLECTIVE over `comm` and is called by one thread per rank (the thread
// that owns the Comm); it starts and joins its own reader/writer threads. A non-writer rank
// (a second rank on a node) relays broadcasts and writes nothing. Memory: pipeline_depth
// chunk buffers per rank, whatever the file size. Errors never abort: they come back in the
// report, identical in `ok` and `exit_code` on every rank.
#pragma once

#include "bcast/comm/comm.h"
#include "bcast/io/source.h"
#include "bcast/io/store.h"
#include "bcast/transfer/terms.h"

namespace stage {

StageReport stage_transfer(Comm& comm, SourceReader* source, LocalStore& store, const StageOptions& opt,
                           const StageEndpoint& ep, const ProgressFn& progress = {});

// The pre-validation decision for one regular file (pure; unit-tested).
bool needs_copy(const LocalState& local, const FileMeta& src, Validate mode, bool overwrite,
                uint64_t local_crc, uint64_t source_crc, SourceVersion rule = SourceVersion::full);

}  // namespace stage
