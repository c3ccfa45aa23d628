#include "fusefs/group/control_mpi.h"

#include <cstring>

namespace stagefs {

using stage::check_mpi;

namespace {
constexpr int kRequestTag = 17;
}

MpiRequest::~MpiRequest() {
  int finalized = 0;
  if (req_ == MPI_REQUEST_NULL || MPI_Finalized(&finalized) != MPI_SUCCESS || finalized != 0) return;
  int flag = 0;
  if (kind_ == Kind::collective || MPI_Test(&req_, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS || flag != 0)
    return;
  if (kind_ == Kind::recv) {
    MPI_Cancel(&req_);
    MPI_Wait(&req_, MPI_STATUS_IGNORE);  // a cancelled receive completes at once
  } else {
    MPI_Request_free(&req_);  // the send completes (or is dropped) in the background
  }
}

stage::Result<bool> MpiRequest::test(MPI_Status* status) {
  if (req_ == MPI_REQUEST_NULL) return false;
  int flag = 0;
  if (auto st = check_mpi(MPI_Test(&req_, &flag, status), "MPI_Test"); !st) return st.error();
  return flag != 0;
}

stage::Result<std::unique_ptr<MpiControlPlane>> MpiControlPlane::create(MPI_Comm world, int coordinator) {
  auto cp = std::unique_ptr<MpiControlPlane>(new MpiControlPlane());
  auto rq = stage::MpiComm::dup(world);
  if (!rq) return rq.error();
  auto an = stage::MpiComm::dup(world);
  if (!an) return an.error();
  cp->req_comm_ = std::move(rq.value());
  cp->ann_comm_ = std::move(an.value());
  cp->rank_ = cp->req_comm_->rank();
  cp->coordinator_ = coordinator;
  cp->ann_.set_kind(MpiRequest::Kind::collective);
  cp->recv_.set_kind(MpiRequest::Kind::recv);
  if (cp->is_coordinator()) {
    if (auto st = cp->post_request_recv(); !st) return st.error();
  } else {
    if (auto st = cp->post_announcement_recv(); !st) return st.error();
  }
  return cp;
}

stage::Status MpiControlPlane::post_request_recv() {
  return check_mpi(MPI_Irecv(recv_buf_.data(), static_cast<int>(recv_buf_.size()), MPI_BYTE, MPI_ANY_SOURCE,
                             kRequestTag, req_comm_->handle(), recv_.handle()),
                   "MPI_Irecv");
}

stage::Status MpiControlPlane::post_announcement_recv() {
  return check_mpi(MPI_Ibcast(ann_buf_.data(), static_cast<int>(ann_buf_.size()), MPI_BYTE, coordinator_,
                              ann_comm_->handle(), ann_.handle()),
                   "MPI_Ibcast");
}

stage::Status MpiControlPlane::close() {
  if (stopped_) return {};
  if (is_coordinator() && !ann_.active()) {
    if (auto st = announce(Message{MsgType::shutdown, 0, {}}); !st) return st;
  }
  stopped_ = true;
  return check_mpi(MPI_Wait(ann_.handle(), MPI_STATUS_IGNORE), "MPI_Wait");
}

stage::Status MpiControlPlane::send_request(const Message& m) {
  // Drop completed sends first, so the list holds only what MPI still reads from.
  for (auto it = sends_.begin(); it != sends_.end();) {
    auto done = it->req.test();
    if (!done) return done.error();
    it = *done ? sends_.erase(it) : std::next(it);
  }
  auto& out = sends_.emplace_back();
  out.bytes = encode_message(m);
  return check_mpi(MPI_Isend(out.bytes.data(), static_cast<int>(out.bytes.size()), MPI_BYTE, coordinator_,
                             kRequestTag, req_comm_->handle(), out.req.handle()),
                   "MPI_Isend");
}

stage::Result<std::optional<Message>> MpiControlPlane::poll_request() {
  MPI_Status status;
  auto done = recv_.test(&status);
  if (!done) return done.error();
  if (!*done) return std::optional<Message>();
  int count = 0;
  if (auto st = check_mpi(MPI_Get_count(&status, MPI_BYTE, &count), "MPI_Get_count"); !st) return st.error();
  auto msg = decode_message(std::span(recv_buf_.data(), static_cast<size_t>(count)));
  if (auto st = post_request_recv(); !st) return st.error();
  if (!msg) {
    // A malformed request is dropped (and reported), never acted on.
    stage::Error e = msg.error();
    e.message += " (from rank " + std::to_string(status.MPI_SOURCE) + ")";
    return e;
  }
  return std::optional<Message>(std::move(msg.value()));
}

stage::Status MpiControlPlane::announce(const Message& m) {
  if (!is_coordinator() || ann_.active())
    return stage::stage_error(stage::Errc::bad_message, "announce while busy");
  const std::string bytes = encode_message(m);
  const auto len = static_cast<uint32_t>(bytes.size());
  std::memcpy(ann_buf_.data(), &len, 4);
  std::memcpy(ann_buf_.data() + 4, bytes.data(), bytes.size());
  return post_announcement_recv();  // on the root, the same call sends
}

stage::Result<std::optional<Message>> MpiControlPlane::poll_announcement() {
  auto done = ann_.test();
  if (!done) return done.error();
  if (!*done) return std::optional<Message>();
  uint32_t len = 0;
  std::memcpy(&len, ann_buf_.data(), 4);
  if (len > kMaxMessage) return stage::stage_error(stage::Errc::bad_message, "announcement length");
  auto msg = decode_message(std::span(ann_buf_.data() + 4, len));
  if (!msg) return msg.error();
  if (msg->type == MsgType::shutdown) stopped_ = true;
  if (!is_coordinator() && !stopped_) {
    if (auto st = post_announcement_recv(); !st) return st.error();
  }
  return std::optional<Message>(std::move(msg.value()));
}

}  // namespace stagefs
