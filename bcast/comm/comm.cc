#include "bcast/comm/comm.h"

namespace stage {

Status bcast_string(Comm& comm, std::string& s, int root) {
  int64_t len = static_cast<int64_t>(s.size());
  if (auto st = comm.bcast(std::as_writable_bytes(std::span(&len, 1)), root); !st) return st;
  if (len < 0) return stage_error(Errc::bad_message, "broadcast string length");
  s.resize(static_cast<size_t>(len));
  return comm.bcast(std::as_writable_bytes(std::span(s.data(), s.size())), root);
}

Status bcast_value(Comm& comm, uint64_t& v, int root) {
  return comm.bcast(std::as_writable_bytes(std::span(&v, 1)), root);
}

Result<int64_t> allreduce_max(Comm& comm, int64_t v) {
  if (auto st = comm.allreduce_max(std::span(&v, 1)); !st) return st.error();
  return v;
}

Result<int64_t> allreduce_sum(Comm& comm, int64_t v) {
  if (auto st = comm.allreduce_sum(std::span(&v, 1)); !st) return st.error();
  return v;
}

}  // namespace stage
