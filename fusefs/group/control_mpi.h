// MPI side of the control plane. Two communicators duplicated from the world (requests:
// point-to-point to the coordinator; announcements: MPI_Ibcast from the coordinator), both
// with MPI_ERRORS_RETURN. Every rank keeps at most one announcement broadcast outstanding,
// so announcements start in the same order everywhere, as non-blocking collectives require.
// Only non-blocking calls (Isend, Irecv, Ibcast, Test): the service thread polls and sleeps,
// so an idle daemon costs almost no CPU (a blocking MPI wait spins in Open MPI).
// Owned and called by one thread (the one that initialized MPI).
#pragma once

#include <mpi.h>

#include <array>
#include <list>
#include <memory>

#include "bcast/comm/comm_mpi.h"
#include "fusefs/group/control.h"

namespace stagefs {

// One outstanding MPI request. On destruction a pending receive is cancelled and completed; a
// pending send is freed (Open MPI cannot cancel sends, and waiting for one whose receiver has
// already left would hang the exit); a collective cannot be cancelled or freed (MPI forbids
// it) and is left to the process exit: the daemon completes it with close() or a shutdown
// announcement, and a stalled group exits without finalizing.
class MpiRequest {
 public:
  MpiRequest() = default;
  MpiRequest(const MpiRequest&) = delete;
  MpiRequest& operator=(const MpiRequest&) = delete;
  ~MpiRequest();
  MPI_Request* handle() { return &req_; }
  [[nodiscard]] bool active() const { return req_ != MPI_REQUEST_NULL; }
  // True once complete (the request is then inactive); status filled if given.
  stage::Result<bool> test(MPI_Status* status = MPI_STATUS_IGNORE);
  enum class Kind { send, recv, collective };
  void set_kind(Kind k) { kind_ = k; }

 private:
  MPI_Request req_ = MPI_REQUEST_NULL;
  Kind kind_ = Kind::send;
};

class MpiControlPlane final : public ControlPlane {
 public:
  static stage::Result<std::unique_ptr<MpiControlPlane>> create(MPI_Comm world, int coordinator);
  [[nodiscard]] bool is_coordinator() const override { return rank_ == coordinator_; }
  stage::Status send_request(const Message& m) override;
  stage::Result<std::optional<Message>> poll_request() override;
  stage::Status announce(const Message& m) override;
  stage::Result<std::optional<Message>> poll_announcement() override;
  stage::Status close() override;

 private:
  MpiControlPlane() = default;
  stage::Status post_request_recv();
  stage::Status post_announcement_recv();

  std::unique_ptr<stage::MpiComm> req_comm_;
  std::unique_ptr<stage::MpiComm> ann_comm_;
  int rank_ = 0;
  int coordinator_ = 0;
  bool stopped_ = false;  // a shutdown announcement was seen: post nothing more

  struct Outgoing {
    std::string bytes;
    MpiRequest req;
  };
  std::list<Outgoing> sends_;
  std::array<std::byte, kMaxMessage> recv_buf_{};
  MpiRequest recv_;
  std::array<std::byte, kMaxMessage + 4> ann_buf_{};  // u32 length + message
  MpiRequest ann_;
};

}  // namespace stagefs
