// stagefs: mount a read-only view of SOURCE_DIR whose files are copied onto every node's
// local disk at their first open (one MPI broadcast per file for the whole job step).
// A thin shell over fusefs/edge/daemon.h: parse options into DaemonConfig (whose member values are
// the defaults --help shows), run the daemon or wait for readiness.
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <tuple>

#include "bcast/holds/holds.h"
#include "bcast/io/chunk.h"
#include "bcast/io/paths.h"
#include "bcast/transfer/pipeline.h"
#include "fusefs/base/log.h"
#include "fusefs/edge/daemon.h"
#include "fusefs/run/run.h"
#include "fusefs/run/site.h"
#include "fusefs/run/slurm.h"
#include "tools/cli.h"
#include "tools/help_format.h"
#include "tools/options.h"

namespace {

// --cache-size: bytes with K/M/G/T, or N% of the cache filesystem.
void parse_cache_size(const std::string& text, stagefs::DaemonConfig& cfg) {
  if (!text.empty() && text.back() == '%') {
    const auto pct = stagetools::finite_number(text.substr(0, text.size() - 1));
    if (!pct || !(*pct > 0 && *pct <= 100))
      throw CLI::ValidationError("--cache-size", "not a percentage in (0, 100]: '" + text + "'");
    cfg.cache_size_percent = *pct;
    return;
  }
  const auto n = stage::parse_size(text);
  if (!n || *n == 0) throw CLI::ValidationError("--cache-size", "not a size: '" + text + "'");
  cfg.cache_size = *n;
}

// The largest count an option takes (a double holds every whole number up to it).
constexpr double kMaxCount = 9007199254740992.0;  // 2^53

const std::vector<std::pair<std::string, bool>> kOnOff{{"on", true}, {"off", false}};

const char* const kAbout =
    "stagefs: a read-only FUSE view of SOURCE_DIR at MOUNTPOINT. The first open of a file, on any\n"
    "node, copies it to every node's CACHE_DIR with one MPI broadcast (one node reads the shared\n"
    "source); reads are then served from the local copy (kernel passthrough where the kernel and\n"
    "privileges allow it), and a large file's reads may start before its copy ends.\n"
    "In a Slurm job, one line does it all (stagefs run --help, man stagefs-run):\n\n"
    "  stagefs run /shared/images -- srun ch-run /stage/$SLURM_JOB_ID/app.sqsh -- python3 train.py\n\n"
    "By hand: one daemon per node as a step that runs for the whole job (--overlap lets the job's\n"
    "other steps share the nodes), then the job's steps:\n\n"
    "  srun --overlap --ntasks-per-node=1 --mpi=pmix stagefs /shared/images /stage/$SLURM_JOB_ID \\\n"
    "       --cache /nvme/stagefs/$USER &\n"
    "  stagefs --wait /stage/$SLURM_JOB_ID     # returns once every node has mounted\n"
    "  srun ch-run /stage/$SLURM_JOB_ID/pytorch.sqsh -- ...   # or pyxis: srun --container-image=...\n\n"
    "Without srun/mpirun it is a one-node cache-on-open filesystem. Stop it with fusermount3 -u on\n"
    "any node, a read of the mount's user.stagefs.stop attribute, SIGTERM to the daemons (scancel\n"
    "--signal=TERM JOBID.STEPID; killing srun itself makes Slurm SIGKILL the tasks), or the end of\n"
    "the job step: every node unmounts.\n\n"
    "Exit status: 0 unmounted, 1 refused at start or failed, 2 usage: a bad option, or SOURCE_DIR,\n"
    "MOUNTPOINT and --cache inside one another (symlinks resolved), or SOURCE_DIR on /proc, /sys...,\n"
    "3 not every node's daemon got through MPI start-up within --startup-timeout (nothing mounted).\n"
    "As a user (the model on a cluster: each job's daemons run as its user): the mount is for that\n"
    "user only unless /etc/fuse.conf has user_allow_other, and reads are spliced (kernel\n"
    "passthrough needs CAP_SYS_ADMIN).";

// The command line: the daemon's settings, and what only this command uses.
struct Cli {
  stagefs::DaemonConfig cfg;
  std::string wait_for;
  double wait_timeout = 300;
  bool verbose = false, no_passthrough = false;
};

// SOURCE_DIR, MOUNTPOINT and --cache.
void add_paths(CLI::App& app, Cli& cli, const std::string& mountpoint_help) {
  stagefs::DaemonConfig& cfg = cli.cfg;
  app.add_option("SOURCE_DIR", cfg.source_dir, "shared directory to mirror");
  app.add_option("MOUNTPOINT", cfg.mountpoint, mountpoint_help);
  app.add_option("--cache", cfg.cache_dir,
                 "node-local directory for the copies (created 0700); not inside SOURCE_DIR or "
                 "MOUNTPOINT, nor containing either");
}

// Every daemon option but its paths: the mount's, and stagefs run's for the daemons it starts.
void add_mount_options(CLI::App& app, Cli& cli) {
  using stagetools::add_choice;
  using stagetools::add_size;
  using stagetools::seconds;
  using stagetools::whole;
  stagefs::DaemonConfig& cfg = cli.cfg;
  add_size(app, "--chunk-size", cfg.chunk_size, "broadcast chunk, 4K..1G", stage::check_chunk_size);
  add_choice(app, "--bcast-algorithm", cfg.bcast_algorithm, stagetools::bcast_algorithms(),
             "how chunk data travels: chain (every chunk through one pipelined chain of "
             "segments, the source sends each byte once; time nearly flat in the node count), "
             "tree (pipelined binary tree), mpi (the MPI library's MPI_Bcast, chunk by chunk), "
             "auto (chain for transfers over 64 KiB)");
  stagetools::add_bcast_segment(app, cfg.bcast_segment, "every node uses rank 0's");
  app.add_option("--attr-timeout", cfg.mount.attr_timeout, "seconds the kernel caches attributes")
      ->capture_default_str()
      ->check(seconds(0, 1e9));
  app.add_option("--entry-timeout", cfg.mount.entry_timeout, "seconds the kernel caches names")
      ->capture_default_str()
      ->check(seconds(0, 1e9));
  app.add_option("--stall-timeout", cfg.stall_timeout,
                 "seconds without progress (a node or link gone) before a waiting open gives up; also how "
                 "long an open waits for room in the cache that files held open take (then ENOSPC)")
      ->capture_default_str()
      ->check(seconds(0.1, 1e6));
  app.add_option("--startup-timeout", cfg.startup_timeout,
                 "seconds a daemon waits for every node's daemon to get through MPI start-up (one "
                 "that died or hangs at start would otherwise keep the others waiting until the "
                 "job's time limit); then it says so and exits with status 3. 0 waits forever")
      ->capture_default_str()
      ->check(seconds(0, 1e6));
  add_choice(app, "--on-stall", cfg.on_stall,
             {{"eio", stagefs::StallPolicy::eio}, {"source", stagefs::StallPolicy::source}},
             "what a stalled open does: eio (fail) or source (read the shared source directly)");
  add_choice(app, "--direct-io", cfg.direct_io, {{"auto", true}, {"off", false}},
             "off: buffered cache writes, so the copy is in the page cache for the read that "
             "asked for it; auto: O_DIRECT where the cache filesystem accepts it (less CPU "
             "while materializing, but the first read comes from disk)");
  add_choice(app, "--verify-cache", cfg.verify_cache,
             {{"crc", stagefs::Verify::crc}, {"none", stagefs::Verify::none}},
             "crc: before a copy found in the cache (made by an earlier mount) is first served, "
             "read it once and check the CRC it was recorded with; a corrupted copy is removed "
             "and copied again. none: trust its recorded origin (--source-version)");
  add_choice(app, "--source-version", cfg.source_version, stagetools::source_versions(),
             stagetools::kSourceVersionHelp);
  app.add_option_function<std::string>(
         "--cache-size", [&c = cli.cfg](const std::string& text) { parse_cache_size(text, c); },
         "most the cache may hold: bytes with K/M/G/T, or N% of the cache filesystem; least "
         "recently used copies not open on the node are evicted to make room")
      ->type_name("SIZE|N%")
      ->default_str("no limit beyond the filesystem's free space");
  app.add_option("--spare-caches", cfg.spare_caches,
                 "when --cache is in use by another stagefs on this node (another job of the same user), "
                 "use the first free of CACHE/spare.1 .. CACHE/spare.N instead: a cache of its own, "
                 "reused by later jobs that find CACHE in use. 0: refuse to start")
      ->capture_default_str()
      ->check(whole(0, 64));
  add_choice(app, "--read-during-copy", cfg.read_during_copy, kOnOff,
             "on: an open of a file being copied returns as soon as its transfer runs on this "
             "node; a read waits only for the chunks it needs, and the source sends the chunks "
             "readers on any node wait for first (such a handle is served by the daemon, not "
             "kernel passthrough). off: an open waits for the whole verified copy");
  add_choice(app, "--nested-batches", cfg.batches.nested_batches, kOnOff,
             "on: a batch of small files opened while a large file is being copied is copied "
             "at once, on a second communicator, nested at the next chunk of the large "
             "stream, instead of waiting until the large copy ends (only the setting of rank "
             "0 counts). off: one transfer at a time");
  add_choice(app, "--prefetch-siblings", cfg.batches.prefetch_siblings, kOnOff,
             "on: once opens have staged the small files of two directories with the same "
             "parent (a reader walking a tree), the small files of the parent's other "
             "subdirectories (those every user may list and enter) are staged too, one "
             "directory after another, in the background: only when no open waits, so the "
             "source is read while readers read what is already here (only the setting of "
             "rank 0 counts). off: only what opens ask for");
  app.add_option("--batch-max-files", cfg.batches.batch_max_files,
                 "a batch stages at most this many small files: a larger directory goes in several "
                 "batches, the opened file's first, and other users' opens are served between them "
                 "(only the setting of rank 0 counts). 0: no limit")
      ->capture_default_str()
      ->check(whole(0, kMaxCount));
  add_size(app, "--batch-max-bytes", cfg.batches.batch_max_bytes,
           "a batch stages at most this many bytes (K/M/G), as --batch-max-files, each file "
           "counted as its size and 8K more (what its copy takes beyond its bytes). 0: no limit");
  app.add_option("--prefetch-max-dirs", cfg.batches.prefetch_max_dirs,
                 "--prefetch-siblings stages at most this many subdirectories of a walked parent "
                 "(rank 0's setting). 0: no limit")
      ->capture_default_str()
      ->check(whole(0, kMaxCount));
  add_size(app, "--prefetch-max-bytes", cfg.batches.prefetch_max_bytes,
           "--prefetch-siblings stages at most this many bytes (K/M/G) of small files per "
           "walked parent, each file counted as its size and 8K more (what its copy takes "
           "beyond its bytes); so do the batches one open or prefetch of a small file starts "
           "(its directory's slices, taken together). What is left waits for its own opens "
           "(rank 0's setting). 0: no limit");
  app.add_option("--prefetch-max-files", cfg.batches.prefetch_max_files,
                 "as --prefetch-max-bytes, in small files: at most this many per walked parent, and "
                 "per open or prefetch of a small file (rank 0's setting). 0: no limit")
      ->capture_default_str()
      ->check(whole(0, kMaxCount));
  add_size(app, "--small-file-size", cfg.small_file_size,
           "files of at most this size (bytes with K/M/G) are staged by directory: the first "
           "open of one copies every small file of its directory (not subdirectories) in one "
           "transfer; larger files are copied alone. 0: every file alone",
           [](uint64_t n) -> std::optional<std::string> {
             if (n > stagefs::kMaxSmallFileSize)
               return "at most " + stage::size_text(stagefs::kMaxSmallFileSize) + ": '" +
                      stage::size_text(n) + "'";
             return std::nullopt;
           });
  app.add_option("--sync-after", cfg.sync_after,
                 "seconds after a batch's copies are published that they are synced to disk in "
                 "the background: the open that waits for a batch never waits for the "
                 "disk. The batch's names are recorded in the cache first (one small synced write), "
                 "so after a crash or power loss the next start removes the copies that were not "
                 "synced. 0: sync each batch before its files appear")
      ->capture_default_str()
      ->check(seconds(0, 3600));
  app.add_option("--profile", cfg.profile,
                 "where the mount records what its job read (the files, in the order of first access, "
                 "and the chunks of large files read while they were copied), written when the mount "
                 "ends, and where the next mount of SOURCE_DIR finds it: auto (under $XDG_CACHE_HOME "
                 "or ~/.cache/stagefs/profiles/, one file per SOURCE_DIR), off (no profile), or a path "
                 "(the same on every node)")
      ->capture_default_str();
  add_choice(app, "--replay", cfg.replay, kOnOff,
             "on: once every node has mounted, the files of the last job's profile are staged in the "
             "background, in the order that job read them: behind every open, never evicting a copy, "
             "each checked against the access of the profile's user (the daemon's; for a daemon "
             "running as root, the profile file's owner). off: only record (rank 0's setting)");
  app.add_option("--max-open-per-user", cfg.max_open_per_user,
                 "files and directories one user (other than root) may hold open through the mount on "
                 "a node; past it, that user's opens fail with EMFILE (Too many open files), others' "
                 "go on. At most a quarter of what the daemon's descriptor limit (RLIMIT_NOFILE, raised "
                 "to its hard limit at start; an eighth is kept for the daemon's own work) leaves users")
      ->capture_default_str()
      ->check(whole(1, kMaxCount));
  app.add_option("--metrics-file", cfg.metrics_file,
                 "write the counters in Prometheus text format to this file (atomically, every "
                 "--metrics-interval seconds), e.g. for node_exporter's textfile collector");
  app.add_option("--metrics-interval", cfg.metrics_interval, "seconds between metrics file rewrites")
      ->capture_default_str()
      ->check(seconds(0.1, 86400));
  app.add_option("--threads", cfg.mount.max_threads, "FUSE worker threads")
      ->capture_default_str()
      ->check(whole(1, 1024));
  app.add_flag("--no-passthrough", cli.no_passthrough,
               "serve reads from the daemon even where passthrough works");
  app.add_flag("-v,--verbose", cli.verbose, "debug logging");
  app.add_flag("-d,--debug-fuse", cfg.mount.debug, "log every FUSE request (libfuse -d)");
}

// stagefs run: its own options, then the daemon's (passed on to every node's daemon).
struct Run {
  Cli cli;
  double wait_timeout = 300;
  std::vector<const CLI::Option*> passed_on;  // the daemon options, in --help order
};

const char* const kRunAbout =
    "stagefs run: mount SOURCE_DIR on every node of this Slurm job, run COMMAND, unmount. One line\n"
    "in a job script (in the batch script, or an interactive job step; not in salloc's shell):\n\n"
    "  stagefs run /shared/images -- srun --container-image=/stage/$SLURM_JOB_ID/app.sqsh python3 train.py\n"
    "  stagefs run /shared/images -- srun ch-run /stage/$SLURM_JOB_ID/app.sqsh -- python3 train.py\n\n"
    "It starts one daemon per node as a step of the job (srun --overlap --ntasks-per-node=1\n"
    "--kill-on-bad-exit=1 --mpi=pmix, without the job's PYXIS_CONTAINER_* variables), waits until every\n"
    "node has mounted (a node that cannot mount ends the wait at once, with its error), runs COMMAND\n"
    "with STAGEFS_MOUNT set to the mount point, asks the daemons to stop (every node unmounts), prints\n"
    "one line on what was staged, and exits with COMMAND's status.\n\n"
    "The defaults are the site's, from /etc/stagefs/stagefs.conf (or the file STAGEFS_CONF names):\n"
    "MOUNTPOINT STAGEFS_MOUNT (/stage/%j: a directory of this job), --cache STAGEFS_CACHE\n"
    "(/nvme/stagefs/%u: your cache on each node, reused by your later jobs), --cache-size\n"
    "STAGEFS_CACHE_SIZE (50%), --spare-caches STAGEFS_SPARE_CACHES (4); %j is the job id, %u your\n"
    "user name, %U your uid. The site's stagefs prolog creates these directories, yours alone.\n\n"
    "Exit status: COMMAND's; 125 stagefs run failed (usage, not in a job, the mount did not start:\n"
    "COMMAND did not run); 126 COMMAND cannot be executed; 127 COMMAND not found.";

void add_run(CLI::App& app, Run& r) {
  auto* sub = app.add_subcommand(
      "run",
      "stagefs run SOURCE_DIR [MOUNTPOINT] -- COMMAND: mount on every node of this Slurm job, run "
      "COMMAND, unmount (stagefs run --help)");
  stagetools::use_help_format(*sub);
  add_paths(*sub, r.cli,
            "where to mount, the same path on every node (default: the site's STAGEFS_MOUNT, /stage/%j)");
  sub->get_option("SOURCE_DIR")->required();
  sub->get_option("--cache")->description(
      "node-local directory for the copies (default: the site's STAGEFS_CACHE, /nvme/stagefs/%u)");
  sub->add_option("--wait-timeout", r.wait_timeout, "seconds to wait until every node has mounted")
      ->capture_default_str()
      ->check(stagetools::seconds(0.001, 1e6));
  const size_t before = sub->get_options().size();
  sub->option_defaults()->group("Options of every node's daemon (as for the mount itself)");
  add_mount_options(*sub, r.cli);
  sub->get_option("--cache-size")->default_str("the site's STAGEFS_CACHE_SIZE, 50%");
  sub->get_option("--spare-caches")->default_str("the site's STAGEFS_SPARE_CACHES, 4");
  const auto all = sub->get_options();
  r.passed_on.assign(all.begin() + static_cast<std::ptrdiff_t>(before), all.end());
}

// stagefs run's --help: its description, and its usage line with the command.
std::string run_help(CLI::App& sub) {
  sub.description(kRunAbout);
  std::string h = sub.help();
  const std::string usage = "Usage: run [OPTIONS] SOURCE_DIR [MOUNTPOINT]";
  if (const size_t at = h.find(usage); at != std::string::npos)
    h.replace(at, usage.size(), "Usage: stagefs run [OPTIONS] SOURCE_DIR [MOUNTPOINT] -- COMMAND [ARGS...]");
  return h;
}

// The daemon's command line for the options given to stagefs run.
std::vector<std::string> passed_on(const Run& r) {
  std::vector<std::string> args;
  for (const CLI::Option* o : r.passed_on) {
    if (o->count() == 0) continue;
    if (o->get_expected_max() == 0) {  // a flag
      for (size_t i = 0; i < o->count(); ++i) args.push_back(o->get_name());
      continue;
    }
    for (const auto& v : o->results()) {
      args.push_back(o->get_name());
      args.push_back(v);
    }
  }
  return args;
}

int run_failed(const std::string& m) {
  std::fprintf(stderr, "stagefs run: %s\n", m.c_str());
  return stagefs::run::kRunFailed;
}

int run_main(Run& r, const CLI::App& sub, std::vector<std::string> command) {
  namespace run = stagefs::run;
  if (command.empty()) return run_failed("no COMMAND: give it after --\nTry 'stagefs run --help'.");
  auto job = run::slurm_job([](const char* n) { return std::getenv(n); });
  if (!job) return run_failed(job.error().message);
  const char* conf = std::getenv(run::kSiteConfigEnv);
  auto site = run::load_site_config(conf != nullptr && *conf != '\0' ? conf : run::kSiteConfigPath);
  if (!site) return run_failed(site.error().message);
  for (const auto& w : site->warnings) std::fprintf(stderr, "stagefs run: warning: %s\n", w.c_str());
  const run::PatternValues who{job->id, stage::user_name(::getuid()), ::getuid()};
  stagefs::DaemonConfig& cfg = r.cli.cfg;
  for (auto [given, pattern, key] : {std::tuple{&cfg.mountpoint, site->mount, "STAGEFS_MOUNT"},
                                     std::tuple{&cfg.cache_dir, site->cache, "STAGEFS_CACHE"}}) {
    if (!given->empty()) continue;
    auto path = run::expand_pattern(pattern, who);
    if (!path) return run_failed(std::string(key) + ": " + path.error().message);
    *given = *path;
  }
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return run_failed(std::string("/proc/self/exe: ") + std::strerror(errno));
  std::vector<std::string> daemon{std::string(self, static_cast<size_t>(n)),
                                  std::filesystem::absolute(cfg.source_dir).lexically_normal().string(),
                                  cfg.mountpoint, "--cache", cfg.cache_dir};
  const auto given = passed_on(r);
  daemon.insert(daemon.end(), given.begin(), given.end());
  if (sub.get_option("--cache-size")->count() == 0)
    daemon.insert(daemon.end(), {"--cache-size", site->cache_size});
  if (sub.get_option("--spare-caches")->count() == 0)
    daemon.insert(daemon.end(), {"--spare-caches", site->spare_caches});
  run::RunPlan plan;
  plan.step = run::daemon_step(*job, daemon);
  plan.step_env = run::step_environment(environ);
  plan.mountpoint = cfg.mountpoint;
  plan.command = std::move(command);
  plan.wait_timeout = r.wait_timeout;
  return run::run_job(plan);
}

// The mount's command line: its paths, --wait, and the daemon's options.
void add_mount(CLI::App& app, Cli& cli) {
  add_paths(app, cli, "empty directory to mount on (the same path on every node)");
  app.add_option("--wait", cli.wait_for,
                 "do not mount: wait until the mount at this path is ready on every node")
      ->excludes("SOURCE_DIR");
  app.add_option("--wait-timeout", cli.wait_timeout, "seconds --wait waits")
      ->capture_default_str()
      ->check(stagetools::seconds(0.001, 1e6));
  add_mount_options(app, cli);
}

// stagefs run ... -- COMMAND: the command, cut off args before parsing (never read as options).
std::vector<std::string> cut_command(std::vector<char*>& args) {
  std::vector<std::string> command;
  const auto dashes =
      std::find_if(args.begin() + 2, args.end(), [](const char* a) { return std::strcmp(a, "--") == 0; });
  if (dashes != args.end()) {
    command.assign(dashes + 1, args.end());
    args.erase(dashes, args.end());
  }
  return command;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<char*> args(argv, argv + argc);
  const bool is_run = argc > 1 && std::strcmp(argv[1], "run") == 0;
  std::vector<std::string> command = is_run ? cut_command(args) : std::vector<std::string>{};
  Cli cli;
  Run r;
  CLI::App app{kAbout, "stagefs"};
  stagetools::use_help_format(app);
  app.set_version_flag("--version", std::string("stagefs ") + STAGEFS_VERSION);
  add_mount(app, cli);
  add_run(app, r);
  CLI::App* const run = app.get_subcommand("run");
  const stagetools::Command cmd{"stagefs",
                                is_run ? "stagefs run" : "stagefs",
                                is_run ? stagefs::run::kRunFailed : 2,
                                true,
                                [&] { return is_run ? run_help(*run) : app.help(); },
                                {}};
  if (auto exit_status = stagetools::parse(app, static_cast<int>(args.size()), args.data(), cmd))
    return *exit_status;
  if (*run) return run_main(r, *run, std::move(command));
  stagefs::DaemonConfig& cfg = cli.cfg;
  if (app.count("--wait") > 0) {
    if (cli.wait_for.empty()) return stagetools::usage_error(cmd, "--wait: empty mount point");
    return stagefs::wait_ready(cli.wait_for, cli.wait_timeout);
  }
  if (cfg.source_dir.empty() || cfg.mountpoint.empty())
    return stagetools::usage_error(cmd, "SOURCE_DIR and MOUNTPOINT are required");
  if (cfg.cache_dir.empty()) return stagetools::usage_error(cmd, "--cache CACHE_DIR is required");
  cfg.mount.passthrough = !cli.no_passthrough;
  // Logs go to stderr, uncoloured: under srun/mpirun they land in job logs, often via a pty.
  // Control characters in messages (from file names users chose) are escaped (fusefs/base/log.h).
  spdlog::set_default_logger(std::make_shared<spdlog::logger>("stagefs", stagefs::escaping_sink()));
  spdlog::set_level(cli.verbose ? spdlog::level::debug : spdlog::level::info);
  cfg.wrap_seams = stage::test_holds;  // the crash tests stop real processes at these points
  return stagefs::run_daemon(cfg, &argc, &argv);
}
