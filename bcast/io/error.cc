#include "bcast/io/error.h"

#include <unistd.h>

#include <array>
#include <cstring>

namespace stage {
namespace {

class StageCategory final : public std::error_category {
 public:
  [[nodiscard]] const char* name() const noexcept override { return "stage"; }
  [[nodiscard]] std::string message(int v) const override {
    switch (static_cast<Errc>(v)) {
      case Errc::ok:
        return "success";
      case Errc::checksum_mismatch:
        return "checksum mismatch";
      case Errc::source_changed:
        return "source changed during transfer";
      case Errc::short_read:
        return "source ended before its recorded size";
      case Errc::peer_failed:
        return "another rank failed";
      case Errc::bad_message:
        return "malformed message between ranks";
      case Errc::comm_failed:
        return "MPI communication failed";
      case Errc::timed_out:
        return "transfer timed out";
      case Errc::unsupported:
        return "file type is not materialized";
      case Errc::comm_broken:
        return "mount group stopped after a stalled transfer";
      case Errc::cancelled:
        return "transfer abandoned";
    }
    return "unknown stage error";
  }
};

}  // namespace

const std::error_category& stage_category() noexcept {
  static const StageCategory cat;
  return cat;
}

// The one errno table: core conditions -> what a FUSE reply carries.
int Error::to_errno() const noexcept {
  if (!code) return 0;
  if (code.category() == std::generic_category() || code.category() == std::system_category())
    return code.value();
  switch (static_cast<Errc>(code.value())) {
    case Errc::unsupported:
      return EOPNOTSUPP;
    case Errc::timed_out:
      return ETIMEDOUT;
    case Errc::source_changed:
      return ESTALE;
    default:
      return EIO;
  }
}

const std::string& host_name() {
  static const std::string name = [] {
    std::array<char, 256> buf{};
    if (gethostname(buf.data(), buf.size() - 1) != 0) return std::string("unknown-host");
    return std::string(buf.data());
  }();
  return name;
}

static std::string compose(const std::string& what, const std::string& path, const std::string& why) {
  std::string m = host_name() + ": " + what;
  if (!path.empty()) m += ": " + path;
  m += ": " + why;
  return m;
}

Error sys_error(int err, const std::string& what, const std::string& path) {
  return Error{std::error_code(err, std::generic_category()), compose(what, path, std::strerror(err))};
}

Error stage_error(Errc e, const std::string& what, const std::string& path) {
  auto code = make_error_code(e);
  return Error{code, compose(what, path, code.message())};
}

}  // namespace stage
