// The transfer's phases in order (bcast/transfer/transfer.h names the file of each), its outcome,
// and the public entry point.
#include "bcast/transfer/engine.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>

#include "bcast/transfer/transfer.h"

namespace stage {
namespace engine {

StageReport Transfer::report(bool ok, Clock::time_point t0) {
  r_.ok = ok;
  r_.bytes_read_source = read_source_;
  r_.bytes_read_seed = read_seed_;
  if (local_err_) r_.local_error = local_err_->code;
  // The source's own failure (not a node's, not a seed's replaced feed): its errno everywhere.
  if (!ok && !local_err_ && root_errno_ != 0)
    r_.source_error = std::error_code(root_errno_, std::generic_category());
  r_.exit_code = ok ? 0 : 1;
  r_.t.total = since(t0);
  return r_;
}

// A collective failure (MPI error, malformed message) ends the transfer here: no further
// collectives are attempted, every temporary file is removed by the Txn destructors.
StageReport Transfer::comm_broke(const Status& st, Clock::time_point t0) {
  r_.comm_broken = true;
  std::string msg = st.error().message;
  if (seeded_)  // a seed's node lost mid-copy: say which one fed the stream
    msg += " (the transfer was fed by rank " + std::to_string(data_root_) + host_of(comm_, data_root_) +
           "'s copy)";
  r_.errors.push_back(msg);
  spdlog::error("{}", msg);
  return report(false, t0);
}

// Metadata, decision and preparation. A report: the transfer ended there (nothing to copy,
// or a failure); nullopt: the copy goes ahead.
std::optional<StageReport> Transfer::plan_and_prepare(Clock::time_point t0) {
  if (auto st = share_manifest(); !st) {
    if (st.error().code == make_error_code(Errc::comm_failed)) return comm_broke(st, t0);
    r_.errors.push_back(st.error().message);
    return report(false, t0);  // the source's error, identical on every rank
  }
  r_.t.metadata = since(t0);

  const auto t_pre = Clock::now();
  if (auto st = decide(); !st) {
    if (st.error().code != make_error_code(Errc::peer_failed)) return comm_broke(st, t0);
    r_.errors.push_back(st.error().message);
    return report(false, t0);
  }
  const bool any_need = std::any_of(need_any_.begin(), need_any_.end(), [](int64_t v) { return v != 0; });
  if (!any_need) {  // the same on every rank: nothing to read, nothing to send
    auto failed = allreduce_max(comm_, local_err_ ? 1 : 0);
    r_.t.prevalidate = since(t_pre);
    if (!failed) return comm_broke(Status(failed.error()), t0);
    if (*failed != 0) {
      collect_errors();
      return report(false, t0);
    }
    return report(true, t0);
  }
  if (auto st = prepare(); !st) {
    r_.t.prevalidate = since(t_pre);
    if (st.error().code != make_error_code(Errc::peer_failed)) return comm_broke(st, t0);
    txn_.clear();
    collect_errors();
    return report(false, t0);
  }
  r_.t.prevalidate = since(t_pre);
  return std::nullopt;
}

// The outcome, and the slowest rank's pipeline figures (microseconds) in the same allreduce;
// then how many nodes published. r_.ok holds the outcome.
Status Transfer::share_outcome() {
  PipelineTimes& p = r_.pipe;
  std::array<double*, 7> figures{&p.read,  &p.read_wait,  &p.bcast, &p.verify,
                                 &p.write, &p.write_wait, &p.sync};
  // Bytes read: one rank reads each kind, so the max is its figure.
  constexpr size_t kFig = 4;
  std::array<int64_t, kFig + figures.size()> outcome{source_err_ ? 1 : 0, local_err_ ? 1 : 0,
                                                     static_cast<int64_t>(read_source_),
                                                     static_cast<int64_t>(read_seed_)};
  for (size_t k = 0; k < figures.size(); ++k) outcome[kFig + k] = static_cast<int64_t>(*figures[k] * 1e6);
  if (auto st = comm_.allreduce_max(outcome); !st) return st;
  for (size_t k = 0; k < figures.size(); ++k) *figures[k] = static_cast<double>(outcome[kFig + k]) * 1e-6;
  read_source_ = static_cast<uint64_t>(outcome[2]);
  read_seed_ = static_cast<uint64_t>(outcome[3]);
  auto written = allreduce_sum(comm_, published_ ? 1 : 0);
  if (!written) return written.error();
  r_.nodes_written = *written;
  r_.ok = outcome[0] == 0 && outcome[1] == 0;
  return {};
}

StageReport Transfer::run() {
  const auto t0 = Clock::now();
  if (auto ended = plan_and_prepare(t0)) return *ended;
  const auto t_copy = Clock::now();
  for (;;) {
    if (auto st = copy(); !st) return comm_broke(st, t0);
    if (!refeed_) break;  // the same on every rank (the trailer)
    if (auto st = feed_again(); !st) return comm_broke(st, t0);
    if (source_err_) break;  // no rank could go on
  }
  finish();
  r_.t.copy = since(t_copy) - r_.t.postvalidate;  // includes fsync and rename
  if (auto st = share_outcome(); !st) return comm_broke(st, t0);
  collect_errors();
  return report(r_.ok, t0);
}

}  // namespace engine

StageReport stage_transfer(Comm& comm, SourceReader* source, LocalStore& store, const StageOptions& opt,
                           const StageEndpoint& ep, const ProgressFn& progress) {
  engine::Transfer t(comm, source, store, opt, ep, progress);
  return t.run();
}

}  // namespace stage
