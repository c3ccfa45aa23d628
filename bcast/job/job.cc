#include "bcast/job/job.h"

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "bcast/comm/comm_mpi.h"
#include "bcast/io/paths.h"
#include "bcast/transfer/report.h"

namespace stage {

namespace {

// What this rank finds wrong with the paths it will use, or empty: a source on a
// pseudo filesystem (a /proc file is 0 bytes by stat and text by read: the copy would be
// empty), a destination that is a device, FIFO or socket (the copy is renamed over it: --dest
// /dev/null would replace /dev/null) or a directory without -r, a destination that is the
// source or, with -r, overlaps the source tree (the tree would be staged into itself).
// Symlinks are resolved first. The source rank checks the source, each writer its own
// destination. The engine refuses special destinations again when it reaches them (and files
// that read longer than their size), with status 1; these checks give the usage status 2
// before anything is created.
std::string check_paths(const BcastJob& job, const std::string& dest, bool reads_source, bool writes) {
  const std::string& source = job.source;
  const bool recursive = job.opt.recursive;
  if (reads_source) {
    if (const char* fs = pseudo_fs_of(source))
      return "--source " + source + " is on " + fs +
             ", a pseudo filesystem whose file sizes do not describe their contents: refusing it "
             "(copy it to a regular file first)";
  }
  if (!writes) return {};
  struct stat st {};
  if (::lstat(dest.c_str(), &st) == 0) {
    if (const char* kind = special_file_kind(st.st_mode))
      return "--dest " + dest + " is a " + kind +
             ": refusing to replace it (give the path of a regular file, or of one that does not exist)";
    if (S_ISDIR(st.st_mode) && !recursive)
      return "--dest " + dest +
             " is a directory: give the destination file's path (or --recursive for a tree)";
  }
  const std::string src = resolve_path(source);
  const std::string dst = resolve_path(dest);
  if (dst == src) return "--dest " + dest + " is the source " + source + " itself (" + dst + ")";
  if (recursive && path_within(dst, src))
    return "--dest " + dest + " lies inside --source " + source + " (" + dst + " in " + src +
           "): the tree would be staged into itself";
  if (recursive && path_within(src, dst))
    return "--source " + source + " lies inside --dest " + dest + " (" + src + " in " + dst +
           "): the copy would be written over the source tree";
  return {};
}

// Every rank learns whether any rank refused its paths; the first rank prints each distinct
// message once. Returns the exit status (2), or 0 when every rank is fine, 1 if MPI failed.
int agree_on_paths(Comm& world, const std::string& why) {
  auto bad = allreduce_max(world, why.empty() ? 0 : 1);
  if (!bad) {
    std::fprintf(stderr, "stage-bcast: %s\n", bad.error().message.c_str());
    return 1;
  }
  if (*bad == 0) return 0;
  auto all = world.gather(why, 0);
  if (!all) {
    std::fprintf(stderr, "stage-bcast: %s\n", all.error().message.c_str());
    return 1;
  }
  if (world.rank() == 0) {
    std::vector<std::string> seen;
    for (const auto& m : *all) {
      if (m.empty() || std::find(seen.begin(), seen.end(), m) != seen.end()) continue;
      seen.push_back(m);
      std::fprintf(stderr, "stage-bcast: %s\n", m.c_str());
    }
    std::fputs("Try 'stage-bcast --help'.\n", stderr);
  }
  return 2;
}

// After the transfer: the verbose line, the report on the source rank, the exit status.
int finish_job(const BcastJob& job, const StageReport& report, const Comm& world, const NodeRole& role,
               const std::string& dest) {
  if (job.verbose)
    spdlog::info("{}: rank {} {} {}", host_name(), world.rank(),
                 !role.writer             ? "relayed (not this node's writer)"
                 : report.this_node_wrote ? "wrote"
                                          : "already had a current copy of",
                 dest);
  if (report.comm_broken) {
    // Some ranks may be stuck inside MPI (a lost node or link): MPI_Finalize would wait for
    // them forever. Leave without it; the launcher sees a rank end without finalizing and
    // ends the others (mpirun and srun both do), so every rank's command returns.
    for (const auto& e : report.errors)
      std::fprintf(stderr, "stage-bcast: rank %d: error: %s\n", world.rank(), e.c_str());
    std::fflush(nullptr);
    std::_Exit(1);
  }
  if (world.rank() == job.opt.root) {
    if (job.json)
      std::fputs(report_json(report, job.source, job.dest, world.size()).c_str(), stdout);
    else
      std::fputs(report_table(report, job.source, job.dest).c_str(), stdout);
    for (const auto& e : report.errors) std::fprintf(stderr, "stage-bcast: error: %s\n", e.c_str());
  }
  return report.exit_code;
}

}  // namespace

std::string expand_dest(const std::string& pattern, int rank, int node, const std::string& host) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '%' || i + 1 == pattern.size()) {
      out += pattern[i];
      continue;
    }
    switch (pattern[++i]) {
      case 'r':
        out += std::to_string(rank);
        break;
      case 'n':
        out += std::to_string(node);
        break;
      case 'h':
        out += host;
        break;
      case '%':
        out += '%';
        break;
      default:
        out += '%';
        out += pattern[i];
    }
  }
  return out;
}

std::string check_job(const BcastJob& job) {
  if (job.source.empty()) return "--source: empty path";
  if (job.dest.empty()) return "--dest: empty path";
  if (job.dest.back() == '/') return "--dest: give the destination file's path, not a directory";
  return {};
}

namespace {
int usage_error(const BcastJob& job, const std::string& why) {
  if (job.usage_error) return job.usage_error(why);
  if (launcher_rank() == 0) std::fprintf(stderr, "stage-bcast: %s\n", why.c_str());
  return 2;
}
}  // namespace

int run_bcast_job(BcastJob job, int* argc, char*** argv) {
  if (auto why = check_job(job); !why.empty()) return usage_error(job, why);
  spdlog::set_default_logger(spdlog::stderr_logger_mt("stage-bcast"));
  spdlog::set_pattern("[%l] %v");
  spdlog::set_level(job.verbose ? spdlog::level::info : spdlog::level::warn);

  // With a launcher: MPI (FUNNELED: only this thread calls MPI; the engine's reader and writer
  // threads never do). Without one: a world of one rank, no MPI at all.
  auto ranks = start_ranks(
      argc, argv, {{"stage-bcast", job.startup_timeout, MPI_THREAD_FUNNELED}, true, job.ranks_as_nodes});
  if (!ranks) {
    std::fprintf(stderr, "stage-bcast: %s\n", ranks.error().message.c_str());
    return 1;
  }
  Comm& world = *ranks->world;
  const StageOptions& opt = job.opt;
  if (opt.root < 0 || opt.root >= world.size())
    return usage_error(job, "--source-rank " + std::to_string(opt.root) + " is out of range (job has " +
                                std::to_string(world.size()) + " ranks)");

  StageEndpoint ep;
  ep.source = job.source;
  ep.dest = expand_dest(job.dest, world.rank(), ranks->role.node, host_name());
  ep.writer = ranks->role.writer;
  const bool is_root = world.rank() == opt.root;
  if (const int rc = agree_on_paths(world, check_paths(job, ep.dest, is_root, ep.writer)); rc != 0) return rc;
  // Every rank posts receives of the sender's message size: the source rank's counts.
  if (auto st = bcast_value(world, job.opt.pipeline.segment, opt.root); !st) {
    std::fprintf(stderr, "stage-bcast: %s\n", st.error().message.c_str());
    return 1;
  }
  PosixSource source;
  PosixStore store(StoreOptions{.direct_io = job.direct_io, .xattrs = job.xattrs});
  const auto io = wrap_seams(job.wrap_seams, store, source, world.rank());
  ProgressLine progress(is_root ? progress_mode(job.json && job.progress == ProgressWhen::automatic
                                                    ? ProgressWhen::off
                                                    : job.progress,
                                                job.verbose, isatty(STDERR_FILENO) != 0)
                                : ProgressMode::off);
  auto report = stage_transfer(world, &io->source(), io->store(), opt, ep,
                               [&](uint64_t done, uint64_t total) { progress.update(done, total); });
  progress.finish();
  report.t.topology = ranks->topology_s;  // the report times our work, not MPI start-up
  report.t.total += ranks->topology_s;
  return finish_job(job, report, world, ranks->role, ep.dest);
}

}  // namespace stage
