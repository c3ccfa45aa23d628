// One run of stage-bcast on every rank of a job (or alone, without a launcher): the library
// behind tools/stage_bcast.cc, which only parses options into a BcastJob. run_bcast_job()
// starts the ranks (bcast/comm/mpi_start.h: MPI under the start-up watchdog, one writer per node),
// expands each rank's destination, agrees that every rank's paths are acceptable, runs the
// collective transfer (bcast/transfer/engine.h) and prints the report on the source rank.
//
// Exit status: 0 staged (or already there), 1 failed (the same on every rank), 2 usage (paths
// refused, --source-rank out of range), 3 MPI start-up did not complete in time (the
// watchdog exits the process itself). Messages go to stderr prefixed "stage-bcast: ".
#pragma once

#include <functional>
#include <string>

#include "bcast/comm/mpi_start.h"
#include "bcast/io/seams.h"
#include "bcast/text/progress.h"
#include "bcast/transfer/engine.h"

namespace stage {

// What stage-bcast is asked to do. The member values are its defaults (--help shows them).
struct BcastJob {
  std::string source;
  // Each node's destination; %r, %n, %h expand to rank, node index, host name, %% to '%'.
  std::string dest;
  // The engine's options; opt.root is --source-rank. StageOptions' defaults, except that
  // stage-bcast seeds from current copies unless a source rank is given.
  StageOptions opt = [] {
    StageOptions o;
    o.seed_from_copies = true;
    return o;
  }();
  bool direct_io = true;  // --direct-io auto: O_DIRECT where the destination accepts it
  // The xattrs each copy records its origin and chunk CRCs in (the tool's names; empty: none,
  // and no copy is ever current by the recorded origin).
  CopyXattrs xattrs;
  double startup_timeout = kDefaultStartupTimeout;
  bool ranks_as_nodes = false;  // every rank its own node (tests on one machine)
  bool json = false;
  bool verbose = false;
  // The progress line on the source rank (bcast/text/progress.h): auto shows it on a terminal, and
  // as a line per tenth in a log with --verbose; never with --json unless asked (on).
  ProgressWhen progress = ProgressWhen::automatic;
  // Wraps the store and the source before the transfer sees them (the tool's: the crash tests'
  // hold points); empty: they are used as they are.
  SeamWrapper wrap_seams;
  // Reports a usage error found once the ranks are up (--source-rank out of range) as the
  // tool reports its others, and returns the exit status; empty: "stage-bcast: why" on the
  // launcher's rank 0, status 2.
  std::function<int(const std::string& why)> usage_error;
};

// Usage errors no rank could get past, checked before MPI starts: an explanation, or empty.
std::string check_job(const BcastJob& job);

// Runs the job: COLLECTIVE over every rank the launcher started. Returns the exit status; a
// rank whose communicator broke mid-transfer ends the process with _Exit(1) instead (ranks
// may be stuck inside MPI, and MPI_Finalize would wait for them).
int run_bcast_job(BcastJob job, int* argc, char*** argv);

// %r rank, %n node index, %h host name, %% a percent sign (pure; unit-tested).
std::string expand_dest(const std::string& pattern, int rank, int node, const std::string& host);

}  // namespace stage
