// The profile's file: its default path, the atomic write, the distrustful read (file.h).
#include "fusefs/profile/file.h"

#include <fcntl.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <span>
#include <vector>

#include "bcast/io/crc.h"
#include "bcast/io/fd.h"

namespace stagefs {

namespace {

std::string home_dir() {
  if (const char* h = std::getenv("HOME"); h != nullptr && h[0] == '/') return h;
  std::vector<char> buf(16384);
  passwd pw{};
  passwd* found = nullptr;
  if (::getpwuid_r(::geteuid(), &pw, buf.data(), buf.size(), &found) == 0 && found != nullptr &&
      found->pw_dir != nullptr && found->pw_dir[0] == '/')
    return found->pw_dir;
  return {};
}

// The source's last component, kept to what reads well in a file name.
std::string readable_name(const std::string& source_dir) {
  std::string base = source_dir.substr(source_dir.find_last_of('/') + 1);
  std::string out;
  for (char c : base.substr(0, 64))
    out.push_back(
        (std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '.' || c == '-' || c == '_') ? c : '_');
  if (out.empty() || out[0] == '.') out.insert(out.begin(), 'p');
  return out;
}

// mkdir -p of dir's missing components, mode 0700.
stage::Status make_dirs(const std::string& dir) {
  for (size_t pos = 1; pos <= dir.size(); ++pos) {
    if (pos != dir.size() && dir[pos] != '/') continue;
    const std::string part = dir.substr(0, pos);
    if (::mkdir(part.c_str(), 0700) != 0 && errno != EEXIST) return stage::sys_error(errno, "create", part);
  }
  return {};
}

stage::Status write_all(int fd, const std::string& data, const std::string& path) {
  for (size_t done = 0; done < data.size();) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return stage::sys_error(errno, "write", path);
    done += static_cast<size_t>(n);
  }
  return {};
}

}  // namespace

std::string default_profile_path(const std::string& source_dir) {
  std::string base;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && x[0] == '/') {
    base = x;
  } else {
    const std::string home = home_dir();
    if (home.empty()) return {};
    base = home + "/.cache";
  }
  char hash[17];
  std::snprintf(hash, sizeof hash, "%016llx",
                static_cast<unsigned long long>(
                    stage::crc64(std::as_bytes(std::span(source_dir.data(), source_dir.size())))));
  return base + "/stagefs/profiles/" + readable_name(source_dir) + "-" + hash + ".profile";
}

stage::Status write_profile(const std::string& path, const Profile& p) {
  const size_t slash = path.rfind('/');
  const std::string dir =
      slash == std::string::npos || slash == 0 ? (slash == 0 ? "/" : ".") : path.substr(0, slash);
  if (auto st = make_dirs(dir); !st) return st;
  const std::string data = encode_profile(p);
  std::random_device rd;
  char tag[32];
  std::snprintf(tag, sizeof tag, ".%08x", static_cast<unsigned>(rd()));
  const std::string tmp = path + tag + ".tmp." + stage::host_name() + "." + std::to_string(::getpid());
  stage::Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd.valid()) return stage::sys_error(errno, "create", tmp);
  stage::Status st = write_all(fd.get(), data, tmp);
  if (st && ::fsync(fd.get()) != 0) st = stage::sys_error(errno, "fsync", tmp);
  if (st && ::rename(tmp.c_str(), path.c_str()) != 0) st = stage::sys_error(errno, "rename to", path);
  if (!st) {
    ::unlink(tmp.c_str());
    return st;
  }
  stage::Fd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (d.valid()) ::fsync(d.get());  // the rename durable too (a failure here loses no data)
  return {};
}

stage::Result<LoadedProfile> read_profile(const std::string& path, std::optional<uid_t> owner) {
  stage::Fd fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
  if (!fd.valid()) return stage::sys_error(errno == ELOOP ? EPERM : errno, "open profile", path);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return stage::sys_error(errno, "stat profile", path);
  if (!S_ISREG(st.st_mode)) return stage::sys_error(EPERM, "profile: not a regular file", path);
  if (owner && st.st_uid != *owner)
    return stage::sys_error(EPERM,
                            "profile: owned by uid " + std::to_string(st.st_uid) +
                                ", not by this daemon's user (" + std::to_string(*owner) + ")",
                            path);
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0)
    return stage::sys_error(EPERM, "profile: other users may write it", path);
  if (static_cast<uint64_t>(st.st_size) > kMaxProfileBytes)
    return stage::sys_error(EFBIG, "profile: larger than " + std::to_string(kMaxProfileBytes >> 20) + " MiB",
                            path);
  std::string data(static_cast<size_t>(st.st_size), '\0');
  const ssize_t n = stage::pread_full(fd.get(), data.data(), data.size(), 0);
  if (n < 0) return stage::sys_error(static_cast<int>(-n), "read profile", path);
  data.resize(static_cast<size_t>(n));
  auto p = decode_profile(std::as_bytes(std::span(data.data(), data.size())));
  if (!p) return stage::Error{p.error().code, p.error().message + " (" + path + ")"};
  return LoadedProfile{std::move(p.value()), st.st_uid};
}

std::vector<std::string> profile_paths_under(const Profile& p, const std::string& source) {
  std::string prefix;  // source, relative to the profile's source directory
  if (source != p.source && !p.source.empty() && source.size() > p.source.size() &&
      source.compare(0, p.source.size(), p.source) == 0 &&
      (p.source.back() == '/' || source[p.source.size()] == '/'))
    prefix = source.substr(p.source.size() + (p.source.back() == '/' ? 0 : 1)) + "/";
  std::vector<std::string> out;
  for (const ProfileFile& f : p.files)
    if (prefix.empty())
      out.push_back(f.path);
    else if (f.path.size() > prefix.size() && f.path.compare(0, prefix.size(), prefix) == 0)
      out.push_back(f.path.substr(prefix.size()));
  return out;
}

}  // namespace stagefs
