#include "bcast/engine.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "bcast/buffer.h"
#include "bcast/crc.h"
#include "bcast/queue.h"
#include "bcast/stream.h"

namespace stage {

bool needs_copy(const LocalState& local, const FileMeta& src, Validate mode, bool overwrite,
                uint64_t local_crc, uint64_t source_crc) {
  if (overwrite || mode == Validate::none) return true;
  if (!local.exists || !local.regular || local.size != src.size) return true;
  if (mode == Validate::checksum) return local_crc != source_crc;
  if (mode == Validate::origin) {
    return !local.origin || !origin_matches(*local.origin, local.mtime_ns, src);
  }
  return local.mtime_ns != src.mtime_ns;  // size: same size and same mtime as the source
}

namespace {

// Single-file transfers of at most this many chunks travel in the order readers want
// (StageOptions::live): 4 Mi chunks, 64 TiB at the default 16 MiB, 16 GiB at the smallest.
constexpr uint64_t kMaxAdaptiveChunks = 1ULL << 22;
// With a Nest: the source rank's chunks in the stream at once (see stream_chunks). 2 keeps
// the source's link busy across chunk boundaries (the next chunk is queued behind the one
// leaving) and bounds what a nest mark waits for to two chunks: a nested batch waits about
// as many chunk times as there are chunks ahead of its mark, while the large copy's own time
// does not depend on it (bench/results/bench_hol.md). 1 would leave the source's link idle
// for a loop turn at every chunk boundary, which costs little on a slow link but more where
// a chunk takes a millisecond.
constexpr size_t kNestAheadChunks = 2;

// What a copy will occupy: the source's allocation, since holes stay holes (a sparse 4.5 GiB
// file with 1 MiB of data needs about 1 MiB), at most its size. A source filesystem that
// reports no blocks for a non-empty file (some FUSE and object-store mounts) gets the size.
// Holes stay holes within a chunk too (write_sparse), so the estimate holds however the data
// is spread. It can still fall short for a source on a compressing filesystem (allocation
// below the data's size); if the disk fills, the copy fails with ENOSPC and nothing is
// published.
uint64_t expected_disk_bytes(const Entry& e) {
  if (e.type != EntryType::file) return 0;
  return e.allocated == 0 ? e.meta.size : std::min(e.meta.size, e.allocated);
}

bool is_sparse(const Entry& e) {
  return e.type == EntryType::file && e.allocated != 0 && e.allocated < e.meta.size;
}

// Writes data at off, leaving each all-zero 4 KiB block (aligned in the file) a hole. For a
// sparse source's chunks that hold data: without it, a file with one 4 KiB block of data in
// every 16 MiB chunk (1 TiB with 256 MiB allocated, a user's file in the source) would write
// its whole size on every node, far past its reservation and --cache-size.
Status write_sparse(Txn& t, uint64_t off, std::span<const std::byte> data) {
  constexpr uint64_t kBlock = 4096;
  static const std::array<std::byte, kBlock> kZeros{};
  size_t run = 0;
  bool in_run = false;
  for (size_t i = 0; i < data.size();) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(data.size() - i, kBlock - (off + i) % kBlock));
    const bool zero = std::memcmp(data.data() + i, kZeros.data(), n) == 0;
    if (!zero && !in_run) {
      run = i;
      in_run = true;
    } else if (zero && in_run) {
      if (auto st = t.write(off + run, data.subspan(run, i - run)); !st) return st;
      in_run = false;
    }
    i += n;
  }
  if (in_run) return t.write(off + run, data.subspan(run));
  return {};
}

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}
double seconds_between(Clock::time_point a, Clock::time_point b) {
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

// A chunk buffer and the header that describes what it holds now.
struct Buffer {
  ChunkHeader hdr;
  std::unique_ptr<ChunkBuffer> mem;
};
using BufPtr = std::unique_ptr<Buffer>;

class Transfer {
 public:
  Transfer(Comm& comm, SourceReader* src, LocalStore& store, const StageOptions& opt, const StageEndpoint& ep,
           const ProgressFn& progress)
      : comm_(comm), src_(src), store_(store), opt_(opt), ep_(ep), progress_(progress), data_root_(opt.root) {}

  StageReport run();

 private:
  // The source rank: scans the source, shares the manifest and the outcomes.
  [[nodiscard]] bool is_root() const { return comm_.rank() == opt_.root; }
  // The rank that reads and roots the broadcast: the source rank, or a seed.
  [[nodiscard]] bool is_reader() const { return comm_.rank() == data_root_; }
  [[nodiscard]] std::string dest_of(size_t i) const { return join_path(ep_.dest, m_.entries[i].path); }
  void fail_local(Error e) {
    if (!local_err_) local_err_ = std::move(e);
  }

  Status share_manifest();
  Status share_source_crcs(std::vector<uint64_t>& crcs);
  Status decide();
  Status prepare();
  Status copy();
  void finish();
  struct Queues {
    BlockingQueue<BufPtr> free_q, full_q, write_q;
  };
  Status broadcast_chunks(const Layout& layout, bool write_here, Queues& q);
  bool valid_header(const ChunkHeader& h, const Layout& layout, uint64_t seq, std::vector<char>& seen) const;
  // The Nest's poll, at most every 0.5 ms (the copy loop may turn far more often; the control
  // plane needs no finer latency).
  Status poll_nest();
  static ChunkHeader nest_header(uint32_t token) { return ChunkHeader{0, 0, 0, kChunkNest, static_cast<int32_t>(token)}; }
  Status stream_chunks(const Layout& layout, BcastAlgorithm shape, bool write_here, Queues& q);
  void reader_loop(const Layout& layout, BlockingQueue<BufPtr>& free_q, BlockingQueue<BufPtr>& full_q);
  void writer_loop(const Layout& layout, BlockingQueue<BufPtr>& write_q, BlockingQueue<BufPtr>& free_q);
  Status share_root_status(std::optional<Error>& err, int root);
  Status choose_seed();
  Result<std::unique_ptr<SourceFile>> open_input(size_t entry);
  std::optional<Error> check_input_end(SourceFile& f, size_t entry, uint64_t crc) const;
  static std::optional<Error> check_end(SourceFile& f, const FileMeta& expect, const std::string& path,
                                        const char* what);
  std::optional<Error> recheck_source(const Layout& layout);
  void collect_errors();

  Comm& comm_;
  SourceReader* src_;
  LocalStore& store_;
  const StageOptions& opt_;
  const StageEndpoint& ep_;
  const ProgressFn& progress_;

  // Written by the calling thread, except r_.pipe.read/read_wait (reader thread) and
  // r_.pipe.verify/write/write_wait (writer thread): separate fields, read after the joins.
  StageReport r_;
  Manifest m_;
  std::vector<int64_t> need_local_;  // per entry: this node writes it
  std::vector<int64_t> need_any_;    // per entry: some node writes it (it is in the stream)
  std::vector<std::unique_ptr<Txn>> txn_;
  std::vector<uint64_t> file_crc_;         // per entry, accumulated by the writer thread
  std::vector<char> finished_;             // per entry, set by the writer thread
  std::vector<uint64_t> source_file_crc_;  // per layout segment, from the root's trailer
  bool published_ = false;                 // this node renamed a new copy into place
  std::optional<Error> local_err_;         // this node's destination failed
  std::optional<Error> writer_err_;        // written by the writer thread only, read after join
  std::optional<Error> source_err_;        // root: reading the source failed (reader thread, then main)
  std::vector<uint64_t> reader_file_crc_;  // root, per segment, reader thread
  std::vector<BufPtr> buffers_;            // allocated by prepare(), used by copy()
  // Seeding (StageOptions::seed_from_copies): data_root_ reads; seeded_ (the same on every
  // rank) says it reads its own copies, not the source.
  int data_root_;
  bool seeded_ = false;
  std::vector<uint64_t> src_crc_;     // per entry: the source's CRC (--pre-validate checksum)
  std::vector<int64_t> copy_mtime_;   // per entry: this node's copy's mtime when judged current
  std::vector<FileMeta> seed_before_;  // seed, reader thread: each copy's identity when opened
  // Per entry, --pre-validate origin: the CRC this node's copy recorded when it was written
  // (its origin), which a seed's bytes must read back to.
  std::vector<std::optional<uint64_t>> copy_crc_;
  // Bytes read: from the source (the source rank: pre-validation CRCs, then the reader
  // thread) and from a seed's copies (its reader thread); every rank's after the outcome.
  uint64_t read_source_ = 0;
  uint64_t read_seed_ = 0;
  // Reads before the copy ends (StageOptions::live, a single-file transfer): chunks go in
  // the order readers want them; the file CRCs are combined from per-chunk CRCs at the end.
  bool adaptive_ = false;
  std::mutex want_m_;
  std::deque<uint64_t> want_q_;            // root: chunks to read next (MPI thread -> reader)
  std::vector<uint64_t> want_scratch_;     // calling thread
  std::vector<uint64_t> reader_chunk_crc_;  // root, reader thread
  std::vector<uint64_t> writer_chunk_crc_;  // writer thread
  uint64_t writer_chunks_ = 0;              // writer thread: chunks written (adaptive)
  Clock::time_point next_nest_poll_{};      // calling thread: poll_nest()'s rate limit
  void push_want(uint64_t index) {
    const std::lock_guard lk(want_m_);
    want_q_.push_back(index);
  }
  // Calling thread: the wants of this rank's readers go to the reader (root) or up the
  // stream (elsewhere, when there is one); the root also takes its subtree's.
  void route_wants(ChunkStream* stream);
  // Root's reader: the next chunk to read (see LiveCopy).
  uint64_t pick_chunk(std::vector<char>& sent, uint64_t& next, uint64_t& low);
};

Status Transfer::poll_nest() {
  const auto now = Clock::now();
  if (now < next_nest_poll_) return {};
  next_nest_poll_ = now + std::chrono::microseconds(500);
  return opt_.nest->poll();
}

void Transfer::route_wants(ChunkStream* stream) {
  if (!adaptive_) return;
  want_scratch_.clear();
  if (opt_.live != nullptr) opt_.live->take_wanted(want_scratch_);
  for (uint64_t w : want_scratch_) {
    if (is_reader())
      push_want(w);
    else if (stream != nullptr)
      stream->want(w);
  }
  if (stream != nullptr && is_reader())
    while (auto w = stream->take_want()) push_want(*w);
}

uint64_t Transfer::pick_chunk(std::vector<char>& sent, uint64_t& next, uint64_t& low) {
  const uint64_t n = sent.size();
  {
    const std::lock_guard lk(want_m_);
    while (!want_q_.empty()) {
      const uint64_t w = want_q_.front();
      want_q_.pop_front();
      if (w < n && sent[w] == 0) {
        next = w + 1;
        return w;
      }
    }
  }
  if (next < n && sent[next] == 0) return next++;
  while (low < n && sent[low] != 0) ++low;
  next = low + 1;
  return low;
}

// `root` broadcasts "did I fail?" and its message; every rank returns the same error.
Status Transfer::share_root_status(std::optional<Error>& err, int root) {
  const bool me = comm_.rank() == root;
  int64_t failed = me && err ? 1 : 0;
  if (auto st = comm_.bcast(std::as_writable_bytes(std::span(&failed, 1)), root); !st) return st;
  if (failed == 0) return {};
  std::string msg = me ? err->message : std::string();
  if (auto st = bcast_string(comm_, msg, root); !st) return st;
  if (!me) err = Error{make_error_code(Errc::peer_failed), msg};
  return {};
}

// After a file's last byte: is it still the file it was (size, mtime, ctime, inode), and does
// it really end there? A read past its recorded size that returns data means the copy would
// be truncated: a pseudo file whose stat size is not its content, or a file that grew without
// its mtime telling (yet). Either way nothing is published.
std::optional<Error> Transfer::check_end(SourceFile& f, const FileMeta& expect, const std::string& path,
                                         const char* what) {
  auto now = f.stat_now();
  if (!now) return now.error();
  if (*now != expect) return stage_error(Errc::source_changed, what, path);
  auto more = f.data_past(expect.size);
  if (!more) return more.error();
  if (!*more) return std::nullopt;
  Error err = stage_error(Errc::source_changed, what, path);
  err.message += " (it is longer than its size of " + std::to_string(expect.size) +
                 " bytes: it grew, or it is a pseudo file whose size does not describe its content)";
  return err;
}

// The reader's end check: the source against the scan, or a seed's copy against its identity
// when the seed opened it and (the origin rule) its bytes, whose CRC is `crc`, against the CRC
// the copy recorded when it was written. A copy that reads back otherwise was corrupted on
// this node's disk: every chunk's CRC is the seed's own, so only this check catches it; the
// store may then drop it (bad_copy), so that it is not chosen again.
std::optional<Error> Transfer::check_input_end(SourceFile& f, size_t entry, uint64_t crc) const {
  const Entry& e = m_.entries[entry];
  if (!seeded_) return check_end(f, e.meta, join_path(ep_.source, e.path), "source");
  const std::string path = dest_of(entry);
  if (auto err = check_end(f, seed_before_[entry], path, "seed copy")) return err;
  if (!copy_crc_[entry] || *copy_crc_[entry] == crc) return std::nullopt;
  store_.bad_copy(path, seed_before_[entry]);
  return Error{make_error_code(Errc::checksum_mismatch),
               "seed copy " + path + " does not match the checksum it recorded when it was written"};
}

// The reader's file: from the source, or (a seed) this node's copy, which must still be the
// copy decide() judged current. It is too late to choose another seed (every node waits for
// this stream): a copy replaced since fails the transfer.
Result<std::unique_ptr<SourceFile>> Transfer::open_input(size_t entry) {
  const Entry& e = m_.entries[entry];
  if (!seeded_) return src_->open(ep_.source, e);
  const std::string path = dest_of(entry);
  auto f = store_.open_copy(path);
  if (!f) return f.error();
  auto now = (*f)->stat_now();
  if (!now) return now.error();
  if (now->size != e.meta.size || now->mtime_ns != copy_mtime_[entry])
    return stage_error(Errc::source_changed, "seed copy", path);
  seed_before_[entry] = *now;
  return f;
}

// A seeded transfer, after the stream, on the source rank: is the source still the version
// the manifest describes (the check the source rank's reader makes after each file's last
// byte)? Opens each streamed file; reads no data.
std::optional<Error> Transfer::recheck_source(const Layout& layout) {
  for (const Segment& seg : layout.segments()) {
    const Entry& e = m_.entries[seg.entry];
    auto f = src_->open(ep_.source, e);
    if (!f) return f.error();
    if (auto err = check_end(**f, e.meta, join_path(ep_.source, e.path), "source")) return err;
  }
  return std::nullopt;
}

Status Transfer::share_manifest() {
  std::optional<Error> err;
  std::string bytes;
  if (is_root()) {
    auto skip = [&](const std::string& path, const std::string& why) {
      r_.skipped.push_back(path + ": " + why);
      spdlog::warn("{}: skipping {}: {}", host_name(), path, why);
    };
    Result<Manifest> scanned = stage_error(Errc::unsupported, "no source reader");
    if (src_ != nullptr && opt_.small_files_max > 0) {
      auto batch = src_->scan_small_files(ep_.source, opt_.small_files_max, opt_.slice);
      if (batch) {
        r_.batch_next = std::move(batch->next);
        scanned = std::move(batch->manifest);
      } else {
        scanned = batch.error();
      }
    } else if (src_ != nullptr) {
      scanned = src_->scan(ep_.source, opt_.recursive, skip);
    }
    if (scanned) {
      scanned->chunk_size = opt_.chunk_size;  // every rank follows the source rank's
      bytes = encode(*scanned);
    }
    else
      err = scanned.error();
  }
  if (auto st = share_root_status(err, opt_.root); !st) return st;
  if (err) return *err;
  if (auto st = bcast_string(comm_, bytes, opt_.root); !st) return st;
  auto decoded = decode(std::as_bytes(std::span(bytes.data(), bytes.size())));
  if (!decoded) return decoded.error();
  m_ = std::move(decoded.value());
  for (const Entry& e : m_.entries) {
    if (e.type == EntryType::file) {
      ++r_.files;
      r_.bytes_total += e.meta.size;
    } else if (e.type == EntryType::dir) {
      ++r_.dirs;
    } else {
      ++r_.symlinks;
    }
  }
  return {};
}

// --pre-validate checksum: the root reads every source file once and broadcasts the CRCs.
Status Transfer::share_source_crcs(std::vector<uint64_t>& crcs) {
  crcs.assign(m_.entries.size(), 0);
  std::optional<Error> err;
  if (is_root()) {
    std::vector<std::byte> buf(4 * kMiB);
    for (size_t i = 0; i < m_.entries.size() && !err; ++i) {
      const Entry& e = m_.entries[i];
      if (e.type != EntryType::file) continue;
      auto f = src_->open(ep_.source, e);
      if (!f) {
        err = f.error();
        break;
      }
      uint64_t crc = 0;
      for (uint64_t off = 0; off < e.meta.size;) {
        const size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), e.meta.size - off));
        if (auto st = (*f)->read_at(off, std::span(buf.data(), n)); !st) {
          err = st.error();
          break;
        }
        crc = crc64(std::span(buf.data(), n), crc);
        read_source_ += n;
        off += n;
      }
      crcs[i] = crc;
    }
  }
  if (auto st = share_root_status(err, opt_.root); !st) return st;
  if (err) return *err;
  return comm_.bcast(std::as_writable_bytes(std::span(crcs)), opt_.root);
}

Status Transfer::decide() {
  const size_t n = m_.entries.size();
  std::vector<uint64_t>& src_crc = src_crc_;
  if (opt_.pre == Validate::checksum && !opt_.overwrite) {
    if (auto st = share_source_crcs(src_crc); !st) return st;
  }
  need_local_.assign(n, 0);
  copy_mtime_.assign(n, 0);
  copy_crc_.assign(n, std::nullopt);
  if (ep_.writer) {
    if (auto st = store_.make_parents(ep_.dest); !st) fail_local(st.error());
    // Temporary files of killed runs go first, whether or not this node copies anything now.
    int swept = m_.tree ? 0 : store_.remove_stale_temps(parent_dir(ep_.dest));
    for (size_t i = 0; i < n && !local_err_; ++i) {
      const Entry& e = m_.entries[i];
      const std::string path = dest_of(i);
      if (e.type == EntryType::dir) {
        // A batch's directory is a cache directory: created like the parents of a single
        // file (StoreOptions::parent_mode), not with the source directory's mode.
        const bool batch_dir = opt_.small_files_max > 0 && e.path.empty();
        if (auto st = batch_dir ? store_.make_parents(join_path(path, "x")) : store_.make_dir(path, e.meta.mode); !st)
          fail_local(st.error());
        swept += store_.remove_stale_temps(path);
        continue;
      }
      auto ls = store_.inspect(path);
      if (!ls) {
        fail_local(ls.error());
        continue;
      }
      if (ls->special != nullptr) {  // a rename would replace /dev/null, a FIFO, a socket
        fail_local(sys_error(
            EEXIST,
            std::string("destination is a ") + ls->special + ", not a regular file: refusing to replace",
            path));
        continue;
      }
      if (e.type == EntryType::symlink) {
        if (ls->link_target != e.link_target || opt_.overwrite) {
          if (auto st = store_.make_symlink(path, e.link_target); !st) fail_local(st.error());
        }
        continue;
      }
      if (ls->is_dir) {
        fail_local(sys_error(EISDIR, "destination (give the full path of the file)", path));
        continue;
      }
      uint64_t local_crc = 0;
      if (!src_crc.empty() && ls->regular && ls->size == e.meta.size) {
        auto c = store_.checksum(path);
        if (!c) {
          fail_local(c.error());
          continue;
        }
        local_crc = *c;
      }
      copy_mtime_[i] = ls->mtime_ns;
      if (opt_.pre == Validate::origin && ls->origin && ls->origin->crc_known) copy_crc_[i] = ls->origin->crc;
      need_local_[i] =
          needs_copy(*ls, e.meta, opt_.pre, opt_.overwrite, local_crc, src_crc.empty() ? 0 : src_crc[i]) ? 1
                                                                                                         : 0;
    }
    if (swept > 0)
      spdlog::info("{}: removed {} stale temporary file(s) under {}", host_name(), swept, ep_.dest);
  }
  need_any_ = need_local_;
  if (auto st = comm_.allreduce_max(need_any_); !st) return st;
  bool mine = false;
  for (int64_t v : need_local_) mine = mine || v != 0;
  r_.this_node_wrote = mine;
  std::array<int64_t, 2> counts{ep_.writer ? 1 : 0, mine ? 1 : 0};
  if (auto st = comm_.allreduce_sum(counts); !st) return st;
  r_.writers = counts[0];
  r_.nodes_needing = counts[1];
  if (r_.nodes_needing == 0) return {};
  if (opt_.seed_from_copies)
    if (auto st = choose_seed(); !st) return st;
  r_.fed_by = data_root_;
  r_.fed_from_copy = seeded_;
  return {};
}

// Seeding: a writer whose copies of every file any node needs are current (by the
// pre-validation rule) may feed the broadcast; the lowest such rank does. Collective.
Status Transfer::choose_seed() {
  bool can = ep_.writer && !local_err_;
  for (size_t i = 0; i < m_.entries.size() && can; ++i)
    can = need_any_[i] == 0 || (m_.entries[i].type == EntryType::file && need_local_[i] == 0);
  std::array<int64_t, 1> best{can ? comm_.size() - comm_.rank() : 0};  // max: the lowest rank
  if (auto st = comm_.allreduce_max(best); !st) return st;
  if (best[0] == 0) return {};
  data_root_ = comm_.size() - static_cast<int>(best[0]);
  seeded_ = true;
  seed_before_.assign(m_.entries.size(), FileMeta{});
  if (is_root()) spdlog::info("{}: rank {} feeds the transfer from its current copy", host_name(), data_root_);
  return {};
}

Status Transfer::prepare() {
  const size_t n = m_.entries.size();
  txn_.resize(n);
  file_crc_.assign(n, 0);
  finished_.assign(n, 0);
  if (ep_.writer && !local_err_) {
    uint64_t want = 0;
    for (size_t i = 0; i < n; ++i)
      if (need_local_[i] != 0) want += expected_disk_bytes(m_.entries[i]);
    if (want > 0) {
      auto free_bytes = store_.free_bytes(m_.tree ? join_path(ep_.dest, "x") : ep_.dest);
      if (!free_bytes) {
        fail_local(free_bytes.error());
      } else if (*free_bytes < want) {
        Error e = sys_error(ENOSPC, "not enough free space for", ep_.dest);
        e.message += " (need " + std::to_string(want) + " bytes, " + std::to_string(*free_bytes) + " free)";
        fail_local(e);
      }
    }
    for (size_t i = 0; i < n && !local_err_; ++i) {
      if (need_local_[i] == 0) continue;
      const std::string path = dest_of(i);
      auto t = store_.begin(path);
      if (!t)
        fail_local(t.error());
      else
        txn_[i] = std::move(t.value());
    }
  }
  // Every rank relays, so every rank needs the chunk buffers: allocated before the agreement,
  // so a rank short of memory stops the job here rather than stalling it mid-stream.
  uint64_t stream = 0;
  for (size_t i = 0; i < n; ++i)
    if (need_any_[i] != 0 && m_.entries[i].type == EntryType::file) stream += m_.entries[i].meta.size;
  const uint64_t bufsize = std::min<uint64_t>(m_.chunk_size, std::max<uint64_t>(stream, 1));
  // A stream of one chunk (a batch of small files, a small file) needs one buffer, not
  // pipeline_depth buffers of its whole size (each one freshly mapped and zeroed).
  const int nbufs = chunk_count(stream, m_.chunk_size) <= 1 ? 1 : std::max(2, opt_.pipeline_depth);
  for (int k = 0; k < nbufs && !local_err_ && stream > 0; ++k) {
    auto b = std::make_unique<Buffer>();
    b->mem = ChunkBuffer::make(bufsize);
    if (!b->mem) {
      fail_local(sys_error(ENOMEM, "allocate a chunk buffer of " + std::to_string(bufsize) + " bytes"));
      break;
    }
    buffers_.push_back(std::move(b));
  }
  auto any = allreduce_max(comm_, local_err_ ? 1 : 0);
  if (!any) return any.error();
  if (*any != 0) return Error{make_error_code(Errc::peer_failed), "a node could not prepare its destination"};
  return {};
}

void Transfer::reader_loop(const Layout& layout, BlockingQueue<BufPtr>& free_q,
                           BlockingQueue<BufPtr>& full_q) {
  const uint64_t nchunks = chunk_count(layout.bytes(), m_.chunk_size);
  std::unique_ptr<SourceFile> file;
  size_t open_seg = SIZE_MAX;
  reader_file_crc_.assign(layout.segments().size(), 0);
  // Empty files have no piece in any chunk, so no end of file below: check them first (a
  // /proc file is empty by stat and full of text by read).
  for (const Segment& seg : layout.segments()) {
    if (seg.size != 0) continue;
    auto f = open_input(seg.entry);
    source_err_ = f ? check_input_end(**f, seg.entry, 0) : std::optional<Error>(f.error());
    if (source_err_) break;
  }
  if (source_err_) {
    if (nchunks == 0) return;  // the trailer carries the error
    auto b = free_q.pop();
    if (!b) return;
    (*b)->hdr = ChunkHeader{0, chunk_range(layout.bytes(), m_.chunk_size, 0).length, 0, kChunkAbort, 0};
    full_q.push(std::move(*b));
    return;
  }
  std::vector<char> sent(adaptive_ ? nchunks : 0);
  uint64_t next = 0, low = 0;
  if (adaptive_) reader_chunk_crc_.assign(nchunks, 0);
  for (uint64_t k = 0; k < nchunks; ++k) {
    auto t_wait = Clock::now();
    auto b = free_q.pop();
    if (!b) return;
    // Chosen once a buffer is free: as late as possible, so the latest wants count.
    const uint64_t i = adaptive_ ? pick_chunk(sent, next, low) : k;
    if (adaptive_) sent[i] = 1;
    const auto t_read = Clock::now();
    r_.pipe.read_wait += seconds_between(t_wait, t_read);
    const Accumulate busy(r_.pipe.read, t_read);
    Buffer& buf = **b;
    const ChunkRange range = chunk_range(layout.bytes(), m_.chunk_size, i);
    buf.hdr = ChunkHeader{i, range.length, 0, 0, 0};
    if (opt_.cancelled && opt_.cancelled()) {
      source_err_ = stage_error(Errc::cancelled, "transfer abandoned (stopping)", ep_.source);
      buf.hdr.flags = kChunkAbort;
      full_q.push(std::move(*b));
      return;
    }
    bool any_data = false;
    uint64_t crc = 0;
    for (const Piece& p : layout.pieces(range.offset, range.length)) {
      const Segment& seg = layout.segments()[p.segment];
      const Entry& e = m_.entries[seg.entry];
      if (open_seg != p.segment) {
        auto f = open_input(seg.entry);
        if (!f) {
          source_err_ = f.error();
          break;
        }
        file = std::move(f.value());
        open_seg = p.segment;
      }
      const std::span<std::byte> dst(buf.mem->data() + p.chunk_off, p.length);
      uint64_t piece_crc = 0;
      if (file->has_data(p.file_off, p.length)) {
        if (auto st = file->read_at(p.file_off, dst); !st) {
          source_err_ = st.error();
          if (seeded_) store_.bad_copy(dest_of(seg.entry), seed_before_[seg.entry]);  // unreadable
          break;
        }
        (seeded_ ? read_seed_ : read_source_) += p.length;
        any_data = true;
        piece_crc = crc64(dst);
      } else {
        // A hole, or the end of a file that shrank since the scan: zeros only for a hole
        // (a reader of the copy in progress may see this chunk before the end check).
        auto now = file->stat_now();
        if (!now) {
          source_err_ = now.error();
          break;
        }
        if (now->size < p.file_off + p.length) {
          source_err_ = stage_error(Errc::source_changed, seeded_ ? "seed copy" : "source",
                                    seeded_ ? dest_of(seg.entry) : join_path(ep_.source, e.path));
          source_err_->message += " (it shrank during the copy)";
          break;
        }
        std::memset(dst.data(), 0, dst.size());
        piece_crc = crc64_zeros(p.length);
      }
      crc = crc64_combine(crc, piece_crc, p.length);
      if (adaptive_) continue;  // one piece per chunk; the file's CRC and end check below
      reader_file_crc_[p.segment] = crc64_combine(reader_file_crc_[p.segment], piece_crc, p.length);
      if (p.file_off + p.length == seg.size) {  // end of this file: is it still the same file?
        source_err_ = check_input_end(*file, seg.entry, reader_file_crc_[p.segment]);
        if (source_err_) break;
      }
    }
    if (adaptive_ && !source_err_) {
      reader_chunk_crc_[i] = crc;
      if (k + 1 == nchunks) {  // every chunk read: the file's CRC, and is it still the same file?
        for (uint64_t j = 0; j < nchunks; ++j)
          reader_file_crc_[0] = crc64_combine(reader_file_crc_[0], reader_chunk_crc_[j],
                                              chunk_range(layout.bytes(), m_.chunk_size, j).length);
        source_err_ = check_input_end(*file, layout.segments()[0].entry, reader_file_crc_[0]);
      }
    }
    if (source_err_) {
      buf.hdr.flags = kChunkAbort;
      full_q.push(std::move(*b));
      return;
    }
    buf.hdr.crc = crc;
    buf.hdr.flags = any_data ? 0 : kChunkZero;
    full_q.push(std::move(*b));
  }
}

void Transfer::writer_loop(const Layout& layout, BlockingQueue<BufPtr>& write_q,
                           BlockingQueue<BufPtr>& free_q) {
  std::vector<uint64_t> piece_crc;
  for (auto t_wait = Clock::now();; t_wait = Clock::now()) {
    auto b = write_q.pop();
    if (!b) break;
    const auto t_verify = Clock::now();
    r_.pipe.write_wait += seconds_between(t_wait, t_verify);
    Buffer& buf = **b;
    if (!writer_err_) {
      const bool zero = (buf.hdr.flags & kChunkZero) != 0;
      const ChunkRange range = chunk_range(layout.bytes(), m_.chunk_size, buf.hdr.index);
      const auto pieces = layout.pieces(range.offset, range.length);
      piece_crc.assign(pieces.size(), 0);
      uint64_t crc = 0;
      for (size_t k = 0; k < pieces.size(); ++k) {
        const Piece& p = pieces[k];
        piece_crc[k] =
            zero ? crc64_zeros(p.length) : crc64(std::span(buf.mem->data() + p.chunk_off, p.length));
        crc = crc64_combine(crc, piece_crc[k], p.length);
      }
      const auto t_write = Clock::now();
      r_.pipe.verify += seconds_between(t_verify, t_write);
      const Accumulate busy(r_.pipe.write, t_write);
      if (!zero && crc != buf.hdr.crc) {
        writer_err_ =
            stage_error(Errc::checksum_mismatch, "chunk " + std::to_string(buf.hdr.index) + " for", ep_.dest);
      }
      for (size_t k = 0; k < pieces.size() && !writer_err_; ++k) {
        const Piece& p = pieces[k];
        const Segment& seg = layout.segments()[p.segment];
        if (need_local_[seg.entry] == 0) continue;
        Txn& t = *txn_[seg.entry];
        if (!zero) {
          const std::span<const std::byte> data(buf.mem->data() + p.chunk_off, p.length);
          if (auto st = is_sparse(m_.entries[seg.entry]) ? write_sparse(t, p.file_off, data) : t.write(p.file_off, data);
              !st) {
            writer_err_ = st.error();
            break;
          }
        }
        if (adaptive_) {  // chunks in any order: the file's CRC once all are here
          writer_chunk_crc_[buf.hdr.index] = piece_crc[k];
          if (opt_.live != nullptr) opt_.live->chunk_written(buf.hdr.index, zero);
          if (++writer_chunks_ < writer_chunk_crc_.size()) continue;
          for (uint64_t j = 0; j < writer_chunk_crc_.size(); ++j)
            file_crc_[seg.entry] = crc64_combine(file_crc_[seg.entry], writer_chunk_crc_[j],
                                                 chunk_range(layout.bytes(), m_.chunk_size, j).length);
          if (auto st = t.finish(m_.entries[seg.entry].meta, file_crc_[seg.entry]); !st) writer_err_ = st.error();
          finished_[seg.entry] = 1;
          continue;
        }
        file_crc_[seg.entry] = crc64_combine(file_crc_[seg.entry], piece_crc[k], p.length);
        if (p.file_off + p.length == seg.size) {
          if (auto st = t.finish(m_.entries[seg.entry].meta, file_crc_[seg.entry]); !st)
            writer_err_ = st.error();
          finished_[seg.entry] = 1;
        }
      }
    }
    free_q.push(std::move(*b));  // a failed writer keeps draining so the pipeline never stalls
  }
}

// Chunk by chunk through the Comm's collectives: a header broadcast, then the payload
// (Comm::bcast). Used with --bcast-algorithm mpi, one rank, or a stream too small to pipeline.
// A nest header (kChunkNest) comes between two chunks: every rank runs the nested transfer.
Status Transfer::broadcast_chunks(const Layout& layout, bool write_here, Queues& q) {
  const uint64_t nchunks = chunk_count(layout.bytes(), m_.chunk_size);
  std::vector<char> seen(nchunks);
  uint64_t done_bytes = 0;
  for (uint64_t i = 0; i < nchunks;) {
    std::optional<BufPtr> b;
    uint32_t token = 0;
    if (is_reader() && (adaptive_ || opt_.nest != nullptr)) {
      // The root's own readers' wants reach its reader, and the control plane is polled, while
      // it waits for the reader.
      for (;;) {
        route_wants(nullptr);
        if (opt_.nest != nullptr) {
          if (auto st = poll_nest(); !st) return st;
          if ((token = opt_.nest->mark()) != 0) break;
        }
        if ((b = q.full_q.pop_for(std::chrono::milliseconds(1)))) break;
      }
    } else {
      // Elsewhere once per chunk (this rank waits inside the header broadcast): its requests
      // still reach the coordinator during a long transfer.
      if (opt_.nest != nullptr)
        if (auto st = opt_.nest->poll(); !st) return st;
      b = is_reader() ? q.full_q.pop() : q.free_q.pop();
      if (!b) return {};
    }
    const Accumulate in_bcast(r_.pipe.bcast);
    ChunkHeader h = token != 0 ? nest_header(token) : is_reader() ? (*b)->hdr : ChunkHeader{};
    if (auto st = comm_.bcast(std::as_writable_bytes(std::span(&h, 1)), data_root_); !st) return st;
    if (!valid_header(h, layout, i, seen))
      return stage_error(Errc::bad_message, "chunk header " + std::to_string(i));  // out of step: stop
    if ((h.flags & kChunkNest) != 0) {
      if (b) q.free_q.push(std::move(*b));  // a receive buffer: no chunk came
      if (auto st = opt_.nest->run(static_cast<uint32_t>(h.reserved)); !st) return st;
      continue;
    }
    Buffer& buf = **b;
    const ChunkRange range = chunk_range(layout.bytes(), m_.chunk_size, h.index);
    if ((h.flags & kChunkAbort) != 0) {
      q.free_q.push(std::move(*b));
      return {};  // every rank sees the same header and leaves the loop at the same chunk
    }
    if ((h.flags & kChunkZero) == 0) {
      if (auto st = data_bcast(comm_, std::span(buf.mem->data(), h.length), data_root_, opt_.bcast_algorithm,
                               opt_.pipeline);
          !st)
        return st;
      r_.bytes_streamed += h.length;
    }
    ++r_.chunks;
    buf.hdr = h;
    (write_here ? q.write_q : q.free_q).push(std::move(*b));
    done_bytes += range.length;
    if (progress_) progress_(done_bytes, layout.bytes());
    ++i;
  }
  return {};
}

// A chunk header from the stream: a known flag set; an abort ends the stream wherever it
// comes; any other chunk must be the next one (in file order) or, with readers steering the
// order, one not seen yet; its length must be its chunk's.
bool Transfer::valid_header(const ChunkHeader& h, const Layout& layout, uint64_t seq, std::vector<char>& seen) const {
  if (h.flags == kChunkNest) return opt_.nest != nullptr && h.index == 0 && h.length == 0 && h.reserved != 0;
  if ((h.flags & ~(kChunkZero | kChunkAbort)) != 0) return false;
  if ((h.flags & kChunkAbort) != 0) return true;
  const uint64_t n = seen.size();
  if (adaptive_ ? (h.index >= n || seen[h.index] != 0) : h.index != seq) return false;
  if (h.length != chunk_range(layout.bytes(), m_.chunk_size, h.index).length) return false;
  seen[h.index] = 1;
  return true;
}

// Every chunk through one pipelined chain or tree (ChunkStream, bcast/pipeline.h): chunk
// i+1 enters the pipeline while chunk i drains, headers travel in-band. The MPI thread feeds
// the stream with buffers (the root: full ones from the reader; the others: free ones to
// receive into), hands completed chunks to the writer, and sleeps briefly when nothing moves.
Status Transfer::stream_chunks(const Layout& layout, BcastAlgorithm shape, bool write_here, Queues& q) {
  const uint64_t nchunks = chunk_count(layout.bytes(), m_.chunk_size);
  std::deque<BufPtr> inflight;  // submitted to the stream, in chunk order (outlives the stream)
  // On a failure, a send or receive MPI could not cancel may still use a submitted buffer
  // after we give up: those buffers are then left allocated, never unmapped or reused (a few
  // chunks, once per failed transfer; a stagefs group stops transferring after a failure).
  bool ok = false;
  struct Quarantine {
    std::deque<BufPtr>& bufs;
    const bool& ok;
    ~Quarantine() {
      if (!ok)
        for (auto& b : bufs) quarantine(std::shared_ptr<void>(std::move(b)));
    }
  } quarantine{inflight, ok};
  ChunkStream stream(*comm_.point_to_point(), data_root_, shape, opt_.pipeline);
  std::vector<ChunkHeader> done;
  std::vector<char> seen(nchunks);
  // The source rank's chunks in the stream at once (kNestAheadChunks with a Nest; else every
  // chunk the reader has filled).
  const size_t root_pending_max = opt_.nest != nullptr ? kNestAheadChunks : SIZE_MAX;
  // submitted: buffers put into the stream (the root: chunks; elsewhere: receive buffers, one
  // per chunk and one per nest header, which a rank learns of as it hands it back).
  uint64_t submitted = 0, completed = 0, done_bytes = 0, nests = 0;
  bool ended = false;      // the abort chunk came out of the stream
  bool abort_sent = false;  // root: the reader's abort chunk is in the stream
  while (completed < nchunks && !ended) {
    const auto t_iter = Clock::now();
    bool moved = false;
    route_wants(&stream);
    if (opt_.nest != nullptr) {
      if (auto st = poll_nest(); !st) return st;
      // A nest header goes in between two chunks, never after the last one (every rank then
      // still has a chunk to receive after it, so it posts a receive for it).
      if (is_reader() && submitted < nchunks && !abort_sent)
        if (const uint32_t token = opt_.nest->mark(); token != 0) {
          if (auto st = stream.submit({}, nest_header(token)); !st) return st;
          inflight.push_back(nullptr);
          moved = true;
        }
    }
    while (submitted < nchunks + (is_reader() ? 0 : nests) && !abort_sent &&
           (!is_reader() || stream.pending() < root_pending_max)) {
      auto b = is_reader() ? q.full_q.try_pop() : q.free_q.try_pop();
      if (!b) break;
      Buffer& buf = **b;
      const ChunkHeader h = is_reader() ? buf.hdr : ChunkHeader{};
      const bool empty = (h.flags & (kChunkZero | kChunkAbort)) != 0;
      const auto span = is_reader() ? std::span(buf.mem->data(), empty ? 0 : h.length) : buf.mem->bytes();
      if (auto st = stream.submit(span, h); !st) return st;
      inflight.push_back(std::move(*b));
      ++submitted;
      moved = true;
      abort_sent = (h.flags & kChunkAbort) != 0;
    }
    done.clear();
    auto r = stream.progress(done);
    if (!r) return r.error();
    for (const ChunkHeader& h : done) {
      BufPtr b = std::move(inflight.front());
      inflight.pop_front();
      if (!valid_header(h, layout, completed, seen))
        return stage_error(Errc::bad_message, "chunk header " + std::to_string(completed));
      if ((h.flags & kChunkNest) != 0) {  // every chunk before it passed on: the nested transfer runs
        if (b) q.free_q.push(std::move(b));  // a receive buffer: no chunk came
        ++nests;
        if (auto st = opt_.nest->run(static_cast<uint32_t>(h.reserved)); !st) return st;
        stream.resumed();
        moved = true;
        continue;
      }
      const ChunkRange range = chunk_range(layout.bytes(), m_.chunk_size, h.index);
      if ((h.flags & kChunkAbort) != 0) {  // every rank sees it at the same chunk
        q.free_q.push(std::move(b));
        ended = true;
        break;
      }
      if ((h.flags & kChunkZero) == 0) r_.bytes_streamed += h.length;
      ++r_.chunks;
      b->hdr = h;
      (write_here ? q.write_q : q.free_q).push(std::move(b));
      done_bytes += range.length;
      if (progress_) progress_(done_bytes, layout.bytes());
      ++completed;
    }
    const bool busy = stream.pending() > 0 || !done.empty();  // else: waiting for the reader or writer
    if (!moved && !*r) stream.idle();
    if (busy) r_.pipe.bcast += seconds_between(t_iter, Clock::now());
  }
  if (auto st = stream.finish(); !st) return st;
  ok = true;
  for (auto& b : inflight)  // receives dropped after an abort (the root's nest marks hold none)
    if (b) q.free_q.push(std::move(b));
  return {};
}

Status Transfer::copy() {
  const Layout layout(m_, need_any_);
  r_.files_streamed = layout.segments().size();
  const bool write_here = ep_.writer && r_.this_node_wrote;
  // The same on every rank: it depends on the manifest and the chunk size only (not on
  // whether this rank has readers: nodes started with different --read-during-copy still
  // agree). At most kMaxAdaptiveChunks (a few bytes of state per chunk and rank).
  const uint64_t nchunks = chunk_count(layout.bytes(), m_.chunk_size);
  adaptive_ = !m_.tree && opt_.small_files_max == 0 && layout.segments().size() == 1 && nchunks <= kMaxAdaptiveChunks;
  if (adaptive_) {
    const size_t e = layout.segments()[0].entry;
    writer_chunk_crc_.assign(nchunks, 0);
    if (opt_.live != nullptr && write_here && need_local_[e] != 0 && txn_[e])
      opt_.live->started(m_.entries[e].meta, m_.chunk_size, *txn_[e]);
  }
  Queues q;
  for (auto& b : buffers_) q.free_q.push(std::move(b));
  buffers_.clear();
  std::thread reader;
  std::thread writer;
  if (is_reader()) reader = std::thread([&] { reader_loop(layout, q.free_q, q.full_q); });
  if (write_here) writer = std::thread([&] { writer_loop(layout, q.write_q, q.free_q); });

  // Same choice on every rank: the layout and the Comm's seam are the same everywhere.
  const BcastAlgorithm shape = resolve(opt_.bcast_algorithm, comm_, layout.bytes());
  const Status comm_status = shape == BcastAlgorithm::mpi ? broadcast_chunks(layout, write_here, q)
                                                          : stream_chunks(layout, shape, write_here, q);
  q.write_q.close();
  if (writer.joinable()) writer.join();
  q.free_q.close();
  if (reader.joinable()) reader.join();
  if (!comm_status) return comm_status;

  // Trailer: the reader's verdict on what it read; with a seed, the source rank's on the
  // source; then the CRC of every streamed file.
  if (auto st = share_root_status(source_err_, data_root_); !st) return st;
  if (source_err_) return {};
  if (seeded_) {
    if (is_root()) source_err_ = recheck_source(layout);
    if (auto st = share_root_status(source_err_, opt_.root); !st) return st;
    if (source_err_) return {};
  }
  source_file_crc_ = is_reader() ? reader_file_crc_ : std::vector<uint64_t>(layout.segments().size());
  if (auto st = comm_.bcast(std::as_writable_bytes(std::span(source_file_crc_)), data_root_); !st) return st;
  if (seeded_ && !src_crc_.empty()) {  // --pre-validate checksum: every rank knows the source's CRCs
    for (size_t k = 0; k < layout.segments().size(); ++k) {
      const size_t i = layout.segments()[k].entry;
      if (source_file_crc_[k] == src_crc_[i]) continue;
      const std::string msg = "seed copy " + dest_of(i) + " does not match the source's checksum";
      source_err_ = Error{make_error_code(is_reader() ? Errc::checksum_mismatch : Errc::peer_failed), msg};
      return {};
    }
  }
  if (writer_err_) fail_local(*writer_err_);
  if (write_here && !local_err_) {
    for (size_t s = 0; s < layout.segments().size(); ++s) {
      const size_t i = layout.segments()[s].entry;
      if (need_local_[i] != 0 && finished_[i] != 0 && file_crc_[i] != source_file_crc_[s])
        fail_local(stage_error(Errc::checksum_mismatch, "copy of", dest_of(i)));
    }
  }
  return {};
}

void Transfer::finish() {
  const size_t n = m_.entries.size();
  const bool stagefs_batch = opt_.small_files_max > 0;
  std::vector<std::string> unsynced_names;  // told to before_unsynced_publish()
  std::vector<size_t> mine;
  for (size_t i = 0; i < n; ++i)
    if (need_local_[i] != 0 && txn_[i]) mine.push_back(i);
  if (!source_err_ && !local_err_) {
    for (size_t i : mine) {  // zero-length files never saw a chunk
      if (finished_[i] == 0) {
        if (auto st = txn_[i]->finish(m_.entries[i].meta, crc64_zeros(0)); !st) fail_local(st.error());
        finished_[i] = 1;
      }
    }
    const Accumulate syncing(r_.pipe.sync);
    if (stagefs_batch && !mine.empty() && !local_err_) {
      // The store decides how the names below become safe: see before_unsynced_publish().
      unsynced_names.reserve(mine.size());
      for (size_t i : mine) unsynced_names.push_back(dest_of(i));
      if (auto st = store_.before_unsynced_publish(ep_.dest, unsynced_names); !st) {
        fail_local(st.error());
        unsynced_names.clear();
      }
    } else if (mine.size() > 8 && !local_err_) {
      if (auto st = store_.sync_filesystem(ep_.dest); !st) fail_local(st.error());
    } else {
      for (size_t i : mine) {
        if (auto st = txn_[i]->sync(); !st) {
          fail_local(st.error());
          break;
        }
      }
    }
  }
  const auto t_post = Clock::now();
  if (!source_err_ && !local_err_ && opt_.post != Validate::none) {
    for (size_t i : mine) {
      const Entry& e = m_.entries[i];
      if (opt_.post == Validate::size) {
        auto sz = txn_[i]->size_on_disk();
        if (!sz)
          fail_local(sz.error());
        else if (*sz != e.meta.size)
          fail_local(stage_error(Errc::checksum_mismatch, "size check of", dest_of(i)));
      } else {
        auto c = txn_[i]->crc_on_disk();
        if (!c)
          fail_local(c.error());
        else if (*c != file_crc_[i])
          fail_local(stage_error(Errc::checksum_mismatch, "post-validation of", dest_of(i)));
      }
      if (local_err_) break;
    }
  }
  r_.t.postvalidate = since(t_post);
  // A node publishes iff the source held still and its own copy verified.
  if (!source_err_ && !local_err_) {
    // Many files: rename each, then one sync for every name (the data was synced above);
    // a single file: rename and fsync its directory. A stagefs batch never syncs its names.
    const bool batch = mine.size() > 8 || stagefs_batch;
    for (size_t i : mine) {
      if (auto st = batch ? txn_[i]->commit_unsynced() : txn_[i]->commit(); !st) {
        fail_local(st.error());
        break;
      }
      r_.published.push_back(m_.entries[i].path);
    }
    // A stagefs batch skips that second sync: before any name appears its data is durable or
    // its names are recorded for the next start (before_unsynced_publish above), so a crash
    // can only lose names, and a lost name is a copy made again at its next open.
    if (batch && !local_err_ && !stagefs_batch) {
      const Accumulate syncing(r_.pipe.sync);
      if (auto st = store_.sync_filesystem(ep_.dest); !st) fail_local(st.error());
    }
    published_ = !mine.empty() && !local_err_;
  }
  // Renamed or not (a check failed in between): the store may now sync what is at those names.
  if (!unsynced_names.empty()) store_.after_unsynced_publish(unsynced_names);
  for (auto& t : txn_)
    if (t) t->abort();  // no-op after commit
}

void Transfer::collect_errors() {
  std::string mine;
  if (local_err_)
    mine = local_err_->message;
  else if (source_err_ && source_err_->code != make_error_code(Errc::peer_failed))
    mine = source_err_->message;  // the rank that read (or re-checked) the source or seed copy
  auto all = comm_.gather(mine, opt_.root);
  if (is_root() && all) {
    for (auto& s : *all)
      if (!s.empty()) r_.errors.push_back(s);
  } else if (!mine.empty()) {
    r_.errors.push_back(mine);
  }
}

StageReport Transfer::run() {
  const auto t0 = Clock::now();
  auto finish_report = [&](bool ok) {
    r_.ok = ok;
    r_.bytes_read_source = read_source_;
    r_.bytes_read_seed = read_seed_;
    if (local_err_) r_.local_error = local_err_->code;
    r_.exit_code = ok ? 0 : 1;
    r_.t.total = since(t0);
    return r_;
  };
  // A collective failure (MPI error, malformed message) ends the transfer here: no further
  // collectives are attempted, every temporary file is removed by the Txn destructors.
  auto comm_broke = [&](const Status& st) {
    r_.comm_broken = true;
    r_.errors.push_back(st.error().message);
    spdlog::error("{}", st.error().message);
    return finish_report(false);
  };

  if (auto st = share_manifest(); !st) {
    if (st.error().code == make_error_code(Errc::comm_failed)) return comm_broke(st);
    r_.errors.push_back(st.error().message);
    return finish_report(false);  // the source's error, identical on every rank
  }
  r_.t.metadata = since(t0);

  const auto t_pre = Clock::now();
  if (auto st = decide(); !st) {
    if (st.error().code != make_error_code(Errc::peer_failed)) return comm_broke(st);
    r_.errors.push_back(st.error().message);
    return finish_report(false);
  }
  const bool any_need = std::any_of(need_any_.begin(), need_any_.end(), [](int64_t v) { return v != 0; });
  if (!any_need) {  // the same on every rank: nothing to read, nothing to send
    auto failed = allreduce_max(comm_, local_err_ ? 1 : 0);
    r_.t.prevalidate = since(t_pre);
    if (!failed) return comm_broke(Status(failed.error()));
    if (*failed != 0) {
      collect_errors();
      return finish_report(false);
    }
    return finish_report(true);
  }
  if (auto st = prepare(); !st) {
    r_.t.prevalidate = since(t_pre);
    if (st.error().code != make_error_code(Errc::peer_failed)) return comm_broke(st);
    txn_.clear();
    collect_errors();
    return finish_report(false);
  }
  r_.t.prevalidate = since(t_pre);

  const auto t_copy = Clock::now();
  if (auto st = copy(); !st) return comm_broke(st);
  finish();
  r_.t.copy = since(t_copy) - r_.t.postvalidate;  // includes fsync and rename

  // The outcome, and the slowest rank's pipeline figures (microseconds) in the same allreduce.
  PipelineTimes& p = r_.pipe;
  std::array<double*, 7> figures{&p.read,  &p.read_wait,  &p.bcast, &p.verify,
                                 &p.write, &p.write_wait, &p.sync};
  // Bytes read: one rank reads each kind, so the max is its figure.
  constexpr size_t kFig = 4;
  std::array<int64_t, kFig + figures.size()> outcome{source_err_ ? 1 : 0, local_err_ ? 1 : 0,
                                                     static_cast<int64_t>(read_source_),
                                                     static_cast<int64_t>(read_seed_)};
  for (size_t k = 0; k < figures.size(); ++k) outcome[kFig + k] = static_cast<int64_t>(*figures[k] * 1e6);
  if (auto st = comm_.allreduce_max(outcome); !st) return comm_broke(st);
  for (size_t k = 0; k < figures.size(); ++k) *figures[k] = static_cast<double>(outcome[kFig + k]) * 1e-6;
  read_source_ = static_cast<uint64_t>(outcome[2]);
  read_seed_ = static_cast<uint64_t>(outcome[3]);
  auto written = allreduce_sum(comm_, published_ ? 1 : 0);
  if (!written) return comm_broke(Status(written.error()));
  r_.nodes_written = *written;
  collect_errors();
  return finish_report(outcome[0] == 0 && outcome[1] == 0);
}

}  // namespace

StageReport stage_transfer(Comm& comm, SourceReader* source, LocalStore& store, const StageOptions& opt,
                           const StageEndpoint& ep, const ProgressFn& progress) {
  Transfer t(comm, source, store, opt, ep, progress);
  return t.run();
}

}  // namespace stage
