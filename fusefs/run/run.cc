// stagefs run's life cycle (run.h): the step, the wait, the command, the stop, the summary.
#include "fusefs/run/run.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "bcast/transfer/report.h"
#include "fusefs/edge/status.h"

extern char** environ;

namespace stagefs::run {

namespace {

using Clock = std::chrono::steady_clock;

void say(const std::string& m) {
  const std::string line = "stagefs run: " + m + "\n";
  (void)!::write(STDERR_FILENO, line.data(), line.size());
}

// The signals stagefs run waits for (blocked, taken with sigtimedwait).
sigset_t handled_signals() {
  sigset_t s;
  sigemptyset(&s);
  for (int sig : {SIGTERM, SIGHUP, SIGINT, SIGQUIT, SIGCHLD}) sigaddset(&s, sig);
  return s;
}

// A signal that arrived within `wait` (SIGCHLD included), or 0.
int next_signal(std::chrono::milliseconds wait) {
  const sigset_t s = handled_signals();
  const timespec ts{static_cast<time_t>(wait.count() / 1000),
                    static_cast<long>(wait.count() % 1000) * 1000000L};
  const int sig = ::sigtimedwait(&s, nullptr, &ts);
  return sig > 0 ? sig : 0;
}

// A child process, reaped once.
struct Child {
  pid_t pid = -1;
  int status = 0;
  bool ended = false;
  // True once it has ended (block: wait for it).
  bool reap(bool block = false) {
    if (pid <= 0 || ended) return true;
    const pid_t r = ::waitpid(pid, &status, block ? 0 : WNOHANG);
    if (r == pid || (r < 0 && errno == ECHILD)) ended = true;
    return ended;
  }
  // Waits up to `limit`; true if it ended.
  bool wait_for(std::chrono::duration<double> limit) {
    const auto deadline = Clock::now() + limit;
    while (!reap()) {
      if (Clock::now() >= deadline) return false;
      next_signal(std::chrono::milliseconds(200));  // SIGCHLD wakes it; other signals: stopping already
    }
    return true;
  }
  [[nodiscard]] int exit_code() const {
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return 1;
  }
  [[nodiscard]] std::string how() const {
    if (WIFSIGNALED(status)) return std::string("killed by signal ") + ::strsignal(WTERMSIG(status));
    return "exit status " + std::to_string(exit_code());
  }
};

// posix_spawnp of argv with env; the child gets an empty signal mask and default handlers.
// out: the fd for its stdout and stderr (-1: inherit); own_group: a process group of its own.
int spawn(Child& c, const std::vector<std::string>& argv, const std::vector<std::string>& env, int out,
          bool own_group) {
  std::vector<char*> a, e;
  for (const auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
  a.push_back(nullptr);
  for (const auto& s : env) e.push_back(const_cast<char*>(s.c_str()));
  e.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t at;
  posix_spawn_file_actions_init(&fa);
  posix_spawnattr_init(&at);
  if (out >= 0) {
    posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, out, STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&fa, out, STDERR_FILENO);
  }
  sigset_t none, dfl = handled_signals();
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&at, &none);
  posix_spawnattr_setsigdefault(&at, &dfl);
  short flags = POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF;
  if (own_group) {
    posix_spawnattr_setpgroup(&at, 0);
    flags |= POSIX_SPAWN_SETPGROUP;
  }
  posix_spawnattr_setflags(&at, flags);
  const int rc = ::posix_spawnp(&c.pid, a[0], &fa, &at, a.data(), e.data());
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&at);
  if (rc != 0) c.pid = -1;
  return rc;
}

// The step's output: copied to stderr line by line on a thread of its own, the error lines
// kept for a failure's message. Ends when the step's last writer closes the pipe.
class StepLog {
 public:
  explicit StepLog(int fd) : fd_(fd), t_([this] { pump(); }) {}
  ~StepLog() { finish(); }
  StepLog(const StepLog&) = delete;
  StepLog& operator=(const StepLog&) = delete;
  void finish() {
    if (t_.joinable()) t_.join();
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  // The first error a daemon (or srun) logged, or "".
  std::string cause() const {
    std::lock_guard lk(m_);
    return cause_;
  }

 private:
  void pump() {
    std::string pending;
    char buf[8192];
    for (;;) {
      const ssize_t n = ::read(fd_, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      pending.append(buf, static_cast<size_t>(n));
      size_t start = 0;
      for (size_t nl; (nl = pending.find('\n', start)) != std::string::npos; start = nl + 1)
        line(std::string_view(pending).substr(start, nl - start + 1));
      pending.erase(0, start);
      if (pending.size() > 65536) {  // no newline for too long: pass it on as it is
        line(pending + "\n");
        pending.clear();
      }
    }
    if (!pending.empty()) line(pending + "\n");
  }
  void line(std::string_view l) {
    (void)!::write(STDERR_FILENO, l.data(), l.size());
    std::lock_guard lk(m_);
    if (cause_.empty() && is_cause_line(l)) cause_.assign(l.substr(0, l.size() - 1));
  }
  int fd_;
  mutable std::mutex m_;
  std::string cause_;  // guarded by m_
  std::thread t_;      // last: starts once the rest is built
};

std::string read_attr(const std::string& path, const char* name) {
  std::string buf(1 << 16, '\0');
  const ssize_t n = ::getxattr(path.c_str(), name, buf.data(), buf.size());
  if (n < 0) return {};
  buf.resize(static_cast<size_t>(n));
  return buf;
}

// The mount's counters once the transfer in flight, if any, has ended (a reader may finish a
// file before its copy is verified and counted), waiting at most `limit` for that.
std::string settled_stats(const std::string& mountpoint, std::chrono::seconds limit) {
  const auto deadline = Clock::now() + limit;
  auto pause = std::chrono::milliseconds(10);
  for (;;) {
    std::string stats = read_attr(mountpoint, "user.stagefs.stats");
    const auto j = nlohmann::json::parse(stats, nullptr, false);
    if (!j.is_object() || !j.contains("transfer") || j["transfer"].is_null() || Clock::now() >= deadline)
      return stats;
    std::this_thread::sleep_for(pause);  // polling the counters, backing off to 200 ms
    pause = std::min(pause * 2, std::chrono::milliseconds(200));
  }
}

// Asks the mount to stop (every node), then waits for the step to end, SIGTERM to srun when
// it does not in time (Slurm then ends the tasks; fusermount3's auto_unmount removes their
// mounts), SIGKILL last. Returns whether it ended after the request alone.
bool stop_step(Child& step, const std::string& mountpoint, double timeout_s) {
  if (step.reap()) return true;
  read_attr(mountpoint, "user.stagefs.stop");  // "ok"; or the mount is gone already
  if (step.wait_for(std::chrono::duration<double>(timeout_s))) return true;
  say("the daemons did not stop within " + std::to_string(static_cast<int>(timeout_s)) +
      " s of the stop request: ending the step");
  ::kill(step.pid, SIGTERM);
  if (step.wait_for(std::chrono::seconds(30))) return false;
  ::kill(step.pid, SIGKILL);
  step.reap(true);
  return false;
}

// Runs the command and waits for it; signals are handled as run.h says.
int run_command(const RunPlan& plan, Child& step) {
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e)
    if (std::strncmp(*e, "STAGEFS_MOUNT=", 14) != 0) env.emplace_back(*e);
  env.push_back("STAGEFS_MOUNT=" + plan.mountpoint);
  Child cmd;
  if (const int rc = spawn(cmd, plan.command, env, -1, false); rc != 0) {
    say("cannot run " + plan.command.front() + ": " + std::strerror(rc));
    return rc == ENOENT ? 127 : 126;
  }
  bool step_gone = false;
  while (!cmd.reap()) {
    const int sig = next_signal(std::chrono::milliseconds(1000));
    if (sig == SIGTERM || sig == SIGHUP) ::kill(cmd.pid, sig);
    if (!step_gone && step.reap()) {
      step_gone = true;
      say("the stagefs step ended while the command ran (" + step.how() + "): the mount is gone");
    }
  }
  return cmd.exit_code();
}

}  // namespace

bool is_cause_line(std::string_view line) {
  if (line.find("another node failed to mount") != std::string_view::npos) return false;
  return line.find("] error: ") != std::string_view::npos || line.starts_with("srun: error:");
}

std::string summary_line(const std::string& stats_json) {
  const auto j = nlohmann::json::parse(stats_json, nullptr, false);
  if (!j.is_object()) return "the mount's counters could not be read";
  const auto n = [&](const char* k) { return j.value(k, uint64_t{0}); };
  const auto count = [](uint64_t v, const char* one, const char* many) {
    return std::to_string(v) + " " + (v == 1 ? one : many);
  };
  // Transfers that found every node's copy current (a replayed profile on warm caches) copied
  // nothing: the summary counts what was copied.
  const uint64_t copied = n("transfers") - std::min(n("transfers"), n("nothing_to_copy"));
  std::string s = count(j.value("ranks", uint64_t{1}), "node", "nodes") + ", " +
                  count(copied, "transfer", "transfers");
  if (n("batch_files") > 0)
    s += " (" + count(n("batch_files"), "small file", "small files") + " in " +
         count(n("batches"), "batch", "batches") + ")";
  if (n("transfer_failures") > 0) s += ", " + std::to_string(n("transfer_failures")) + " failed";
  if (n("bytes_broadcast") > 0 || n("bytes_from_seeds") > 0)
    s += ", " + stage::human_bytes(n("bytes_broadcast")) +
         " staged: " + stage::human_bytes(n("bytes_from_source")) + " read from the shared source, " +
         stage::human_bytes(n("bytes_from_seeds")) + " from node caches";
  s += "; on " + j.value("host", std::string("this node")) + " " + count(n("opens"), "open", "opens") + ", " +
       std::to_string(n("cache_hits")) + " from the cache";
  return s;
}

int run_job(const RunPlan& plan) {
  const sigset_t sigs = handled_signals();
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    say(std::string("pipe: ") + std::strerror(errno));
    return kRunFailed;
  }
  Child step;
  const int rc = spawn(step, plan.step, plan.step_env, fds[1], true);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    say("cannot start the daemons' step (" + plan.step.front() + "): " + std::strerror(rc));
    return kRunFailed;
  }
  StepLog log(fds[0]);

  int sig = 0;
  std::string why = wait_until_ready(plan.mountpoint, plan.wait_timeout, [&]() -> std::string {
    if (const int s = next_signal(std::chrono::milliseconds(0)); s != 0 && s != SIGCHLD) {
      sig = s;
      return std::string("interrupted by SIG") + ::sigabbrev_np(s);
    }
    if (step.reap()) return "the stagefs step ended (" + step.how() + ")";
    return {};
  });
  if (!why.empty()) {
    const bool ended = step.reap();
    stop_step(step, plan.mountpoint, 10);
    log.finish();
    // A node that failed makes the others unmount: this node's mount may be seen gone (stale,
    // stopping) just before the step is: the step's end is the story.
    if (sig == 0 && (ended || why.starts_with("stale") || why == "stopping") && step.exit_code() != 0)
      why = "the stagefs step ended (" + step.how() + ")";
    say(plan.mountpoint + " is not ready on every node: " + why);
    if (const std::string cause = log.cause(); !cause.empty()) say("the first error: " + cause);
    return sig != 0 ? 128 + sig : kRunFailed;
  }

  const int status = run_command(plan, step);
  const std::string stats = settled_stats(plan.mountpoint, std::chrono::seconds(10));
  const bool clean = stop_step(step, plan.mountpoint, plan.stop_timeout);
  log.finish();
  say(plan.mountpoint + ", " + summary_line(stats));
  if (!clean || step.exit_code() != 0)
    say("the stagefs step ended with " + step.how() + " (the daemons' log is above)");
  return status;
}

}  // namespace stagefs::run
