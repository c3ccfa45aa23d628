// The access recorder and the merge of the nodes' profiles (recorder.h).
#include "fusefs/profile/recorder.h"

#include <algorithm>
#include <unordered_set>

namespace stagefs {

AccessRecorder::AccessRecorder(uint64_t chunk_size, Clock::time_point start, size_t max_files)
    : chunk_size_(chunk_size), start_(start), max_files_(max_files) {}

ProfileFile* AccessRecorder::note_locked(const std::string& rel) {
  if (auto it = index_.find(rel); it != index_.end()) return &files_[it->second];
  if (files_.size() >= max_files_) {
    truncated_ = true;
    return nullptr;
  }
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start_).count();
  index_.emplace(rel, files_.size());
  files_.push_back(ProfileFile{rel, static_cast<uint64_t>(std::max<int64_t>(ms, 0)), {}});
  return &files_.back();
}

void AccessRecorder::opened(const std::string& rel) {
  std::lock_guard lk(m_);
  note_locked(rel);
}

void AccessRecorder::live_reads(const std::string& rel, uint64_t chunk_size,
                                const std::vector<uint64_t>& chunks) {
  std::vector<uint32_t> in;
  for (uint64_t c : chunks)
    if (c <= UINT32_MAX) in.push_back(static_cast<uint32_t>(c));
  std::vector<uint64_t> mine = convert_chunks(in, chunk_size, chunk_size_);
  std::lock_guard lk(m_);
  ProfileFile* f = note_locked(rel);
  if (f == nullptr) return;
  std::unordered_set<uint32_t> have(f->chunks.begin(), f->chunks.end());
  for (uint64_t c : mine)
    if (c <= UINT32_MAX && f->chunks.size() < kMaxProfileChunks &&
        have.insert(static_cast<uint32_t>(c)).second)
      f->chunks.push_back(static_cast<uint32_t>(c));
}

bool AccessRecorder::contains(const std::string& rel) const {
  std::lock_guard lk(m_);
  return index_.contains(rel);
}

size_t AccessRecorder::files() const {
  std::lock_guard lk(m_);
  return files_.size();
}

Profile AccessRecorder::snapshot() const {
  Profile p;
  p.chunk_size = chunk_size_;
  std::lock_guard lk(m_);
  p.truncated = truncated_;
  p.files = files_;
  // Opens run on many threads: a later entry may carry an earlier time by a millisecond.
  std::stable_sort(p.files.begin(), p.files.end(),
                   [](const ProfileFile& a, const ProfileFile& b) { return a.first_ms < b.first_ms; });
  return p;
}

Profile merge_profiles(std::vector<Profile> profiles) {
  if (profiles.empty()) return {};
  Profile out;
  out.chunk_size = profiles[0].chunk_size;
  out.uid = profiles[0].uid;
  out.created = profiles[0].created;
  out.source = profiles[0].source;
  size_t total = 0;
  for (const Profile& p : profiles) total += p.files.size();
  // Each path once, in order of appearance (reserved: the index's views into the paths stay
  // valid), then ordered by first access, ties by appearance (a stable sort).
  std::vector<ProfileFile> all;
  all.reserve(total);
  std::unordered_map<std::string_view, size_t> at;
  at.reserve(total);
  for (Profile& p : profiles) {
    out.truncated = out.truncated || p.truncated;
    for (ProfileFile& f : p.files) {
      if (p.chunk_size != out.chunk_size && !f.chunks.empty()) {
        std::vector<uint32_t> c;
        for (uint64_t k : convert_chunks(f.chunks, p.chunk_size, out.chunk_size))
          if (k <= UINT32_MAX) c.push_back(static_cast<uint32_t>(k));
        f.chunks = std::move(c);
      }
      auto it = at.find(f.path);
      if (it == at.end()) {
        all.push_back(std::move(f));
        at.emplace(all.back().path, all.size() - 1);
        continue;
      }
      ProfileFile& m = all[it->second];
      std::vector<uint32_t> later = std::move(f.chunks);
      if (f.first_ms < m.first_ms) {
        m.first_ms = f.first_ms;
        std::swap(m.chunks, later);
      }
      if (later.empty()) continue;
      std::unordered_set<uint32_t> have(m.chunks.begin(), m.chunks.end());
      for (uint32_t c : later)
        if (m.chunks.size() < kMaxProfileChunks && have.insert(c).second) m.chunks.push_back(c);
    }
  }
  at.clear();
  std::stable_sort(all.begin(), all.end(),
                   [](const ProfileFile& a, const ProfileFile& b) { return a.first_ms < b.first_ms; });
  if (all.size() > kMaxProfileFiles) {
    all.resize(kMaxProfileFiles);
    out.truncated = true;
  }
  out.files = std::move(all);
  return out;
}

}  // namespace stagefs
