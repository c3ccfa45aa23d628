// GroupService: one node's member of a mount group. FUSE threads call materialize(); the
// service thread (the one that owns MPI) runs run(), which
//   - forwards this node's first-open requests to the coordinator (rank 0),
//   - on the coordinator: hands every node's requests to a Coordinator (coordinator.h: the
//     pure decisions, one transfer per file however many threads and nodes open it at once)
//     and broadcasts its announcements one at a time, in order,
//   - on every rank: runs each announced transfer through the bcast engine into the cache
//     (nodes whose cache already holds a valid copy take part without writing),
//   - wakes the waiting opens with the outcome.
// Small files: materialize_small_async() asks for the file's directory as a batch
// (MsgType::batch): one transfer stages every small regular file of that directory (not
// recursive) that is not current in some node's cache, packed into one stream, and answers
// every open waiting for any of them. Each node waits per key, (file) or (batch, dir), so
// opens of 200 small files of one directory make one request. A batch whose transfer fails
// is run once more at once (every rank agrees: the outcome is collective): a file that
// changed on the source during the copy fails the whole stream, and the second run
// publishes the unchanged files with the changed one at its new version.
// Reads before the copy ends (GroupConfig::read_during_copy): each single-file
// transfer gets a LiveCopy (live.h) that the engine keeps informed; once this node's
// temporary file exists, the opens waiting for that file are answered with it
// (materialize_live_async), and so is any open of it until the transfer ends. Reads ask for
// missing chunks through it; the engine passes the wants to the source rank.
// More than one transfer at a time (GroupConfig::nested_batches, with a
// second data Comm): while one file's transfer streams, the service thread keeps polling the
// control plane from the engine's copy loop (bcast/transfer/terms.h, Nest), so this node's requests
// still reach the coordinator; the coordinator may then announce one batch as batch_nested,
// and the source rank puts a mark in the running stream. Every rank runs that batch on the
// second Comm once the mark is complete on it, then goes on with the file.
// A nested announcement whose mark never came (the stream ended first) runs right after the
// transfer, like any announcement. Large files still go one at a time (they share the links),
// except that an open's file runs nested in a background one (file_prefetch: a replayed
// profile's, stagectl prefetch's): the background stream pauses at the mark and goes on after.
// Background transfers (Want::background) evict no copy; one that found no room answers a
// want that may_evict by asking again as an open, and any other with the error. An open that
// joins a background wait on this node asks again as an open (the coordinator moves it ahead).
// Walks (GroupConfig::prefetch_siblings; coordinator.h): when the coordinator sees a walk,
// this (its) node lists the parent's subdirectories through the source reader and queues
// their batches behind every request. An open that misses a file of the batch running on
// this node waits for that batch (no new request): a file it did not cover is staged alone.
// Waiting opens hold no thread: materialize_async() keeps a callback per open, run when the
// transfer completes. A watchdog thread (not the service thread, which may be stuck in MPI)
// enforces the stall timeout.
// Stalls: a waiting open gives up when neither its own request nor any collective progress
// (an announcement, a chunk) has happened for stall_timeout. The node then marks the group
// broken: the service thread may be stuck inside MPI for good (Open MPI 4.1 has no
// fault-tolerant collectives), so later cache misses fail at once (or fall back to the
// source, per the mount's policy) while valid cached files keep being served.
//
// Thread safety: materialize(), request_shutdown(), state(), stats() from any thread;
// run() from the service thread only. Lock order: m_ is the only lock; callbacks into the
// engine run without it.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "bcast/transfer/engine.h"
#include "fusefs/base/admission.h"
#include "fusefs/core/core.h"
#include "fusefs/core/live.h"
#include "fusefs/group/control.h"
#include "fusefs/group/coordinator.h"

namespace stagefs {

// The order readers read a file in, for reads during its copy (GroupConfig::read_during_copy):
// what a replayed profile says they will read first, and what this node's readers did read.
// Called on the service thread.
class ReadOrders {
 public:
  virtual ~ReadOrders() = default;
  // On the coordinator's node, before a transfer of rel: chunks (of chunk_size bytes) its
  // LiveCopy wants first, in this order.
  virtual std::vector<uint64_t> first_chunks(const std::string& rel, uint64_t chunk_size) = 0;
  // On every rank, after a transfer of rel: what this node's readers read during the copy
  // (LiveCopy::read_order; called only if they read something).
  virtual void live_reads(const std::string& rel, const LiveCopy::ReadOrder& order) = 0;
};

// How batches of small files, nested batches and walks run, and their budgets: the options
// --nested-batches, --prefetch-siblings, --batch-max-*, --prefetch-max-* under their names
// (DaemonConfig holds one and hands it to the group as it is).
struct BatchPolicy {
  // The coordinator announces batches nested in a running single-file transfer (needs the
  // nested Comm on every rank; only the coordinator's setting counts).
  bool nested_batches = true;
  // Walks (coordinator.h): once opens asked for two sibling directories' batches, the other
  // subdirectories of their parent are staged in the background, behind every request
  // (source readers without list_dirs() never do; only the coordinator's setting counts).
  bool prefetch_siblings = true;
  // Bounded batches (coordinator.h, Slices): one batch stages at most this many small files
  // and bytes (0: no limit); a larger directory goes in several slices, other requests
  // between them. The source rank's (coordinator's) settings count.
  uint64_t batch_max_files = 4096;
  uint64_t batch_max_bytes = uint64_t{256} << 20;
  // Walk budget: at most this many subdirectories of one walked parent are prefetched, and
  // their prefetched slices list at most this many bytes and files of small files; so do the
  // slices of one sequence (a batch an open or a prefetch asked for, and the slices that
  // follow it: coordinator.h, Budgets). 0: no limit. Each file is charged its bytes and
  // GroupConfig::file_charge more (the cache's copy_charge: an empty file's copy is not free).
  uint64_t prefetch_max_dirs = 64;
  uint64_t prefetch_max_bytes = uint64_t{1} << 30;
  uint64_t prefetch_max_files = 16384;
};

struct GroupConfig {
  std::string source_dir;  // SOURCE_DIR (absolute)
  std::string cache_dir;   // CACHE_DIR/data (absolute)
  stage::StageOptions bcast;
  std::chrono::milliseconds stall_timeout{std::chrono::seconds(60)};
  std::chrono::milliseconds idle_poll{20};  // longest sleep of an idle service thread
  // Named in the one log line per materialization (how reads of the copy are served).
  std::function<std::string()> read_path;
  // The cache room's admission around every transfer and batch, on every rank (admission.h;
  // the daemon's is its NodeCopies, cache/copies.h). Null: every node writes every copy and
  // nothing is told of it.
  std::shared_ptr<Admission> admission;
  // Asked by the source rank before each chunk: true abandons the transfer (a local stop).
  std::function<bool()> cancelled;
  // Told, on every rank, of each transfer's and batch's end (the mount's metrics observe it).
  std::function<void(double seconds, bool ok)> transfer_ended;
  // Batches: the largest small file (0: no batches, every file alone).
  uint64_t small_file_size = 0;
  // Reads before the copy ends: single-file transfers get a LiveCopy (materialize_live_async).
  bool read_during_copy = false;
  // With read_during_copy: the order readers read files in (a replayed profile's, and this
  // mount's record: profile/job_profile.h). Null: none.
  std::shared_ptr<ReadOrders> read_orders;
  BatchPolicy batches;  // how batches, walks and their budgets run (--batch-*, --prefetch-*)
  uint64_t file_charge = 0;
  // Warm nodes seed cold ones: when some node's cache holds a current copy (its origin matches
  // the source's version) of every file a transfer needs, the lowest such rank reads its copy
  // and roots the broadcast; the source is only scanned (bcast/transfer/engine.h). Every rank's
  // setting must agree.
  bool seed_from_copies = true;
};

struct GroupStats {
  uint64_t transfers = 0;     // announcements run on this node (every node counts each one)
  uint64_t batches = 0;       // of which directory batches
  uint64_t nested = 0;        // of which batches ran nested in a transfer of one file
  uint64_t nested_files = 0;  // files whose transfer ran nested in a background one
  uint64_t batch_files = 0;   // small files this node published through batches
  uint64_t local_writes = 0;  // transfers in which this node wrote its copy
  uint64_t bytes_broadcast = 0;
  uint64_t nothing_to_copy = 0;   // of the transfers, those that found every node's copy current
  uint64_t chunks_broadcast = 0;  // chunks through the broadcast (a sparse file's skipped holes are none)
  // Where the broadcast bytes were read (every node counts each transfer, as bytes_broadcast):
  // the shared source, or a node's cached copy (a seed); and the transfers this node fed from
  // its own cache that succeeded.
  uint64_t bytes_from_source = 0, bytes_from_seeds = 0;
  uint64_t seeded_here = 0;
  // Feeds that failed on a seed's side and were replaced by another seed or the source within
  // the same transfer (every node counts each one; the opens saw no error).
  uint64_t feed_retries = 0;
  uint64_t failures = 0;
  uint64_t requests_sent = 0;  // first-open requests this node sent (or queued, coordinator)
  uint64_t walks = 0;          // coordinator's node: parents found walked (their subdirectories queued)
  uint64_t prefetch_queued =
      0;  // coordinator's node: subdirectories walks queued (BatchPolicy::prefetch_max_dirs)
  uint64_t prefetch_skipped = 0;  // prefetched batches that failed (no room without evicting...)
  // coordinator's node: walks and batch sequences stopped at their budget (prefetch_max_files...)
  uint64_t budget_stops = 0;
  uint64_t waiting = 0;                                      // files this node waits for
  uint64_t reads_waited_during_copy = 0, chunks_wanted = 0;  // LiveCopy::Stats of ended transfers
  // The transfer in flight, if any.
  std::string current;
  uint64_t current_done = 0, current_total = 0;
  double current_seconds = 0;
};

enum class GroupState { running, broken, shut_down };

class GroupService final : public Materializer {
 public:
  // nested: a second Comm over the same ranks, for batches run nested in a transfer (nullptr:
  // none; then every rank must pass nullptr).
  GroupService(stage::Comm& data, ControlPlane& ctl, stage::SourceReader& src, stage::LocalStore& store,
               GroupConfig cfg, stage::Comm* nested = nullptr);
  ~GroupService() override;

  // Calls done when a transfer of `rel` finished on this node (the caller then opens and
  // checks the cache) or failed, timed out, or the group shut down.
  void materialize_async(const std::string& rel, const Want& want, Done done) override;
  // rel is small: one batch for its directory, a slice that begins with rel (or alone when
  // batches are off).
  void materialize_small_async(const std::string& rel, uint64_t since, const Want& want, Done done) override;
  void materialize_live_async(const std::string& rel, const Want& want, Done done,
                              LiveStarted on_live) override;
  [[nodiscard]] uint64_t epoch() const override;
  // Waits until epoch() is at least `at_least` or `timeout` passes; true if it got there.
  bool wait_for_epoch(uint64_t at_least, std::chrono::milliseconds timeout) const;
  // Likewise until the budgets stopped staging ahead at least `at_least` times (budget_stops).
  bool wait_for_budget_stops(uint64_t at_least, std::chrono::milliseconds timeout) const;
  [[nodiscard]] bool batch_running(const std::string& rel) const override;
  // Ask the whole group to shut down (this node unmounted or got a signal).
  void request_shutdown();
  // Service thread: loops until a shutdown announcement or a broken control plane.
  stage::Status run();

  [[nodiscard]] GroupState state() const;
  [[nodiscard]] GroupStats stats() const;
  [[nodiscard]] bool is_coordinator() const { return ctl_.is_coordinator(); }

 private:
  struct Waiter {
    Clock::time_point requested;
    Message ask;             // the request it sent (sent again if a prefetch it attached to was skipped)
    bool may_evict = false;  // some want of it may evict (Want::may_evict)
    std::vector<Done> callbacks;
    std::vector<std::pair<LiveStarted, Done>> on_live;  // answered by on_live() once the copy runs here
  };
  using Ready = std::vector<std::pair<Done, stage::Status>>;  // run without the lock
  using Key = std::pair<MsgType, std::string>;                // (materialize, file) or (batch, dir)

  // ask: the request to send if this is the node's first wait for its key (or an open's
  // joining a background wait).
  void wait_for(Message ask, bool may_evict, Done done, uint64_t since = UINT64_MAX,
                LiveStarted on_live = {});
  void live_started(const std::string& rel);  // MPI thread, from the LiveCopy
  // Each returns false when the data path broke (StageReport::comm_broken): the Comm must
  // not be used again, so the group stops transferring.
  // What running an announcement did: data_ok false when the data path broke (see above), and
  // what it cost the group (transfer_cost, coordinator.h: the coordinator charges its uid).
  struct Ran {
    bool data_ok = true;
    uint64_t cost = 0;
  };
  Ran run_transfer(const Message& a, stage::Comm& comm);
  // The steps of run_transfer.
  std::shared_ptr<LiveCopy> start_live(const std::string& rel);
  void end_live(const std::string& rel, LiveCopy& live, const stage::StageReport& report);
  void finish_transfer(const Message& a, const stage::StageReport& report, const stage::Status& room,
                       double secs);
  Ran run_batch(const Message& a, stage::Comm& comm);
  // The steps of run_batch. The status line a batch replaces (a nested batch puts back the
  // transfer it interrupted), and its runs (at most two) summed.
  struct ShownTransfer {
    std::string current;
    uint64_t done = 0, total = 0;
    Clock::time_point start;
  };
  struct BatchRuns {
    stage::StageReport report;  // the last run's
    stage::StageReport reads;   // where the runs' bytes were read, summed
    std::vector<std::string> published;
    uint64_t streamed = 0, chunks = 0;
    int runs = 0;
  };
  [[nodiscard]] stage::StageOptions batch_options(const Message& a) const;
  ShownTransfer show_batch(const std::string& shown, Clock::time_point t0);
  // A nested transfer ended: status shows the one it interrupted again (m_ held).
  void show_again_locked(ShownTransfer outer);
  // A transfer's counters (a nested one shows the one it interrupted again).
  void count_transfer(const stage::StageReport& report, bool nested, ShownTransfer outer);
  // A background transfer found no room here (m_ held): the opens or requests waiting for key
  // that may evict ask again, as an open; true if they do (then the key is not completed).
  bool ask_again_evicting_locked(const Key& key);
  BatchRuns stage_batch(const Message& a, stage::Comm& comm, const std::string& shown, bool prefetch);
  void count_batch(const Message& a, const BatchRuns& r, ShownTransfer outer, bool prefetch);
  void finish_batch(const Message& a, const std::string& shown, const BatchRuns& r, double secs,
                    bool prefetch);
  // The engine's options for a transfer into the cache (m_ not needed).
  [[nodiscard]] stage::StageOptions transfer_options() const;
  // Counts where a transfer's bytes were read (m_ held).
  void count_reads_locked(const stage::StageReport& r);
  // ", fed by ..." for the one log line per materialization.
  [[nodiscard]] std::string fed_by(const stage::StageReport& r) const;
  bool run_announcement(const Message& a);  // a transfer or batch, with the coordinator told
  // The next announcement, if one has arrived (the Coordinator, if here, is told).
  stage::Result<std::optional<Message>> receive();
  // The steps of run(): the next announcement to run (deferred or received), the end of the
  // group, and a broken data path.
  stage::Result<std::optional<Message>> next_announcement();
  stage::Status shut_down();
  stage::Status data_path_broke(const Message& m);
  // The engine's Nest (service thread, inside run_transfer): see the comment at the top.
  class NestHook;
  friend class NestHook;
  stage::Status nest_poll();
  uint32_t nest_mark();
  stage::Status nest_run(uint32_t token);
  static uint32_t nest_token(uint64_t id) {
    const auto t = static_cast<uint32_t>(id & 0x7fffffffU);
    return t == 0 ? 1 : t;
  }
  stage::Result<bool> forward_local();  // true if it sent anything
  stage::Result<bool> coordinate();     // coordinator's node; true if anything happened
  void expand_walks();                  // coordinator's node: walks into prefetched batches
  stage::Status control_failed(const stage::Error& e, const char* what = "control plane");
  void complete(const Key& key, const stage::Status& st);
  // Queues this node's request (m_ held): a first open, or opens whose batch was skipped
  // asking again.
  void ask_locked(const Message& ask);
  Ready fail_all_locked(const stage::Error& e);
  static void run_ready(Ready& r);
  void watchdog();
  void mark_progress();
  // The engine's progress callback for a transfer or batch: the stall clock and the status's
  // bytes done (called on the service thread, after each chunk).
  stage::ProgressFn transfer_progress();

  stage::Comm& data_;
  stage::Comm* nested_;
  ControlPlane& ctl_;
  stage::SourceReader& src_;
  stage::LocalStore& store_;
  const GroupConfig cfg_;

  mutable std::mutex m_;
  std::condition_variable service_cv_;
  mutable std::condition_variable epoch_cv_;  // epoch_ or stats_.budget_stops grew (wait_for_*)
  std::map<Key, std::shared_ptr<Waiter>> waits_;
  std::deque<Message> outbox_;  // requests not yet handed to the control plane
  uint64_t epoch_ = 0;          // completed transfers
  // The epoch at which each directory's latest batch succeeded on this node.
  std::map<std::string, uint64_t> batch_done_;
  // Directories whose batch failed (both runs): their small files are staged alone from then
  // on, for the life of the mount, so one bad file does not cost every open a failed batch.
  std::set<std::string> batch_failed_;
  // The batch this node runs now: an open that misses a file of its directory waits for its
  // end instead of asking for another batch (a file the batch did not cover is then staged
  // alone by the caller).
  std::set<std::string> batch_running_;
  // The single-file transfer in progress and its LiveCopy (read_during_copy).
  std::map<std::string, std::shared_ptr<LiveCopy>> live_;
  bool shutdown_requested_ = false;
  GroupState state_ = GroupState::running;
  Clock::time_point last_progress_;
  GroupStats stats_;
  Clock::time_point current_start_;
  bool stop_watchdog_ = false;
  std::condition_variable watchdog_cv_;
  std::thread watchdog_;

  // service thread only
  std::optional<Coordinator> coord_;  // on the coordinator's node
  uint64_t last_seen_id_ = 0;         // the latest announcement this node started to run
  bool shutdown_sent_ = false;        // this node asked the group to shut down
  // Announcements that arrived while a transfer ran (nested batches), in order.
  std::deque<Message> deferred_;
  std::vector<Key> running_;  // the keys of the transfers running here (outer, nested)
  uint64_t marked_ = 0;       // source rank: the latest nested batch it put a mark in the stream for
  // Coordinator's node: slices that left names out (announcement, first name left out), for
  // the Coordinator once the requests that arrived meanwhile are in (coordinate()).
  struct Continuation {
    Message after;
    std::string next;
    Coordinator::Spent spent;
  };
  std::vector<Continuation> continuations_;
};

}  // namespace stagefs
