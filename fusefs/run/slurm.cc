#include "fusefs/run/slurm.h"

#include <cerrno>
#include <charconv>

namespace stagefs::run {

namespace {

// A refusal whose message is the whole story (no host, no strerror).
stage::Error refusal(int err, std::string message) {
  return stage::Error{std::error_code(err, std::generic_category()), std::move(message)};
}

}  // namespace

stage::Result<SlurmJob> slurm_job(const Env& env) {
  const auto get = [&](const char* name) {
    const char* v = env(name);
    return std::string(v != nullptr ? v : "");
  };
  SlurmJob job;
  job.id = get("SLURM_JOB_ID");
  if (job.id.empty())
    return refusal(ENOENT,
                   "not inside a Slurm job (SLURM_JOB_ID is not set): run it in a job script (sbatch) or "
                   "an interactive job step (srun --pty bash); to mount on this machine alone: stagefs "
                   "SOURCE_DIR MOUNTPOINT --cache DIR");
  job.node = get("SLURMD_NODENAME");
  if (job.node.empty())
    return refusal(ENOENT, "this shell does not run on a node of job " + job.id +
                               " (SLURMD_NODENAME is not set: salloc's shell runs on the login node): run it "
                               "in the batch script, or in an interactive job step (srun --pty bash)");
  const std::string n = get("SLURM_JOB_NUM_NODES");
  const auto [end, ec] = std::from_chars(n.data(), n.data() + n.size(), job.nodes);
  if (n.empty() || ec != std::errc() || end != n.data() + n.size() || job.nodes == 0)
    return refusal(EINVAL, "SLURM_JOB_NUM_NODES is '" + n + "', not a node count");
  return job;
}

std::vector<std::string> daemon_step(const SlurmJob& job, const std::vector<std::string>& daemon_argv) {
  const std::string n = std::to_string(job.nodes);
  std::vector<std::string> argv{
      "srun",          "--overlap",           "--job-name=stagefs",   "--nodes=" + n,
      "--ntasks=" + n, "--ntasks-per-node=1", "--kill-on-bad-exit=1", "--mpi=pmix",
      "--quiet"};
  argv.insert(argv.end(), daemon_argv.begin(), daemon_argv.end());
  return argv;
}

bool is_pyxis_container_var(std::string_view entry) {
  return entry.starts_with("PYXIS_CONTAINER_");
}

std::vector<std::string> step_environment(const char* const* environ) {
  std::vector<std::string> out;
  for (const char* const* e = environ; e != nullptr && *e != nullptr; ++e)
    if (!is_pyxis_container_var(*e)) out.emplace_back(*e);
  return out;
}

}  // namespace stagefs::run
