#include "fusefs/group.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <thread>
#include <utility>

#include "fusefs/log.h"

namespace stagefs {

class GroupService::NestHook final : public stage::Nest {
 public:
  explicit NestHook(GroupService& g) : g_(g) {}
  stage::Status poll() override { return g_.nest_poll(); }
  uint32_t mark() override { return g_.nest_mark(); }
  stage::Status run(uint32_t token) override { return g_.nest_run(token); }

 private:
  GroupService& g_;
};

GroupService::GroupService(stage::Comm& data, ControlPlane& ctl, stage::SourceReader& src,
                           stage::LocalStore& store, GroupConfig cfg, stage::Comm* nested)
    : data_(data),
      nested_(nested),
      ctl_(ctl),
      src_(src),
      store_(store),
      cfg_(std::move(cfg)),
      last_progress_(Clock::now()) {
  if (ctl_.is_coordinator()) {
    coord_.emplace();
    coord_->set_nesting(cfg_.nest_batches && nested_ != nullptr);
    coord_->set_walks(cfg_.prefetch_siblings && cfg_.small_file_size > 0);
    coord_->set_budget(cfg_.walk_max_bytes, cfg_.walk_max_files);
  }
  watchdog_ = std::thread([this] { watchdog(); });
}

GroupService::~GroupService() {
  Ready ready;
  {
    std::lock_guard lk(m_);
    stop_watchdog_ = true;
    ready = fail_all_locked(stage::sys_error(ESHUTDOWN, "materialize (mount is shutting down)"));
  }
  watchdog_cv_.notify_all();
  watchdog_.join();
  run_ready(ready);
}

namespace {
Message request(MsgType type, std::string path, const Want& want) {
  return Message{type, 0, std::move(path), want.uid, want.background ? kBackground : uint8_t{0}, {}, {}};
}
}  // namespace

void GroupService::materialize_async(const std::string& rel, const Want& want, Done done) {
  wait_for(request(MsgType::materialize, rel, want), want.may_evict, std::move(done));
}

void GroupService::materialize_small_async(const std::string& rel, uint64_t since, const Want& want,
                                           Done done) {
  if (cfg_.small_file_size == 0) return materialize_async(rel, want, std::move(done));
  std::string dir = batch_dir_of(rel);
  {
    std::unique_lock lk(m_);
    if (batch_failed_.contains(dir)) {
      lk.unlock();
      return materialize_async(rel, want, std::move(done));
    }
  }
  Message ask = request(MsgType::batch, std::move(dir), want);
  ask.from = rel.substr(rel.rfind('/') + 1);  // npos + 1 = 0: a file at the root
  wait_for(std::move(ask), want.may_evict, std::move(done), since);
}

void GroupService::materialize_live_async(const std::string& rel, const Want& want, Done done, LiveStarted on_live) {
  if (!cfg_.read_during_copy) return materialize_async(rel, want, std::move(done));
  wait_for(request(MsgType::materialize, rel, want), want.may_evict, std::move(done), UINT64_MAX,
           std::move(on_live));
}

// The transfer of rel runs here, its temporary file open: the opens waiting for it go on.
void GroupService::live_started(const std::string& rel) {
  std::vector<std::pair<LiveStarted, Done>> on_live;
  std::shared_ptr<LiveCopy> live;
  {
    std::lock_guard lk(m_);
    auto l = live_.find(rel);
    if (l == live_.end()) return;
    live = l->second;
    if (auto it = waits_.find(Key{MsgType::materialize, rel}); it != waits_.end()) on_live = std::move(it->second->on_live);
  }
  for (auto& [e, d] : on_live) e(live);
}

uint64_t GroupService::epoch() const {
  std::lock_guard lk(m_);
  return epoch_;
}

bool GroupService::wait_for_epoch(uint64_t at_least, std::chrono::milliseconds timeout) const {
  std::unique_lock lk(m_);
  return epoch_cv_.wait_for(lk, timeout, [&] { return epoch_ >= at_least; });
}

bool GroupService::wait_for_budget_stops(uint64_t at_least, std::chrono::milliseconds timeout) const {
  std::unique_lock lk(m_);
  return epoch_cv_.wait_for(lk, timeout, [&] { return stats_.budget_stops >= at_least; });
}

bool GroupService::batch_running(const std::string& rel) const {
  const std::string dir = batch_dir_of(rel);
  std::lock_guard lk(m_);
  return batch_running_.contains(dir);
}

void GroupService::wait_for(Message ask, bool may_evict, Done done, uint64_t since, LiveStarted on_live) {
  const Key key{ask.type, ask.path};
  std::unique_lock lk(m_);
  const std::string& rel = key.second;
  if (on_live) {  // the copy is in progress here: no new request, go on with it
    if (auto l = live_.find(rel); l != live_.end() && l->second->ready()) {
      auto live = l->second;
      lk.unlock();
      return on_live(std::move(live));
    }
  }
  if (key.first == MsgType::batch) {
    // The directory's batch completed after the caller looked into the cache: that look may
    // have come just before the copy was published. Answered: the caller looks again.
    if (auto it = batch_done_.find(key.second); it != batch_done_.end() && it->second > since) {
      lk.unlock();
      return done({});
    }
  }
  if (state_ == GroupState::broken) {
    lk.unlock();
    return done(stage::stage_error(stage::Errc::group_broken, "materialize", rel));
  }
  if (state_ == GroupState::shut_down || shutdown_requested_) {
    lk.unlock();
    return done(stage::sys_error(ESHUTDOWN, "materialize (mount is shutting down)", rel));
  }
  auto& slot = waits_[key];
  const bool running_here = key.first == MsgType::batch && batch_running_.contains(key.second);
  if (!slot) {  // first open of this file (batch) on this node: one request, shared by later opens
    slot = std::make_shared<Waiter>();
    slot->requested = Clock::now();
    slot->ask = std::move(ask);
    if (!running_here) ask_locked(slot->ask);
    watchdog_cv_.notify_all();
  } else if ((slot->ask.flags & kBackground) != 0 && (ask.flags & kBackground) == 0) {
    // An open joins a background wait (a replay's, a prefetch's): it asks as an open, so that
    // the coordinator moves the key ahead of the background queue.
    slot->ask = std::move(ask);
    if (!running_here) ask_locked(slot->ask);
  }
  slot->may_evict = slot->may_evict || may_evict;
  if (on_live)
    slot->on_live.emplace_back(std::move(on_live), std::move(done));
  else
    slot->callbacks.push_back(std::move(done));
}

// The stall rule for every waiting open, on a thread of its own.
void GroupService::watchdog() {
  std::unique_lock lk(m_);
  while (!stop_watchdog_) {
    // Armed while an open waits, or while a copy opened during its transfer runs (its reads may
    // wait for chunks: the same stall rule for them, checked every stall_timeout / 4).
    if ((waits_.empty() && live_.empty()) || state_ != GroupState::running) {
      watchdog_cv_.wait(lk);
      continue;
    }
    auto oldest = Clock::time_point::max();
    for (const auto& [rel, w] : waits_) oldest = std::min(oldest, w->requested);
    for (const auto& [rel, live] : live_)
      if (auto t = live->oldest_wait()) oldest = std::min(oldest, *t);
    if (oldest == Clock::time_point::max()) {  // only copies in progress, no read waits
      watchdog_cv_.wait_for(lk, std::max<std::chrono::milliseconds>(cfg_.stall_timeout / 4, std::chrono::milliseconds(10)));
      continue;
    }
    const auto deadline = std::max(oldest, last_progress_) + cfg_.stall_timeout;
    if (Clock::now() < deadline) {
      watchdog_cv_.wait_until(lk, deadline);
      continue;
    }
    const std::string rel = waits_.empty() ? (live_.empty() ? std::string("-") : live_.begin()->first)
                            : waits_.begin()->first.first == MsgType::batch
                                ? "the small files of " + (waits_.begin()->first.second.empty() ? std::string("/")
                                                                                               : waits_.begin()->first.second)
                                : waits_.begin()->first.second;
    log_error("{}: no progress on {} for {} s: mount group marked broken", stage::host_name(), rel,
              std::chrono::duration<double>(cfg_.stall_timeout).count());
    state_ = GroupState::broken;
    Ready ready = fail_all_locked(stage::stage_error(stage::Errc::timed_out, "materialize", rel));
    lk.unlock();
    run_ready(ready);
    lk.lock();
  }
}

GroupService::Ready GroupService::fail_all_locked(const stage::Error& e) {
  Ready ready;
  for (auto& [rel, w] : waits_) {
    for (auto& cb : w->callbacks) ready.emplace_back(std::move(cb), e);
    for (auto& [on_live, cb] : w->on_live) ready.emplace_back(std::move(cb), e);
  }
  waits_.clear();
  outbox_.clear();
  // Reads waiting for chunks of a copy in progress fail too (EIO for what is missing): the
  // service thread may never come back from MPI to end it.
  for (auto& [rel, live] : live_)
    ready.emplace_back([live, why = e.code](const stage::Status&) { live->end(false, why); }, e);
  return ready;
}

void GroupService::run_ready(Ready& r) {
  for (auto& [cb, st] : r) cb(std::move(st));
  r.clear();
}

void GroupService::request_shutdown() {
  std::lock_guard lk(m_);
  shutdown_requested_ = true;
  service_cv_.notify_one();
}

GroupState GroupService::state() const {
  std::lock_guard lk(m_);
  return state_;
}

GroupStats GroupService::stats() const {
  std::lock_guard lk(m_);
  GroupStats s = stats_;
  s.waiting = waits_.size();
  if (!s.current.empty()) s.current_seconds = std::chrono::duration<double>(Clock::now() - current_start_).count();
  return s;
}

void GroupService::mark_progress() {
  std::lock_guard lk(m_);
  last_progress_ = Clock::now();
}

stage::ProgressFn GroupService::transfer_progress() {
  return [this](uint64_t done, uint64_t total) {
    std::lock_guard lk(m_);
    last_progress_ = Clock::now();
    stats_.current_done = done;
    stats_.current_total = total;
  };
}

void GroupService::ask_locked(const Message& ask) {
  outbox_.push_back(ask);
  ++stats_.requests_sent;
  service_cv_.notify_one();
}

void GroupService::complete(const Key& key, const stage::Status& st) {
  std::vector<Done> cbs;
  {
    std::lock_guard lk(m_);
    ++epoch_;
    epoch_cv_.notify_all();
    if (key.first == MsgType::batch) batch_running_.erase(key.second);
    if (key.first == MsgType::batch && st.ok()) batch_done_[key.second] = epoch_;
    auto it = waits_.find(key);
    if (it == waits_.end()) return;
    cbs = std::move(it->second->callbacks);
    for (auto& [on_live, cb] : it->second->on_live) cbs.push_back(std::move(cb));
    waits_.erase(it);
  }
  for (auto& cb : cbs) cb(st);
}

stage::StageOptions GroupService::transfer_options() const {
  stage::StageOptions opt = cfg_.bcast;
  opt.pre = stage::Validate::origin;
  opt.recursive = false;
  opt.root = 0;
  opt.seed_from_copies = cfg_.seed_from_copies;
  opt.cancelled = cfg_.cancelled;
  opt.source_version = cfg_.bcast.source_version;
  return opt;
}

void GroupService::count_reads_locked(const stage::StageReport& r) {
  stats_.bytes_from_source += r.bytes_read_source;
  stats_.bytes_from_seeds += r.bytes_read_seed;
  stats_.feed_retries += static_cast<uint64_t>(r.feed_retries);
  if (r.ok && r.fed_from_copy && r.fed_by == data_.rank()) ++stats_.seeded_here;
}

std::string GroupService::fed_by(const stage::StageReport& r) const {
  if (r.fed_by < 0) return "";
  const std::string again =
      r.feed_retries > 0 ? " (after " + std::to_string(r.feed_retries) + " failed feed(s) from other caches)"
                         : "";
  if (!r.fed_from_copy) return ", fed by the source" + again;
  return ", fed by rank " + std::to_string(r.fed_by) + "'s cache" +
         (r.fed_by == data_.rank() ? " (this node, " + stage::host_name() + ")" : std::string()) + again;
}

// A transfer of one file: an open's (materialize), a background one (file_prefetch: it evicts
// nothing here), or an open's nested in a background one (file_nested, on the nested Comm).
GroupService::Ran GroupService::run_transfer(const Message& a, stage::Comm& comm) {
  const auto t0 = Clock::now();
  const bool nested = a.type == MsgType::file_nested;
  stage::StageOptions opt = transfer_options();
  // The source reader resolves a.path beneath SOURCE_DIR (BeneathSource); the copy goes to the
  // same relative path in the cache.
  NestHook nest(*this);
  if (nested_ != nullptr && !nested) opt.nest = &nest;
  std::shared_ptr<LiveCopy> live = start_live(a.path);
  opt.live_copy = live.get();
  const stage::Status room = cfg_.admission
                                 ? cfg_.admission->before_transfer(a.path, a.type != MsgType::file_prefetch)
                                 : stage::Status{};
  const stage::StageEndpoint ep{a.path, stage::join_path(cfg_.cache_dir, a.path), room.ok()};
  ShownTransfer outer = show_batch(a.path, t0);
  auto report = stage::stage_transfer(comm, &src_, store_, opt, ep, transfer_progress());
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  if (live) end_live(a.path, *live, report);
  if (cfg_.admission) cfg_.admission->after_transfer(a.path, report.ok);
  if (cfg_.transfer_ended) cfg_.transfer_ended(secs, report.ok);
  {
    std::lock_guard lk(m_);
    stats_.current.clear();
    if (nested) {
      ++stats_.nested_files;
      show_again_locked(std::move(outer));
    }
    ++stats_.transfers;
    // A file every node already held (a replayed profile's, on warm caches) moved nothing.
    if (report.ok && report.nodes_needing == 0) ++stats_.nothing_to_copy;
    stats_.bytes_broadcast += report.bytes_streamed;
    stats_.chunks_broadcast += report.chunks;
    count_reads_locked(report);
    if (report.ok && report.this_node_wrote) ++stats_.local_writes;
    if (!report.ok) ++stats_.failures;
    last_progress_ = Clock::now();
  }
  finish_transfer(a, report, room, secs);
  return Ran{!report.comm_broken, transfer_cost(report.bytes_streamed, report.chunks, report.files)};
}

// With reads during the copy: the transfer's LiveCopy, known to the opens (live_), with the
// chunks a replayed profile wants first on the coordinator's node.
std::shared_ptr<LiveCopy> GroupService::start_live(const std::string& rel) {
  if (!cfg_.read_during_copy) return nullptr;
  auto live = std::make_shared<LiveCopy>([this, rel] { live_started(rel); });
  if (coord_ && cfg_.read_orders)
    live->want_first(cfg_.read_orders->first_chunks(rel, cfg_.bcast.chunk_size));
  std::lock_guard lk(m_);
  live_[rel] = live;
  last_progress_ = Clock::now();
  watchdog_cv_.notify_all();
  return live;
}

void GroupService::end_live(const std::string& rel, LiveCopy& live, const stage::StageReport& report) {
  {
    std::lock_guard lk(m_);
    live_.erase(rel);
  }
  // Reads of chunks that never came: EIO, or the stall error when the data path broke (the
  // core then reads the source for them with --on-stall source).
  live.end(report.ok, report.comm_broken ? stage::make_error_code(stage::Errc::group_broken)
                                         : std::error_code(EIO, std::generic_category()));
  if (cfg_.read_orders)
    if (auto order = live.read_order(); !order.chunks.empty()) cfg_.read_orders->read_during_copy(rel, order);
  const LiveCopy::Stats ls = live.stats();
  std::lock_guard lk(m_);
  stats_.reads_waited_during_copy += ls.reads_waited;
  stats_.chunks_wanted += ls.chunks_wanted;
}

// The transfer's one log line and its waiters' answer.
void GroupService::finish_transfer(const Message& a, const stage::StageReport& report,
                                   const stage::Status& room, double secs) {
  const Key key{MsgType::materialize, a.path};
  if (report.ok && !room.ok()) {
    log_info("{} copied to {} other node(s); not to this one (no room in its cache)", a.path,
                 report.nodes_needing);
    {
      std::lock_guard lk(m_);
      if (a.type == MsgType::file_prefetch && ask_again_evicting_locked(key)) return;
    }
    complete(key, room);
  } else if (report.ok && report.nodes_needing == 0) {
    spdlog::debug("{}: every node holds a current copy{}", a.path,
                  a.type == MsgType::file_prefetch ? " (background)" : "");
    complete(key, {});
  } else if (report.ok) {
    log_info(
        "materialized {} ({} bytes) in {:.3f} s, {:.1f} MB/s, {} of {} node(s) wrote{}{}, reads via {}",
        a.path, report.bytes_total, secs,
        secs > 0 ? static_cast<double>(report.bytes_streamed) / secs / 1e6 : 0.0, report.nodes_needing,
        report.writers, fed_by(report),
        a.type == MsgType::file_nested     ? " (nested)"
        : a.type == MsgType::file_prefetch ? " (background)"
                                           : "",
        cfg_.read_path ? cfg_.read_path() : std::string("-"));
    complete(key, {});
  } else {
    const std::string why = report.errors.empty() ? "transfer failed" : report.errors.front();
    log_error("materialize {} failed: {}", a.path, why);
    // This node's own cause (ENOSPC in its cache...), else the source's (its errno), is what
    // its opens report.
    complete(key, stage::Error{report.local_error    ? report.local_error
                               : report.source_error ? report.source_error
                                                     : stage::make_error_code(stage::Errc::peer_failed),
                               why});
  }
}

bool GroupService::ask_again_evicting_locked(const Key& key) {
  auto w = waits_.find(key);
  if (w == waits_.end() || !w->second->may_evict) return false;
  w->second->ask.flags = 0;  // an open's request now, one that may evict
  ask_locked(w->second->ask);
  return true;
}

// A batch: every small file of directory a.path in one transfer. Collective like a single
// transfer: every rank runs it, every rank sees the same outcome, so every rank agrees on
// the one retry.
GroupService::Ran GroupService::run_batch(const Message& a, stage::Comm& comm) {
  const auto t0 = Clock::now();
  const std::string shown = a.path.empty() ? std::string("/") : a.path + "/";
  ShownTransfer outer = show_batch(shown, t0);
  // A prefetched batch (no open asked for it when it was announced) never evicts, and is
  // not run twice: it is only a head start.
  const bool prefetch = a.type == MsgType::batch_prefetch;
  const BatchRuns r = stage_batch(a, comm, shown, prefetch);
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  if (coord_) {
    // What the slice listed counts against its walk's or sequence's budget.
    const auto tally =
        coord_->batch_ran(a, r.report.bytes_total + r.report.files * cfg_.file_charge, r.report.files);
    if (tally.walk && tally.over) {
      {
        std::lock_guard lk(m_);
        ++stats_.budget_stops;
        epoch_cv_.notify_all();
      }
      log_info(
          "readers walk {}/: its budget is spent ({} small file(s), {} bytes charged): {} more director(ies) "
          "left to their own opens (--prefetch-max-files, --prefetch-max-bytes)",
          batch_dir_of(a.path), tally.spent.files, tally.spent.bytes, tally.dropped);
    }
    // The source rank's scan knows what the slice left out: the next slice queues behind the
    // other users' requests. Only while slices find something to copy on some node.
    // It queues after the requests that arrived during this slice (coordinate()).
    if (r.report.ok && r.report.nodes_needing > 0 && !r.report.batch_next.empty())
      continuations_.push_back(Continuation{a, r.report.batch_next, tally.spent});
  }
  if (cfg_.admission) cfg_.admission->after_batch(a.path, r.published, r.report.ok);
  if (cfg_.transfer_ended) cfg_.transfer_ended(secs, r.report.ok);
  count_batch(a, r, std::move(outer), prefetch);
  finish_batch(a, shown, r, secs, prefetch);
  return Ran{!r.report.comm_broken, transfer_cost(r.streamed, r.chunks, r.report.files)};
}

// The engine's options for one slice of a batch: the same selection on every rank.
stage::StageOptions GroupService::batch_options(const Message& a) const {
  stage::StageOptions opt = transfer_options();
  // A selection on every rank (max_file_size > 0 marks one)
  opt.selection.max_file_size = std::max<uint64_t>(cfg_.small_file_size, 1);
  opt.selection.range = stage::SmallFilesSlice{a.from, a.until, (a.flags & kToEnd) != 0, cfg_.batch_max_files,
                                               cfg_.batch_max_bytes};
  // A walk's slice, or one after a sequence's first, lists at most what its budget has left.
  // Only the source rank's scan uses these limits (the other ranks make room for a slice as
  // large as the batch limits allow: a slice of at most that).
  if (auto left = coord_ ? coord_->slice_left(a) : std::nullopt) {
    const auto cap = [](uint64_t limit, uint64_t rest) {
      if (rest == UINT64_MAX) return limit;
      rest = std::max<uint64_t>(rest, 1);  // the slice's first file is always in
      return limit == 0 ? rest : std::min(limit, rest);
    };
    opt.selection.range.max_files = cap(opt.selection.range.max_files, left->files);
    opt.selection.range.max_bytes = cap(opt.selection.range.max_bytes, left->bytes);
  }
  return opt;
}

// Status shows the batch from now on; returns what it showed before.
GroupService::ShownTransfer GroupService::show_batch(const std::string& shown, Clock::time_point t0) {
  ShownTransfer outer;
  std::lock_guard lk(m_);
  outer.current = std::exchange(stats_.current, shown);
  outer.done = stats_.current_done;
  outer.total = stats_.current_total;
  outer.start = current_start_;
  stats_.current_done = stats_.current_total = 0;
  current_start_ = t0;
  return outer;
}

void GroupService::show_again_locked(ShownTransfer outer) {
  stats_.current = std::move(outer.current);
  stats_.current_done = outer.done;
  stats_.current_total = outer.total;
  current_start_ = outer.start;
}

// The batch's transfer, run once more if it failed (not a prefetch, nor a broken Comm).
GroupService::BatchRuns GroupService::stage_batch(const Message& a, stage::Comm& comm,
                                                  const std::string& shown, bool prefetch) {
  const stage::StageOptions opt = batch_options(a);
  const stage::StageEndpoint ep{a.path, stage::join_path(cfg_.cache_dir, a.path), true};
  const stage::ProgressFn progress = transfer_progress();
  BatchRuns r;
  stage::StageReport& report = r.report;
  stage::StageReport& reads = r.reads;  // where the runs' bytes were read, summed
  for (; r.runs < 2; ++r.runs) {
    if (cfg_.admission) cfg_.admission->before_batch(a.path, opt.selection.range, !prefetch);
    report = stage::stage_transfer(comm, &src_, store_, opt, ep, progress);
    r.streamed += report.bytes_streamed;
    r.chunks += report.chunks;
    reads.bytes_read_source += report.bytes_read_source;
    reads.bytes_read_seed += report.bytes_read_seed;
    reads.feed_retries += report.feed_retries;
    reads.fed_from_copy = report.fed_from_copy;  // the last run's feeder
    reads.fed_by = report.fed_by;
    r.published.insert(r.published.end(), report.published.begin(), report.published.end());
    if (report.ok || report.comm_broken || prefetch) break;
    // Identical on every rank (the outcome is collective): try once more, e.g. after a file
    // changed during the copy.
    if (r.runs == 0)
      log_warn("batch {} failed ({}): staging it once more", shown,
               report.errors.empty() ? "transfer failed" : report.errors.front());
  }
  reads.ok = report.ok;
  return r;
}

// The batch's counters; a nested batch shows the transfer it interrupted again.
void GroupService::count_batch(const Message& a, const BatchRuns& r, ShownTransfer outer, bool prefetch) {
  // Nested in a transfer: status shows that transfer again afterwards.
  const bool nested = a.type == MsgType::batch_nested;
  std::lock_guard lk(m_);
  stats_.current.clear();
  if (nested) {
    ++stats_.nested;
    show_again_locked(std::move(outer));
  }
  ++stats_.transfers;
  if (r.report.ok && r.streamed == 0 && r.report.nodes_needing == 0) ++stats_.nothing_to_copy;
  ++stats_.batches;
  stats_.batch_files += r.published.size();
  stats_.bytes_broadcast += r.streamed;
  stats_.chunks_broadcast += r.chunks;
  count_reads_locked(r.reads);
  if (!r.published.empty()) ++stats_.local_writes;
  if (!r.report.ok) ++(prefetch ? stats_.prefetch_skipped : stats_.failures);
  last_progress_ = Clock::now();
}

// The batch's one log line and its waiters' answer: done, a skipped prefetch asked for
// again, or failed (its small files are staged alone from then on).
void GroupService::finish_batch(const Message& a, const std::string& shown, const BatchRuns& r, double secs,
                                bool prefetch) {
  const stage::StageReport& report = r.report;
  const Key key{MsgType::batch, a.path};
  const std::string why = report.ok ? std::string() : report.errors.empty() ? "transfer failed" : report.errors.front();
  if (report.ok) {
    // One line per batch, whatever the number of files.
    log_info(
        "materialized batch {} ({} small file(s), {} bytes; {} written here) in {:.3f} s{}{} (list {:.3f}, "
        "check {:.3f}, copy {:.3f} of which sync {:.3f}), {} of {} node(s) wrote{}, reads via {}",
        shown, report.files, report.bytes_total, r.published.size(), secs, r.runs > 0 ? " (second run)" : "",
        a.type == MsgType::batch_nested ? " (nested)"
        : prefetch                      ? " (prefetched)"
                                        : "",
        report.t.metadata, report.t.prevalidate, report.t.copy, report.pipe.sync, report.nodes_needing,
        report.writers, fed_by(report), cfg_.read_path ? cfg_.read_path() : std::string("-"));
    complete(key, {});
  } else if (prefetch && !report.comm_broken) {
    // Typically a cache full up to --cache-size: what a prefetch would evict is what readers
    // asked for. Nothing is marked failed (an open of this directory asks for it as usual),
    // and the prefetches still queued go too: they would not fit either. Opens that attached
    // to this batch meanwhile keep waiting and ask for it again, as an ordinary batch (one
    // that may evict); the request says it saw this announcement, so it is not dropped. A
    // wait that may not evict (a replayed profile's) gets the error.
    const size_t dropped = coord_ ? coord_->drop_prefetches() : 0;
    log_info("prefetch of {} skipped ({}); it never evicts a copy{}", shown, why,
                 coord_ ? ": " + std::to_string(dropped) + " more prefetched director(ies) dropped" : std::string());
    {
      std::lock_guard lk(m_);
      batch_running_.erase(a.path);
      if (!waits_.contains(key) || ask_again_evicting_locked(key)) return;
    }
    complete(key, stage::Error{report.local_error ? report.local_error
                                                  : stage::make_error_code(stage::Errc::peer_failed),
                               why});
  } else {
    log_error("batch {} failed: {}; its small files are staged one by one from now on", shown, why);
    if (!report.comm_broken) {
      std::lock_guard lk(m_);
      batch_failed_.insert(a.path);
    }
    complete(key, stage::Error{report.local_error ? report.local_error
                                                  : stage::make_error_code(stage::Errc::peer_failed),
                               why});
  }
}

stage::Status GroupService::control_failed(const stage::Error& e, const char* what) {
  log_error("{}: {} failed: {}", stage::host_name(), what, e.message);
  Ready ready;
  {
    std::lock_guard lk(m_);
    state_ = GroupState::broken;
    ready = fail_all_locked(e);
  }
  run_ready(ready);
  return e;
}

// This node's new first opens (and its shutdown) go to the coordinator: through the control
// plane, or straight into the Coordinator on its own node.
stage::Result<bool> GroupService::forward_local() {
  std::vector<Message> msgs;
  bool want_shutdown = false;
  {
    std::lock_guard lk(m_);
    std::deque<Message> keep;
    for (auto& ask : outbox_) {
      const Key key{ask.type, ask.path};
      if (!waits_.contains(key)) continue;  // a transfer answered it already
      // A transfer of that key runs here now (this is the engine's copy loop calling): it
      // answers the open when it ends. A request now would carry that transfer's id, which
      // the coordinator cannot tell from a need that came after it (a second transfer).
      if (std::find(running_.begin(), running_.end(), key) != running_.end()) {
        keep.push_back(std::move(ask));
      } else {
        ask.id = last_seen_id_;
        msgs.push_back(std::move(ask));
      }
    }
    outbox_ = std::move(keep);
    want_shutdown = shutdown_requested_ && !shutdown_sent_;
  }
  if (want_shutdown) msgs.push_back(Message{MsgType::shutdown, 0, {}});
  for (const auto& m : msgs) {
    if (coord_)
      coord_->on_request(m);
    else if (auto st = ctl_.send_request(m); !st)
      return st.error();
  }
  shutdown_sent_ = shutdown_sent_ || want_shutdown;
  return !msgs.empty();
}

// Coordinator's node: every rank's requests into the Coordinator, its next decision out.
stage::Result<bool> GroupService::coordinate() {
  bool busy = false;
  for (;;) {
    auto r = ctl_.poll_request();
    if (!r) {
      log_warn("{}", r.error().message);  // malformed request: dropped
      continue;
    }
    if (!r->has_value()) break;
    busy = true;
    coord_->on_request(**r);
  }
  for (auto& [a, next, spent] : std::exchange(continuations_, {})) {
    if (coord_->continue_batch(a, next, spent)) continue;
    {
      std::lock_guard lk(m_);
      ++stats_.budget_stops;
      epoch_cv_.notify_all();
    }
    log_info(
        "batch {}/: {} small file(s) ({} bytes charged) listed for the open that asked for it; the rest "
        "is staged at its own opens (--prefetch-max-files, --prefetch-max-bytes)",
        a.path, spent.files, spent.bytes);
  }
  expand_walks();
  if (auto next = coord_->next_announcement()) {
    if (auto st = ctl_.announce(*next); !st) return st.error();
    busy = true;
  }
  return busy;
}

void GroupService::expand_walks() {
  const auto walks = coord_->take_walks();
  if (!walks.empty()) {
    std::lock_guard lk(m_);
    stats_.walks += walks.size();
  }
  for (const std::string& parent : walks) {
    // The budget counts the directories queued: the two asked for may be among those listed.
    const size_t budget = cfg_.walk_max_dirs > 0 ? cfg_.walk_max_dirs : SIZE_MAX;
    auto dirs = src_.list_dirs(parent, budget > SIZE_MAX - 2 ? budget : budget + 2);
    if (!dirs) {
      spdlog::debug("walk of {}/: {}", parent, dirs.error().message);
      continue;
    }
    size_t queued = 0;
    for (const std::string& name : *dirs)
      if (queued < budget && coord_->prefetch(stage::join_path(parent, name))) ++queued;
    {
      std::lock_guard lk(m_);
      stats_.prefetch_queued += queued;
    }
    log_info("readers walk {}/: staging the small files of {} of its subdirectories in the background",
             parent, queued);
  }
}

stage::Result<std::optional<Message>> GroupService::receive() {
  auto a = ctl_.poll_announcement();
  if (a && a->has_value() && coord_) coord_->on_announced(**a);
  return a;
}

bool GroupService::run_announcement(const Message& m) {
  // From now on this node's requests say they saw m: an open that starts waiting before m
  // ends here is answered by m; one before m started (a nested batch's announcement may
  // arrive well before it runs) still asks, and the coordinator drops what m answers.
  if (is_batch(m.type)) {
    std::lock_guard lk(m_);  // before this node's requests say they saw m (see wait_for)
    batch_running_.insert(m.path);
  }
  last_seen_id_ = std::max(last_seen_id_, m.id);
  running_.emplace_back(key_type(m.type), m.path);
  if (coord_) coord_->on_started(m);
  stage::Comm& comm = is_nested(m.type) && nested_ != nullptr ? *nested_ : data_;
  const Ran ran = is_file(m.type) ? run_transfer(m, comm) : run_batch(m, comm);
  if (coord_) {
    coord_->charge(m, ran.cost);
    coord_->on_finished(m);
  }
  running_.pop_back();
  return ran.data_ok;
}

// Inside a transfer (the engine's copy loop, service thread): what run() does between
// transfers, except running them. An announcement that arrives now can only be a nested
// batch (the coordinator announces nothing else while a transfer runs): it waits for its mark.
stage::Status GroupService::nest_poll() {
  auto fwd = forward_local();
  if (!fwd) return fwd.error();
  if (coord_) {
    auto c = coordinate();
    if (!c) return c.error();
  }
  auto a = receive();
  if (!a) return a.error();
  if (a->has_value()) {
    deferred_.push_back(std::move(**a));
    mark_progress();
  }
  return {};
}

// The rank that reads (the source rank, or a seed): a mark for the nested batch announced
// last, once. Every rank receives every announcement, so any rank can place the mark.
uint32_t GroupService::nest_mark() {
  for (const Message& m : deferred_)
    if (is_nested(m.type) && m.id > marked_) {
      marked_ = m.id;
      return nest_token(m.id);
    }
  return 0;
}

// Every rank, at the mark: the nested batch runs now, on the nested Comm. Its announcement
// may still be on its way (the control plane and the stream are separate paths): wait for
// it, within the stall timeout.
stage::Status GroupService::nest_run(uint32_t token) {
  auto first_nested = [&] {
    return std::find_if(deferred_.begin(), deferred_.end(),
                        [](const Message& m) { return is_nested(m.type); });
  };
  const auto t0 = Clock::now();
  auto it = first_nested();
  while (it == deferred_.end()) {
    auto a = receive();
    if (!a) return a.error();
    if (a->has_value()) {
      deferred_.push_back(std::move(**a));
      it = first_nested();
      continue;
    }
    if (cfg_.stall_timeout.count() > 0 && Clock::now() - t0 > cfg_.stall_timeout)
      return stage::stage_error(stage::Errc::timed_out, "the announcement of a nested transfer never came");
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  if (nest_token(it->id) != token)
    return stage::stage_error(stage::Errc::bad_message,
                              "a mark names nested transfer " + std::to_string(token) +
                                  ", the next one announced is " + std::to_string(it->id));
  const Message m = std::move(*it);
  deferred_.erase(it);
  if (!run_announcement(m))
    return stage::stage_error(
        stage::Errc::group_broken,
        "the nested transfer of " + (m.path.empty() ? std::string("/") : m.path) + " broke");
  return {};
}

stage::Status GroupService::run() {
  auto idle = std::chrono::milliseconds(1);
  for (;;) {
    auto fwd = forward_local();
    if (!fwd) return control_failed(fwd.error());
    bool busy = *fwd;
    if (coord_) {
      auto c = coordinate();
      if (!c) return control_failed(c.error());
      busy = busy || *c;
    }
    std::optional<Message> next;
    if (!deferred_.empty()) {  // arrived during the last transfer, not run nested in it
      next = std::move(deferred_.front());
      deferred_.pop_front();
    } else {
      auto a = receive();
      if (!a) return control_failed(a.error());
      next = std::move(*a);
    }
    if (next) {
      busy = true;
      mark_progress();
      const Message& m = *next;
      if (m.type == MsgType::shutdown) {
        Ready ready;
        {
          std::lock_guard lk(m_);
          state_ = GroupState::shut_down;
          ready = fail_all_locked(stage::sys_error(ESHUTDOWN, "materialize (mount group shut down)"));
        }
        run_ready(ready);
        return {};
      }
      const bool data_ok = run_announcement(m);
      if (!data_ok) {
        // The ranks may no longer be in step: no MPI call may follow. The group is broken
        // (later cache misses fail at once or go to the source; cached files are still
        // served) and this thread waits, without MPI, for the mount to be shut down.
        (void)control_failed(stage::stage_error(stage::Errc::group_broken,
                                                "the mount group stops transferring (the broadcast of " +
                                                    (m.path.empty() ? std::string("/") : m.path) + " broke)"),
                             "data path");
        std::unique_lock lk(m_);
        service_cv_.wait(lk, [&] { return shutdown_requested_; });
        return {};
      }
    }
    if (busy) {
      idle = std::chrono::milliseconds(1);
      continue;
    }
    // Idle: sleep until a local request arrives or the poll interval passes (backing off to
    // idle_poll), so remote requests and announcements are still noticed.
    std::unique_lock lk(m_);
    service_cv_.wait_for(lk, idle,
                         [&] { return !outbox_.empty() || (shutdown_requested_ && !shutdown_sent_); });
    idle = std::min(idle * 2, cfg_.idle_poll);
  }
}

}  // namespace stagefs
