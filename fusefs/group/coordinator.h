// Coordinator: the decisions of a mount group's coordinator (rank 0), as a pure state
// machine: requests in, announcements out. No MPI, no threads, no clocks: GroupService feeds
// it what its control plane received and broadcasts what it decides; the unit tests feed it
// N simulated ranks (tests/unit/test_coordinator.cc).
//
// Rules (the same order on every rank comes from the control plane: at most one announcement
// outstanding, each one started after the previous completed):
//   - Keys: a request names a key, (materialize, FILE) or (batch, DIR). A node asks for a
//     small file's directory as a batch (GroupService decides by size), so every small file
//     of one directory shares the key of its batch; the rules below apply per key.
//   - Merge: a key already queued is not queued again, so however many threads and nodes
//     open one file (or small files of one directory) at once, it costs one transfer.
//   - Answered already: a request carries the id of the latest announcement its node had
//     seen. If the key was announced later than that (announced id > request id), the node
//     will see that announcement and it answers the request: the request is dropped.
//   - Shutdown: the first shutdown request jumps the queue; it is the last announcement.
//     Requests after it are dropped (their nodes fail their opens with ESHUTDOWN when they
//     see it), and nothing is announced after it.
//   - Nested (only with nesting on): while the coordinator's node runs the
//     transfer of one file (on_started .. on_finished of a materialize announcement), the
//     first queued batch, and only a batch, is announced as batch_nested; while it runs a
//     background transfer of one file (file_prefetch: no open had asked for it), the first
//     queued request in turn, a batch or a file, is announced nested (batch_nested,
//     file_nested): an open never waits behind a background copy of a large file. At most one
//     nested transfer is open at a time (from its announcement to its on_finished); nothing
//     else is announced while a transfer runs (nor after a shutdown request), and shutdown
//     waits for its end. Without on_started calls (or with nesting off) one announcement runs
//     at a time, in request order.
//   - Walks (readers that walk a tree; only with walks on): once opens have asked
//     for the batches of two different directories with the same parent, that parent is a
//     walk, reported once by take_walks(). The caller lists the parent's subdirectories
//     (the coordinator does no I/O) and hands each to prefetch(): a batch key queued behind
//     every request, announced only when no request waits (a request for it moves it
//     ahead: promoted), never nested in a running transfer, and never queued if its key was
//     announced already in this mount (an open of a file that changed since asks again).
//     So the source reads and broadcasts the next directories while readers read the last.
//     It is announced as batch_prefetch (no open asked for it yet), which never evicts a
//     copy; when one did not fit, the caller drops the rest of the queue (drop_prefetches).
//   - Turns (fairness between users, by cost): requests queue per uid (the requester's,
//     Message::uid), first come first served within a uid. Each uid has a tally of the work
//     run for it (charge(): what a transfer cost, transfer_cost(), known once it ran, so no
//     request can understate it), and each announcement goes to the uid with something
//     queued whose tally is lowest; ties go to the uid whose turn came longest ago (so with
//     equal costs the uids take turns, one announcement each). A uid with nothing queued
//     banks nothing: when it asks again its tally is raised to the tally of the last uid
//     served. So one user's backlog (a directory of 100,000 files in slices, a prefetch of
//     thousands of names, large files) delays another user's open by at most the one
//     transfer or slice in progress and one per other waiting user, and a user whose
//     transfers cost more gets fewer of them: another user's cheap opens go before its next
//     expensive one until their costs are even.
//   - Slices (bounded batches): a batch stages at most the group's batch limits of files and
//     bytes, the slice of the directory's names from Message::from (the opened file) on,
//     round to where it started. When a slice leaves names out, the group's node tells the
//     coordinator (continue_batch) and the next slice, the rest of the range, queues at the
//     back of the same uid's queue (a walk's: behind every request), so other requests run
//     between the slices.
//     A slice that found nothing to copy on any node ends the sequence (the rest is staged
//     already, or is staged at its own opens): a new file in a big staged directory costs one
//     slice, not a check of every name.
//   - Background requests (Message::flags kBackground: stagectl prefetch, a replayed
//     profile): queued with the walks' prefetches, behind every request; a request for the
//     same key promotes it. A background file is announced as file_prefetch (it never evicts).
//   - Budgets (what staging beyond the files opened may take): one walk's prefetched slices
//     list at most the budget's files and bytes of small files (batch_ran: each file charged
//     at least what its copy takes, so empty files are not free); past it, that walk's
//     queued prefetches are dropped. Likewise the slices of one sequence, a request's batch
//     and the slices that follow it (continue_batch stops queueing them), so one open in a
//     directory of 200,000 empty files stages a budget's worth, not the directory. A slice
//     after the first lists at most what its budget has left (slice_left). An open of a file
//     past them starts a sequence of its own.
// Ids are 1, 2, 3... in announcement order (shutdown included), so an id orders every
// announcement a node has seen.
//
// Not thread-safe: owned by the service thread of the coordinator's node.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "fusefs/group/control.h"

namespace stagefs {

struct CoordinatorStats {
  uint64_t requests = 0;
  uint64_t merged = 0;            // key already queued
  uint64_t already_answered = 0;  // announced after the node's last seen id
  uint64_t announced = 0;         // transfers (shutdown not counted)
  uint64_t batches = 0;           // of which directory batches
  uint64_t nested = 0;            // of which announced nested in a running transfer (batch or file)
  uint64_t walks = 0;             // parents found walked (take_walks)
  uint64_t prefetched = 0;        // batches announced from prefetch() (not asked for by then)
  uint64_t promoted = 0;          // prefetch keys a request moved ahead
  uint64_t prefetch_dropped = 0;  // prefetch keys dropped unannounced (drop_prefetches, budget)
  uint64_t continued = 0;         // next slices queued by continue_batch
  uint64_t budget_stopped = 0;    // sequences whose next slice a spent budget held back
};

// What a transfer cost the group, in bytes: the bytes it moved, plus a fixed cost for each
// chunk (a chunk of holes moves no bytes but still takes a turn of every rank's loop), for
// each file (its stat and, on every writing node, its open, origin record and rename) and for
// the transfer (its collectives). A sparse file's holes of whole chunks cost nothing: they
// never travel.
inline constexpr uint64_t kChunkCost = uint64_t{64} << 10;
inline constexpr uint64_t kFileCost = uint64_t{64} << 10;
inline constexpr uint64_t kTransferCost = uint64_t{1} << 20;
inline uint64_t transfer_cost(uint64_t bytes_moved, uint64_t chunks, uint64_t files) {
  return bytes_moved + chunks * kChunkCost + files * kFileCost + kTransferCost;
}

class Coordinator {
 public:
  // A request from any rank (the coordinator's own node included).
  void on_request(const Message& m);
  // The next announcement to broadcast, if one may start now: none is outstanding and one is
  // queued. The caller must broadcast it, then report its completion with on_announced().
  std::optional<Message> next_announcement();
  // The outstanding announcement completed (the coordinator's own poll returned it).
  void on_announced(const Message& m);
  // The coordinator's node starts / ends running announcement m (nested ones included).
  void on_started(const Message& m);
  void on_finished(const Message& m);
  // Announcement a ran (on every rank) and cost `cost` (transfer_cost): the uid whose request
  // it answered is charged (see Turns). Prefetched and background ones charge nobody: they run
  // only when no request waits.
  void charge(const Message& a, uint64_t cost);
  void set_nesting(bool on) { nesting_ = on; }
  // Walks: the parents found walked since the last call (each parent once per coordinator).
  void set_walks(bool on) { walks_on_ = on; }
  std::vector<std::string> take_walks();
  // Queue the batch of dir behind every request (see Walks above). False: not queued (asked
  // for, queued or announced already, or a shutdown).
  bool prefetch(const std::string& dir);
  // What small files a walk or a sequence listed, or may list (see Budgets above).
  struct Spent {
    uint64_t bytes = 0, files = 0;
  };
  // The budget of one walk and of one sequence (bytes as the caller charges them; 0: no limit).
  void set_budget(uint64_t bytes, uint64_t files) { budget_ = Spent{bytes, files}; }
  // Batch announcement a ran on the coordinator's node (every batch does, whatever its
  // outcome) and its slice listed `files` small files charged `bytes`: counted against its
  // walk (a walk's prefetched slice; past the budget, that walk's queued prefetches are
  // dropped) or its sequence. spent: the walk's or sequence's total now (for continue_batch);
  // over: the budget is spent (a walk's: by this slice); dropped: prefetches that went with it.
  struct Tally {
    Spent spent;
    bool walk = false;  // a walk's slice
    bool over = false;
    size_t dropped = 0;
  };
  Tally batch_ran(const Message& a, uint64_t bytes, uint64_t files);
  // What batch announcement a's slice may still list (UINT64_MAX: no limit); nullopt: only the
  // batch limits apply (a request's first slice, which the open asked for).
  [[nodiscard]] std::optional<Spent> slice_left(const Message& a) const;
  // Batch announcement a ran on the coordinator's node, found something to copy, and its
  // slice left out the names from `next` on ("" none): queue the directory's next slice (see
  // Slices above), unless its sequence's budget is spent (`spent`, from batch_ran): then
  // false (the rest waits for its own opens).
  bool continue_batch(const Message& a, const std::string& next, Spent spent);
  bool continue_batch(const Message& a, const std::string& next) { return continue_batch(a, next, Spent{}); }
  // Forget every walk's prefetch key not yet announced (a prefetched batch found no room
  // without evicting: the next ones would not either). Returns how many were dropped.
  // Requests (background ones included) and later walks are unaffected.
  size_t drop_prefetches();

  [[nodiscard]] bool outstanding() const { return outstanding_; }
  [[nodiscard]] bool shut_down() const { return shutdown_announced_; }
  [[nodiscard]] size_t queued() const {
    return queued_.size() + later_set_.size() + (shutdown_queued_ && !shutdown_announced_ ? 1 : 0);
  }
  [[nodiscard]] const CoordinatorStats& stats() const { return stats_; }

 private:
  void note_batch_request(const std::string& dir);
  using Key = std::pair<MsgType, std::string>;
  // What a queued key is announced with.
  struct Pending {
    uint32_t uid = 0;
    std::string from, until;          // batches: the slice ...
    uint8_t flags = 0;                // ... and its kToEnd
    std::optional<std::string> walk;  // a walk's prefetch: the walked parent
    bool continued = false;           // a slice after its sequence's first...
    Spent spent{};                    // ...and what the sequence listed before it
    uint64_t later_seq = 0;           // background: its entry in later_
  };
  void enqueue(Key key, Pending p);
  // Behind every request (later_); false if the key is there already.
  bool queue_later(Key key, Pending p);
  // Removes and returns the key to announce next: the first of the uid whose turn it is, or
  // with batch_only the first batch in turn order (a nested one).
  std::optional<Key> take_turn(bool batch_only);
  Message announce(MsgType type, const Key& key, const Pending& p);
  // Requests: per uid in arrival order; turns_ holds each uid with a non-empty queue once,
  // the one whose turn came longest ago first (it breaks ties of tally_).
  std::map<Key, Pending> queued_;
  std::map<uint32_t, std::deque<Key>> by_uid_;
  std::deque<uint32_t> turns_;
  // Turns by cost: each uid's tally of what was run for it, the tally of the uid served last
  // (where a uid that asks again starts), and the uid each announcement taken from the
  // queues is charged to (until charge()).
  std::map<uint32_t, uint64_t> tally_;
  uint64_t served_tally_ = 0;
  std::map<uint64_t, uint32_t> charge_to_;
  // Prefetched batches and background requests, behind every request: later_set_ holds the
  // ones still queued, later_ their order (a promoted or dropped one stays in later_ until
  // reached, then is skipped: its sequence number is no longer the key's).
  std::deque<std::pair<Key, uint64_t>> later_;
  std::map<Key, Pending> later_set_;
  uint64_t later_seq_ = 0;
  bool walks_on_ = false;
  // Walks: per parent, the first directory asked for as a batch (until a second one makes it
  // a walk, then the parent goes to walked_).
  std::map<std::string, std::string> first_child_;
  std::set<std::string> walked_;
  std::vector<std::string> new_walks_;
  // Budgets: what each walk's prefetched slices listed; the walk of each prefetched directory
  // announced (its continuation belongs to the same walk); for each batch announced and not
  // yet ran that is not a walk's, its sequence (continued or not, and what it listed before).
  [[nodiscard]] bool over(const Spent& s) const {
    return (budget_.bytes > 0 && s.bytes >= budget_.bytes) || (budget_.files > 0 && s.files >= budget_.files);
  }
  [[nodiscard]] Spent left(const Spent& s) const;
  Spent budget_;
  std::map<std::string, Spent> walk_spent_;
  std::map<std::string, std::string> walk_of_;
  std::map<uint64_t, std::pair<bool, Spent>> sequence_of_;
  // The id of the latest announcement of each key.
  std::map<Key, uint64_t> announced_id_;
  bool shutdown_queued_ = false;
  bool shutdown_announced_ = false;
  bool outstanding_ = false;
  bool nesting_ = false;
  std::optional<Message> running_;  // the transfer the coordinator's node runs (outer one)
  uint64_t nested_open_ = 0;        // id of the nested transfer announced and not yet finished
  uint64_t next_id_ = 1;
  CoordinatorStats stats_;
};

}  // namespace stagefs
