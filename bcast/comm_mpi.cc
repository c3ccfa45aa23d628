#include "bcast/comm_mpi.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <ctime>
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

// Completes a nonblocking collective without burning a core: MPI_Test (which drives Open
// MPI's progress engine) in a tight loop for a short while, then with sleeps that double from
// 10 us up to 500 us. A rank that waits for the source's reader or for a slow peer then costs
// ~nothing, instead of spinning in a blocking call (Open MPI busy-polls, and even with
// mpi_yield_when_idle the sched_yield loop took a third of the CPU of 4 ranks on 2 cores).
static Status wait_polite(MPI_Request& req, const char* call) {
  constexpr int kSpins = 100;
  constexpr long kFirstSleepNs = 10'000, kMaxSleepNs = 500'000;
  long sleep_ns = 0;
  for (int spins = 0;;) {
    int done = 0;
    // An error here is the request completing in error (MPI_Test then frees it) or a broken
    // communicator; either way the caller stops using this Comm for the transfer.
    if (auto st = check_mpi(MPI_Test(&req, &done, MPI_STATUS_IGNORE), call); !st) return st;
    if (done != 0) return {};
    if (spins < kSpins) {
      ++spins;
      continue;
    }
    sleep_ns = std::min(sleep_ns == 0 ? kFirstSleepNs : sleep_ns * 2, kMaxSleepNs);
    const timespec ts{0, sleep_ns};
    ::nanosleep(&ts, nullptr);
  }
}

bool MpiComm::polite_bcast(uint64_t bytes) const {
  return size_ <= kPoliteBcastMaxRanks || bytes <= kPoliteBcastMaxBytes;
}

Status MpiComm::bcast(std::span<std::byte> buf, int root) {
  const bool polite = polite_bcast(buf.size());
  uint64_t done = 0;
  while (done < buf.size()) {  // counts stay under INT_MAX
    const int n = mpi_piece(buf.size() - done);
    if (polite) {
      MPI_Request req = MPI_REQUEST_NULL;
      if (auto st = check_mpi(MPI_Ibcast(buf.data() + done, n, MPI_BYTE, root, comm_, &req), "MPI_Ibcast");
          !st)
        return st;
      if (auto st = wait_polite(req, "MPI_Ibcast (wait)"); !st) return st;
    } else if (auto st = check_mpi(MPI_Bcast(buf.data() + done, n, MPI_BYTE, root, comm_), "MPI_Bcast");
               !st) {
      return st;
    }
    done += static_cast<uint64_t>(n);
  }
  return {};
}

static Status allreduce(MPI_Comm comm, std::span<int64_t> inout, MPI_Op op) {
  uint64_t done = 0;
  while (done < inout.size()) {
    const int n = mpi_piece(inout.size() - done);
    MPI_Request req = MPI_REQUEST_NULL;
    if (auto st = check_mpi(MPI_Iallreduce(MPI_IN_PLACE, inout.data() + done, n, MPI_INT64_T, op, comm, &req),
                            "MPI_Iallreduce");
        !st)
      return st;
    if (auto st = wait_polite(req, "MPI_Iallreduce (wait)"); !st) return st;
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
  MPI_Request req = MPI_REQUEST_NULL;
  if (auto st = check_mpi(MPI_Ibarrier(comm_, &req), "MPI_Ibarrier"); !st) return st;
  return wait_polite(req, "MPI_Ibarrier (wait)");
}

}  // namespace stage
