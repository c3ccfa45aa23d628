#include "bcast/comm/mpi_start.h"

#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace stage {

namespace {

int env_int(std::initializer_list<const char*> names, int fallback) {
  for (const char* v : names)
    if (const char* s = std::getenv(v); s != nullptr && *s != '\0') return std::atoi(s);
  return fallback;
}

// Sleeps until the deadline or until disarmed; at the deadline it reports the phase the MPI
// thread is in and ends the process. Thread-safe: the MPI thread sets the phase and the rank;
// the watchdog only reads them.
class StartupWatchdog {
 public:
  StartupWatchdog(const char* program, double timeout_s)
      : program_(program),
        timeout_s_(timeout_s),
        rank_(launcher_rank()),
        size_(env_int({"OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS", "SLURM_NPROCS"}, 0)) {
    if (timeout_s_ > 0) {
      thread_ = std::thread([this] { run(); });
      ::pthread_setname_np(thread_.native_handle(), "startup-watch");  // ps -L, /proc/PID/task
    }
  }
  StartupWatchdog(const StartupWatchdog&) = delete;
  StartupWatchdog& operator=(const StartupWatchdog&) = delete;
  ~StartupWatchdog() { disarm(); }

  // What the MPI thread waits for now (a string literal).
  void phase(const char* what) { phase_.store(what); }
  void know_rank(int rank, int size) {
    rank_.store(rank);
    size_.store(size);
  }
  // Stops the watchdog (it never fires afterwards) and joins it.
  void disarm() {
    {
      std::lock_guard lk(m_);
      disarmed_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void run() {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s_);
    std::unique_lock lk(m_);
    if (cv_.wait_until(lk, deadline, [this] { return disarmed_; })) return;
    const int size = size_.load();
    const std::string of = size > 0 ? " of " + std::to_string(size) : std::string();
    std::fprintf(stderr,
                 "%s: rank %d%s on %s: MPI start-up did not complete within %g s (--startup-timeout): "
                 "still waiting in %s. Some rank of the job has not started, is stopped or has died "
                 "(MPI does not tell which); exiting with status %d.\n",
                 program_, rank_.load(), of.c_str(), host_name().c_str(), timeout_s_, phase_.load(),
                 kStartupTimeoutExit);
    std::fflush(nullptr);
    std::_Exit(kStartupTimeoutExit);  // MPI_Finalize would wait for the missing rank as well
  }

  const char* program_;
  double timeout_s_;
  std::atomic<int> rank_;
  std::atomic<int> size_;
  std::atomic<const char*> phase_{"MPI_Init_thread (the launcher's start-up exchange with every rank)"};
  std::mutex m_;
  std::condition_variable cv_;
  bool disarmed_ = false;  // guarded by m_
  std::thread thread_;
};

}  // namespace

Result<MpiWorld> start_mpi(int* argc, char*** argv, const MpiStartOptions& opt) {
  (void)host_name();  // resolved before any thread exists (the watchdog only reads it)
  StartupWatchdog watchdog(opt.program, opt.timeout_s);
  MpiWorld w;
  auto env = MpiEnv::init(argc, argv, opt.thread_level);
  if (!env) return env.error();
  w.env = std::move(env.value());
  watchdog.phase("MPI_Comm_dup of MPI_COMM_WORLD and the placement exchange (the first collectives)");
  auto world = MpiComm::dup(MPI_COMM_WORLD);
  if (!world) return world.error();
  w.world = std::move(world.value());
  watchdog.know_rank(w.world->rank(), w.world->size());
  // The first agreement: complete on this rank only when every rank has entered it.
  watchdog.phase("the first barrier after MPI start-up (not every rank has reached it)");
  if (auto st = w.world->barrier(); !st) return st.error();
  watchdog.disarm();
  return w;
}

Result<NodeRole> node_role(MpiComm& world, bool ranks_as_nodes) {
  if (ranks_as_nodes) return NodeRole{true, world.rank()};
  // One writer per node: the lowest rank of each shared-memory domain; the others relay.
  auto local = world.split_node();
  if (!local) return local.error();
  NodeRole role;
  role.writer = (*local)->rank() == 0;
  // Node index: writers below my rank, minus one if I am not my node's writer (my node's
  // writer is the lowest rank on the node, so it was counted).
  std::vector<int64_t> is_writer(static_cast<size_t>(world.size()), 0);
  is_writer[static_cast<size_t>(world.rank())] = role.writer ? 1 : 0;
  if (auto st = world.allreduce_max(is_writer); !st) return st.error();
  int64_t below = 0;
  for (int r = 0; r < world.rank(); ++r) below += is_writer[static_cast<size_t>(r)];
  role.node = static_cast<int>(below) - (role.writer ? 0 : 1);
  return role;
}

Result<Ranks> start_ranks(int* argc, char*** argv, const RanksOptions& opt) {
  Ranks r;
  if (!launched_by_mpi_launcher()) {
    r.world = std::make_unique<SelfComm>();
    return r;
  }
  auto started = start_mpi(argc, argv, opt.start);
  if (!started) return started.error();
  r.env = std::move(started->env);
  if (opt.node_topology) {
    const auto t0 = std::chrono::steady_clock::now();
    auto role = node_role(*started->world, opt.ranks_as_nodes);
    if (!role) return role.error();
    r.role = *role;
    r.topology_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } else {
    r.role.node = started->world->rank();
  }
  r.world = std::move(started->world);
  return r;
}

}  // namespace stage
