// The mount's core without FUSE or MPI: StageFsCore over a GroupService of one rank
// (SelfComm + LocalControlPlane), and the group's stall handling with a comm that hangs.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <condition_variable>
#include <filesystem>
#include <functional>
#include <future>
#include <thread>

#include "bcast/comm/comm.h"
#include "bcast/io/store.h"
#include "fusefs/base/beneath.h"
#include "fusefs/cache/cache.h"
#include "fusefs/cache/copy_xattrs.h"
#include "fusefs/core/core.h"
#include "fusefs/core/stagectl_channel.h"
#include "fusefs/group/group.h"
#include "group_hooks.h"
#include "source_cache.h"
#include "tmpdir.h"

namespace stagefs {
namespace {

using stage::testing::TmpDirTest;
namespace fs = std::filesystem;

// A one-rank comm whose broadcasts of data block until released: a stalled collective.
class HangingComm final : public stage::Comm {
 public:
  [[nodiscard]] int rank() const override { return 0; }
  [[nodiscard]] int size() const override { return 1; }
  stage::Status bcast(std::span<std::byte> buf, int /*root*/) override {
    if (buf.size() > 64) {  // chunk payloads, not headers or manifests
      std::unique_lock lk(m_);
      cv_.wait(lk, [&] { return released_; });
    }
    return {};
  }
  stage::Status allreduce_max(std::span<int64_t>) override { return {}; }
  stage::Status allreduce_sum(std::span<int64_t>) override { return {}; }
  stage::Result<std::vector<std::string>> gather(const std::string& s, int) override {
    return std::vector{s};
  }
  stage::Status barrier() override { return {}; }
  void release() {
    std::lock_guard lk(m_);
    released_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  bool released_ = false;
};

class GroupTest : public testing::SourceCacheTest {
 protected:
  void SetUp() override {
    TmpDirTest::SetUp();
    fs::create_directories(path("src/dir"));
    open_source_and_cache();
  }
  GroupConfig config(std::chrono::milliseconds stall = std::chrono::seconds(30)) {
    GroupConfig g;
    g.source_dir = path("src");
    g.cache_dir = cache_->store_root();
    g.bcast.chunk_size = 65536;
    g.stall_timeout = stall;
    g.idle_poll = std::chrono::milliseconds(5);
    return g;
  }
  std::unique_ptr<StageFsCore> core(StallPolicy on_stall, Materializer& mat) {
    auto c = StageFsCore::create(CoreConfig{path("src"), on_stall}, *cache_, mat);
    EXPECT_TRUE(c);
    return c ? std::move(c.value()) : nullptr;
  }
  // A group of one rank whose service thread runs while it lives (also when a test fails);
  // a core made over it must be declared after it (destroyed first).
  struct Mount {
    Mount(GroupTest& t, const GroupConfig& cfg) : group(comm, ctl, *t.source_, t.store_, cfg) {
      service = std::thread([this] { EXPECT_TRUE(group.run().ok()); });
    }
    ~Mount() {
      group.request_shutdown();
      service.join();
    }
    Mount(const Mount&) = delete;
    Mount& operator=(const Mount&) = delete;
    stage::SelfComm comm;
    LocalControlPlane ctl;
    GroupService group;
    std::thread service;
  };
  stage::PosixStore store_{stage::StoreOptions{.xattrs = stagefs::kCopyXattrs}};
};

TEST_F(GroupTest, OpenMaterializesOnceThenHitsTheCache) {
  const std::string data = random_bytes(300000, 1);
  write_file(path("src/dir/img.sqsh"), data);
  stage::SelfComm comm;
  LocalControlPlane ctl;
  GroupService group(comm, ctl, *source_, store_, config());
  std::thread service([&] { EXPECT_TRUE(group.run().ok()); });
  {
    auto core = std::optional(this->core(StallPolicy::eio, group));
    ASSERT_TRUE(*core);
    auto dir = (*core)->lookup(StageFsCore::kRootId, "dir");
    ASSERT_TRUE(dir);
    auto img = (*core)->lookup(dir->first, "img.sqsh");
    ASSERT_TRUE(img);
    EXPECT_EQ(img->second.st_size, static_cast<off_t>(data.size()));
    // Many threads open the same new file at once: one transfer.
    std::vector<std::thread> openers;
    std::atomic<int> ok{0};
    for (int i = 0; i < 8; ++i)
      openers.emplace_back([&] {
        if (auto f = (*core)->open(img->first, O_RDONLY); f) ++ok;
      });
    for (auto& t : openers) t.join();
    EXPECT_EQ(ok.load(), 8);
    EXPECT_EQ(group.stats().transfers, 1U);
    EXPECT_EQ(read_file(path("cache/data/dir/img.sqsh")), data);
    auto again = (*core)->open(img->first, O_RDONLY);
    ASSERT_TRUE(again);
    EXPECT_TRUE(again->cache_hit);
    EXPECT_EQ(group.stats().transfers, 1U);
    // The source changes: the old id is outdated (ESTALE: the kernel looks the name up again),
    // the new lookup names the new version, and its open materializes again.
    write_file(path("src/dir/img.sqsh"), random_bytes(1000, 2));
    auto old = (*core)->open(img->first, O_RDONLY);
    ASSERT_FALSE(old);
    EXPECT_EQ(old.error().to_errno(), ESTALE);
    auto img2 = (*core)->lookup(dir->first, "img.sqsh");
    ASSERT_TRUE(img2);
    EXPECT_NE(img2->first, img->first);
    EXPECT_EQ(img2->second.st_size, 1000);
    auto fresh = (*core)->open(img2->first, O_RDONLY);
    ASSERT_TRUE(fresh);
    EXPECT_FALSE(fresh->cache_hit);
    EXPECT_EQ(read_file(path("cache/data/dir/img.sqsh")).size(), 1000U);
    EXPECT_EQ(group.stats().transfers, 2U);
  }
  group.request_shutdown();
  service.join();
  EXPECT_EQ(group.state(), GroupState::shut_down);
}

// A file with two names whose copy an earlier mount left under one name: the next mount
// serves that copy (read back for its CRC once) and then the other name from it, with no
// transfer at all (in a job where other nodes lack it, that name would otherwise be copied
// from the source).
TEST_F(GroupTest, TheOtherNameOfAFileWhoseCopyAnEarlierMountLeftCostsNoTransfer) {
  const std::string data = random_bytes(300000, 3);
  write_file(path("src/dir/big"), data);
  ASSERT_EQ(::link(path("src/dir/big").c_str(), path("src/dir/big2").c_str()), 0);
  for (int mount_no = 0; mount_no < 2; ++mount_no) {
    SCOPED_TRACE(mount_no == 0 ? "first mount" : "second mount");
    Mount m(*this, config());
    auto c = core(StallPolicy::eio, m.group);
    ASSERT_TRUE(c);
    auto dir = c->lookup(StageFsCore::kRootId, "dir");
    ASSERT_TRUE(dir);
    for (const char* name : {"big", "big2"}) {
      auto node = c->lookup(dir->first, name);
      ASSERT_TRUE(node);
      auto f = c->open(node->first, O_RDONLY);
      ASSERT_TRUE(f) << name << ": " << f.error().message;
      std::string got(data.size() + 1, '\0');
      got.resize(static_cast<size_t>(std::max<ssize_t>(0, ::pread(f->fd.get(), got.data(), got.size(), 0))));
      EXPECT_TRUE(got == data) << name;
      c->release(f->pinned);
    }
    EXPECT_EQ(m.group.stats().transfers, mount_no == 0 ? 1U : 0U);
    c->stop();
  }
  EXPECT_FALSE(fs::exists(path("cache/data/dir/big2"))) << "the second name was copied";
}

// stagectl's requests run without a mount: the attribute names parse to requests, a
// prefetch answers once the copy is in the cache, an evict removes it, others are refused;
// whether a copy is cached is answered to who may read the file only.
TEST_F(GroupTest, StagectlRequestsRunOnTheCoreWithoutAMount) {
  EXPECT_EQ(parse_stagectl_request("user.stagefs.prefetch"), StagectlRequest::prefetch);
  EXPECT_EQ(parse_stagectl_request("user.stagefs.prefetch.nowait"), StagectlRequest::prefetch_nowait);
  EXPECT_EQ(parse_stagectl_request("user.stagefs.evict"), StagectlRequest::evict);
  EXPECT_EQ(parse_stagectl_request("user.stagefs.cached"), StagectlRequest::cached);
  EXPECT_FALSE(parse_stagectl_request("user.stagefs.status"));
  EXPECT_FALSE(parse_stagectl_request("user.stagefs.prefetchx"));
  EXPECT_TRUE(needs_caller_groups(StagectlRequest::prefetch));
  EXPECT_FALSE(needs_caller_groups(StagectlRequest::evict));
  EXPECT_TRUE(needs_caller_groups(StagectlRequest::cached));
  const std::string data = random_bytes(200000, 3);
  write_file(path("src/dir/f"), data);
  write_file(path("src/dir/secret"), "s");
  fs::permissions(path("src/dir/secret"), fs::perms::owner_read | fs::perms::owner_write);
  Mount m(*this, config());
  GroupService& group = m.group;
  const auto core = this->core(StallPolicy::eio, group);
  ASSERT_TRUE(core);
  const uint64_t dir = core->lookup(StageFsCore::kRootId, "dir")->first;
  const uint64_t f = core->lookup(dir, "f")->first;
  const uint64_t secret = core->lookup(dir, "secret")->first;
  auto ask = [&](uint64_t id, StagectlRequest r, Caller who = {}) {
    std::promise<stage::Result<std::string>> answer;
    run_stagectl_request(*core, id, r, who,
                         [&](const stage::Result<std::string>& v) { answer.set_value(v); });
    return answer.get_future().get();
  };
  auto run = [&](uint64_t id, StagectlRequest r, Caller who = {}) -> stage::Status {
    auto v = ask(id, r, who);
    if (!v) return v.error();
    EXPECT_EQ(*v, kStagectlDone);
    return {};
  };
  auto cached = [&](uint64_t id, Caller who = {}) {
    auto v = ask(id, StagectlRequest::cached, who);
    return v ? *v : "error " + std::to_string(v.error().to_errno());
  };
  EXPECT_EQ(cached(f), "no");
  const stage::Status prefetched = run(f, StagectlRequest::prefetch);
  EXPECT_TRUE(prefetched) << prefetched.error().message;
  EXPECT_EQ(read_file(path("cache/data/dir/f")), data);
  EXPECT_EQ(group.stats().transfers, 1U);
  EXPECT_EQ(cached(f), "yes");
  cache_->added("dir/f");  // what the daemon's admission does after a transfer
  EXPECT_EQ(run(f, StagectlRequest::evict, Caller{12345, 12345, {}}).error().to_errno(), EPERM);
  EXPECT_EQ(cached(f, Caller{12345, 12345, {}}), "yes");
  if (::geteuid() == 0) {  // a daemon that is not root checks no other user's access
    // Whether a copy is cached is told only to who may read the file.
    EXPECT_EQ(cached(secret, Caller{12345, 12345, {}}), "error " + std::to_string(EACCES));
    EXPECT_EQ(cached(secret), "no");
  }
  EXPECT_EQ(cached(dir).substr(0, 5), "error");  // not a regular file
  const stage::Status evicted = run(f, StagectlRequest::evict);
  EXPECT_TRUE(evicted) << evicted.error().message;
  EXPECT_FALSE(fs::exists(path("cache/data/dir/f")));
  EXPECT_EQ(cached(f), "no");
  EXPECT_FALSE(run(dir, StagectlRequest::evict));  // not a regular file
  // .nowait answers at once; the copy goes on, and a waiting prefetch finds it.
  EXPECT_TRUE(run(f, StagectlRequest::prefetch_nowait));
  EXPECT_TRUE(run(f, StagectlRequest::prefetch));
  EXPECT_EQ(read_file(path("cache/data/dir/f")), data);
  EXPECT_EQ(group.stats().transfers, 2U);
}

TEST_F(GroupTest, ReadOnlyAndNothingOutsideTheSource) {
  write_file(path("src/f"), "x");
  write_file(path("outside"), "secret");
  fs::create_symlink("../outside", path("src/escape"));
  stage::SelfComm comm;
  LocalControlPlane ctl;
  GroupService group(comm, ctl, *source_, store_, config());
  auto core = std::optional(this->core(StallPolicy::eio, group));
  ASSERT_TRUE(*core);
  auto f = (*core)->lookup(StageFsCore::kRootId, "f");
  ASSERT_TRUE(f);
  EXPECT_EQ((*core)->open(f->first, O_RDWR).error().to_errno(), EROFS);
  EXPECT_EQ((*core)->open(f->first, O_RDONLY | O_TRUNC).error().to_errno(), EROFS);
  EXPECT_EQ((*core)->lookup(StageFsCore::kRootId, "..").error().to_errno(), ENOENT);
  EXPECT_EQ((*core)->lookup(StageFsCore::kRootId, "a/b").error().to_errno(), ENOENT);
  auto esc = (*core)->lookup(StageFsCore::kRootId, "escape");
  ASSERT_TRUE(esc);  // shown as a symlink...
  EXPECT_TRUE(S_ISLNK(esc->second.st_mode));
  EXPECT_EQ((*core)->readlink(esc->first).value(), "../outside");
  EXPECT_FALSE((*core)->open(esc->first, O_RDONLY));  // ...never followed when materializing
  EXPECT_FALSE(open_beneath(root_.get(), "escape", O_RDONLY));
  EXPECT_FALSE(open_beneath(root_.get(), "../outside", O_RDONLY));
}

TEST_F(GroupTest, StalledTransferReleasesOpensAndBreaksTheGroup) {
  write_file(path("src/big"), random_bytes(200000, 3));
  write_file(path("src/other"), random_bytes(200000, 4));
  HangingComm comm;
  LocalControlPlane ctl;
  GroupService group(comm, ctl, *source_, store_, config(std::chrono::milliseconds(300)));
  std::thread service([&] { (void)group.run(); });
  auto core = std::optional(this->core(StallPolicy::eio, group));
  ASSERT_TRUE(*core);
  auto big = (*core)->lookup(StageFsCore::kRootId, "big");
  ASSERT_TRUE(big);
  auto r = (*core)->open(big->first, O_RDONLY);  // returns after the stall timeout, not never
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().to_errno(), ETIMEDOUT);
  EXPECT_EQ(group.state(), GroupState::broken);
  auto other = (*core)->lookup(StageFsCore::kRootId, "other");
  ASSERT_TRUE(other);
  EXPECT_FALSE((*core)->open(other->first, O_RDONLY));  // at once: the group is broken
  EXPECT_FALSE(fs::exists(path("cache/data/big")));     // nothing partial was published
  comm.release();  // the engine finishes; the node keeps taking part until told to stop
  group.request_shutdown();
  service.join();
  EXPECT_EQ(group.state(), GroupState::shut_down);
}

TEST_F(GroupTest, StallFallsBackToTheSourceWhenAsked) {
  const std::string data = random_bytes(200000, 5);
  write_file(path("src/big"), data);
  HangingComm comm;
  LocalControlPlane ctl;
  GroupService group(comm, ctl, *source_, store_, config(std::chrono::milliseconds(300)));
  std::thread service([&] { (void)group.run(); });
  auto core = std::optional(this->core(StallPolicy::source, group));
  ASSERT_TRUE(*core);
  auto big = (*core)->lookup(StageFsCore::kRootId, "big");
  ASSERT_TRUE(big);
  auto r = (*core)->open(big->first, O_RDONLY);
  ASSERT_TRUE(r);
  EXPECT_TRUE(r->from_source);
  std::string back(data.size(), '\0');
  ASSERT_EQ(::pread(r->fd.get(), back.data(), back.size(), 0), static_cast<ssize_t>(back.size()));
  EXPECT_EQ(back, data);
  comm.release();
  group.request_shutdown();
  service.join();
}

// Room in a cache under a limit, with copies held open (pinned): as the daemon, the group
// makes room before each transfer (a node without room relays without writing) and indexes
// the copy afterwards; the core waits for room (CoreConfig::space_wait).
class RoomTest : public GroupTest {
 protected:
  static constexpr size_t kFile = 300000;
  void SetUp() override {
    GroupTest::SetUp();
    for (const char* n : {"held", "next"}) write_file(path(std::string("src/") + n), random_bytes(kFile, 7));
    struct stat st {};
    ASSERT_EQ(::stat(path("src/held").c_str(), &st), 0);
    // Room for one copy, not two.
    cache_->set_limit(stage::allocated_from_stat(st) * 3 / 2 + 2 * cache_->copy_overhead());
  }
  GroupConfig room_config() {
    GroupConfig g = config();
    group_hooks(g).on_before_transfer = [this](const std::string& rel, bool) -> stage::Status {
      struct stat st {};
      if (::stat(path("src/" + rel).c_str(), &st) != 0) return {};
      return cache_->make_room(rel, stage::allocated_from_stat(st) + cache_->copy_overhead());
    };
    group_hooks(g).on_after_transfer = [this](const std::string& rel, bool) { cache_->added(rel); };
    return g;
  }
  std::unique_ptr<StageFsCore> core_with_wait(Materializer& mat, std::chrono::milliseconds wait) {
    CoreConfig cc{path("src"), StallPolicy::eio};
    cc.space_wait = wait;
    auto c = StageFsCore::create(cc, *cache_, mat);
    EXPECT_TRUE(c);
    return c ? std::move(c.value()) : nullptr;
  }
  static stage::Result<OpenFile> open_name(StageFsCore& core, const std::string& name) {
    return core.open(core.lookup(StageFsCore::kRootId, name)->first, O_RDONLY);
  }
  // An open of name whose answer comes later, once the core waits for room for it.
  static std::future<stage::Result<OpenFile>> open_waiting_for_room(StageFsCore& core,
                                                                    const std::string& name) {
    auto answer = std::make_shared<std::promise<stage::Result<OpenFile>>>();
    auto f = answer->get_future();
    core.open_async(core.lookup(StageFsCore::kRootId, name)->first, O_RDONLY, Caller{},
                    [answer](stage::Result<OpenFile> r) { answer->set_value(std::move(r)); });
    core.copy_counters().room_waits.wait(
        0);  // until the open is queued for room (the test's timeout bounds it)
    EXPECT_EQ(core.copy_counters().room_waits.load(), 1U);
    return f;
  }
};

TEST_F(RoomTest, AnOpenWaitsForRoomHeldByAnOpenCopyAndGetsItWhenReleased) {
  Mount m(*this, room_config());
  auto core = this->core_with_wait(m.group, std::chrono::minutes(10));  // only a bound
  ASSERT_TRUE(core);
  auto held = open_name(*core, "held");
  ASSERT_TRUE(held) << held.error().message;
  EXPECT_EQ(cache_->usage().pinned_files, 1U);
  auto f = open_waiting_for_room(*core, "next");
  EXPECT_EQ(f.wait_for(std::chrono::seconds(0)), std::future_status::timeout);  // still waiting
  core->release(held->pinned);                                                  // the held copy may go now
  auto next = f.get();
  ASSERT_TRUE(next) << next.error().message;
  EXPECT_EQ(read_file(path("cache/data/next")), read_file(path("src/next")));
  EXPECT_FALSE(fs::exists(path("cache/data/held")));  // evicted to make room
  core->release(next->pinned);
}

TEST_F(RoomTest, AnOpenThatNeverGetsRoomFailsWithEnospcNamingThePinnedCopies) {
  Mount m(*this, room_config());
  auto core = this->core_with_wait(m.group, std::chrono::milliseconds(200));
  ASSERT_TRUE(core);
  auto held = open_name(*core, "held");
  ASSERT_TRUE(held) << held.error().message;
  auto next = open_name(*core, "next");
  ASSERT_FALSE(next);
  EXPECT_EQ(next.error().to_errno(), ENOSPC) << next.error().message;
  EXPECT_NE(next.error().message.find("held by 1 cop(ies) of files open on this node"), std::string::npos)
      << next.error().message;
  EXPECT_EQ(core->copy_counters().room_waits.load(), 1U);
  EXPECT_TRUE(fs::exists(path("cache/data/held")));  // never evicted while open
  EXPECT_FALSE(fs::exists(path("cache/data/next")));
  core->release(held->pinned);
}

TEST_F(RoomTest, AStopAnswersTheOpensWaitingForRoom) {
  Mount m(*this, room_config());
  auto core = this->core_with_wait(m.group, std::chrono::minutes(10));
  ASSERT_TRUE(core);
  auto held = open_name(*core, "held");
  ASSERT_TRUE(held) << held.error().message;
  auto f = open_waiting_for_room(*core, "next");
  core->stop();
  auto next = f.get();
  ASSERT_FALSE(next);
  EXPECT_EQ(next.error().to_errno(), ESHUTDOWN);
  core->release(held->pinned);
}

}  // namespace
}  // namespace stagefs
