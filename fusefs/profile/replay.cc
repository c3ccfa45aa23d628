// The replay of a profile (replay.h).
#include "fusefs/profile/replay.h"

#include <spdlog/spdlog.h>

#include <condition_variable>
#include <mutex>
#include <unordered_set>

namespace stagefs {

struct Replay::State {
  State(Profile p, std::string where, const Config& cfg)
      : profile(std::move(p)),
        path(std::move(where)),
        window(std::max<size_t>(cfg.window, 1)),
        plan(cfg.small_file_size, profile.chunk_size, cfg.transfer_chunk) {}
  const Profile profile;
  const std::string path;
  const size_t window;
  std::mutex m;
  std::condition_variable cv;
  ReplayPlan plan;                // guarded by m
  std::vector<int64_t> item_of;   // per profile file: its item, or -1 (skipped, not reached)
  std::vector<uint64_t> size_of;  // per profile file: its size as the replay found it
  enum class Item : char { asked, ok, failed };
  std::vector<Item> items;  // per plan item
  size_t outstanding = 0;
  int failures_in_a_row = 0;
  uint64_t failed_files = 0;
  bool stopping = false;
  std::string end;  // why the walk ended early: full, failed, stopped ("" not yet / done)
  bool walked = false;
  ReplayStats accounted;  // account()'s figures
};

Replay::Replay(Profile profile, std::string path, Config cfg, Materializer& mat, Probe probe, Want want)
    : mat_(mat), probe_(std::move(probe)), want_(want), profile_chunk_(profile.chunk_size) {
  for (const ProfileFile& f : profile.files)
    if (!f.chunks.empty()) chunks_.emplace(f.path, f.chunks);
  s_ = std::make_shared<State>(std::move(profile), std::move(path), cfg);
  s_->item_of.assign(s_->profile.files.size(), -1);
  s_->size_of.assign(s_->profile.files.size(), 0);
}

Replay::~Replay() {
  stop();
}

void Replay::start() {
  spdlog::info("replaying {} ({} file(s) the last job read): staging them in the background", s_->path,
               s_->profile.files.size());
  thread_ = std::thread([s = s_, &mat = mat_, probe = probe_, want = want_] { run(s, mat, probe, want); });
}

void Replay::stop() {
  {
    std::lock_guard lk(s_->m);
    if (!s_->walked && s_->end.empty()) s_->end = "stopped";
    s_->stopping = true;
  }
  s_->cv.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Replay::run(const std::shared_ptr<State>& s, Materializer& mat, const Probe& probe, Want want) {
  const auto& files = s->profile.files;
  for (size_t i = 0; i < files.size(); ++i) {
    {
      std::unique_lock lk(s->m);
      s->cv.wait(lk, [&] { return s->stopping || !s->end.empty() || s->outstanding < s->window; });
      if (s->stopping || !s->end.empty()) break;
    }
    const FileProbe p = probe(files[i].path);  // no lock: a path walk on the source
    std::optional<size_t> fresh;
    {
      std::lock_guard lk(s->m);
      fresh = s->plan.add(files[i], p);
      if (p.state == FileProbe::State::ok && S_ISREG(p.st.st_mode)) {
        s->item_of[i] = static_cast<int64_t>(s->plan.last_item());
        s->size_of[i] = static_cast<uint64_t>(p.st.st_size);
      }
      if (fresh) {
        s->items.push_back(State::Item::asked);
        ++s->outstanding;
      }
    }
    if (fresh) ask(s, *fresh, mat, want);
  }
  std::unique_lock lk(s->m);
  s->cv.wait(lk, [&] { return s->stopping || s->outstanding == 0; });
  s->walked = true;
  s->cv.notify_all();  // wait_for_end
  const PlanCounts& c = s->plan.counts();
  spdlog::info(
      "replay of {} {}: {} of {} file(s) asked for in {} transfer(s), {} skipped (gone {}, not readable "
      "by its user {}, not regular {}, failed {})",
      s->path, s->end.empty() ? "done" : "ended (" + s->end + ")", c.files, files.size(), s->items.size(),
      c.gone + c.denied + c.other + s->failed_files, c.gone, c.denied, c.other, s->failed_files);
}

void Replay::ask(const std::shared_ptr<State>& s, size_t item, Materializer& mat, Want want) {
  ReplayItem it;
  {
    std::lock_guard lk(s->m);
    it = s->plan.item(item);
  }
  auto done = [s, item](stage::Status st) { answered(*s, item, st); };
  if (it.kind == ReplayItem::Kind::batch)
    mat.materialize_small_async(it.path, /*since=*/0, want, std::move(done));
  else
    mat.materialize_async(it.path, want, std::move(done));
}

void Replay::answered(State& s, size_t item, const stage::Status& st) {
  {
    std::lock_guard lk(s.m);
    --s.outstanding;
    s.items[item] = st.ok() ? State::Item::ok : State::Item::failed;
    if (st.ok()) {
      s.failures_in_a_row = 0;
    } else {
      s.failed_files += s.plan.item(item).files;
      const int err = st.error().to_errno();
      spdlog::debug("replay of {}: {}", s.plan.item(item).path, st.error().message);
      if (err == ENOSPC && s.end.empty()) s.end = "full";
      if (err == ESHUTDOWN && s.end.empty()) s.end = "stopped";
      if (++s.failures_in_a_row >= kMaxFailures && s.end.empty()) s.end = "failed";
    }
  }
  s.cv.notify_all();
}

bool Replay::wait_for_end(std::chrono::milliseconds timeout) const {
  std::unique_lock lk(s_->m);
  return s_->cv.wait_for(lk, timeout, [&] { return s_->walked || !s_->end.empty(); });
}

ReplayStats Replay::stats() const {
  ReplayStats r;
  std::lock_guard lk(s_->m);
  r.note = s_->path;
  r.files = s_->profile.files.size();
  r.state = !s_->end.empty() ? s_->end : s_->walked ? "done" : "running";
  const PlanCounts& c = s_->plan.counts();
  r.files_queued = c.files;
  r.bytes_queued = c.bytes;
  r.files_skipped = c.gone + c.denied + c.other + s_->failed_files;
  for (size_t i = 0; i < s_->items.size(); ++i)
    if (s_->items[i] == State::Item::ok) {
      r.files_done += s_->plan.item(i).files;
      r.bytes_done += s_->plan.item(i).bytes;
    }
  const ReplayStats& a = s_->accounted;
  r.accounted = a.accounted;
  r.files_used = a.files_used;
  r.bytes_used = a.bytes_used;
  r.files_unused = a.files_unused;
  r.bytes_unused = a.bytes_unused;
  return r;
}

std::vector<uint64_t> Replay::first_chunks(const std::string& rel, uint64_t chunk_size) const {
  auto it = chunks_.find(rel);
  if (it == chunks_.end()) return {};
  return convert_chunks(it->second, profile_chunk_, chunk_size);
}

void Replay::account(const Profile& job) {
  std::unordered_set<std::string_view> opened;
  for (const ProfileFile& f : job.files) opened.insert(f.path);
  std::lock_guard lk(s_->m);
  ReplayStats& a = s_->accounted;
  a = ReplayStats{};
  a.accounted = true;
  const auto& files = s_->profile.files;
  for (size_t i = 0; i < files.size(); ++i) {
    const int64_t item = s_->item_of[i];
    if (item < 0 || s_->items[static_cast<size_t>(item)] != State::Item::ok) continue;
    const uint64_t bytes = s_->size_of[i];
    if (opened.contains(files[i].path)) {
      ++a.files_used;
      a.bytes_used += bytes;
    } else {
      ++a.files_unused;
      a.bytes_unused += bytes;
    }
  }
}

}  // namespace stagefs
