// gather_profiles(): every node's profile (recorder.h) merged on rank 0 when the mount ends,
// over the data Comm's point-to-point seam. A binomial tree: rank r merges what r+1, r+2, r+4...
// (its subtree) send it, then sends the result to its parent, so no rank ever holds more than
// the job's own set (with every node reading the same files, rank 0 gets log2(N) messages of
// one profile each, not N).
//
// Bounded: it runs when the group has agreed to shut down, while the daemon's own shutdown
// clock runs, so each level of the tree has its share of `budget`; a child that has not sent
// by then is left out (GatherResult::missing, its subtree with it) and a send that did not
// complete is cancelled (clean false: the Comm is then to be treated as broken, as after any
// cancelled send, and MPI not finalized). A profile larger than kMaxProfileBytes encoded is
// not sent (its parent counts it missing).
// COLLECTIVE over the p2p's ranks; the thread that owns the Comm. nullptr (a group of one):
// returns mine.
#pragma once

#include <chrono>

#include "bcast/comm/comm.h"
#include "fusefs/profile/format.h"

namespace stagefs {

struct GatherResult {
  Profile merged;   // rank 0: the job's profile; elsewhere: this rank's subtree's
  int missing = 0;  // children (with their subtrees) that sent nothing usable in time
  bool clean = true;
};

GatherResult gather_profiles(stage::PointToPoint* p2p, Profile mine, std::chrono::milliseconds budget);

}  // namespace stagefs
