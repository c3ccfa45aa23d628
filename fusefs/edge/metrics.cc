#include "fusefs/edge/metrics.h"

#include <fcntl.h>
#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <sstream>

#include "bcast/io/store.h"

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
    auto& read = pm::BuildCounter()
                     .Name("stagefs_bytes_read_total")
                     .Help("Bytes the transfers this node took part in read, by where: source (the shared "
                           "source) or seed (a node's cached copy)")
                     .Register(*registry);
    auto with_from = [&](const char* from) {
      pm::Labels l = labels;
      l["from"] = from;
      return &read.Add(l);
    };
    read_source = with_from("source");
    read_seed = with_from("seed");
    seeded_here = &counter("stagefs_seeded_transfers_total", "Transfers this node fed from its own cache");
    feed_retries =
        &counter("stagefs_feed_retries_total",
                 "Feeds that failed on a seed's side (its copy changed, unreadable or not its recorded "
                 "CRCs) and were replaced within the same transfer by another seed or the source");
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
    auto& replay_files = pm::BuildCounter()
                             .Name("stagefs_replay_files_total")
                             .Help(
                                 "The coordinator's node: files of the last job's profile the replay asked "
                                 "for (queued), got staged (staged: copied, or current already), skipped "
                                 "(gone, not readable by the profile's user, failed); at unmount, of the "
                                 "staged ones, those the job opened on any node (used) and the rest (unused)")
                             .Register(*registry);
    auto& replay_bytes = pm::BuildCounter()
                             .Name("stagefs_replay_bytes_total")
                             .Help("The bytes of stagefs_replay_files_total's files, by the same kinds")
                             .Register(*registry);
    for (const char* k : {"queued", "staged", "skipped", "used", "unused"}) {
      pm::Labels l = labels;
      l["kind"] = k;
      replay_file[k] = &replay_files.Add(l);
      if (std::string_view(k) != "skipped") replay_byte[k] = &replay_bytes.Add(l);
    }
    cache_bytes = &gauge("stagefs_cache_bytes", "Bytes the cached copies occupy on this node");
    cache_limit = &gauge("stagefs_cache_limit_bytes", "--cache-size in bytes (0: no limit)");
    cache_files = &gauge("stagefs_cache_files", "Copies in the cache");
    cache_unsynced = &gauge("stagefs_cache_unsynced_files",
                            "Copies published by a batch whose data is not yet synced to disk (--sync-after)");
    waiting = &gauge("stagefs_waiting_files", "Files this node's opens are waiting for");
    in_flight_done = &gauge("stagefs_transfer_done_bytes",
                            "Bytes done so far of the copy in flight on this node (0: none); moves while a "
                            "long copy is healthy");
    in_flight_size =
        &gauge("stagefs_transfer_size_bytes", "Bytes of the copy in flight on this node (0: none)");
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
    feed(read_source, s.bytes_from_source, last.bytes_from_source);
    feed(read_seed, s.bytes_from_seeds, last.bytes_from_seeds);
    feed(seeded_here, s.seeded_here, last.seeded_here);
    feed(feed_retries, s.feed_retries, last.feed_retries);
    feed(evictions, s.cache.evictions, last.cache.evictions);
    feed(evicted_bytes, s.cache.evicted_bytes, last.cache.evicted_bytes);
    feed(prefetches, s.prefetches, last.prefetches);
    feed(err["open"], s.open_errors, last.open_errors);
    feed(err["transfer"], s.transfer_failures, last.transfer_failures);
    feed(err["corrupt"], s.corrupt, last.corrupt);
    feed(err["denied"], s.denied, last.denied);
    feed(err["fallback"], s.source_fallbacks, last.source_fallbacks);
    if (s.replay) {
      const ReplayStats& r = *s.replay;
      feed(replay_file["queued"], r.files_queued, last_replay.files_queued);
      feed(replay_file["staged"], r.files_done, last_replay.files_done);
      feed(replay_file["skipped"], r.files_skipped, last_replay.files_skipped);
      feed(replay_file["used"], r.files_used, last_replay.files_used);
      feed(replay_file["unused"], r.files_unused, last_replay.files_unused);
      feed(replay_byte["queued"], r.bytes_queued, last_replay.bytes_queued);
      feed(replay_byte["staged"], r.bytes_done, last_replay.bytes_done);
      feed(replay_byte["used"], r.bytes_used, last_replay.bytes_used);
      feed(replay_byte["unused"], r.bytes_unused, last_replay.bytes_unused);
    }
    cache_bytes->Set(static_cast<double>(s.cache.bytes));
    cache_limit->Set(static_cast<double>(s.cache.limit));
    cache_files->Set(static_cast<double>(s.cache.files));
    cache_unsynced->Set(static_cast<double>(s.cache.unsynced));
    waiting->Set(static_cast<double>(s.waiting));
    const bool in_flight = !s.current.empty();  // the figures of the last copy stay behind it
    in_flight_done->Set(in_flight ? static_cast<double>(s.current_done) : 0);
    in_flight_size->Set(in_flight ? static_cast<double>(s.current_total) : 0);
    up->Set(s.state == "ready" ? 1 : 0);
  }
  std::shared_ptr<pm::Registry> registry;
  pm::Labels labels;
  pm::Counter *opens, *hits, *misses, *transfers, *local_writes, *bytes_bcast, *read_source, *read_seed,
      *seeded_here, *feed_retries, *evictions, *evicted_bytes, *prefetches;
  std::map<std::string, pm::Counter*> err;
  std::map<std::string, pm::Counter*> replay_file, replay_byte;
  ReplayStats last_replay;
  pm::Gauge *cache_bytes, *cache_limit, *cache_files, *cache_unsynced, *waiting, *in_flight_done,
      *in_flight_size, *up;
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

namespace {

// ".stagefs-metrics." and 64 random bits (getrandom through std::random_device, drawn anew
// each time: a user who watches the directory cannot predict the next name).
std::string random_temp_name() {
  std::random_device rd;
  const uint64_t r = (static_cast<uint64_t>(rd()) << 32) | rd();
  char buf[40];
  std::snprintf(buf, sizeof buf, ".stagefs-metrics.%016llx.tmp", static_cast<unsigned long long>(r));
  return buf;
}

std::string base_name(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

int MetricsFile::replace_file(const std::string& text) const {
  const stage::Fd dir(::open(stage::parent_dir(path_).c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!dir.valid()) return errno;
  std::string tmp;
  stage::Fd fd;
  // A taken name (a user's file, directory or symlink) is only ever a collision: another one.
  for (int attempt = 0; attempt < 8 && !fd.valid(); ++attempt) {
    tmp = random_temp_name();
    fd = stage::Fd(
        ::openat(dir.get(), tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
    if (!fd.valid() && errno != EEXIST) return errno;
  }
  if (!fd.valid()) return EEXIST;
  int err = 0;
  for (size_t done = 0; err == 0 && done < text.size();) {
    const ssize_t n = ::write(fd.get(), text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      err = n < 0 ? errno : EIO;
    } else {
      done += static_cast<size_t>(n);
    }
  }
  if (::close(fd.release()) != 0 && err == 0) err = errno;
  if (err == 0 && ::renameat(dir.get(), tmp.c_str(), dir.get(), base_name(path_).c_str()) != 0) err = errno;
  if (err != 0) ::unlinkat(dir.get(), tmp.c_str(), 0);
  return err;
}

bool MetricsFile::remove_stale() const {
  const stage::Fd dir(::open(stage::parent_dir(path_).c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!dir.valid()) return false;
  const std::string base = base_name(path_);
  struct stat st {};
  if (::fstatat(dir.get(), base.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode) ||
      st.st_uid != ::geteuid())
    return false;  // gone already, or not ours: a user's file or directory is left alone
  return ::unlinkat(dir.get(), base.c_str(), 0) == 0;
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
  const int err = replace_file(text);
  if (err == 0) {
    // Said only after a failure that was logged: a file that fails every other write (a full
    // filesystem) logs no more than its warnings.
    if (std::exchange(failure_logged_, false)) log_info("--metrics-file {} written again", path_);
    return true;
  }
  const bool removed = remove_stale();
  uint64_t held_back = 0;
  failure_logged_ =
      warnings_.allow("write failed", "cannot write --metrics-file", LogLimits::Clock::now(), held_back);
  if (failure_logged_)
    log_warn("cannot write --metrics-file {}: {}{}{}", path_, std::strerror(err),
             removed ? "; removed it, so that it does not show values that no longer change" : "",
             held_back > 0 ? " (" + std::to_string(held_back) + " more failed writes since the last warning)"
                           : std::string());
  return false;
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
