// stagefs run: the whole life of a mount inside a Slurm job, around one command.
//
//   1. start the daemons' step (slurm.h) in the background, in a process group of its own
//      (a ^C at the terminal is the command's, not srun's); its output, the daemons' logs,
//      goes to stderr line by line, and the errors in it are kept
//   2. wait until the mount is ready on every node (on this node the state is "ready" only
//      once every node has mounted: status.h); give up at once when the step ends (quoting
//      the error a daemon logged: the node and the cause), at the wait timeout, or on a signal
//   3. run the command, with STAGEFS_MOUNT=MOUNTPOINT in its environment, and wait for it
//   4. read the mount's counters, ask the mount to stop (a read of user.stagefs.stop: every
//      node unmounts and its daemon exits 0, so Slurm cancels nothing and nobody is
//      signalled), wait for the step to end (bounded: then SIGTERM to srun, then SIGKILL)
//   5. one summary line on stderr; the command's exit status
//
// Exit status: the command's (128+N when signal N ended it); 125 when stagefs run failed
// before the command ran (the mount did not start); 126 the command could not be executed;
// 127 it was not found. SIGTERM and SIGHUP are passed on to the command; SIGINT and SIGQUIT
// reach it from the terminal (it shares stagefs run's process group) and are not passed on a
// second time. Before the command starts, any of them stops the mount (128+N).
// One call per process: it blocks those signals and SIGCHLD in the calling thread (before
// its own thread starts) and waits for them there.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace stagefs::run {

inline constexpr int kRunFailed = 125;

struct RunPlan {
  std::vector<std::string> step;      // the daemons' step (daemon_step)
  std::vector<std::string> step_env;  // its environment (step_environment)
  std::string mountpoint;
  std::vector<std::string> command;  // argv, looked up on PATH
  double wait_timeout = 300;         // seconds until every node has mounted
  double stop_timeout = 60;          // seconds the step gets to end after the stop request
};

int run_job(const RunPlan& plan);

// What a line of the step's output says: an error a daemon logged ("[stagefs n3 r2] error:
// ..."), or srun's ("srun: error: ..."); a daemon's echo of another node's failure is not one.
bool is_cause_line(std::string_view line);

// The one-line summary of the mount's counters (its user.stagefs.stats JSON): nodes, files
// staged, bytes and where they were read, this node's opens and cache hits.
std::string summary_line(const std::string& stats_json);

}  // namespace stagefs::run
