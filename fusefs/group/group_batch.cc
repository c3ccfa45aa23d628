// GroupService (group.h): a batch of small files, from its options to its waiters' answer.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <thread>
#include <utility>

#include "fusefs/base/log.h"
#include "fusefs/group/group.h"

namespace stagefs {

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
    if (r.report.ok && r.report.nodes_needing > 0 && !r.report.next_slice.empty())
      continuations_.push_back(Continuation{a, r.report.next_slice, tally.spent});
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
  opt.selection.range = stage::SelectionSlice{a.from, a.until, (a.flags & kToEnd) != 0,
                                              cfg_.batches.batch_max_files, cfg_.batches.batch_max_bytes};
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
  const std::string why = report.ok               ? std::string()
                          : report.errors.empty() ? "transfer failed"
                                                  : report.errors.front();
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
    log_info(
        "prefetch of {} skipped ({}); it never evicts a copy{}", shown, why,
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

}  // namespace stagefs
