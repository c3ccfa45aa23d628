// The engine's inside (bcast/transfer/engine.h is its public face, terms.h its types): one transfer, as a
// class whose member functions live in one file per phase:
//   plan.cc         manifest, source CRCs, the per-file decision, the seed choice
//   prepare.cc      free space, temporary files, chunk buffers, the prepare agreement
//   copy.cc         the copy phase on the calling (MPI) thread: starts the reader and writer
//                   threads, runs the one chunk loop, shares the trailer
//   chunk_mover.cc  how the chunks travel under that loop: the pipelined stream, or the
//                   MPI collective per chunk (chunk_mover.h)
//   copy_reader.cc  the reader thread (the rank that feeds the stream)
//   copy_writer.cc  the writer thread (a rank that writes a copy)
//   refeed.cc       a failed feed: the copy phase again from another seed or the source
//   finish.cc       sync, post-validation, publication, the gathered errors
//   engine.cc       the phases in order, the outcome, stage_transfer()
// Internal: included by those files only.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "bcast/transfer/chunk_mover.h"
#include "bcast/transfer/layout.h"
#include "bcast/transfer/queue.h"
#include "bcast/transfer/terms.h"

namespace stage::engine {

using Clock = std::chrono::steady_clock;
inline double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}
inline double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}
// Adds the time from construction (or `from`) to destruction to `acc`.
class Accumulate {
 public:
  explicit Accumulate(double& acc, Clock::time_point from = Clock::now()) : acc_(acc), from_(from) {}
  Accumulate(const Accumulate&) = delete;
  Accumulate& operator=(const Accumulate&) = delete;
  ~Accumulate() { acc_ += since(from_); }

 private:
  double& acc_;
  Clock::time_point from_;
};

// The buffers' round: free -> (reader) full -> (MPI thread) write -> (writer) free; a rank
// that does not read receives into free buffers, one that does not write hands them back.
struct Queues {
  BlockingQueue<BufPtr> free_q, full_q, write_q;
};

// The chunk loop's own state (move_chunks, copy.cc), on the calling thread.
struct ChunkLoop {
  uint64_t nchunks = 0;
  bool write_here = false;
  size_t ahead = SIZE_MAX;  // the reader's chunks in the mover at once
  // submitted: buffers given to the mover (the reader: chunks; elsewhere: receive buffers,
  // one per chunk and one per nest mark, which a rank learns of as it comes out).
  uint64_t submitted = 0, completed = 0, done_bytes = 0, nests = 0;
  std::vector<char> seen;   // per chunk: its header came (chunks in any order: live copy)
  bool ended = false;       // the abort chunk came out of the mover
  bool abort_sent = false;  // the reader: its abort chunk is in the mover
  bool closed = false;      // a buffer queue closed under the loop: stop
  bool moved = false;       // this turn moved something
  Clock::time_point t_turn;
};

// The reader thread's input file: one open at a time.
struct Input {
  std::unique_ptr<SourceFile> file;
  size_t segment = SIZE_MAX;  // its layout segment
};

// What proves a node's copy of an entry to be the source's current version, so that it may
// feed other nodes (a seed): nothing (it may still count as present on its own node), its
// whole-file CRC (a recorded origin that matches the source now, or --pre-validate checksum),
// or also a ChunkRecord against which every chunk is proven before it is sent.
enum class Proof : uint8_t { none, whole, chunks };

// The seed's proof of its chunks while it reads (copy_reader.cc; the reader thread): the
// record's units, and per chunk the CRC a proving pass found (a unit larger than a chunk is
// read and proven whole before its first chunk is sent).
struct ChunkProof {
  ChunkRecord record;
  std::vector<char> unit_proven;
  std::vector<uint64_t> chunk_crc;
  std::unique_ptr<ChunkBuffer> scratch;  // the proving pass's reads
};

// Single-file transfers of at most this many chunks travel in the order readers want
// (StageOptions::live_copy): 4 Mi chunks, 64 TiB at the default 16 MiB, 16 GiB at the smallest.
inline constexpr uint64_t kMaxLiveCopyChunks = 1ULL << 22;

// " (HOST)" for rank r where the Comm knows where its ranks sit (its point-to-point seam's
// placement: the host name, or Slurm's topology address), else "": messages name nodes.
inline std::string host_of(Comm& comm, int r) {
  PointToPoint* p = comm.point_to_point();
  if (p == nullptr || r < 0 || static_cast<size_t>(r) >= p->placement().size() || p->placement()[r].empty())
    return "";
  return " (" + p->placement()[static_cast<size_t>(r)] + ")";
}

// Everything one transfer knows. Three threads touch it:
//   [call]    the calling thread (the one that owns the Comm: every phase, the chunk loop);
//   [reader]  the reader thread, on the rank that feeds the stream, during the copy phase;
//   [writer]  the writer thread, on a rank that writes, during the copy phase.
// A member marked [reader] or [writer] is written by that thread only while it runs and read
// by the calling thread only after the join; [call] members are set before the threads start
// and only read by them. The one member shared while the threads run is want_q_ (a mutex).
struct TransferState {
  TransferState(Comm& comm, SourceReader* src, LocalStore& store, const StageOptions& opt,
                const StageEndpoint& ep, const ProgressFn& progress)
      : comm_(comm),
        src_(src),
        store_(store),
        opt_(opt),
        ep_(ep),
        progress_(progress),
        data_root_(opt.root) {}

  Comm& comm_;
  SourceReader* src_;
  LocalStore& store_;
  const StageOptions& opt_;
  const StageEndpoint& ep_;
  const ProgressFn& progress_;

  // [call], except r_.pipe.read/read_wait [reader] and r_.pipe.verify/write/write_wait
  // [writer]: separate fields.
  StageReport r_;
  Manifest m_;                             // [call] from share_manifest() on
  std::vector<int64_t> need_local_;        // [call] per entry: this node writes it
  std::vector<int64_t> need_any_;          // [call] per entry: some node writes it (it is in the stream)
  std::vector<std::unique_ptr<Txn>> txn_;  // [call] made by prepare(); [writer] writes through them
  std::vector<uint64_t> file_crc_;         // [writer] per entry, accumulated
  std::vector<char> finished_;             // [writer] per entry (then [call] in finish())
  std::vector<uint64_t> source_file_crc_;  // [call] per layout segment, from the reader's trailer
  bool published_ = false;                 // [call] this node renamed a new copy into place
  std::optional<Error> local_err_;         // [call] this node's destination failed
  std::optional<Error> writer_err_;        // [writer]
  std::optional<Error> source_err_;        // [reader], then [call]: reading the input failed
  int root_errno_ = 0;                     // [call] the errno of the last failure a root shared
  std::vector<uint64_t> reader_file_crc_;  // [reader] per segment
  std::vector<BufPtr> buffers_;            // [call] allocated by prepare(), handed to the copy
  // Seeding (StageOptions::seed_from_copies): data_root_ reads; seeded_ (the same on every
  // rank) says it reads its own copies, not the source. [call]
  int data_root_;
  bool seeded_ = false;
  std::vector<uint64_t> src_crc_;      // [call] per entry: the source's CRC (--pre-validate checksum)
  std::vector<FileMeta> copy_seen_;    // [call] per entry: this node's copy as judged (same_copy's fields)
  std::vector<FileMeta> seed_before_;  // [reader] the seed's copies' identities when opened
  // Per entry: the CRC this node's copy recorded when it was written (its origin), when the
  // origin matches the source now, which a seed's bytes must read back to. [call]
  std::vector<std::optional<uint64_t>> copy_crc_;
  std::vector<Proof> proof_;           // [call] per entry: what proves this node's copy (seeding)
  std::optional<ChunkRecord> record_;  // [call] a single file: this node's copy's ChunkRecord, if it proves
  ChunkProof chunk_proof_;             // [reader] a seed proving its chunks against record_
  bool seed_proves_chunks_ = false;    // [call] the feeding seed proves every chunk (the same everywhere)
  int64_t inode_only_ = 0;             // [call] copies whose origin matches the source but for its inode
  // Fallback (refeed.cc): the feed failed on the seed's side (the same on every rank), the
  // ranks whose feeds failed in this transfer, and the seeds tried. [call]
  bool refeed_ = false;
  std::vector<char> excluded_;
  int seeds_tried_ = 0;
  bool live_started_ = false;  // [call] LiveCopyReaders::started() was called for this node's copy
  // Bytes read: from the source (the source rank: pre-validation CRCs [call], then [reader])
  // and from a seed's copies ([reader]); every rank's after the outcome.
  uint64_t read_source_ = 0;
  uint64_t read_seed_ = 0;
  // A live copy (StageOptions::live_copy, a single-file transfer): chunks go in the order
  // readers want them; the file CRCs are combined from per-chunk CRCs at the end.
  bool live_copy_ = false;                  // [call], set before the threads start
  std::mutex want_m_;                       // guards want_q_
  std::deque<uint64_t> want_q_;             // root: chunks to read next ([call] -> [reader])
  std::vector<uint64_t> want_scratch_;      // [call]
  std::vector<uint64_t> reader_chunk_crc_;  // [reader]
  std::vector<uint64_t> writer_chunk_crc_;  // [writer] (sized by [call] before it starts)
  uint64_t writer_chunks_ = 0;              // [writer] chunks written (live copy)
  Clock::time_point next_nest_poll_{};      // [call] poll_nest()'s rate limit
};

class Transfer : private TransferState {
 public:
  using TransferState::TransferState;
  StageReport run();  // engine.cc

 private:
  // The source rank: scans the source, shares the manifest and the outcomes.
  [[nodiscard]] bool is_root() const { return comm_.rank() == opt_.root; }
  // The rank that reads and roots the broadcast: the source rank, or a seed.
  [[nodiscard]] bool is_reader() const { return comm_.rank() == data_root_; }
  [[nodiscard]] std::string dest_of(size_t i) const { return join_path(ep_.dest, m_.entries[i].path); }
  void fail_local(Error e) {
    if (!local_err_) local_err_ = std::move(e);
  }
  StageReport report(bool ok, Clock::time_point t0);
  StageReport comm_broke(const Status& st, Clock::time_point t0);
  std::optional<StageReport> plan_and_prepare(Clock::time_point t0);
  Status share_outcome();

  // plan.cc
  Status share_root_status(std::optional<Error>& err, int root, int64_t* how = nullptr);
  Result<Manifest> scan_source();
  void count_entries();
  Status share_manifest();
  Status share_source_crcs(std::vector<uint64_t>& crcs);
  void judge_entry(size_t i, int& swept);
  Proof judge_proof(size_t i, const LocalState& ls, uint64_t local_crc);
  [[nodiscard]] bool single_file_of_chunks() const;
  Status decide();
  Status choose_seed();

  // prepare.cc
  void check_space();
  bool allocate_buffers();
  Status prepare();

  // copy.cc
  Status copy();
  void start_live(const Layout& layout, bool write_here);
  Status share_trailer(const Layout& layout);
  void check_copies(const Layout& layout, bool write_here);
  // The chunk loop (one, over a ChunkMover) and its steps.
  Status run_chunks(const Layout& layout, bool write_here, Queues& q);
  Status move_chunks(const Layout& layout, ChunkMover& mover, bool write_here, Queues& q);
  Status nest_turn(ChunkMover& mover, ChunkLoop& s);
  std::optional<BufPtr> next_buffer(ChunkMover& mover, Queues& q, ChunkLoop& s);
  Status feed(ChunkMover& mover, Queues& q, ChunkLoop& s);
  Status hand_on(MovedChunk& c, const Layout& layout, ChunkMover& mover, ChunkLoop& s, Queues& q);
  bool header_fits(const ChunkHeader& h, const Layout& layout) const;
  bool valid_header(const ChunkHeader& h, const Layout& layout, uint64_t seq, std::vector<char>& seen) const;
  // The Nest's poll, at most every 0.5 ms (the copy loop may turn far more often; the control
  // plane needs no finer latency).
  Status poll_nest();
  static ChunkHeader nest_header(uint32_t token) {
    return ChunkHeader{0, 0, 0, kChunkNest, static_cast<int32_t>(token)};
  }
  void push_want(uint64_t index) {
    const std::lock_guard lk(want_m_);
    want_q_.push_back(index);
  }
  // Calling thread: the wants of this rank's readers go to the reader (root) or up the
  // stream (elsewhere, when the mover carries them); the reader also takes its subtree's.
  void route_wants(const Layout& layout, ChunkMover& mover);

  // copy_reader.cc
  void reader_loop(const Layout& layout, BlockingQueue<BufPtr>& free_q, BlockingQueue<BufPtr>& full_q);
  bool check_empty_files(const Layout& layout);
  void read_chunk(const Layout& layout, Input& in, Buffer& buf, uint64_t i, bool last);
  std::optional<Error> read_piece(const Layout& layout, Input& in, const Piece& p, Buffer& buf,
                                  uint64_t& piece_crc, bool& any_data);
  // The reader: the next chunk to read (see LiveCopyReaders).
  uint64_t pick_chunk(std::vector<char>& sent, uint64_t& next, uint64_t& low);
  Result<std::unique_ptr<SourceFile>> open_input(size_t entry);
  std::optional<Error> check_input_end(SourceFile& f, size_t entry, uint64_t crc) const;
  static std::optional<Error> check_end(SourceFile& f, const FileMeta& expect, const std::string& path,
                                        bool seed_copy);
  std::optional<Error> recheck_source(const Layout& layout);
  std::optional<Error> prove_chunk(Input& in, const Segment& seg, uint64_t i, const Buffer& buf,
                                   uint64_t crc);
  std::optional<Error> prove_unit(Input& in, const Segment& seg, uint64_t u);
  [[nodiscard]] Error unproven(size_t entry, const std::string& what) const;

  // copy_writer.cc
  void writer_loop(const Layout& layout, BlockingQueue<BufPtr>& write_q, BlockingQueue<BufPtr>& free_q);
  void write_chunk(const Layout& layout, Buffer& buf, std::vector<uint64_t>& piece_crc,
                   Clock::time_point t_verify);
  void finish_file(Txn& t, size_t entry, const ChunkRecord* chunks = nullptr);

  // refeed.cc
  Status feed_again();
  void rejoin_as_writer();
  void reset_copy_state(bool rewind);

  // finish.cc
  void finish();
  std::vector<size_t> my_files() const;
  void finish_empty_files(const std::vector<size_t>& mine);
  std::unique_ptr<Publication> sync_copies(const std::vector<size_t>& mine);
  void post_validate(const std::vector<size_t>& mine);
  void publish(const std::vector<size_t>& mine);
  void collect_errors();
};

}  // namespace stage::engine
