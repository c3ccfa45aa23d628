// The replay's plan (plan.h).
#include "fusefs/profile/plan.h"

#include <string_view>

#include "fusefs/base/batch_rules.h"

namespace stagefs {

ReplayPlan::ReplayPlan(uint64_t small_file_size, uint64_t profile_chunk, uint64_t transfer_chunk)
    : small_(small_file_size), profile_chunk_(profile_chunk), transfer_chunk_(transfer_chunk) {}

std::optional<size_t> ReplayPlan::add(const ProfileFile& f, const FileProbe& probe) {
  switch (probe.state) {
    case FileProbe::State::gone:
      ++counts_.gone;
      return std::nullopt;
    case FileProbe::State::denied:
      ++counts_.denied;
      return std::nullopt;
    case FileProbe::State::other:
      ++counts_.other;
      return std::nullopt;
    case FileProbe::State::ok:
      break;
  }
  if (!S_ISREG(probe.st.st_mode)) {
    ++counts_.other;
    return std::nullopt;
  }
  const auto bytes = static_cast<uint64_t>(probe.st.st_size);
  ++counts_.files;
  counts_.bytes += bytes;
  const std::string_view name = std::string_view(f.path).substr(f.path.rfind('/') + 1);
  std::optional<size_t> fresh;
  if (batch_eligible(probe.st, name, small_)) {
    const size_t slash = f.path.rfind('/');
    auto [it, is_new] = batch_of_dir_.try_emplace(
        slash == std::string::npos ? std::string() : f.path.substr(0, slash), items_.size());
    if (is_new) {
      items_.push_back(ReplayItem{ReplayItem::Kind::batch, f.path, {}, 0, 0});
      fresh = it->second;
    }
    last_ = it->second;
  } else {
    items_.push_back(ReplayItem{ReplayItem::Kind::file, f.path,
                                convert_chunks(f.chunks, profile_chunk_, transfer_chunk_), 0, 0});
    last_ = items_.size() - 1;
    fresh = last_;
  }
  ++items_[last_].files;
  items_[last_].bytes += bytes;
  return fresh;
}

}  // namespace stagefs
