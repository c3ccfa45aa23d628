// GroupService (group.h): a transfer of one file, from the cache's admission to its waiters' answer.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <thread>
#include <utility>

#include "fusefs/base/log.h"
#include "fusefs/group/group.h"

namespace stagefs {

// The engine's Nest inside a transfer: the service thread's loop, run from the copy loop
// (group_service.cc).
class GroupService::NestHook final : public stage::Nest {
 public:
  explicit NestHook(GroupService& g) : g_(g) {}
  stage::Status poll() override { return g_.nest_poll(); }
  uint32_t mark() override { return g_.nest_mark(); }
  stage::Status run(uint32_t token) override { return g_.nest_run(token); }

 private:
  GroupService& g_;
};

stage::StageOptions GroupService::transfer_options() const {
  stage::StageOptions opt = cfg_.bcast;
  opt.pre = stage::Validate::recorded;
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
  count_transfer(report, nested, std::move(outer));
  finish_transfer(a, report, room, secs);
  return Ran{!report.comm_broken, transfer_cost(report.bytes_streamed, report.chunks, report.files)};
}

// The transfer's counters; a nested one shows the transfer it interrupted again.
void GroupService::count_transfer(const stage::StageReport& report, bool nested, ShownTransfer outer) {
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
  live.end(report.ok, report.comm_broken ? stage::make_error_code(stage::Errc::comm_broken)
                                         : std::error_code(EIO, std::generic_category()));
  if (cfg_.read_orders)
    if (auto order = live.read_order(); !order.chunks.empty()) cfg_.read_orders->live_reads(rel, order);
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
    log_info("materialized {} ({} bytes) in {:.3f} s, {:.1f} MB/s, {} of {} node(s) wrote{}{}, reads via {}",
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

}  // namespace stagefs
