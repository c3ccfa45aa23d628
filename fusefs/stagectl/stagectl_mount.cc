#include "fusefs/stagectl/stagectl_mount.h"

#include <sys/stat.h>
#include <sys/xattr.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>

#include "bcast/text/text.h"

namespace stagefs::ctl {

std::string shown(const std::string& name) {
  return stage::escape_controls(name);
}

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string absolute_path(const std::string& p) {
  std::error_code ec;
  fs::path a = fs::absolute(p, ec);
  if (ec) a = p;
  a = a.lexically_normal();
  if (a.has_relative_path() && !a.has_filename()) a = a.parent_path();  // "/stage/" -> "/stage"
  return a.string();
}

// The status attribute answers: mnt is the root of a running stagefs mount.
bool is_stagefs_root(const std::string& mnt) {
  std::string v;
  return get_attr(mnt, "user.stagefs.status", v) == 0;
}

// The older form's relative PATH: from the current directory if that exists inside the
// mount, else from MOUNTPOINT; empty (message printed) when both exist and differ.
std::string old_form_path(const std::string& mnt, const std::string& arg) {
  const std::string here = absolute_path(arg);
  const std::string there = absolute_path((fs::path(mnt) / arg).string());
  struct stat m {
  }, h{}, t{};
  const bool in_mount =
      ::stat(mnt.c_str(), &m) == 0 && ::lstat(here.c_str(), &h) == 0 && h.st_dev == m.st_dev;
  const bool under_mnt = ::lstat(there.c_str(), &t) == 0;
  if (in_mount && under_mnt && (h.st_dev != t.st_dev || h.st_ino != t.st_ino)) {
    std::fprintf(stderr,
                 "stagectl: %s is ambiguous: %s (from the current directory) or %s (under %s); write "
                 "./%s or the whole path\n",
                 shown(arg).c_str(), shown(here).c_str(), shown(there).c_str(), shown(mnt).c_str(),
                 shown(arg).c_str());
    return {};
  }
  return in_mount || !under_mnt ? here : there;
}

}  // namespace

int get_attr(const std::string& path, const char* name, std::string& out) {
  std::vector<char> buf(1 << 16);
  for (;;) {
    const ssize_t n = ::getxattr(path.c_str(), name, buf.data(), buf.size());
    if (n >= 0) {
      out.assign(buf.data(), static_cast<size_t>(n));
      return 0;
    }
    if (errno == ERANGE && buf.size() < (1U << 24)) {
      buf.resize(buf.size() * 4);
      continue;
    }
    return errno;
  }
}

std::string dump(const json& j) {
  return j.dump(2, ' ', true, json::error_handler_t::replace);
}

int read_status(const std::string& mnt, json& out) {
  std::string text;
  if (const int err = get_attr(mnt, "user.stagefs.status", text); err != 0) {
    std::fprintf(stderr, "stagectl: %s: not a running stagefs mount (%s)\n", shown(mnt).c_str(),
                 err == ENODATA || err == ENOTSUP ? "no stagefs status attribute" : std::strerror(err));
    return 1;
  }
  out = json::parse(text, nullptr, false);
  if (out.is_discarded()) {
    std::fprintf(stderr, "stagectl: %s: unreadable status\n", shown(mnt).c_str());
    return 1;
  }
  return 0;
}

std::optional<std::string> mount_root(const std::string& path, std::string* why) {
  fs::path p = absolute_path(path);
  struct stat st {};
  // The path (followed, as df does), or the nearest ancestor that exists.
  while (::stat(p.c_str(), &st) != 0) {
    if ((errno != ENOENT && errno != ENOTDIR) || p == p.root_path()) {
      *why = p.string() + ": " + std::strerror(errno);
      return std::nullopt;
    }
    p = p.parent_path();
  }
  fs::path root = p;
  while (root != root.root_path()) {
    const fs::path up = root.parent_path();
    struct stat ust {};
    if (::stat(up.c_str(), &ust) != 0) {
      *why = up.string() + ": " + std::strerror(errno);
      return std::nullopt;
    }
    if (ust.st_dev != st.st_dev) break;
    root = up;
  }
  return root.string();
}

Targets resolve_targets(const std::vector<std::string>& args) {
  Targets out;
  for (const auto& a : args) {
    if (a.empty()) {
      std::fprintf(stderr, "stagectl: an empty path\nTry 'stagectl --help'.\n");
      out.status = 2;
      return out;
    }
  }
  size_t first = 0;
  std::string old_mnt;  // the older form's MOUNTPOINT
  if (args.size() >= 2 && is_stagefs_root(args[0])) {
    old_mnt = args[0];
    first = 1;
  }
  std::map<std::string, bool> checked;  // mount -> a running stagefs
  for (size_t i = first; i < args.size(); ++i) {
    const std::string& a = args[i];
    const std::string path = !old_mnt.empty() && a[0] != '/' ? old_form_path(old_mnt, a) : absolute_path(a);
    if (path.empty()) {
      out.status = 2;
      return out;
    }
    std::string why;
    const auto mnt = mount_root(path, &why);
    if (!mnt) {
      std::fprintf(stderr, "stagectl: %s: %s\n", shown(a).c_str(), shown(why).c_str());
      out.status = 1;
      return out;
    }
    auto [it, fresh] = checked.emplace(*mnt, false);
    if (fresh) it->second = is_stagefs_root(*mnt);
    if (!it->second) {
      std::fprintf(stderr, "stagectl: %s: not in a running stagefs mount (%s is the mount it lies in)\n",
                   shown(a).c_str(), shown(*mnt).c_str());
      out.status = 1;
      return out;
    }
    out.targets.push_back({*mnt, path});
  }
  return out;
}

}  // namespace stagefs::ctl
