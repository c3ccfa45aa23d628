// The communicator seam. The engine talks to a Comm, never to MPI directly:
//   MpiComm     (comm_mpi.h)  a duplicated MPI communicator with MPI_ERRORS_RETURN
//   SelfComm    (below)       a world of one rank: the standalone, no-launcher default
//   ThreadComm  (tests/)      N ranks as threads in one process, with fault injection
// Every method is COLLECTIVE over the communicator (all ranks call it, in the same order) and
// none is thread-safe: one thread owns a Comm. Buffers may exceed INT_MAX bytes; the MPI side
// splits them. A failed call returns Errc::comm_failed; no implementation ever aborts.
//
// PointToPoint (below) is the data path's seam: nonblocking sends and receives that
// bcast/transfer/pipeline.h builds its pipelined chain and tree broadcasts from. A Comm may offer one
// over the same ranks (point_to_point()); MpiComm does, SelfComm and the plain ThreadComm do
// not (the engine then uses Comm::bcast).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "bcast/io/error.h"

namespace stage {

// Nonblocking point-to-point messages between the ranks of a Comm. NOT collective, NOT
// thread-safe: the thread that owns the Comm owns this too. A request is an id returned by
// isend/irecv; it lives until test() reports it complete or failed, or cancel() drops it.
// The buffer of a live request belongs to the implementation: keep it valid and untouched
// (a cancelled send may still be read by the MPI library; see MpiPointToPoint). Messages
// between one pair of ranks with one tag are matched in the order they were started (MPI's
// non-overtaking rule); a receive must be exactly the size of the message.
class PointToPoint {
 public:
  using Request = int;
  static constexpr int kMaxTag = 32767;  // the smallest MPI_TAG_UB the standard allows

  PointToPoint() = default;
  PointToPoint(const PointToPoint&) = delete;
  PointToPoint& operator=(const PointToPoint&) = delete;
  virtual ~PointToPoint() = default;

  [[nodiscard]] virtual int rank() const = 0;
  [[nodiscard]] virtual int size() const = 0;
  // Where each rank sits, one key per rank (SLURM_TOPOLOGY_ADDR, else the host name): ranks
  // with equal or neighbouring keys share a node or a switch. Known to every rank.
  [[nodiscard]] virtual const std::vector<std::string>& placement() const = 0;

  virtual Result<Request> isend(std::span<const std::byte> buf, int dest, int tag) = 0;
  virtual Result<Request> irecv(std::span<std::byte> buf, int source, int tag) = 0;
  // true: complete (the id is released); false: still pending; an error: the request failed
  // (the id is released).
  virtual Result<bool> test(Request r) = 0;
  // Drops a pending request (best effort: a receive is cancelled; a send may not be).
  virtual void cancel(Request r) noexcept = 0;
};

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

  // Point-to-point messages over the same ranks, or nullptr if this Comm has none. Owned by
  // the Comm; not collective.
  virtual PointToPoint* point_to_point() { return nullptr; }
};

// Convenience wrappers (collective, like the calls they wrap).
Status bcast_string(Comm& comm, std::string& s, int root);
// root's v on every rank (a setting every rank must share: root's counts).
Status bcast_value(Comm& comm, uint64_t& v, int root);
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
