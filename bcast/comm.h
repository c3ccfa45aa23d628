// The communicator seam. The engine talks to a Comm, never to MPI directly:
//   MpiComm     (comm_mpi.h)  a duplicated MPI communicator with MPI_ERRORS_RETURN
//   SelfComm    (below)       a world of one rank: the standalone, no-launcher default
//   ThreadComm  (tests/)      N ranks as threads in one process, with fault injection
// Every method is COLLECTIVE over the communicator (all ranks call it, in the same order) and
// none is thread-safe: one thread owns a Comm. Buffers may exceed INT_MAX bytes; the MPI side
// splits them. A failed call returns Errc::comm_failed; no implementation ever aborts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "bcast/error.h"

namespace stage {

class Comm {
 public:
  Comm() = default;
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;
  virtual ~Comm() = default;

  [[nodiscard]] virtual int rank() const = 0;
  [[nodiscard]] virtual int size() const = 0;

  virtual Status bcast(std::span<std::byte> buf, int root) = 0;
  // Element-wise maximum / sum over all ranks, in place.
  virtual Status allreduce_max(std::span<int64_t> inout) = 0;
  virtual Status allreduce_sum(std::span<int64_t> inout) = 0;
  // Every rank's string, in rank order, on root (empty vector elsewhere).
  virtual Result<std::vector<std::string>> gather(const std::string& mine, int root) = 0;
  virtual Status barrier() = 0;
};

// Convenience wrappers (collective, like the calls they wrap).
Status bcast_string(Comm& comm, std::string& s, int root);
Result<int64_t> allreduce_max(Comm& comm, int64_t v);
Result<int64_t> allreduce_sum(Comm& comm, int64_t v);

class SelfComm final : public Comm {
 public:
  [[nodiscard]] int rank() const override { return 0; }
  [[nodiscard]] int size() const override { return 1; }
  Status bcast(std::span<std::byte> /*buf*/, int /*root*/) override { return {}; }
  Status allreduce_max(std::span<int64_t> /*inout*/) override { return {}; }
  Status allreduce_sum(std::span<int64_t> /*inout*/) override { return {}; }
  Result<std::vector<std::string>> gather(const std::string& mine, int /*root*/) override {
    return std::vector<std::string>{mine};
  }
  Status barrier() override { return {}; }
};

}  // namespace stage
