// stage-bcast: copy one file (or, with --recursive, a tree) from shared storage to every node's
// local disk with one source read and a pipelined MPI broadcast. A thin shell over
// bcast/engine.h: parse options, set up MPI and the node topology, run the collective
// transfer, print the report. Exit status: 0 done, 1 failed (the same on every rank), 2 usage,
// 3 MPI start-up did not complete within --startup-timeout (bcast/mpi_start.h).
#include <signal.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "bcast/comm_mpi.h"
#include "bcast/engine.h"
#include "bcast/mpi_start.h"
#include "bcast/paths.h"
#include "tools/report.h"
#include "tools/help_format.h"

namespace {

using stage::launcher_rank;  // before MPI_Init, so usage errors print once
using stage::Validate;

struct Cli {
  std::string source, dest;
  std::string pre = "size", post = "none", chunk = "16M", direct_io = "auto", algorithm = "auto", segment;
  double stall_timeout = 120;
  double startup_timeout = stage::kDefaultStartupTimeout;
  bool overwrite = false, verbose = false, json = false, recursive = false, ranks_as_nodes = false;
  int source_rank = 0;
};

Validate parse_validate(const std::string& s) {
  return s == "none" ? Validate::none : s == "checksum" ? Validate::checksum : Validate::size;
}

// %r rank, %n node index, %h host name, %% a percent sign: lets ranks sharing one machine act
// as separate nodes in tests (--dest /tmp/t/node%n/img).
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

int usage_error(const std::string& msg) {
  if (launcher_rank() == 0) std::fprintf(stderr, "stage-bcast: %s\nTry 'stage-bcast --help'.\n", msg.c_str());
  return 2;
}

// What this rank finds wrong with the paths it will use, or empty: a source on a
// pseudo filesystem (a /proc file is 0 bytes by stat and text by read: the copy would be
// empty), a destination that is a device, FIFO or socket (the copy is renamed over it: --dest
// /dev/null would replace /dev/null) or a directory without -r, a destination that is the
// source or, with -r, overlaps the source tree (the tree would be staged into itself).
// Symlinks are resolved first. The source rank checks the source, each writer its own
// destination. The engine refuses special destinations again when it reaches them (and files
// that read longer than their size), with status 1; these checks give the usage status 2
// before anything is created.
std::string check_paths(const Cli& c, const std::string& dest, bool reads_source, bool writes) {
  if (reads_source) {
    if (const char* fs = stage::pseudo_fs_of(c.source))
      return "--source " + c.source + " is on " + fs +
             ", a pseudo filesystem whose file sizes do not describe their contents: refusing it "
             "(copy it to a regular file first)";
  }
  if (!writes) return {};
  struct stat st {};
  if (::lstat(dest.c_str(), &st) == 0) {
    if (const char* kind = stage::special_file_kind(st.st_mode))
      return "--dest " + dest + " is a " + kind +
             ": refusing to replace it (give the path of a regular file, or of one that does not exist)";
    if (S_ISDIR(st.st_mode) && !c.recursive)
      return "--dest " + dest +
             " is a directory: give the destination file's path (or --recursive for a tree)";
  }
  const std::string src = stage::resolve_path(c.source);
  const std::string dst = stage::resolve_path(dest);
  if (dst == src) return "--dest " + dest + " is the source " + c.source + " itself (" + dst + ")";
  if (c.recursive && stage::path_within(dst, src))
    return "--dest " + dest + " lies inside --source " + c.source + " (" + dst + " in " + src +
           "): the tree would be staged into itself";
  if (c.recursive && stage::path_within(src, dst))
    return "--source " + c.source + " lies inside --dest " + dest + " (" + src + " in " + dst +
           "): the copy would be written over the source tree";
  return {};
}

// Every rank learns whether any rank refused its paths; the first rank prints each distinct
// message once. Returns the exit status (2), or 0 when every rank is fine, 1 if MPI failed.
int agree_on_paths(stage::Comm& world, const std::string& why) {
  auto bad = stage::allreduce_max(world, why.empty() ? 0 : 1);
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

}  // namespace

int main(int argc, char** argv) {
  // A reader of stdout or stderr that went away (`| head`, a log pipeline that ended) must not
  // end this rank mid-broadcast (and with it the whole job's copy): writes then fail with
  // EPIPE and the exit status stays the transfer's.
  ::signal(SIGPIPE, SIG_IGN);
  Cli c;
  CLI::App app{
      "Stage a file from shared storage onto every node's local disk: one rank reads the source,\n"
      "the chunks travel by MPI broadcast, each node writes them to a temporary file, checks every\n"
      "chunk's CRC-64, fsyncs and renames it into place. Nodes that already hold a valid copy write\n"
      "nothing. Run one rank per node:  srun --mpi=pmix stage-bcast --source F --dest D\n"
      "Exit status: 0 staged (or already there), 1 failed on some node (same on every rank), 2 usage,\n"
      "3 not every rank got through MPI start-up within --startup-timeout.\n"
      "Refused as usage errors: a --dest that is a device, FIFO or socket (or a directory without\n"
      "--recursive), a --source on a pseudo filesystem (/proc, /sys, ...: sizes there are not\n"
      "contents), a --dest that is the source or, with -r, overlaps the source tree. A source\n"
      "that reads longer than its size fails the copy (1); nothing is published.",
      "stage-bcast"};
  stagetools::use_help_format(app);
  app.set_version_flag("--version", std::string("stage-bcast ") + STAGEFS_VERSION);
  app.add_option("--source", c.source,
                 "file (or directory, with --recursive) on shared storage; not on /proc, /sys or "
                 "another pseudo filesystem")
      ->required();
  app.add_option("--dest", c.dest,
                 "destination path on each node; %r, %n, %h expand to rank, node index, host name. "
                 "A regular file or a path that does not exist (a directory with --recursive), "
                 "never a device, FIFO or socket")
      ->required();
  app.add_option("--pre-validate", c.pre,
                 "when a node's existing copy counts as current: size (size and mtime match), "
                 "checksum (CRC-64 matches), none (always copy)")
      ->check(CLI::IsMember({"size", "checksum", "none"}))
      ->capture_default_str();
  app.add_option("--post-validate", c.post,
                 "after writing: size, checksum (re-read each copy from disk and compare with the "
                 "source's CRC), or none")
      ->check(CLI::IsMember({"size", "checksum", "none"}))
      ->capture_default_str();
  app.add_flag("--overwrite", c.overwrite, "copy even where a current copy exists");
  auto* source_rank =
      app.add_option("--source-rank", c.source_rank,
                     "rank that reads the source. Without it, when some node already holds a current copy "
                     "(by --pre-validate) of every file a node needs, that node's rank reads its own copy "
                     "and feeds the others (a seed), and the source is read for metadata only")
          ->capture_default_str();
  app.add_option("--chunk-size", c.chunk, "broadcast chunk, 4K..1G (K, M, G suffixes)")
      ->capture_default_str();
  app.add_option("--bcast-algorithm", c.algorithm,
                 "how chunk data travels: chain (every chunk through one pipelined chain of "
                 "segments over point-to-point messages: the source sends each byte once, time "
                 "nearly flat in the node count), tree (pipelined binary tree), mpi (the MPI "
                 "library's MPI_Bcast, chunk by chunk), auto (chain for transfers over 64 KiB)")
      ->check(CLI::IsMember({"auto", "chain", "tree", "mpi"}))
      ->capture_default_str();
  app.add_option("--bcast-segment", c.segment,
                 "chain/tree message size, 4K..64M (default 60K: under Open MPI's TCP eager limit)");
  app.add_option("--stall-timeout", c.stall_timeout,
                 "chain/tree: seconds without progress (a node or link gone) before the transfer "
                 "fails; 0 waits forever")
      ->check(CLI::Range(0.0, 1e6))
      ->capture_default_str();
  app.add_option("--startup-timeout", c.startup_timeout,
                 "seconds a rank waits for every rank to get through MPI start-up (a rank that "
                 "died or hangs at start would otherwise keep the others waiting until the job's "
                 "time limit); then it says so and exits with status 3. 0 waits forever")
      ->check(CLI::Range(0.0, 1e6))
      ->capture_default_str();
  app.add_option("--direct-io", c.direct_io,
                 "auto: write each copy with O_DIRECT where the destination filesystem accepts it (no "
                 "page-cache copy, no cache pollution; unaligned parts go buffered), off: buffered writes")
      ->check(CLI::IsMember({"auto", "off"}))
      ->capture_default_str();
  app.add_flag("-r,--recursive", c.recursive, "stage a directory tree (files, directories, symlinks)");
  app.add_flag("--ranks-as-nodes", c.ranks_as_nodes,
               "treat every rank as its own node (tests; same as STAGE_RANKS_AS_NODES=1)");
  app.add_flag("--json", c.json, "print the report as JSON on stdout");
  app.add_flag("-v,--verbose", c.verbose, "log each node's decisions");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    if (launcher_rank() == 0) std::fputs(app.help().c_str(), stdout);
    return 0;
  } catch (const CLI::CallForAllHelp& e) {
    if (launcher_rank() == 0) std::fputs(app.help().c_str(), stdout);
    return 0;
  } catch (const CLI::CallForVersion& e) {
    if (launcher_rank() == 0) std::puts(e.what());
    return 0;
  } catch (const CLI::ParseError& e) {
    return usage_error(e.what());
  }
  if (const char* env = std::getenv("STAGE_RANKS_AS_NODES"); env != nullptr && std::string(env) == "1")
    c.ranks_as_nodes = true;

  stage::StageOptions opt;
  const auto chunk = stage::parse_size(c.chunk);
  if (!chunk) return usage_error("--chunk-size: not a size: '" + c.chunk + "'");
  if (auto why = stage::check_chunk_size(*chunk)) return usage_error("--chunk-size: " + *why);
  if (c.source.empty()) return usage_error("--source: empty path");
  if (c.dest.empty()) return usage_error("--dest: empty path");
  if (c.dest.back() == '/') return usage_error("--dest: give the destination file's path, not a directory");
  opt.chunk_size = *chunk;
  opt.pre = parse_validate(c.pre);
  opt.post = parse_validate(c.post);
  opt.overwrite = c.overwrite;
  opt.recursive = c.recursive;
  opt.root = c.source_rank;
  opt.seed_from_copies = source_rank->count() == 0;
  opt.bcast_algorithm = *stage::parse_bcast_algorithm(c.algorithm);  // checked by CLI11 above
  opt.pipeline.stall_timeout = std::chrono::milliseconds(static_cast<int64_t>(c.stall_timeout * 1000));
  if (!c.segment.empty()) {
    const auto seg = stage::parse_size(c.segment);
    if (!seg || *seg < 4096 || *seg > 64 * stage::kMiB)
      return usage_error("--bcast-segment: give a size from 4K to 64M: '" + c.segment + "'");
    opt.pipeline.segment = *seg;
  }

  spdlog::set_default_logger(spdlog::stderr_logger_mt("stage-bcast"));
  spdlog::set_pattern("[%l] %v");
  spdlog::set_level(c.verbose ? spdlog::level::info : spdlog::level::warn);

  auto t0 = std::chrono::steady_clock::now();
  // With a launcher: MPI (FUNNELED: only this thread calls MPI; the engine's reader and writer
  // threads never do). Without one: a world of one rank, no MPI at all.
  std::unique_ptr<stage::MpiEnv> env;
  std::unique_ptr<stage::Comm> world;
  bool writer = true;
  int node = 0;
  if (stage::launched_by_mpi_launcher()) {
    auto started = stage::start_mpi(&argc, &argv, {"stage-bcast", c.startup_timeout, MPI_THREAD_FUNNELED});
    if (!started) {
      std::fprintf(stderr, "stage-bcast: %s\n", started.error().message.c_str());
      return 1;
    }
    env = std::move(started->env);
    t0 = std::chrono::steady_clock::now();  // the report times our work, not MPI start-up
    auto role = stage::node_role(*started->world, c.ranks_as_nodes);
    if (!role) {
      std::fprintf(stderr, "stage-bcast: %s\n", role.error().message.c_str());
      return 1;
    }
    writer = role->writer;
    node = role->node;
    world = std::move(started->world);
  } else {
    world = std::make_unique<stage::SelfComm>();
  }
  if (opt.root < 0 || opt.root >= world->size())
    return usage_error("--source-rank " + std::to_string(opt.root) + " is out of range (job has " +
                       std::to_string(world->size()) + " ranks)");
  const double topology = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  stage::StageEndpoint ep;
  ep.source = c.source;
  ep.dest = expand_dest(c.dest, world->rank(), node, stage::host_name());
  ep.writer = writer;
  if (const int rc = agree_on_paths(*world, check_paths(c, ep.dest, world->rank() == opt.root, writer));
      rc != 0)
    return rc;
  stage::PosixSource source;
  stage::PosixStore store(stage::StoreOptions{.direct_io = c.direct_io == "auto"});
  const bool is_root = world->rank() == opt.root;
  stage::ProgressLine progress(is_root && !c.json && isatty(STDERR_FILENO) != 0);
  auto report = stage::stage_transfer(*world, &source, store, opt, ep,
                                      [&](uint64_t done, uint64_t total) { progress.update(done, total); });
  progress.done();
  report.t.topology = topology;
  report.t.total += topology;

  if (c.verbose)
    spdlog::info("{}: rank {} {} {}", stage::host_name(), world->rank(),
                 !writer                  ? "relayed (not this node's writer)"
                 : report.this_node_wrote ? "wrote"
                                          : "already had a current copy of",
                 ep.dest);
  if (report.comm_broken) {
    // Some ranks may be stuck inside MPI (a lost node or link): MPI_Finalize would wait for
    // them forever. Leave without it; the launcher sees a rank end without finalizing and
    // ends the others (mpirun and srun both do), so every rank's command returns.
    for (const auto& e : report.errors)
      std::fprintf(stderr, "stage-bcast: rank %d: error: %s\n", world->rank(), e.c_str());
    std::fflush(nullptr);
    std::_Exit(1);
  }
  if (is_root) {
    if (c.json)
      std::fputs(stage::report_json(report, c.source, c.dest, world->size()).c_str(), stdout);
    else
      std::fputs(stage::report_table(report, c.source, c.dest).c_str(), stdout);
    for (const auto& e : report.errors) std::fprintf(stderr, "stage-bcast: error: %s\n", e.c_str());
  }
  return report.exit_code;
}
