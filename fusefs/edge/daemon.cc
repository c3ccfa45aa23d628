#include "fusefs/edge/daemon.h"

#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <thread>

#include "bcast/comm/comm_mpi.h"
#include "bcast/comm/mpi_start.h"
#include "bcast/io/paths.h"
#include "bcast/io/store.h"
#include "fusefs/base/batch_rules.h"
#include "fusefs/base/beneath.h"
#include "fusefs/base/log.h"
#include "fusefs/cache/cache.h"
#include "fusefs/edge/metrics.h"
#include "fusefs/group/control_mpi.h"
#include "fusefs/group/group.h"
#include "fusefs/profile/file.h"
#include "fusefs/profile/job_profile.h"

namespace stagefs {

namespace fs = std::filesystem;

namespace {

constexpr const char* kStateXattr = "user.stagefs.state";
// Reading it stops the mount on every node, as SIGTERM would (root or the daemon's user).
constexpr const char* kStopXattr = "user.stagefs.stop";

// Everything one node's daemon owns, in construction order (destroyed in reverse).
class Daemon {
 public:
  Daemon(DaemonConfig cfg) : cfg_(std::move(cfg)) {}
  int run(int* argc, char*** argv);

 private:
  std::string setup_local();
  // The steps of setup_local: each returns why it failed (empty: done).
  std::string open_cache(const std::string& cache_as_given);
  void limit_cache();
  void create_copies();
  [[nodiscard]] std::chrono::milliseconds stall_timeout() const {
    return std::chrono::milliseconds(static_cast<int64_t>(cfg_.stall_timeout * 1000));
  }
  [[nodiscard]] GroupConfig group_config();
  [[nodiscard]] std::string profile_path() const;
  std::string create_group_core_mount(const GroupConfig& g);
  // The steps of run.
  static void set_signals();
  bool start_mpi(int* argc, char*** argv);
  int mount_everywhere();
  int serve();
  std::optional<stage::Result<std::string>> control_xattr(const std::string& name, const Caller& who) const;
  MountStatus status() const;
  const char* state_name() const;
  void supervise();
  void trigger_shutdown(const char* why);

  DaemonConfig cfg_;
  std::unique_ptr<stage::MpiEnv> env_;
  std::unique_ptr<stage::Comm> data_;
  std::unique_ptr<stage::Comm> nested_;  // batches nested in a running transfer
  std::unique_ptr<ControlPlane> ctl_;
  std::unique_ptr<NodeCache> cache_;
  stage::Fd source_root_;
  std::unique_ptr<BeneathSource> source_;
  // The cache room: the core's answers about copies and the group's admission (cache/copies.h).
  std::shared_ptr<NodeCopies> copies_;
  std::unique_ptr<stage::Seams> seams_;  // the group's store and source (DaemonConfig::wrap_seams)
  std::unique_ptr<MetricsFile> metrics_;
  std::unique_ptr<JobProfile> profile_;  // recorded here, replayed on the coordinator's node
  std::unique_ptr<GroupService> group_;  // (uses data_ and ctl_ only inside run())
  std::unique_ptr<StageFsCore> core_;
  std::unique_ptr<FuseMount> mount_;

  std::atomic<const char*> state_{"mounting"};
  std::mutex m_;
  std::condition_variable cv_;
  bool main_done_ = false;         // guarded by m_
  bool shutting_down_ = false;     // guarded by m_
  bool usage_error_ = false;       // setup_local refused the paths: exit status 2
  bool mpi_usable_ = true;         // false: the profiles' exchange cancelled a send (no finalize)
  uint64_t descriptor_limit_ = 0;  // RLIMIT_NOFILE, raised to the hard limit at start
  // The uid whose read of user.stagefs.stop asked the mount to stop (-1: none); the supervisor
  // acts on it, after the request was answered.
  mutable std::atomic<int64_t> stop_by_{-1};
};

std::string Daemon::setup_local() {
  // The cache path as given (made absolute, not resolved): a symlink in it is the cache's
  // check to refuse, not something to follow.
  const std::string cache_as_given = fs::absolute(cfg_.cache_dir).lexically_normal().string();
  if (auto why = check_paths(cfg_); !why.empty()) {
    usage_error_ = true;
    return why;
  }
  if (auto why = check_source_and_mount(cfg_); !why.empty()) return why;
  cfg_.mount.mountpoint = cfg_.mountpoint;
  if (auto why = open_cache(cache_as_given); !why.empty()) return why;
  source_root_ = stage::Fd(::open(cfg_.source_dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!source_root_.valid()) return "SOURCE_DIR " + cfg_.source_dir + ": " + std::strerror(errno);
  source_ = std::make_unique<BeneathSource>(source_root_.get());
  limit_cache();
  profile_ = std::make_unique<JobProfile>(JobProfile::Config{profile_path(), cfg_.replay, cfg_.source_dir,
                                                             cfg_.chunk_size, cfg_.small_file_size});
  create_copies();
  return create_group_core_mount(group_config());
}

// The node cache, opened; what it recovered and swept is logged.
std::string Daemon::open_cache(const std::string& cache_as_given) {
  // The cache: checked (owner, mode, symlinks, every parent), locked and swept (cache.h).
  // Copies are readable only through the mount. A cache another stagefs holds (a job of the
  // same user running at the same time) may be replaced by a spare one below it.
  const auto open = [this](const std::string& dir) {
    return NodeCache::open(dir, stage::StoreOptions{.direct_io = cfg_.direct_io, .parent_mode = 0700},
                           std::chrono::milliseconds(std::llround(cfg_.sync_after * 1000)));
  };
  auto cache = open(cache_as_given);
  for (unsigned k = 1; !cache && k <= cfg_.spare_caches && cache.error().to_errno() == EBUSY; ++k) {
    const std::string spare = cache_as_given + "/spare." + std::to_string(k);
    spdlog::info("{}: using the spare cache {}", cache.error().message, spare);
    cache = open(spare);
  }
  if (!cache) {
    if (cache.error().to_errno() == EBUSY && cfg_.spare_caches > 0)
      return cache.error().message + " (and every one of the " + std::to_string(cfg_.spare_caches) +
             " spare caches: --spare-caches)";
    return cache.error().message;
  }
  cache_ = std::move(cache.value());
  cache_->set_source_version(cfg_.source_version);
  cfg_.cache_dir = cache_->dir();
  if (const RecoveryCounts& r = cache_->recovered();
      r.found && !r.unreadable) {  // unreadable: NodeCache said so
    if (r.other_boot)
      log_warn(
          "cache: the machine restarted while {} cached cop(ies) were not yet synced to disk: removed "
          "(each is copied again at its next open)",
          r.removed);
    else
      log_info("cache: synced {} cop(ies) an earlier daemon of this boot had not synced yet ({} removed)",
               r.synced, r.removed);
  }
  if (cache_->swept().temps > 0)
    log_info("removed {} temporary file(s) left in the cache by an interrupted run", cache_->swept().temps);
  if (cache_->swept().untrusted > 0)
    log_warn("removed {} cache entr(ies) this daemon did not write", cache_->swept().untrusted);
  return {};
}

// --cache-size (or its percentage of the cache's file system) as the cache's limit.
void Daemon::limit_cache() {
  if (cfg_.cache_size_percent > 0) {
    struct statvfs sv {};
    if (::fstatvfs(cache_->data_fd(), &sv) == 0)
      cfg_.cache_size =
          static_cast<uint64_t>(static_cast<double>(sv.f_blocks) * static_cast<double>(sv.f_frsize) *
                                cfg_.cache_size_percent / 100.0);
  }
  cache_->set_limit(cfg_.cache_size);
  if (cfg_.cache_size > 0)
    log_info("cache limit {} bytes; {} copies ({} bytes) in the cache", cfg_.cache_size,
             cache_->usage().files, cache_->usage().bytes);
}

// The cache room over the opened cache: an open waits for room as long as for a stalled copy.
void Daemon::create_copies() {
  NodeCopies::Config c;
  c.source_root = source_root_.get();
  c.verify_cache = cfg_.verify_cache;
  c.space_wait = stall_timeout();
  c.small_file_size = cfg_.small_file_size;
  copies_ = std::make_shared<NodeCopies>(*cache_, c);
}

// --profile as a path ("" off): made absolute, its last component not resolved (a symlink
// there is read_profile's to refuse).
std::string Daemon::profile_path() const {
  if (cfg_.profile == "off") return {};
  if (cfg_.profile == "auto") {
    std::string p = default_profile_path(cfg_.source_dir);
    if (p.empty())
      spdlog::warn("no home directory: no profile is recorded or replayed (give --profile PATH)");
    return p;
  }
  return fs::absolute(cfg_.profile).lexically_normal().string();
}

// The group's configuration: the daemon's options, and the objects it asks: the cache room's
// admission around every transfer and batch, the profile's read orders.
GroupConfig Daemon::group_config() {
  GroupConfig g;
  g.source_dir = cfg_.source_dir;
  g.cache_dir = cache_->store_root();  // /proc/self/fd/N: never resolved through a replaced path
  // The cache room decides around every transfer and batch (admission.h); the metrics observe them.
  g.admission = copies_;
  g.transfer_ended = [this](double secs, bool ok) {
    if (metrics_) metrics_->observe_transfer(secs, ok);
  };
  g.small_file_size = cfg_.small_file_size;
  g.read_during_copy = cfg_.read_during_copy;
  g.batches = cfg_.batches;
  g.file_charge = kCopyCharge;
  g.cancelled = [this] {
    std::lock_guard lk(m_);
    return shutting_down_;
  };
  profile_->attach(g);
  g.bcast.chunk_size = cfg_.chunk_size;
  g.bcast.source_version = cfg_.source_version;
  g.stall_timeout = stall_timeout();
  g.bcast.bcast_algorithm = cfg_.bcast_algorithm;
  g.bcast.pipeline.segment = cfg_.bcast_segment;     // rank 0's (Daemon::run)
  g.bcast.pipeline.stall_timeout = g.stall_timeout;  // a chunk's data path gives up as the opens do
  g.read_path = [this] { return std::string(mount_ ? read_path_name(mount_->read_path()) : "-"); };
  return g;
}

// The group over the cache and the source, the core over the group, and the mount.
std::string Daemon::create_group_core_mount(const GroupConfig& g) {
  seams_ = stage::wrap_seams(cfg_.wrap_seams, cache_->store(), *source_, data_->rank());
  group_ = std::make_unique<GroupService>(*data_, *ctl_, seams_->source(), seams_->store(), g, nested_.get());
  CoreConfig core_cfg{cfg_.source_dir, cfg_.on_stall, cfg_.verify_cache};
  core_cfg.small_file_size = cfg_.small_file_size;
  core_cfg.source_version = cfg_.source_version;
  core_cfg.read_during_copy = cfg_.read_during_copy;
  std::string lowered;
  core_cfg.handles = descriptor_budget(descriptor_limit_, cfg_.max_open_per_user, lowered);
  if (!lowered.empty()) log_info("{}", lowered);
  auto core = StageFsCore::create(core_cfg, *copies_, *group_);
  if (!core) return core.error().message;
  core_ = std::move(core.value());
  core_->set_control_xattr([this](const std::string& n, const Caller& who) { return control_xattr(n, who); });
  profile_->core_ready(*core_);
  MountOptions mount_opt = cfg_.mount;
  mount_opt.backing_probe = cache_->dir() + "/.lock";  // a regular file on the cache's filesystem
  auto mount = FuseMount::create(*core_, mount_opt);
  if (!mount) return mount.error().message;
  mount_ = std::move(mount.value());
  return {};
}

// The state a job script sees: the daemon's life cycle, overridden by a broken group.
const char* Daemon::state_name() const {
  if (group_ && group_->state() == GroupState::broken) return "broken";
  return state_.load();
}

MountStatus Daemon::status() const {
  MountStatus s;
  s.host = stage::host_name();
  s.rank = data_->rank();
  s.ranks = data_->size();
  s.pid = static_cast<int>(::getpid());
  s.state = state_name();
  s.mountpoint = cfg_.mountpoint;
  s.source = cfg_.source_dir;
  s.cache_dir = cache_->dir();
  s.read_path = mount_ ? read_path_name(mount_->read_path()) : "-";
  const CoreCounters& c = core_->counters();
  const CopyCounters& k = copies_->counters();
  s.opens = c.opens;
  s.cache_hits = c.cache_hits;
  s.materializations = c.materializations;
  s.source_fallbacks = c.source_fallbacks;
  s.open_errors = c.open_errors;
  s.verified = k.verified;
  s.verify_waits = k.verify_waits;
  s.corrupt = k.corrupt;
  s.stale_opens = c.stale_opens;
  s.denied = c.denied;
  s.prefetches = c.prefetches;
  const GroupStats g = group_->stats();
  s.transfers = g.transfers;
  s.batches = g.batches;
  s.nested_batches = g.nested;
  s.nested_files = g.nested_files;
  s.batch_files = g.batch_files;
  s.local_writes = g.local_writes;
  s.bytes_broadcast = g.bytes_broadcast;
  s.chunks_broadcast = g.chunks_broadcast;
  s.nothing_to_copy = g.nothing_to_copy;
  s.budget_stops = g.budget_stops;
  s.bytes_from_source = g.bytes_from_source;
  s.bytes_from_seeds = g.bytes_from_seeds;
  s.seeded_here = g.seeded_here;
  s.feed_retries = g.feed_retries;
  s.transfer_failures = g.failures;
  s.requests = g.requests_sent;
  s.waiting = g.waiting;
  s.opens_during_copy = c.opens_during_copy;
  s.room_waits = k.room_waits;
  s.reads_waited_during_copy = g.reads_waited_during_copy;
  s.chunks_wanted = g.chunks_wanted;
  s.current = g.current;
  s.current_done = g.current_done;
  s.current_total = g.current_total;
  s.current_seconds = g.current_seconds;
  s.cache = cache_->usage();
  s.replay = profile_->stats();
  return s;
}

std::optional<stage::Result<std::string>> Daemon::control_xattr(const std::string& name,
                                                                const Caller& who) const {
  if (name == kStateXattr) return std::string(state_name());
  if (name == kStopXattr) {
    if (who.uid != 0 && who.uid != ::getuid())
      return stage::sys_error(EPERM,
                              "stop the mount: only root and " + stage::owner_text(::getuid()) + " may");
    int64_t none = -1;
    stop_by_.compare_exchange_strong(none, who.uid);
    return std::string("ok");
  }
  if (name == "user.stagefs.stats" || name == "user.stagefs.status") {
    MountStatus s = status();
    show_to(s, *core_, who);
    return to_json(s);
  }
  return std::nullopt;
}

void Daemon::trigger_shutdown(const char* why) {
  {
    std::lock_guard lk(m_);
    if (shutting_down_) return;
    shutting_down_ = true;
  }
  log_info("shutting down: {}", why);
  state_ = "stopping";
  mount_->unmount();
  group_->request_shutdown();
  cv_.notify_all();
}

// Supervisor thread: signals, and the bounded wait for the group to shut down together.
void Daemon::supervise() {
  sigset_t sigs;
  sigemptyset(&sigs);
  for (int s : {SIGTERM, SIGINT, SIGHUP}) sigaddset(&sigs, s);
  const timespec tick{0, 200 * 1000 * 1000};
  for (;;) {
    {
      std::lock_guard lk(m_);
      if (main_done_ || shutting_down_) break;
    }
    const int sig = ::sigtimedwait(&sigs, nullptr, &tick);
    if (sig > 0) trigger_shutdown(sig == SIGTERM ? "SIGTERM" : sig == SIGINT ? "SIGINT" : "SIGHUP");
    held_back_report();  // causes whose log lines were held back and that went quiet since
    if (const int64_t uid = stop_by_.load(); uid >= 0) {
      log_info("{} asked the mount to stop ({})", stage::owner_text(static_cast<uid_t>(uid)), kStopXattr);
      trigger_shutdown("stop requested");
    }
  }
  std::unique_lock lk(m_);
  const auto limit = std::chrono::duration<double>(cfg_.shutdown_timeout);
  if (!cv_.wait_for(lk, limit, [&] { return main_done_; })) {
    // The MPI thread is stuck (a peer died mid-collective): the mount is already detached,
    // nothing partial was published; end the process rather than leave an orphan.
    log_error("the mount group did not shut down within {} s (a node or link is gone?); exiting",
              cfg_.shutdown_timeout);
    std::fflush(nullptr);
    std::_Exit(1);
  }
}

int Daemon::run(int* argc, char*** argv) {
  set_signals();
  // Every handle a user holds is a descriptor here: the soft limit (often 1024) would be the
  // first thing to run out. Before MPI starts, whose connections take descriptors too.
  descriptor_limit_ = raise_descriptor_limit();
  if (!start_mpi(argc, argv)) return 1;
  // Settings every rank's data path must share: rank 0's count.
  if (auto st = stage::bcast_value(*data_, cfg_.bcast_segment, 0); !st) {
    spdlog::error("{}", st.error().message);
    return 1;
  }
  // Set up locally, then agree: either every node is mounted, or none stays mounted.
  if (const int failed = mount_everywhere(); failed != 0) return failed;
  state_ = "ready";
  if (!cfg_.metrics_file.empty())
    metrics_ = std::make_unique<MetricsFile>(cfg_.metrics_file, cfg_.metrics_interval, cfg_.mountpoint,
                                             [this] { return status(); });
  log_info("{} mounted at {} (cache {}), {} node(s)", cfg_.source_dir, cfg_.mountpoint, cfg_.cache_dir,
           data_->size());
  if (ctl_->is_coordinator()) profile_->start_replay(*group_, *core_, source_root_.get());
  return serve();
}

// The supervisor takes SIGTERM/SIGINT/SIGHUP with sigtimedwait: block them before any thread
// exists (MPI's and libfuse's threads inherit the mask), or the default action would kill
// the process and leave a stale mount.
void Daemon::set_signals() {
  sigset_t sigs;
  sigemptyset(&sigs);
  for (int s : {SIGTERM, SIGINT, SIGHUP}) sigaddset(&sigs, s);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  // Signals whose default action would end the process (and the mount, for every user) but
  // that mean nothing to it are ignored, process-wide (whatever the signal masks of MPI's
  // and libfuse's threads): SIGPIPE, when stderr is a pipe whose reader went away (the log's
  // writes then fail with EPIPE, which it survives: log.h); SIGUSR1 and SIGUSR2, which
  // mpirun forwards to every rank and `srun --signal` / `sbatch --signal` send before a time
  // limit; SIGALRM. Set before MPI_Init: the launcher's own handlers come after.
  for (int s : {SIGPIPE, SIGUSR1, SIGUSR2, SIGALRM}) ::signal(s, SIG_IGN);
}

// The ranks, the data path and the control plane; false (logged) if MPI did not start.
bool Daemon::start_mpi(int* argc, char*** argv) {
  // One daemon per node: no node topology (every rank is its node's writer).
  auto ranks =
      stage::start_ranks(argc, argv, {{"stagefs", cfg_.startup_timeout, MPI_THREAD_FUNNELED}, false});
  if (!ranks) {
    log_error("{}", ranks.error().message);
    return false;
  }
  if (ranks->mpi()) {
    auto c = MpiControlPlane::create(MPI_COMM_WORLD, 0);
    if (!c) {
      log_error("{}", c.error().message);
      return false;
    }
    auto n = stage::MpiComm::dup(MPI_COMM_WORLD);
    if (!n) {
      log_error("{}", n.error().message);
      return false;
    }
    nested_ = std::move(n.value());
    ctl_ = std::move(c.value());
  } else {
    nested_ = std::make_unique<stage::SelfComm>();
    ctl_ = std::make_unique<LocalControlPlane>();
  }
  env_ = std::move(ranks->env);
  data_ = std::move(ranks->world);
  spdlog::set_pattern("[stagefs " + stage::host_name() + " r" + std::to_string(data_->rank()) + "] %l: %v");
  return true;
}

// This node's setup, then the group's agreement: 0 if every node is mounted, else the exit
// status (this node's mount is undone).
int Daemon::mount_everywhere() {
  const std::string err = setup_local();
  if (!err.empty()) log_error("{}", err);
  // 2 (usage: the paths contradict each other) wins over 1, so every rank exits alike.
  auto failed = stage::allreduce_max(*data_, err.empty() ? 0 : usage_error_ ? 2 : 1);
  if (!failed || *failed != 0) {
    if (err.empty()) log_error("another node failed to mount; unmounting");
    mount_.reset();
    (void)ctl_->close();  // complete the posted announcement so MPI can finalize
    return failed && *failed == 2 ? 2 : 1;
  }
  return 0;
}

// The mount serves until every node agreed to shut down; then the orderly end (or, with a
// broken group, an exit without finalizing MPI).
int Daemon::serve() {
  std::thread fuse([this] {
    if (auto st = mount_->loop(); !st) log_error("{}", st.error().message);
    trigger_shutdown("unmounted");
  });
  std::thread supervisor([this] { supervise(); });

  auto st = group_->run();  // until every node agreed to shut down
  if (!st) log_error("{}", st.error().message);
  trigger_shutdown("mount group shut down");
  fuse.join();
  // Every node's record to rank 0, within part of the shutdown's time (the supervisor's clock).
  mpi_usable_ = profile_->finish(*data_, group_->state() == GroupState::broken,
                                 std::chrono::milliseconds(std::llround(cfg_.shutdown_timeout * 400)));
  core_->stop();                   // opens answered late by the completion pool are done (or dropped) now
  metrics_.reset();                // a last write, with the final counters
  held_back_report(/*all=*/true);  // what the log's limits held back and did not say yet
  if (group_->state() != GroupState::broken && mpi_usable_) {
    // Finalize while the supervisor still watches the clock: MPI_Finalize synchronizes with
    // the other ranks, which a launcher may be killing.
    ctl_.reset();
    nested_.reset();
    data_.reset();
    env_.reset();
  }
  {
    std::lock_guard lk(m_);
    main_done_ = true;
  }
  cv_.notify_all();
  supervisor.join();
  if (group_->state() == GroupState::broken || !mpi_usable_) {
    std::fflush(nullptr);
    std::_Exit(1);  // MPI may be stuck mid-collective: do not finalize
  }
  return st.ok() ? 0 : 1;
}

}  // namespace

int run_daemon(DaemonConfig cfg, int* argc, char*** argv) {
  Daemon d(std::move(cfg));
  return d.run(argc, argv);
}

}  // namespace stagefs
