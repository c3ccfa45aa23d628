#include "bcast/comm/comm_mpi.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <ctime>
#include <limits>
#include <numeric>

#include "bcast/io/chunk.h"

namespace stage {

bool launched_by_mpi_launcher() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "SLURM_STEP_ID"})
    if (std::getenv(v) != nullptr) return true;
  return false;
}

int launcher_rank() {
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"})
    if (const char* s = std::getenv(v)) return std::atoi(s);
  return 0;
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
  if (inited != 0) return std::unique_ptr<MpiEnv>(new MpiEnv(false));
  // Our ranks mostly wait while other threads of the same process read, check and write: let a
  // waiting MPI call yield the CPU instead of spinning (Open MPI's default spins, which on a
  // node with few cores starves the writer threads: 4 ranks on 2 cores staged 512 MiB in
  // 8.4 s spinning, 4.5 s yielding). A user's own setting wins.
  ::setenv("OMPI_MCA_mpi_yield_when_idle", "1", 0);
  int provided = 0;
  if (auto st = check_mpi(MPI_Init_thread(argc, argv, required, &provided), "MPI_Init_thread"); !st)
    return st.error();
  auto env = std::unique_ptr<MpiEnv>(new MpiEnv(true));
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
  return make(c);
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
  return make(c);
}

std::string placement_key() {
  if (const char* t = std::getenv("SLURM_TOPOLOGY_ADDR"); t != nullptr && *t != '\0') return t;
  return host_name();
}

Result<std::unique_ptr<MpiComm>> MpiComm::make(MPI_Comm c) {
  auto comm = std::unique_ptr<MpiComm>(new MpiComm(c));  // frees c if we fail below
  constexpr size_t kKey = 256;                           // a fixed-size slot per rank
  std::array<char, kKey> mine{};
  const std::string key = placement_key();
  std::copy_n(key.data(), std::min(key.size(), kKey - 1), mine.begin());
  std::vector<char> all(kKey * static_cast<size_t>(comm->size_));
  if (auto st = check_mpi(MPI_Allgather(mine.data(), static_cast<int>(kKey), MPI_CHAR, all.data(),
                                        static_cast<int>(kKey), MPI_CHAR, c),
                          "MPI_Allgather (placement)");
      !st)
    return st.error();
  std::vector<std::string> placement;
  for (int r = 0; r < comm->size_; ++r) placement.emplace_back(all.data() + kKey * static_cast<size_t>(r));
  comm->p2p_ = std::make_unique<MpiPointToPoint>(c, comm->rank_, comm->size_, std::move(placement));
  return comm;
}

MpiPointToPoint::~MpiPointToPoint() {
  for (Request r = 0; r < static_cast<Request>(reqs_.size()); ++r) cancel(r);
}

PointToPoint::Request MpiPointToPoint::slot() {
  for (size_t i = 0; i < reqs_.size(); ++i)
    if (reqs_[i] == MPI_REQUEST_NULL) return static_cast<Request>(i);
  reqs_.push_back(MPI_REQUEST_NULL);
  return static_cast<Request>(reqs_.size() - 1);
}

Result<PointToPoint::Request> MpiPointToPoint::isend(std::span<const std::byte> buf, int dest, int tag) {
  if (buf.size() > static_cast<size_t>(std::numeric_limits<int>::max()))
    return stage_error(Errc::bad_message, "MPI_Isend: message too large");
  const Request r = slot();
  auto& req = reqs_[static_cast<size_t>(r)];
  // MPI_Isend takes a const buffer since MPI-3.
  if (auto st = check_mpi(
          MPI_Isend(buf.data(), static_cast<int>(buf.size()), MPI_BYTE, dest, tag, comm_, &req), "MPI_Isend");
      !st) {
    req = MPI_REQUEST_NULL;
    return st.error();
  }
  return r;
}

Result<PointToPoint::Request> MpiPointToPoint::irecv(std::span<std::byte> buf, int source, int tag) {
  if (buf.size() > static_cast<size_t>(std::numeric_limits<int>::max()))
    return stage_error(Errc::bad_message, "MPI_Irecv: message too large");
  const Request r = slot();
  auto& req = reqs_[static_cast<size_t>(r)];
  if (auto st =
          check_mpi(MPI_Irecv(buf.data(), static_cast<int>(buf.size()), MPI_BYTE, source, tag, comm_, &req),
                    "MPI_Irecv");
      !st) {
    req = MPI_REQUEST_NULL;
    return st.error();
  }
  return r;
}

Result<bool> MpiPointToPoint::test(Request r) {
  if (r < 0 || static_cast<size_t>(r) >= reqs_.size() || reqs_[static_cast<size_t>(r)] == MPI_REQUEST_NULL)
    return stage_error(Errc::bad_message, "MPI_Test: no such request");
  auto& req = reqs_[static_cast<size_t>(r)];
  int done = 0;
  const int rc = MPI_Test(&req, &done, MPI_STATUS_IGNORE);
  if (rc != MPI_SUCCESS) {  // the request completed in error and is freed, or the comm broke
    if (req != MPI_REQUEST_NULL) cancel(r);
    req = MPI_REQUEST_NULL;
    return check_mpi(rc, "MPI_Test (point-to-point)").error();
  }
  if (done == 0) return false;
  req = MPI_REQUEST_NULL;  // MPI_Test set it already; kept explicit
  return true;
}

void MpiPointToPoint::cancel(Request r) noexcept {
  if (r < 0 || static_cast<size_t>(r) >= reqs_.size()) return;
  auto& req = reqs_[static_cast<size_t>(r)];
  if (req == MPI_REQUEST_NULL) return;
  int finalized = 0;
  if (MPI_Finalized(&finalized) == MPI_SUCCESS && finalized == 0) {
    // Errors ignored: this is the give-up path; MPI_Request_free lets MPI finish it later.
    (void)MPI_Cancel(&req);
    (void)MPI_Request_free(&req);
  }
  req = MPI_REQUEST_NULL;
}

MpiComm::~MpiComm() {
  p2p_.reset();  // its requests go before the communicator
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
