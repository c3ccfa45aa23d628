#include "fusefs/metrics.h"

#include <fcntl.h>
#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstring>
#include <sstream>

#include "bcast/store.h"

namespace stagefs {

namespace pm = prometheus;

struct MetricsFile::Impl {
  explicit Impl(const std::string& mnt) : registry(std::make_shared<pm::Registry>()), labels{{"mountpoint", mnt}} {
    auto counter = [&](const char* name, const char* help, pm::Labels extra = {}) -> pm::Counter& {
      pm::Labels l = labels;
      l.insert(extra.begin(), extra.end());
      return pm::BuildCounter().Name(name).Help(help).Register(*registry).Add(l);
    };
    auto gauge = [&](const char* name, const char* help) -> pm::Gauge& {
      return pm::BuildGauge().Name(name).Help(help).Register(*registry).Add(labels);
    };
    opens = &counter("stagefs_opens_total", "Opens of regular files on this node");
    hits = &counter("stagefs_cache_hits_total", "Opens served by a copy already in the cache");
    misses = &counter("stagefs_cache_misses_total", "Opens that waited for a materialization");
    transfers = &counter("stagefs_transfers_total", "Collective transfers this node took part in");
    local_writes = &counter("stagefs_local_writes_total", "Transfers in which this node wrote its copy");
    bytes_bcast = &counter("stagefs_bytes_broadcast_total", "Bytes of file data broadcast in transfers");
    evictions = &counter("stagefs_evictions_total", "Copies evicted from the cache");
    evicted_bytes = &counter("stagefs_evicted_bytes_total", "Bytes of copies evicted from the cache");
    prefetches = &counter("stagefs_prefetches_total", "stagectl prefetch requests");
    auto& errors = pm::BuildCounter()
                       .Name("stagefs_errors_total")
                       .Help("Errors by kind: open (failed opens), transfer (failed transfers), corrupt (cached "
                             "copies whose CRC did not match), denied (opens refused by the source's permissions), "
                             "fallback (opens served from the source after a stall)")
                       .Register(*registry);
    for (const char* k : {"open", "transfer", "corrupt", "denied", "fallback"}) {
      pm::Labels l = labels;
      l["kind"] = k;
      err[k] = &errors.Add(l);
    }
    cache_bytes = &gauge("stagefs_cache_bytes", "Bytes the cached copies occupy on this node");
    cache_limit = &gauge("stagefs_cache_limit_bytes", "--cache-size in bytes (0: no limit)");
    cache_files = &gauge("stagefs_cache_files", "Copies in the cache");
    cache_unsynced = &gauge("stagefs_cache_unsynced_files",
                            "Copies published by a batch whose data is not yet synced to disk (--sync-after)");
    waiting = &gauge("stagefs_waiting_files", "Files this node's opens are waiting for");
    up = &gauge("stagefs_up", "1 while the mount serves");
    transfer_seconds = &pm::BuildHistogram()
                            .Name("stagefs_transfer_seconds")
                            .Help("Duration of collective transfers on this node")
                            .Register(*registry)
                            .Add(labels, pm::Histogram::BucketBoundaries{0.01, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 120,
                                                                         300, 600});
  }
  void update(const MountStatus& s) {
    auto feed = [](pm::Counter* c, uint64_t now, uint64_t& prev) {
      if (now > prev) c->Increment(static_cast<double>(now - prev));
      prev = now;
    };
    feed(opens, s.opens, last.opens);
    feed(hits, s.cache_hits, last.cache_hits);
    feed(misses, s.materializations, last.materializations);
    feed(transfers, s.transfers, last.transfers);
    feed(local_writes, s.local_writes, last.local_writes);
    feed(bytes_bcast, s.bytes_broadcast, last.bytes_broadcast);
    feed(evictions, s.cache.evictions, last.cache.evictions);
    feed(evicted_bytes, s.cache.evicted_bytes, last.cache.evicted_bytes);
    feed(prefetches, s.prefetches, last.prefetches);
    feed(err["open"], s.open_errors, last.open_errors);
    feed(err["transfer"], s.transfer_failures, last.transfer_failures);
    feed(err["corrupt"], s.corrupt, last.corrupt);
    feed(err["denied"], s.denied, last.denied);
    feed(err["fallback"], s.source_fallbacks, last.source_fallbacks);
    cache_bytes->Set(static_cast<double>(s.cache.bytes));
    cache_limit->Set(static_cast<double>(s.cache.limit));
    cache_files->Set(static_cast<double>(s.cache.files));
    cache_unsynced->Set(static_cast<double>(s.cache.unsynced));
    waiting->Set(static_cast<double>(s.waiting));
    up->Set(s.state == "ready" ? 1 : 0);
  }
  std::shared_ptr<pm::Registry> registry;
  pm::Labels labels;
  pm::Counter *opens, *hits, *misses, *transfers, *local_writes, *bytes_bcast, *evictions, *evicted_bytes,
      *prefetches;
  std::map<std::string, pm::Counter*> err;
  pm::Gauge *cache_bytes, *cache_limit, *cache_files, *cache_unsynced, *waiting, *up;
  pm::Histogram* transfer_seconds;
  MountStatus last;
  std::mutex m;  // update() and Collect() vs observe
};

MetricsFile::MetricsFile(std::string path, double interval_s, const std::string& mountpoint,
                         std::function<MountStatus()> snapshot)
    : impl_(std::make_unique<Impl>(mountpoint)),
      path_(std::move(path)),
      interval_(interval_s),
      snapshot_(std::move(snapshot)) {
  thread_ = std::thread([this] { loop(); });
}

MetricsFile::~MetricsFile() {
  {
    std::lock_guard lk(m_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void MetricsFile::observe_transfer(double seconds, bool /*ok*/) {
  impl_->transfer_seconds->Observe(seconds);
}

bool MetricsFile::write_now() {
  std::string text;
  {
    std::lock_guard lk(impl_->m);
    impl_->update(snapshot_());
    std::ostringstream out;
    pm::TextSerializer().Serialize(out, impl_->registry->Collect());
    text = out.str();
  }
  const std::string tmp = stage::parent_dir(path_) + "/.stagefs-metrics." + std::to_string(::getpid()) + ".tmp";
  ::unlink(tmp.c_str());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  bool ok = fd >= 0;
  if (ok) {
    ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
    ok = ::close(fd) == 0 && ok;
    ok = ok && ::rename(tmp.c_str(), path_.c_str()) == 0;
    if (!ok) ::unlink(tmp.c_str());
  }
  if (!ok && !warned_) {
    warned_ = true;
    spdlog::warn("cannot write --metrics-file {}: {}", path_, std::strerror(errno));
  }
  return ok;
}

void MetricsFile::loop() {
  std::unique_lock lk(m_);
  for (;;) {
    lk.unlock();
    write_now();
    lk.lock();
    if (stop_) return;
    cv_.wait_for(lk, interval_, [&] { return stop_; });
  }
}

}  // namespace stagefs
