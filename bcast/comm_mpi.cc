#include "bcast/comm_mpi.h"

#include <array>
#include <cstdlib>
#include <numeric>

#include "bcast/chunk.h"

namespace stage {

bool launched_by_mpi_launcher() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "SLURM_STEP_ID"})
    if (std::getenv(v) != nullptr) return true;
  return false;
}

Status check_mpi(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return {};
  std::array<char, MPI_MAX_ERROR_STRING> text{};
  int len = 0;
  if (MPI_Error_string(rc, text.data(), &len) != MPI_SUCCESS) len = 0;
  Error e = stage_error(Errc::comm_failed, call);
  e.message += " (" + std::string(text.data(), static_cast<size_t>(len)) + ")";
  return e;
}

Result<std::unique_ptr<MpiEnv>> MpiEnv::init(int* argc, char*** argv, int required) {
  int inited = 0;
  if (auto st = check_mpi(MPI_Initialized(&inited), "MPI_Initialized"); !st) return st.error();
  int provided = 0;
  if (inited != 0) {
    if (auto st = check_mpi(MPI_Query_thread(&provided), "MPI_Query_thread"); !st) return st.error();
    return std::unique_ptr<MpiEnv>(new MpiEnv(false, provided));
  }
  // Our ranks mostly wait while other threads of the same process read, check and write: let a
  // waiting MPI call yield the CPU instead of spinning (Open MPI's default spins, which on a
  // node with few cores starves the writer threads: 4 ranks on 2 cores staged 512 MiB in
  // 8.4 s spinning, 4.5 s yielding). A user's own setting wins.
  ::setenv("OMPI_MCA_mpi_yield_when_idle", "1", 0);
  if (auto st = check_mpi(MPI_Init_thread(argc, argv, required, &provided), "MPI_Init_thread"); !st)
    return st.error();
  auto env = std::unique_ptr<MpiEnv>(new MpiEnv(true, provided));
  if (provided < required)
    return stage_error(Errc::comm_failed, "MPI_Init_thread: the MPI library lacks the thread level");
  return env;
}

MpiEnv::~MpiEnv() {
  int finalized = 0;
  if (owns_ && MPI_Finalized(&finalized) == MPI_SUCCESS && finalized == 0) MPI_Finalize();
}

MpiComm::MpiComm(MPI_Comm c) : comm_(c) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

Result<std::unique_ptr<MpiComm>> MpiComm::dup(MPI_Comm base) {
  MPI_Comm c = MPI_COMM_NULL;
  if (auto st = check_mpi(MPI_Comm_dup(base, &c), "MPI_Comm_dup"); !st) return st.error();
  if (auto st = check_mpi(MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler"); !st) {
    MPI_Comm_free(&c);
    return st.error();
  }
  return std::unique_ptr<MpiComm>(new MpiComm(c));
}

Result<std::unique_ptr<MpiComm>> MpiComm::split_node() const {
  MPI_Comm c = MPI_COMM_NULL;
  if (auto st = check_mpi(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &c),
                          "MPI_Comm_split_type");
      !st)
    return st.error();
  if (auto st = check_mpi(MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler"); !st) {
    MPI_Comm_free(&c);
    return st.error();
  }
  return std::unique_ptr<MpiComm>(new MpiComm(c));
}

MpiComm::~MpiComm() {
  int finalized = 0;
  if (comm_ != MPI_COMM_NULL && comm_ != MPI_COMM_WORLD && comm_ != MPI_COMM_SELF &&
      MPI_Finalized(&finalized) == MPI_SUCCESS && finalized == 0)
    MPI_Comm_free(&comm_);
}

Status MpiComm::bcast(std::span<std::byte> buf, int root) {
  uint64_t done = 0;
  while (done < buf.size()) {  // counts stay under INT_MAX
    const int n = mpi_piece(buf.size() - done);
    if (auto st = check_mpi(MPI_Bcast(buf.data() + done, n, MPI_BYTE, root, comm_), "MPI_Bcast"); !st)
      return st;
    done += static_cast<uint64_t>(n);
  }
  return {};
}

static Status allreduce(MPI_Comm comm, std::span<int64_t> inout, MPI_Op op) {
  uint64_t done = 0;
  while (done < inout.size()) {
    const int n = mpi_piece(inout.size() - done);
    if (auto st = check_mpi(MPI_Allreduce(MPI_IN_PLACE, inout.data() + done, n, MPI_INT64_T, op, comm),
                            "MPI_Allreduce");
        !st)
      return st;
    done += static_cast<uint64_t>(n);
  }
  return {};
}

Status MpiComm::allreduce_max(std::span<int64_t> inout) {
  return allreduce(comm_, inout, MPI_MAX);
}
Status MpiComm::allreduce_sum(std::span<int64_t> inout) {
  return allreduce(comm_, inout, MPI_SUM);
}

Result<std::vector<std::string>> MpiComm::gather(const std::string& mine, int root) {
  const int len = static_cast<int>(std::min<size_t>(mine.size(), 1U << 20));  // a message, not data
  std::vector<int> lens(rank_ == root ? static_cast<size_t>(size_) : 0);
  if (auto st = check_mpi(MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, root, comm_), "MPI_Gather");
      !st)
    return st.error();
  std::vector<int> displs(lens.size());
  std::string all;
  if (rank_ == root) {
    std::exclusive_scan(lens.begin(), lens.end(), displs.begin(), 0);
    all.resize(static_cast<size_t>(std::accumulate(lens.begin(), lens.end(), 0)));
  }
  if (auto st = check_mpi(MPI_Gatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(),
                                      MPI_CHAR, root, comm_),
                          "MPI_Gatherv");
      !st)
    return st.error();
  std::vector<std::string> out;
  for (size_t i = 0; i < lens.size(); ++i)
    out.emplace_back(all.substr(static_cast<size_t>(displs[i]), static_cast<size_t>(lens[i])));
  return out;
}

Status MpiComm::barrier() {
  return check_mpi(MPI_Barrier(comm_), "MPI_Barrier");
}

}  // namespace stage
