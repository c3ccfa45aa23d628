// mpirun -np N polite_wait: ranks that wait in MpiComm's collectives do not burn a core.
//
// Rank 0 arrives late (it sleeps before each collective: the scenario under test is "a peer
// is slow", not a synchronization); every other rank measures the CPU time its process used
// while it waited. A spinning wait costs about as much CPU as wall time (on 2 cores shared by
// 4 ranks, at least a fair share of it); a polite one costs a few milliseconds. Checked for the
// allreduce (always polite), the barrier, and the bcast of data when polite_bcast() says it
// is polite; a blocking bcast (more than kPoliteBcastMaxRanks ranks) is checked for its bytes.
// Exit status 0 = pass, 1 = fail (each failing rank says why).
#include <mpi.h>

#include <cstdio>
#include <ctime>
#include <string>
#include <vector>

#include "bcast/comm/comm_mpi.h"

namespace {

double now(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

constexpr double kLateSeconds = 1.0;   // how late rank 0 arrives
constexpr double kMaxCpuShare = 0.25;  // of the wait, that a waiting rank may use

int failures = 0;

void fail(int rank, const std::string& what) {
  std::fprintf(stderr, "polite_wait: rank %d: FAIL: %s\n", rank, what.c_str());
  ++failures;
}

// Runs op on every rank with rank 0 arriving late; others check the CPU they spent waiting.
template <class Op>
void check_wait(stage::MpiComm& comm, const char* name, bool must_be_polite, Op op) {
  if (comm.rank() == 0) {
    const timespec late{static_cast<time_t>(kLateSeconds), 0};
    nanosleep(&late, nullptr);
  }
  const double wall0 = now(CLOCK_MONOTONIC), cpu0 = now(CLOCK_PROCESS_CPUTIME_ID);
  if (auto st = op(); !st) fail(comm.rank(), std::string(name) + ": " + st.error().message);
  const double wall = now(CLOCK_MONOTONIC) - wall0, cpu = now(CLOCK_PROCESS_CPUTIME_ID) - cpu0;
  if (comm.rank() == 0) return;
  std::fprintf(stderr, "polite_wait: rank %d: %s waited %.3f s, used %.3f CPU-s%s\n", comm.rank(), name, wall,
               cpu, must_be_polite ? "" : " (blocking: not checked)");
  if (must_be_polite && cpu > kMaxCpuShare * wall)
    fail(comm.rank(), std::string(name) + " spun: " + std::to_string(cpu) + " CPU-s in " +
                          std::to_string(wall) + " s of waiting");
}

}  // namespace

int main(int argc, char** argv) {
  auto env = stage::MpiEnv::init(&argc, &argv, MPI_THREAD_FUNNELED);
  if (!env) {
    std::fprintf(stderr, "polite_wait: %s\n", env.error().message.c_str());
    return 1;
  }
  auto comm = stage::MpiComm::dup(MPI_COMM_WORLD);
  if (!comm) {
    std::fprintf(stderr, "polite_wait: %s\n", comm.error().message.c_str());
    return 1;
  }
  stage::MpiComm& c = **comm;

  std::vector<int64_t> v{c.rank() + 1};
  check_wait(c, "allreduce", true, [&] { return c.allreduce_sum(v); });
  if (v[0] != static_cast<int64_t>(c.size()) * (c.size() + 1) / 2) fail(c.rank(), "allreduce: wrong sum");

  check_wait(c, "barrier", true, [&] { return c.barrier(); });

  const size_t n = 4U << 20U;  // a chunk's worth of data
  std::vector<std::byte> buf(n, std::byte{0});
  if (c.rank() == 0)
    for (size_t i = 0; i < n; ++i) buf[i] = static_cast<std::byte>(i * 7 + 3);
  check_wait(c, "bcast 4 MiB", c.polite_bcast(n), [&] { return c.bcast(buf, 0); });
  for (size_t i = 0; i < n; ++i)
    if (buf[i] != static_cast<std::byte>(i * 7 + 3)) {
      fail(c.rank(), "bcast: wrong byte at " + std::to_string(i));
      break;
    }

  std::vector<int64_t> any{failures};
  if (auto st = c.allreduce_max(any); !st) return 1;
  comm->reset();
  return any[0] == 0 ? 0 : 1;
}
