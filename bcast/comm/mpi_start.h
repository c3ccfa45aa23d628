// Starting a group of ranks (one per node) bounded in time, for stage-bcast and the stagefs
// daemon alike: MPI_Init_thread, a duplicate of MPI_COMM_WORLD (MpiComm, with its placement
// exchange) and a first barrier on it, all under a start-up watchdog.
//
// Why a watchdog: a rank that dies or hangs before it has joined the others (a crash in
// MPI_Init, a node that never starts its task, a stopped process) leaves every other rank
// blocked inside MPI_Init or the first collective, and blocking MPI calls cannot be
// interrupted. srun without --kill-on-bad-exit would then wait until the step's time limit.
// So a thread started BEFORE MPI_Init_thread sleeps until the deadline; if the rank has not
// completed the first barrier by then (the barrier completes on a rank only once every rank
// has entered it, so every rank is through MPI start-up), the watchdog says on stderr which
// rank waits for what, and ends the process with _exit(kStartupTimeoutExit): no MPI_Finalize,
// which would wait for the missing rank too. The launcher sees a rank end without finalizing
// and ends the step, so every command returns. The watchdog never calls MPI and only sleeps:
// no thread of ours competes for the CPU while MPI starts (the tools start their working
// threads after start_mpi() returns).
//
// The watchdog covers start-up only: start_mpi() stops and joins it once the first barrier
// completed, before it returns; nothing after that (paths, transfers, a mount's whole life) is
// bounded by it. The main of a tool may use this; a library must not (it _exits).
#pragma once

#include <mpi.h>

#include <memory>

#include "bcast/comm/comm_mpi.h"

namespace stage {

// Exit status of a rank whose start-up watchdog fired: distinct from the tools' 0 (done),
// 1 (failed) and 2 (usage).
inline constexpr int kStartupTimeoutExit = 3;
// Default bound (seconds) on MPI start-up and the first barrier: far above what a start of a
// thousand nodes takes (launch fan-out, PMIx exchange, TCP wire-up: seconds to tens of seconds)
// and short enough that a job whose rank died at start gives its nodes back soon.
inline constexpr double kDefaultStartupTimeout = 300;

struct MpiStartOptions {
  const char* program = "stage";              // names the process in the watchdog's message
  double timeout_s = kDefaultStartupTimeout;  // 0: no bound
  int thread_level = MPI_THREAD_FUNNELED;
};

struct MpiWorld {
  std::unique_ptr<MpiEnv> env;     // declared first: finalized after the communicator is freed
  std::unique_ptr<MpiComm> world;  // a duplicate of MPI_COMM_WORLD, MPI_ERRORS_RETURN
};

// Collective over MPI_COMM_WORLD. Returns once every rank is through MPI start-up, or an error
// (an MPI call failed: the caller prints it and exits 1). Does not return when the deadline
// passes first: the process then exits with kStartupTimeoutExit.
Result<MpiWorld> start_mpi(int* argc, char*** argv, const MpiStartOptions& opt);

// Where this rank sits among the nodes: whether it is its node's writer (the lowest rank of its
// shared-memory domain; the others relay), and its node's index (0..nodes-1, in rank order).
// Collective. ranks_as_nodes: every rank is its own node (tests on one machine).
struct NodeRole {
  bool writer = true;
  int node = 0;
};
Result<NodeRole> node_role(MpiComm& world, bool ranks_as_nodes);

// The ranks of one job step, however the process was started; stage-bcast and the stagefs
// daemon both begin with start_ranks(). With a launcher (srun, mpirun): MPI started under the
// watchdog (start_mpi) and, when asked, this rank's place among the nodes (node_role). Without
// one: a world of one rank (SelfComm) that is its node's writer, and no MPI at all.
struct Ranks {
  std::unique_ptr<MpiEnv> env;  // null without a launcher; declared first: finalized last
  std::unique_ptr<Comm> world;  // MpiComm (a duplicate of MPI_COMM_WORLD) or SelfComm
  NodeRole role;
  double topology_s = 0;  // seconds node_role took
  [[nodiscard]] bool mpi() const { return env != nullptr; }
};
struct RanksOptions {
  MpiStartOptions start;
  bool node_topology = true;    // compute `role` (collective); false: every rank a writer
  bool ranks_as_nodes = false;  // node_role's: every rank its own node (tests on one machine)
};
// Collective over MPI_COMM_WORLD with a launcher. An error: the caller prints it and exits 1;
// a start-up deadline passed: does not return (start_mpi).
Result<Ranks> start_ranks(int* argc, char*** argv, const RanksOptions& opt);

}  // namespace stage
