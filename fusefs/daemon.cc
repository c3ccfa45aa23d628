#include "fusefs/daemon.h"

#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <thread>

#include "bcast/comm_mpi.h"
#include "bcast/store.h"
#include "fusefs/beneath.h"
#include "fusefs/control_mpi.h"
#include "fusefs/group.h"

namespace stagefs {

namespace fs = std::filesystem;

namespace {

constexpr const char* kStateXattr = "user.stagefs.state";

bool inside(const std::string& child, const std::string& parent) {
  return child == parent || (child.size() > parent.size() && child.compare(0, parent.size(), parent) == 0 &&
                             (parent.back() == '/' || child[parent.size()] == '/'));
}

std::string absolute(const std::string& p) {
  std::error_code ec;
  auto a = fs::weakly_canonical(fs::absolute(p), ec);
  return ec ? fs::absolute(p).lexically_normal().string() : a.string();
}

// Removes temporary files a dead writer left in the cache (the cache is locked: nobody else
// writes there) and returns how many.
int sweep_temps(const std::string& dir) {
  int n = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    if (it->is_regular_file(ec) && stage::is_temp_name(it->path().filename().string()) &&
        fs::remove(it->path(), ec))
      ++n;
  }
  return n;
}

}  // namespace

std::string validate_config(DaemonConfig& cfg) {
  if (cfg.source_dir.empty() || cfg.mountpoint.empty() || cfg.cache_dir.empty())
    return "SOURCE_DIR, MOUNTPOINT and --cache are required";
  cfg.source_dir = absolute(cfg.source_dir);
  cfg.mountpoint = absolute(cfg.mountpoint);
  cfg.cache_dir = absolute(cfg.cache_dir);
  struct stat st {};
  if (::stat(cfg.source_dir.c_str(), &st) != 0)
    return "SOURCE_DIR " + cfg.source_dir + ": " + std::strerror(errno);
  if (!S_ISDIR(st.st_mode)) return "SOURCE_DIR " + cfg.source_dir + " is not a directory";
  if (cfg.source_dir == cfg.mountpoint) return "SOURCE_DIR and MOUNTPOINT are the same directory";
  if (inside(cfg.mountpoint, cfg.source_dir))
    return "MOUNTPOINT " + cfg.mountpoint + " lies inside SOURCE_DIR";
  if (inside(cfg.cache_dir, cfg.mountpoint)) return "--cache " + cfg.cache_dir + " lies inside MOUNTPOINT";
  if (inside(cfg.cache_dir, cfg.source_dir)) return "--cache " + cfg.cache_dir + " lies inside SOURCE_DIR";
  if (inside(cfg.source_dir, cfg.cache_dir)) return "SOURCE_DIR lies inside --cache " + cfg.cache_dir;
  if (cfg.stall_timeout <= 0) return "--stall-timeout must be positive";
  return check_mountpoint(cfg.mountpoint);
}

int wait_ready(const std::string& mountpoint, double timeout_s) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  auto pause = std::chrono::milliseconds(10);
  std::string last = "not mounted";
  while (Clock::now() < deadline) {
    char buf[64] = {};
    const ssize_t n = ::getxattr(mountpoint.c_str(), kStateXattr, buf, sizeof buf - 1);
    if (n > 0) {
      last.assign(buf, static_cast<size_t>(n));
      if (last == "ready") return 0;
      if (last == "broken" || last == "stopping") break;
    } else if (errno == ENOTCONN) {
      last = "stale mount (daemon gone)";
      break;
    }
    std::this_thread::sleep_for(pause);  // polling a CLI, backing off to 200 ms
    pause = std::min(pause * 2, std::chrono::milliseconds(200));
  }
  std::fprintf(stderr, "stagefs --wait: %s is not ready (%s)\n", mountpoint.c_str(), last.c_str());
  return 1;
}

namespace {

// Everything one node's daemon owns, in construction order (destroyed in reverse).
class Daemon {
 public:
  Daemon(DaemonConfig cfg)
      : cfg_(std::move(cfg)),
        data_dir_(cfg_.cache_dir + "/data"),
        store_(stage::StoreOptions{.direct_io = cfg_.direct_io}) {}
  int run(int* argc, char*** argv);

 private:
  std::string setup_local();
  std::optional<std::string> control_xattr(const std::string& name) const;
  const char* state_name() const;
  void supervise();
  void trigger_shutdown(const char* why);

  DaemonConfig cfg_;
  std::string data_dir_;
  std::unique_ptr<stage::MpiEnv> env_;
  std::unique_ptr<stage::Comm> data_;
  std::unique_ptr<ControlPlane> ctl_;
  stage::Fd lock_;
  stage::Fd source_root_;
  std::unique_ptr<BeneathSource> source_;
  stage::PosixStore store_;
  std::unique_ptr<GroupService> group_;  // (uses data_ and ctl_ only inside run())
  std::unique_ptr<StageFsCore> core_;
  std::unique_ptr<FuseMount> mount_;

  std::atomic<const char*> state_{"mounting"};
  std::mutex m_;
  std::condition_variable cv_;
  bool main_done_ = false;      // guarded by m_
  bool shutting_down_ = false;  // guarded by m_
};

std::string Daemon::setup_local() {
  if (auto why = validate_config(cfg_); !why.empty()) return why;
  data_dir_ = cfg_.cache_dir + "/data";
  cfg_.mount.mountpoint = cfg_.mountpoint;
  std::error_code ec;
  fs::create_directories(data_dir_, ec);
  if (ec) return "cannot create cache " + data_dir_ + ": " + ec.message();
  if (::chmod(cfg_.cache_dir.c_str(), 0700) != 0)  // copies are readable only through the mount
    return "cannot chmod cache " + cfg_.cache_dir + ": " + std::strerror(errno);
  lock_ = stage::Fd(::open((cfg_.cache_dir + "/.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!lock_.valid() || ::flock(lock_.get(), LOCK_EX | LOCK_NB) != 0)
    return "cache " + cfg_.cache_dir + " is in use by another stagefs on this node";
  if (const int n = sweep_temps(data_dir_); n > 0)
    spdlog::info("removed {} temporary file(s) left in the cache by an interrupted run", n);
  source_root_ = stage::Fd(::open(cfg_.source_dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!source_root_.valid()) return "SOURCE_DIR " + cfg_.source_dir + ": " + std::strerror(errno);
  source_ = std::make_unique<BeneathSource>(source_root_.get());
  GroupConfig g;
  g.source_dir = cfg_.source_dir;
  g.cache_dir = data_dir_;
  g.bcast.chunk_size = cfg_.chunk_size;
  g.stall_timeout = std::chrono::milliseconds(static_cast<int64_t>(cfg_.stall_timeout * 1000));
  g.bcast.bcast_algorithm = cfg_.bcast_algorithm;
  g.bcast.pipeline.stall_timeout = g.stall_timeout;  // a chunk's data path gives up as the opens do
  g.read_path = [this] {
    if (!mount_) return std::string("-");
    if (mount_->read_path() != ReadPath::unknown) return std::string(read_path_name(mount_->read_path()));
    return std::string(mount_->passthrough().active() ? "kernel passthrough"
                                                      : read_path_name(ReadPath::splice));
  };
  group_ = std::make_unique<GroupService>(*data_, *ctl_, *source_, store_, g);
  auto core = StageFsCore::create(CoreConfig{cfg_.source_dir, data_dir_, cfg_.on_stall}, *group_);
  if (!core) return core.error().message;
  core_ = std::move(core.value());
  core_->set_control_xattr([this](const std::string& n) { return control_xattr(n); });
  auto mount = FuseMount::create(*core_, cfg_.mount);
  if (!mount) return mount.error().message;
  mount_ = std::move(mount.value());
  return {};
}

// The state a job script sees: the daemon's life cycle, overridden by a broken group.
const char* Daemon::state_name() const {
  if (group_ && group_->state() == GroupState::broken) return "broken";
  return state_.load();
}

std::optional<std::string> Daemon::control_xattr(const std::string& name) const {
  if (name == kStateXattr) return std::string(state_name());
  if (name != "user.stagefs.stats") return std::nullopt;
  const GroupStats g = group_->stats();
  const CoreCounters& c = core_->counters();
  char buf[768];
  std::snprintf(
      buf, sizeof buf,
      "{\"host\":\"%s\",\"rank\":%d,\"ranks\":%d,\"pid\":%d,\"state\":\"%s\",\"read_path\":\"%s\","
      "\"opens\":%llu,\"cache_hits\":%llu,\"materializations\":%llu,\"source_fallbacks\":%llu,"
      "\"open_errors\":%llu,\"transfers\":%llu,\"local_writes\":%llu,\"bytes_broadcast\":%llu,"
      "\"transfer_failures\":%llu,\"requests\":%llu}",
      stage::host_name().c_str(), data_->rank(), data_->size(), static_cast<int>(::getpid()), state_name(),
      read_path_name(mount_->read_path()), static_cast<unsigned long long>(c.opens.load()),
      static_cast<unsigned long long>(c.cache_hits.load()),
      static_cast<unsigned long long>(c.materializations.load()),
      static_cast<unsigned long long>(c.source_fallbacks.load()),
      static_cast<unsigned long long>(c.open_errors.load()), static_cast<unsigned long long>(g.transfers),
      static_cast<unsigned long long>(g.local_writes), static_cast<unsigned long long>(g.bytes_broadcast),
      static_cast<unsigned long long>(g.failures), static_cast<unsigned long long>(g.requests_sent));
  return std::string(buf);
}

void Daemon::trigger_shutdown(const char* why) {
  {
    std::lock_guard lk(m_);
    if (shutting_down_) return;
    shutting_down_ = true;
  }
  spdlog::info("shutting down: {}", why);
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
  }
  std::unique_lock lk(m_);
  const auto limit = std::chrono::duration<double>(cfg_.shutdown_timeout);
  if (!cv_.wait_for(lk, limit, [&] { return main_done_; })) {
    // The MPI thread is stuck (a peer died mid-collective): the mount is already detached,
    // nothing partial was published; end the process rather than leave an orphan.
    spdlog::error("the mount group did not shut down within {} s (a node or link is gone?); exiting",
                  cfg_.shutdown_timeout);
    std::fflush(nullptr);
    std::_Exit(1);
  }
}

int Daemon::run(int* argc, char*** argv) {
  // The supervisor takes SIGTERM/SIGINT/SIGHUP with sigtimedwait: block them before any thread
  // exists (MPI's and libfuse's threads inherit the mask), or the default action would kill
  // the process and leave a stale mount.
  sigset_t sigs;
  sigemptyset(&sigs);
  for (int s : {SIGTERM, SIGINT, SIGHUP}) sigaddset(&sigs, s);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  if (stage::launched_by_mpi_launcher()) {
    auto e = stage::MpiEnv::init(argc, argv, MPI_THREAD_FUNNELED);
    if (!e) {
      spdlog::error("{}", e.error().message);
      return 1;
    }
    env_ = std::move(e.value());
    auto d = stage::MpiComm::dup(MPI_COMM_WORLD);
    if (!d) {
      spdlog::error("{}", d.error().message);
      return 1;
    }
    auto c = MpiControlPlane::create(MPI_COMM_WORLD, 0);
    if (!c) {
      spdlog::error("{}", c.error().message);
      return 1;
    }
    data_ = std::move(d.value());
    ctl_ = std::move(c.value());
  } else {
    data_ = std::make_unique<stage::SelfComm>();
    ctl_ = std::make_unique<LocalControlPlane>();
  }
  spdlog::set_pattern("[stagefs " + stage::host_name() + " r" + std::to_string(data_->rank()) + "] %l: %v");

  // Set up locally, then agree: either every node is mounted, or none stays mounted.
  const std::string err = setup_local();
  if (!err.empty()) spdlog::error("{}", err);
  auto failed = stage::allreduce_max(*data_, err.empty() ? 0 : 1);
  if (!failed || *failed != 0) {
    if (err.empty()) spdlog::error("another node failed to mount; unmounting");
    mount_.reset();
    (void)ctl_->close();  // complete the posted announcement so MPI can finalize
    return 1;
  }
  state_ = "ready";
  spdlog::info("{} mounted at {} (cache {}), {} node(s)", cfg_.source_dir, cfg_.mountpoint, cfg_.cache_dir,
               data_->size());

  std::thread fuse([this] {
    if (auto st = mount_->loop(); !st) spdlog::error("{}", st.error().message);
    trigger_shutdown("unmounted");
  });
  std::thread supervisor([this] { supervise(); });

  auto st = group_->run();  // until every node agreed to shut down
  if (!st) spdlog::error("{}", st.error().message);
  trigger_shutdown("mount group shut down");
  fuse.join();
  if (group_->state() != GroupState::broken) {
    // Finalize while the supervisor still watches the clock: MPI_Finalize synchronizes with
    // the other ranks, which a launcher may be killing.
    ctl_.reset();
    data_.reset();
    env_.reset();
  }
  {
    std::lock_guard lk(m_);
    main_done_ = true;
  }
  cv_.notify_all();
  supervisor.join();
  if (group_->state() == GroupState::broken) {
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
