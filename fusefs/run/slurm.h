// stagefs run's Slurm glue: the job it runs in (from the environment Slurm gives a batch
// script or an interactive step), and the step that starts the daemons:
//
//   srun --overlap --job-name=stagefs --nodes=N --ntasks=N --ntasks-per-node=1
//        --kill-on-bad-exit=1 --mpi=pmix --quiet  STAGEFS SOURCE_DIR MOUNTPOINT --cache DIR ...
//
//   --overlap          the step runs for the whole job: without it, it would hold its CPUs and
//                      every later step would wait, silently, until it ends
//   --nodes, --ntasks, --ntasks-per-node=1   one daemon per node, whatever the job's layout
//   --kill-on-bad-exit=1  a daemon that fails (a node that cannot mount) ends the step at once
//   --mpi=pmix         the daemons form one MPI job
//   --quiet            no informational lines from srun in the job's output (errors stay)
//
// The step starts without the job's PYXIS_CONTAINER_* variables (with them, pyxis would run
// the daemons inside the container) and with stdin from /dev/null.
// Pure functions; thread-safe.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "bcast/io/error.h"

namespace stagefs::run {

// The environment, looked up by name (getenv, or a map in tests); nullptr: unset.
using Env = std::function<const char*(const char*)>;

struct SlurmJob {
  std::string id;      // SLURM_JOB_ID
  unsigned nodes = 0;  // SLURM_JOB_NUM_NODES: the job's, not the step's
  std::string node;    // SLURMD_NODENAME: this shell runs on a node of the job
};

// The job this process runs in, or why stagefs run cannot start here (not in a job; in
// salloc's shell on a login node, which is no node of the job).
stage::Result<SlurmJob> slurm_job(const Env& env);

// The daemons' step: srun, its options, then the daemon's command line.
std::vector<std::string> daemon_step(const SlurmJob& job, const std::vector<std::string>& daemon_argv);

// Whether a NAME=VALUE environment entry is one of pyxis's PYXIS_CONTAINER_* variables.
bool is_pyxis_container_var(std::string_view entry);

// The step's environment: environ without pyxis's container variables.
std::vector<std::string> step_environment(const char* const* environ);

}  // namespace stagefs::run
