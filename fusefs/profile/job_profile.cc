// A mount's profile from start to end (job_profile.h).
#include "fusefs/profile/job_profile.h"

#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ctime>

#include "fusefs/base/beneath.h"
#include "fusefs/profile/exchange.h"
#include "fusefs/profile/file.h"

namespace stagefs {

namespace {

// Whose access the replay has: the daemon's own user (it cannot take another's), or, for a
// root daemon, the profile's owner with the groups the system gives that user.
Caller replay_caller(uid_t owner) {
  if (::geteuid() != 0) {
    Caller c{::geteuid(), ::getegid(), {}};
    std::vector<gid_t> groups(static_cast<size_t>(std::max(::getgroups(0, nullptr), 0)));
    const int n = ::getgroups(static_cast<int>(groups.size()), groups.data());
    for (int i = 0; i < n; ++i) c.groups.push_back(groups[static_cast<size_t>(i)]);
    return c;
  }
  if (owner == 0) return Caller{};
  std::vector<char> buf(16384);
  passwd pw{};
  passwd* found = nullptr;
  // No passwd entry: the uid alone, with no group but the nobody group (no group access).
  if (::getpwuid_r(owner, &pw, buf.data(), buf.size(), &found) != 0 || found == nullptr)
    return Caller{owner, 65534, {}};
  Caller c{owner, found->pw_gid, {}};
  int n = 64;
  std::vector<gid_t> groups(static_cast<size_t>(n));
  if (::getgrouplist(found->pw_name, found->pw_gid, groups.data(), &n) < 0) {
    groups.resize(static_cast<size_t>(n));
    ::getgrouplist(found->pw_name, found->pw_gid, groups.data(), &n);
  }
  for (int i = 0; i < n && i < static_cast<int>(groups.size()); ++i)
    c.groups.push_back(groups[static_cast<size_t>(i)]);
  return c;
}

}  // namespace

JobProfile::JobProfile(Config cfg) : cfg_(std::move(cfg)) {
  off_.state = cfg_.path.empty() || !cfg_.replay ? "off" : "none";
  off_.note = cfg_.path;
  if (!cfg_.path.empty())
    recorder_ = std::make_unique<AccessRecorder>(cfg_.chunk_size, AccessRecorder::Clock::now());
}

JobProfile::~JobProfile() {
  if (replay_) replay_->stop();
}

void JobProfile::attach(GroupConfig& g) {
  // Not owned by the group: the daemon's JobProfile outlives it.
  if (recorder_) g.read_orders = std::shared_ptr<ReadOrders>(std::shared_ptr<void>(), this);
}

void JobProfile::live_reads(const std::string& rel, const LiveCopy::ReadOrder& order) {
  recorder_->live_reads(rel, order.chunk_size, order.chunks);
}

// Called on the service thread, which also starts the replay: no race on replay_.
std::vector<uint64_t> JobProfile::first_chunks(const std::string& rel, uint64_t chunk_size) {
  return replay_ ? replay_->first_chunks(rel, chunk_size) : std::vector<uint64_t>{};
}

void JobProfile::core_ready(StageFsCore& core) {
  if (recorder_) core.set_open_observer([this](const std::string& rel) { recorder_->opened(rel); });
}

FileProbe JobProfile::probe(const std::string& rel, const Caller& who) const {
  FileProbe p;
  if (has_temp_component(rel)) {  // never cached (beneath.h)
    p.state = FileProbe::State::other;
    return p;
  }
  auto fd = open_beneath(source_root_, rel, O_PATH);
  if (!fd) {
    const int err = fd.error().to_errno();
    p.state = err == ENOENT || err == ENOTDIR ? FileProbe::State::gone : FileProbe::State::other;
    return p;
  }
  if (::fstat(fd->get(), &p.st) != 0) return p;
  p.state = core_->may_read(rel, who) ? FileProbe::State::ok : FileProbe::State::denied;
  return p;
}

void JobProfile::start_replay(Materializer& mat, StageFsCore& core, int source_root) {
  std::lock_guard lk(m_);
  coordinator_ = true;
  core_ = &core;
  source_root_ = source_root;
  if (cfg_.path.empty() || !cfg_.replay) return;
  // A daemon that is not root accepts only its own user's profile; root any user's, and then
  // has that user's access.
  const std::optional<uid_t> owner = ::geteuid() != 0 ? std::optional<uid_t>(::geteuid()) : std::nullopt;
  auto loaded = read_profile(cfg_.path, owner);
  if (!loaded) {
    if (loaded.error().to_errno() == ENOENT) {
      spdlog::info("no profile at {} yet: this job's reads make one at its end", cfg_.path);
      return;
    }
    off_.state = "refused";
    off_.note = loaded.error().message;
    spdlog::warn("not replaying: {}", loaded.error().message);
    return;
  }
  if (loaded->profile.source != cfg_.source_dir)
    spdlog::info("{} was recorded from {}: its paths are taken relative to {}", cfg_.path,
                 loaded->profile.source, cfg_.source_dir);
  const Caller who = replay_caller(loaded->owner);
  Replay::Probe probe = [this, who](const std::string& rel) { return this->probe(rel, who); };
  replay_ =
      std::make_unique<Replay>(std::move(loaded->profile), cfg_.path,
                               Replay::Config{cfg_.small_file_size, cfg_.chunk_size, Replay::kWindow}, mat,
                               std::move(probe), Want{who.uid, /*background=*/true, /*may_evict=*/false});
  replay_->start();
}

bool JobProfile::finish(stage::Comm& data, bool group_broken, std::chrono::milliseconds budget) {
  {
    std::lock_guard lk(m_);
    if (replay_) replay_->stop();
  }
  if (!recorder_) return true;
  Profile mine = recorder_->snapshot();
  mine.uid = static_cast<uint32_t>(::geteuid());
  mine.created = static_cast<int64_t>(std::time(nullptr));
  mine.source = cfg_.source_dir;
  GatherResult g;
  if (group_broken || data.size() < 2)
    g.merged = std::move(mine);  // a broken group: no collective may follow; rank 0 writes its own
  else
    g = gather_profiles(data.point_to_point(), std::move(mine), budget);
  if (data.rank() != 0) return g.clean;
  {
    std::lock_guard lk(m_);
    if (replay_) replay_->account(g.merged);
  }
  if (g.missing > 0)
    spdlog::warn(
        "profile: {} node(s) (with the nodes below them) did not send their record in time: left out",
        g.missing);
  if (g.merged.files.empty()) {
    spdlog::info("the job opened no file: {} left as it was", cfg_.path);
    return g.clean;
  }
  if (auto st = write_profile(cfg_.path, g.merged); !st)
    spdlog::warn("profile not written: {} (the next job starts cold; --profile PATH names a "
                 "writable place, --profile off stops recording)",
                 st.error().message);
  else
    spdlog::info("wrote the job's profile {}: {} file(s){}", cfg_.path, g.merged.files.size(),
                 g.merged.truncated ? " (the first the job read: more than a profile holds)" : "");
  return g.clean;
}

std::optional<ReplayStats> JobProfile::stats() const {
  std::lock_guard lk(m_);
  if (!coordinator_) return std::nullopt;
  if (replay_) return replay_->stats();
  return off_;
}

}  // namespace stagefs
