// One error model for the whole core: an Error is a std::error_code (errno values in
// std::generic_category, or stage-specific conditions in stage_category) plus a message that
// already names the host and the path, so it can be printed as it is on any rank.
// Result<T> carries a value or an Error; Status is Result<void>. Nothing here throws.
// The FUSE edge maps Error::code to an errno with to_errno() (one table, below).
#pragma once

#include <cerrno>
#include <string>
#include <system_error>
#include <utility>
#include <variant>

namespace stage {

// Conditions that have no errno of their own.
enum class Errc {
  ok = 0,
  checksum_mismatch = 1,  // a chunk or a file did not match the CRC computed at the source
  source_changed = 2,     // the source was modified or replaced during the transfer
  short_read = 3,         // the source ended before its recorded size
  peer_failed = 4,        // another rank failed; this rank aborted with it
  bad_message = 5,        // a message between ranks failed validation
  comm_failed = 6,        // an MPI call returned an error
  timed_out = 7,          // a transfer did not finish within its deadline
  unsupported = 8,        // file type that is never materialized (FIFO, socket, device)
  comm_broken = 9,        // a communicator broke (lost rank or link, stall): its ranks no longer agree
  cancelled = 10,         // the transfer was abandoned (the daemon is stopping)
};

const std::error_category& stage_category() noexcept;
inline std::error_code make_error_code(Errc e) noexcept {
  return {static_cast<int>(e), stage_category()};
}

struct Error {
  std::error_code code;
  std::string message;  // human-readable, names host and path where there is one

  // Maps to the errno a FUSE reply or an exit path should carry.
  [[nodiscard]] int to_errno() const noexcept;
};

// Builds an Error from errno (or an explicit errno value) with "host: what: path: strerror".
Error sys_error(int err, const std::string& what, const std::string& path = {});
Error stage_error(Errc e, const std::string& what, const std::string& path = {});

// The host name this process reports in messages (cached).
const std::string& host_name();

template <class T>
class [[nodiscard]] Result {
 public:
  Result(T v) : v_(std::move(v)) {}      // NOLINT(google-explicit-constructor)
  Result(Error e) : v_(std::move(e)) {}  // NOLINT(google-explicit-constructor)
  [[nodiscard]] bool ok() const noexcept { return v_.index() == 0; }
  explicit operator bool() const noexcept { return ok(); }
  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  [[nodiscard]] const Error& error() const { return std::get<1>(v_); }

 private:
  std::variant<T, Error> v_;
};

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Error e) : err_(std::move(e)), failed_(true) {}  // NOLINT(google-explicit-constructor)
  [[nodiscard]] bool ok() const noexcept { return !failed_; }
  explicit operator bool() const noexcept { return ok(); }
  [[nodiscard]] const Error& error() const { return err_; }

 private:
  Error err_;
  bool failed_ = false;
};

}  // namespace stage

template <>
struct std::is_error_code_enum<stage::Errc> : std::true_type {};
