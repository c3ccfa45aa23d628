#include "bcast/io/temp_name.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <span>

#include "bcast/io/crc.h"
#include "bcast/io/error.h"

namespace stage {

namespace {

const char* const kTempMark = ".stage-tmp.";

std::string base_name(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// ".<name>.stage-tmp.<host>.<pid>" must fit NAME_MAX (255) whatever the name: a long name is
// cut and tagged with its CRC, a long host name cut, so the result stays under 190 bytes.
std::string temp_stem(const std::string& base) {
  if (base.size() <= 120) return base;
  char tag[24];
  std::snprintf(tag, sizeof tag, "~%016llx",
                static_cast<unsigned long long>(crc64(std::as_bytes(std::span(base.data(), base.size())))));
  return base.substr(0, 100) + tag;
}

std::string temp_host() {
  return host_name().substr(0, 40);
}

}  // namespace

std::string parent_dir(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string temp_name_for(const std::string& path) {
  return parent_dir(path) + "/." + temp_stem(base_name(path)) + kTempMark + temp_host() + "." +
         std::to_string(::getpid());
}

bool is_temp_name(std::string_view name) {
  return !name.empty() && name[0] == '.' && name.find(kTempMark) != std::string_view::npos;
}

long temp_name_pid(std::string_view name) {
  const std::string mark = kTempMark + temp_host() + ".";
  const size_t at = name.rfind(mark);
  if (name.empty() || name[0] != '.' || at == std::string_view::npos) return 0;
  const std::string digits(name.substr(at + mark.size()));
  char* end = nullptr;
  const long pid = std::strtol(digits.c_str(), &end, 10);
  if (end == digits.c_str() || *end != '\0') return 0;  // "<host>.<pid>" must end the name
  return pid;
}

}  // namespace stage
