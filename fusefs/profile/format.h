// A job's profile: what a mount's job read (which files, in the order of their first access,
// and which chunks of a large file its readers read first while the file was being copied),
// so that the next mount of the same source can stage it before the job asks (replay.h).
//
// The file format (version 1; docs/profile-format.md is its reference) is small for a
// million files: the directories once, sorted and front-coded, each file as its directory's
// index and its name, integers as varints, first-access times as increments. A header with a
// magic, the version and the body's length, and a CRC-64 of everything before it at the end:
// a truncated, cut or edited file is refused whole, never half read.
//
// decode_profile() treats its input as hostile (another user may have written it, or edited
// it by hand): every length is bounded by what is left, every count by kMaxProfileFiles and
// kMaxProfileChunks, every path must stay beneath the source (relative, no "." or ".." or empty
// component, no NUL, a plain name per file), no path twice. What it accepts is still only a
// list of names: the replay checks each one against the source, as the profile's user, before
// anything is staged. Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "bcast/io/error.h"

namespace stagefs {

inline constexpr uint8_t kProfileVersion = 1;
// The most files a profile holds (the recorder stops there and says so), chunks recorded of
// one file, and bytes of a profile file (a larger one is refused before it is read).
inline constexpr size_t kMaxProfileFiles = 1'000'000;
inline constexpr size_t kMaxProfileChunks = 4096;
inline constexpr uint64_t kMaxProfileBytes = uint64_t{64} << 20;

struct ProfileFile {
  std::string path;   // relative to the source directory
  uint64_t first_ms;  // first access: milliseconds since the mount was ready
  // The chunks (of Profile::chunk_size bytes) its readers read first while the file was
  // being copied, in that order; empty: no order known (read whole, or through passthrough).
  std::vector<uint32_t> chunks;
  bool operator==(const ProfileFile&) const = default;
};

struct Profile {
  uint64_t chunk_size = 0;         // of every file's chunks
  uint32_t uid = 0;                // the user whose mount recorded it (informational)
  int64_t created = 0;             // seconds since the epoch (informational)
  std::string source;              // the source directory it was recorded from (informational)
  bool truncated = false;          // the job read more than kMaxProfileFiles files
  std::vector<ProfileFile> files;  // by first access
  bool operator==(const Profile&) const = default;
};

std::string encode_profile(const Profile& p);
stage::Result<Profile> decode_profile(std::span<const std::byte> bytes);

// Chunks recorded in chunks of `from` bytes, as chunks of `to` bytes, in the same order, each
// once (at most kMaxProfileChunks). from or to 0: none.
std::vector<uint64_t> convert_chunks(const std::vector<uint32_t>& chunks, uint64_t from, uint64_t to);

}  // namespace stagefs
