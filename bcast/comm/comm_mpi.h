// MPI side of the Comm seam. One RAII type per MPI resource:
//   MpiEnv   MPI_Init_thread / MPI_Finalize (only if this object initialized MPI)
//   MpiComm  a duplicate of a communicator with MPI_ERRORS_RETURN, freed unless finalized
// Every MPI return code is checked and turned into Errc::comm_failed; nothing calls MPI_Abort.
//
// How ranks wait: staging ranks mostly wait (for the source's reader, for a slower disk) while
// their own reader and writer threads need the CPU. So collectives are started nonblocking and
// completed by polling MPI_Test with a back-off to 500 us sleeps (wait_polite in the .cc):
// allreduces, barriers, and every bcast of at most kPoliteBcastMaxBytes or on at most
// kPoliteBcastMaxRanks ranks (where Open MPI's MPI_Ibcast sends straight from the root, so no
// rank has to forward data for others). A large bcast on a larger communicator stays a
// blocking MPI_Bcast: Open MPI's pipelined trees need every rank inside MPI to forward the
// segments at once, and a sleeping forwarder would stall its subtree.
// Chunk data no longer takes that path by default: the engine sends it through
// bcast/transfer/pipeline.h over MpiPointToPoint (below), which waits politely at every size;
// MpiComm::bcast carries it only with --bcast-algorithm mpi.
// Thread level: the caller asks for what it uses (FUNNELED: only the thread that initialized
// MPI calls it); MpiEnv::init fails if the library provides less (unless MPI was already
// initialized: then it neither initializes nor finalizes it).
#pragma once

#include <mpi.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bcast/comm/comm.h"

namespace stage {

// True when this process was started by a launcher (srun, mpirun) rather than by hand.
bool launched_by_mpi_launcher();
// This process's rank as the launcher tells it before MPI_Init (OMPI_COMM_WORLD_RANK, PMIX_RANK,
// SLURM_PROCID), or 0.
int launcher_rank();

class MpiEnv {
 public:
  static Result<std::unique_ptr<MpiEnv>> init(int* argc, char*** argv, int required_thread_level);
  MpiEnv(const MpiEnv&) = delete;
  MpiEnv& operator=(const MpiEnv&) = delete;
  ~MpiEnv();

 private:
  explicit MpiEnv(bool owns) : owns_(owns) {}
  bool owns_;
};

// Nonblocking point-to-point on an MpiComm's communicator (owned by the MpiComm; same thread
// rules). Requests live in a table indexed by PointToPoint::Request. cancel() cancels and frees
// the request: a receive is gone, but Open MPI cannot cancel a send, so a send's buffer may
// still be read until MPI completes it: after a cancelled send the communicator is to be
// treated as broken (the engine gives up the transfer and every later collective).
class MpiPointToPoint final : public PointToPoint {
 public:
  MpiPointToPoint(MPI_Comm comm, int rank, int size, std::vector<std::string> placement)
      : comm_(comm), rank_(rank), size_(size), placement_(std::move(placement)) {}
  ~MpiPointToPoint() override;
  [[nodiscard]] int rank() const override { return rank_; }
  [[nodiscard]] int size() const override { return size_; }
  [[nodiscard]] const std::vector<std::string>& placement() const override { return placement_; }
  Result<Request> isend(std::span<const std::byte> buf, int dest, int tag) override;
  Result<Request> irecv(std::span<std::byte> buf, int source, int tag) override;
  Result<bool> test(Request r) override;
  void cancel(Request r) noexcept override;

 private:
  Request slot();
  MPI_Comm comm_;
  int rank_, size_;
  std::vector<std::string> placement_;
  std::vector<MPI_Request> reqs_;  // MPI_REQUEST_NULL: free slot
};

// This process's placement key: SLURM_TOPOLOGY_ADDR when the launcher sets it (switch path
// and node, e.g. "s0.s3.node17"), else the host name.
std::string placement_key();

class MpiComm final : public Comm {
 public:
  // Duplicates `base` (never frees WORLD/SELF themselves).
  static Result<std::unique_ptr<MpiComm>> dup(MPI_Comm base);
  // MPI_Comm_split_type(SHARED): the ranks on this node.
  Result<std::unique_ptr<MpiComm>> split_node() const;
  ~MpiComm() override;

  [[nodiscard]] int rank() const override { return rank_; }
  [[nodiscard]] int size() const override { return size_; }
  [[nodiscard]] MPI_Comm handle() const { return comm_; }

  Status bcast(std::span<std::byte> buf, int root) override;
  Status allreduce_max(std::span<int64_t> inout) override;
  Status allreduce_sum(std::span<int64_t> inout) override;
  Result<std::vector<std::string>> gather(const std::string& mine, int root) override;
  Status barrier() override;
  PointToPoint* point_to_point() override { return p2p_.get(); }

  // Whether a bcast of `bytes` is completed by polite polling rather than a blocking call.
  [[nodiscard]] bool polite_bcast(uint64_t bytes) const;
  static constexpr int kPoliteBcastMaxRanks = 4;
  static constexpr uint64_t kPoliteBcastMaxBytes = 64 * 1024;

 private:
  explicit MpiComm(MPI_Comm c);
  // Collective: every rank's placement key (an allgather), for the point-to-point seam.
  static Result<std::unique_ptr<MpiComm>> make(MPI_Comm c);
  MPI_Comm comm_;
  std::unique_ptr<MpiPointToPoint> p2p_;
  int rank_ = 0;
  int size_ = 1;
};

// Turns an MPI return code into a Status naming the call (ADIOS2's CheckMPIReturn).
Status check_mpi(int rc, const char* call);

}  // namespace stage
