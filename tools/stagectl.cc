// stagectl: inspect and steer a running stagefs mount on this node.
//   stagectl status PATH                state, nodes, cache use and limit, transfer in flight
//   stagectl stats PATH                 the counters
//   stagectl prefetch [--no-wait] PATH...   materialize files (directories: every regular
//                                       file below) before anyone opens them: a progress line,
//                                       then one summary (files, bytes, copied, cached, failed)
//   stagectl evict PATH...              drop files' copies from this node's cache
// PATH: relative to the current directory or absolute; the mount is the one it lies in (the
// older form CMD MOUNTPOINT PATH... still works: fusefs/stagectl/stagectl_mount.h). --json on every
// command. Exit 0: done; 1: a request failed (or PATH is not in a running stagefs); 2: usage.
// A thin shell over fusefs/stagectl/stagectl_client.h (the channel, and how names are shown).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>
#include <vector>

#include "fusefs/stagectl/stagectl_client.h"
#include "tools/cli.h"
#include "tools/help_format.h"
#include "tools/options.h"

int main(int argc, char** argv) {
  CLI::App app{
      "stagectl: inspect and steer a running stagefs mount on this node.\n"
      "Requests travel as attribute reads through the mount: a user may prefetch what they may\n"
      "read, evict what they own (root: anything), and the cache stays private.\n"
      "PATH is relative to the current directory, or absolute; the mount is the one it lies in\n"
      "(stagectl prefetch /stage/images). The older form CMD MOUNTPOINT PATH... still works.\n"
      "Exit status: 0 done, 1 a request failed (or no stagefs mounted there), 2 usage.",
      "stagectl"};
  stagetools::use_help_format(app);
  app.set_version_flag("--version", std::string("stagectl ") + STAGEFS_VERSION);
  stagefs::ctl::Options o;
  bool no_wait = false;
  std::string where;
  std::vector<std::string> paths;
  app.add_flag("--json", o.json, "print JSON (one object) instead of text");
  app.require_subcommand(1);
  auto* status = app.add_subcommand("status", "state, nodes, cache use and limit, transfer in flight");
  status->add_option("PATH", where, "the mount point, or any path inside the mount")->required();
  auto* stats = app.add_subcommand("stats", "the mount's counters on this node");
  stats->add_option("PATH", where, "the mount point, or any path inside the mount")->required();
  auto* prefetch = app.add_subcommand(
      "prefetch",
      "materialize files on every node before they are opened (directories: every file below); shows "
      "progress, then one summary: files, bytes, copied, already cached, failed");
  prefetch->add_flag("--no-wait", no_wait, "return once the requests are queued");
  prefetch->add_flag("-v,--verbose", o.verbose, "list every file as it is done (copied, cached, queued)");
  stagetools::add_choice(
      *prefetch, "--progress", o.progress,
      {{"auto", stage::ProgressWhen::automatic},
       {"on", stage::ProgressWhen::on},
       {"off", stage::ProgressWhen::off}},
      "the progress line on stderr (files, bytes, rate, ETA): auto shows it rewritten in "
      "place when stderr is a terminal; on shows it in a log too (a line per tenth, or per "
      "minute); off never");
  prefetch->add_option("PATH", paths, "files or directories in a stagefs mount")->required();
  auto* evict = app.add_subcommand("evict", "remove files' copies from this node's cache (not while open)");
  evict->add_option("PATH", paths, "files in a stagefs mount")->required();
  for (auto* sub : {status, stats, prefetch, evict}) sub->add_flag("--json", o.json, "print JSON");
  const stagetools::Command cmd{"stagectl", "stagectl", 2, true, {}, stagefs::ctl::shown};
  if (auto exit_status = stagetools::parse(app, argc, argv, cmd)) return *exit_status;
  if (*status || *stats) return stagefs::ctl::show_status(where, stats->parsed(), o.json);
  if (*evict) return stagefs::ctl::evict(paths, o.json);
  return stagefs::ctl::prefetch(paths, no_wait, o);
}
