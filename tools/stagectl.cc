// stagectl: inspect and steer a running stagefs mount on this node.
//   stagectl status MOUNTPOINT          state, nodes, cache use and limit, transfer in flight
//   stagectl stats MOUNTPOINT           the counters
//   stagectl prefetch [--no-wait] MOUNTPOINT PATH...   materialize files (directories: every
//                                       regular file below) before anyone opens them
//   stagectl evict MOUNTPOINT PATH...   drop files' copies from this node's cache
// --json on every command. Exit 0: done; 1: a request failed (or MOUNTPOINT is not a running
// stagefs); 2: usage.
// A thin shell over fusefs/stagectl_client.h (the channel, and how names are shown).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>
#include <vector>

#include "fusefs/stagectl_client.h"
#include "tools/help_format.h"

int main(int argc, char** argv) {
  CLI::App app{
      "stagectl: inspect and steer a running stagefs mount on this node.\n"
      "Requests travel as attribute reads through the mount: a user may prefetch what they may\n"
      "read, evict what they own (root: anything), and the cache stays private.\n"
      "Exit status: 0 done, 1 a request failed (or no stagefs mounted there), 2 usage.",
      "stagectl"};
  stagetools::use_help_format(app);
  app.set_version_flag("--version", std::string("stagectl ") + STAGEFS_VERSION);
  bool as_json = false, no_wait = false;
  std::string mnt;
  std::vector<std::string> paths;
  app.add_flag("--json", as_json, "print JSON (one object) instead of text");
  app.require_subcommand(1);
  auto* status = app.add_subcommand("status", "state, nodes, cache use and limit, transfer in flight");
  status->add_option("MOUNTPOINT", mnt, "the stagefs mount point")->required();
  auto* stats = app.add_subcommand("stats", "the mount's counters on this node");
  stats->add_option("MOUNTPOINT", mnt, "the stagefs mount point")->required();
  auto* prefetch = app.add_subcommand(
      "prefetch", "materialize files on every node before they are opened (directories: every file below)");
  prefetch->add_flag("--no-wait", no_wait, "return once the requests are queued");
  prefetch->add_option("MOUNTPOINT", mnt, "the stagefs mount point")->required();
  prefetch->add_option("PATH", paths, "files or directories (relative to MOUNTPOINT, or absolute)")->required();
  auto* evict = app.add_subcommand("evict", "remove files' copies from this node's cache (not while open)");
  evict->add_option("MOUNTPOINT", mnt, "the stagefs mount point")->required();
  evict->add_option("PATH", paths, "files (relative to MOUNTPOINT, or absolute)")->required();
  for (auto* sub : {status, stats, prefetch, evict}) sub->add_flag("--json", as_json, "print JSON");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout);
    return 0;
  } catch (const CLI::CallForVersion& e) {
    std::puts(e.what());
    return 0;
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) {
      std::fputs(app.help().c_str(), stdout);
      return 0;
    }
    std::fprintf(stderr, "stagectl: %s\nTry 'stagectl --help'.\n", stagefs::ctl::shown(e.what()).c_str());
    return 2;
  }
  if (*status || *stats) return stagefs::ctl::show_status(mnt, stats->parsed(), as_json);
  using stagefs::ctl::Request;
  return stagefs::ctl::send_requests(mnt, paths,
                                     *evict ? Request::evict : no_wait ? Request::prefetch_no_wait : Request::prefetch,
                                     as_json);
}
