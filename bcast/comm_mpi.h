// MPI side of the Comm seam. One RAII type per MPI resource:
//   MpiEnv   MPI_Init_thread / MPI_Finalize (only if this object initialized MPI)
//   MpiComm  a duplicate of a communicator with MPI_ERRORS_RETURN, freed unless finalized
// Every MPI return code is checked and turned into Errc::comm_failed; nothing calls MPI_Abort.
// Thread level: the caller asks for what it uses (FUNNELED: only the thread that initialized
// MPI calls it) and MpiEnv reports what it got.
#pragma once

#include <mpi.h>

#include <memory>
#include <optional>

#include "bcast/comm.h"

namespace stage {

// True when this process was started by a launcher (srun, mpirun) rather than by hand.
bool launched_by_mpi_launcher();

class MpiEnv {
 public:
  static Result<std::unique_ptr<MpiEnv>> init(int* argc, char*** argv, int required_thread_level);
  MpiEnv(const MpiEnv&) = delete;
  MpiEnv& operator=(const MpiEnv&) = delete;
  ~MpiEnv();
  [[nodiscard]] int thread_level() const { return provided_; }

 private:
  MpiEnv(bool owns, int provided) : owns_(owns), provided_(provided) {}
  bool owns_;
  int provided_;
};

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

 private:
  explicit MpiComm(MPI_Comm c);
  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
};

// Turns an MPI return code into a Status naming the call (ADIOS2's CheckMPIReturn).
Status check_mpi(int rc, const char* call);

}  // namespace stage
