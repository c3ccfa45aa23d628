#include "bcast/io/paths.h"

#include <pwd.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <vector>

namespace stage {

namespace fs = std::filesystem;

std::string resolve_path(const std::string& p) {
  std::error_code ec;
  const fs::path abs = fs::absolute(p, ec);
  if (ec) return fs::path(p).lexically_normal().string();
  const fs::path r = fs::weakly_canonical(abs, ec);
  std::string out = (ec ? abs.lexically_normal() : r).string();
  while (out.size() > 1 && out.back() == '/') out.pop_back();  // "/a/b/" (a missing "b") -> "/a/b"
  return out;
}

bool path_within(const std::string& child, const std::string& parent) {
  if (parent.empty()) return false;
  if (child == parent) return true;
  if (parent == "/") return !child.empty() && child[0] == '/';
  return child.size() > parent.size() && child.compare(0, parent.size(), parent) == 0 &&
         child[parent.size()] == '/';
}

const char* pseudo_fs_name(long f_type) {
  // From linux/magic.h (and the kernel sources for those it lacks: configfs, fusectl, mqueue).
  struct Known {
    unsigned long magic;
    const char* name;
  };
  static constexpr Known kPseudo[] = {
      {0x9fa0, "proc"},        {0x62656572, "sysfs"},      {0x64626720, "debugfs"},
      {0x74726163, "tracefs"}, {0x73636673, "securityfs"}, {0x27e0eb, "cgroup"},
      {0x63677270, "cgroup2"}, {0x62656570, "configfs"},   {0xde5e81e4, "efivarfs"},
      {0xcafe4a11, "bpf"},     {0x6165676c, "pstore"},     {0xf97cff8c, "selinuxfs"},
      {0x43415d53, "smackfs"}, {0x5a3c69f0, "apparmorfs"}, {0x42494e4d, "binfmt_misc"},
      {0x65735543, "fusectl"}, {0x1cd1, "devpts"},         {0x6e736673, "nsfs"},
      {0x7655821, "resctrl"},  {0x19800202, "mqueue"},     {0x9fa1, "openpromfs"},
      {0xabba1974, "xenfs"},   {0x9fa2, "usbdevfs"},
  };
  // f_type is a signed long on 64-bit Linux; compare its low 32 bits (magics are 32-bit).
  const auto t = static_cast<unsigned long>(f_type) & 0xffffffffUL;
  for (const Known& k : kPseudo)
    if (k.magic == t) return k.name;
  return nullptr;
}

const char* pseudo_fs_of(const std::string& path) {
  struct statfs sf {};
  if (::statfs(path.c_str(), &sf) != 0) return nullptr;
  return pseudo_fs_name(static_cast<long>(sf.f_type));
}

const char* special_file_kind(mode_t mode) {
  if (S_ISCHR(mode)) return "character device";
  if (S_ISBLK(mode)) return "block device";
  if (S_ISFIFO(mode)) return "FIFO";
  if (S_ISSOCK(mode)) return "socket";
  return nullptr;
}

std::string user_name(uid_t uid) {
  const long hint = ::sysconf(_SC_GETPW_R_SIZE_MAX);
  std::vector<char> buf(hint > 0 ? static_cast<size_t>(hint) : 4096);
  struct passwd pw {};
  struct passwd* found = nullptr;
  while (::getpwuid_r(uid, &pw, buf.data(), buf.size(), &found) == ERANGE && buf.size() < (1U << 20))
    buf.resize(buf.size() * 2);
  return found != nullptr && found->pw_name != nullptr ? found->pw_name : "";
}

std::string owner_text(uid_t uid) {
  const std::string name = user_name(uid);
  return "uid " + std::to_string(uid) + (name.empty() ? "" : " (" + name + ")");
}

}  // namespace stage
