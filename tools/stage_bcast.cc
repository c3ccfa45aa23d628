// stage-bcast: copy one file (or, with --recursive, a tree) from shared storage to every
// node's local disk with one source read and a pipelined MPI broadcast. A thin shell over
// bcast/job/job.h: parse options into a BcastJob (whose member values are the defaults --help
// shows) and run it. Exit status: 0 done, 1 failed (the same on every rank), 2 usage,
// 3 MPI start-up did not complete within --startup-timeout (bcast/comm/mpi_start.h).
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <sstream>
#include <string>

#include "bcast/comm/comm_mpi.h"
#include "bcast/holds/holds.h"
#include "bcast/io/paths.h"
#include "bcast/job/job.h"
#include "fusefs/cache/copy_xattrs.h"
#include "fusefs/profile/file.h"
#include "tools/cli.h"
#include "tools/help_format.h"
#include "tools/options.h"

namespace {

const char* const kAbout =
    "Stage a file from shared storage onto every node's local disk: one rank reads the source,\n"
    "the chunks travel by MPI broadcast, each node writes them to a temporary file, checks every\n"
    "chunk's CRC-64, fsyncs and renames it into place. Nodes that already hold a valid copy write\n"
    "nothing. Run one rank per node:  srun --mpi=pmix stage-bcast --source F --dest D\n"
    "Exit status: 0 staged (or already there), 1 failed on some node (same on every rank), 2 usage,\n"
    "3 not every rank got through MPI start-up within --startup-timeout.\n"
    "Refused as usage errors: a --dest that is a device, FIFO or socket (or a directory without\n"
    "--recursive), a --source on a pseudo filesystem (/proc, /sys, ...: sizes there are not\n"
    "contents), a --dest that is the source or, with -r, overlaps the source tree. A source\n"
    "that reads longer than its size fails the copy (1); nothing is published.";

// Declares the options on `job` (and --profile's path); returns --source-rank's option.
CLI::Option* add_options(CLI::App& app, stage::BcastJob& job, std::string& profile) {
  using stage::Validate;
  using stagetools::add_choice;
  stage::StageOptions& opt = job.opt;
  app.add_option("--source", job.source,
                 "file (or directory, with --recursive) on shared storage; not on /proc, /sys or "
                 "another pseudo filesystem")
      ->required();
  app.add_option("--dest", job.dest,
                 "destination path on each node; %r, %n, %h expand to rank, node index, host name. "
                 "A regular file or a path that does not exist (a directory with --recursive), "
                 "never a device, FIFO or socket")
      ->required();
  const std::vector<std::pair<std::string, Validate>> validations{
      {"size", Validate::size}, {"checksum", Validate::checksum}, {"none", Validate::none}};
  add_choice(app, "--pre-validate", opt.pre, validations,
             "when a node's existing copy counts as current: size (size and mtime match), "
             "checksum (CRC-64 matches), none (always copy). A copy feeds other nodes only if it is "
             "proven to be the source's current version: one stage-bcast wrote whose recorded origin "
             "matches the source now, or one checked by checksum");
  add_choice(app, "--source-version", opt.source_version, stagetools::source_versions(),
             stagetools::kSourceVersionHelp);
  add_choice(app, "--post-validate", opt.post, validations,
             "after writing: size, checksum (re-read each copy from disk and compare with the "
             "source's CRC), or none");
  app.add_flag("--overwrite", opt.overwrite, "copy even where a current copy exists");
  CLI::Option* source_rank =
      app.add_option("--source-rank", opt.root,
                     "rank that reads the source. Without it, when some node already holds a proven current "
                     "copy (see --pre-validate) of every file a node needs, that node's rank reads its own "
                     "copy and feeds the others (a seed), and the source is read for metadata only; a seed "
                     "that fails mid-way is replaced by another, or by the source")
          ->capture_default_str()
          ->check(stagetools::whole(0, 2147483647));
  stagetools::add_size(app, "--chunk-size", opt.chunk_size,
                       "broadcast chunk, 4K..1G (K, M, G suffixes); every rank uses the source rank's",
                       stage::check_chunk_size);
  add_choice(app, "--bcast-algorithm", opt.bcast_algorithm, stagetools::bcast_algorithms(),
             "how chunk data travels: chain (every chunk through one pipelined chain of "
             "segments over point-to-point messages: the source sends each byte once, time "
             "nearly flat in the node count), tree (pipelined binary tree), mpi (the MPI "
             "library's MPI_Bcast, chunk by chunk), auto (chain for transfers over 64 KiB)");
  stagetools::add_bcast_segment(app, opt.pipeline.segment, "every rank uses the source rank's");
  std::ostringstream stall;
  stall << std::chrono::duration<double>(opt.pipeline.stall_timeout).count();
  app.add_option_function<double>(
         "--stall-timeout",
         [&o = job.opt](double s) {
           o.pipeline.stall_timeout = std::chrono::milliseconds(static_cast<int64_t>(s * 1000));
         },
         "chain/tree: seconds without progress (a node or link gone) before the transfer "
         "fails; 0 waits forever")
      ->check(stagetools::seconds(0, 1e6))
      ->default_str(stall.str());
  app.add_option("--startup-timeout", job.startup_timeout,
                 "seconds a rank waits for every rank to get through MPI start-up (a rank that "
                 "died or hangs at start would otherwise keep the others waiting until the job's "
                 "time limit); then it says so and exits with status 3. 0 waits forever")
      ->check(stagetools::seconds(0, 1e6))
      ->capture_default_str();
  add_choice(app, "--direct-io", job.direct_io, {{"auto", true}, {"off", false}},
             "auto: write each copy with O_DIRECT where the destination filesystem accepts it (no "
             "page-cache copy, no cache pollution; unaligned parts go buffered), off: buffered writes");
  app.add_flag("-r,--recursive", opt.recursive, "stage a directory tree (files, directories, symlinks)");
  app.add_option("--profile", profile,
                 "with --recursive: the files of this stagefs profile (what a job read, see stagefs "
                 "--profile) go first in the stream, in the order that job read them; the other files "
                 "follow. Paths are taken relative to --source (or to the profile's source directory, "
                 "when --source lies inside it). Read by the source rank; one it cannot use is said "
                 "and left out");
  app.add_flag("--ranks-as-nodes", job.ranks_as_nodes,
               "treat every rank as its own node (tests on one machine)");
  app.add_flag("--json", job.json, "print the report as JSON on stdout");
  add_choice(app, "--progress", job.progress,
             {{"auto", stage::ProgressWhen::automatic},
              {"on", stage::ProgressWhen::on},
              {"off", stage::ProgressWhen::off}},
             "the source rank's progress line on stderr (bytes, percent, rate, ETA): auto shows it "
             "rewritten in place when stderr is a terminal, and as a line per tenth of the copy "
             "in a log with --verbose; on shows it in a log too (a line per tenth, or per minute), "
             "off never");
  app.add_flag("-v,--verbose", job.verbose,
               "log each node's decisions (and the progress in a log: --progress)");
  return source_rank;
}

// --profile: the profile's files, for the source rank's stream (none, said, if it cannot be
// used: the order only saves time, and the other ranks do not read it).
std::vector<std::string> first_files(const std::string& path, const stage::BcastJob& job) {
  if (!job.opt.recursive) {
    std::fprintf(stderr, "stage-bcast: --profile orders the files of a tree: it needs --recursive\n");
    return {};
  }
  auto p = stagefs::read_profile(path, ::geteuid() != 0 ? std::optional<uid_t>(::geteuid()) : std::nullopt);
  if (!p) {
    std::fprintf(stderr, "stage-bcast: --profile not used: %s\n", p.error().message.c_str());
    return {};
  }
  return stagefs::profile_paths_under(p->profile, stage::resolve_path(job.source));
}

}  // namespace

int main(int argc, char** argv) {
  // A reader of stdout or stderr that went away (`| head`, a log pipeline that ended) must not
  // end this rank mid-broadcast (and with it the whole job's copy): writes then fail with
  // EPIPE and the exit status stays the transfer's.
  ::signal(SIGPIPE, SIG_IGN);
  stage::BcastJob job;
  CLI::App app{kAbout, "stage-bcast"};
  stagetools::use_help_format(app);
  app.set_version_flag("--version", std::string("stage-bcast ") + STAGEFS_VERSION);
  std::string profile;
  CLI::Option* source_rank = add_options(app, job, profile);
  // Every rank parses; the launcher's first rank alone prints (help, version, usage errors).
  const stagetools::Command cmd{"stage-bcast", "stage-bcast", 2, stage::launcher_rank() == 0, {}, {}};
  if (auto exit_status = stagetools::parse(app, argc, argv, cmd)) return *exit_status;
  job.opt.seed_from_copies = source_rank->count() == 0;
  if (!profile.empty() && stage::launcher_rank() == job.opt.root)
    job.opt.first_files = first_files(profile, job);
  job.xattrs = stagefs::kCopyXattrs;   // the mount's names: its copies and ours read alike
  job.wrap_seams = stage::test_holds;  // the crash tests stop real processes at these points
  job.usage_error = [&cmd](const std::string& why) { return stagetools::usage_error(cmd, why); };
  return stage::run_bcast_job(std::move(job), &argc, &argv);
}
