// Walks: opens in two sibling directories stage the parent's other subdirectories in the
// background, behind every open; a prefetch that does not fit drops the walk quietly; a walk
// stops at its budget of files, bytes and directories.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <sys/xattr.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <future>
#include <iostream>
#include <mutex>
#include <set>
#include <thread>

#include "acl.h"
#include "batch_fixture.h"
#include "bcast/comm/comm.h"
#include "bcast/io/store.h"
#include "fakes.h"
#include "fusefs/base/batch_rules.h"
#include "fusefs/base/beneath.h"
#include "fusefs/cache/cache.h"
#include "fusefs/core/core.h"
#include "fusefs/group/group.h"
#include "group_hooks.h"
#include "tmpdir.h"

namespace stagefs {
namespace {

using testing::BatchEnds;
using testing::BatchTest;
namespace fs = std::filesystem;
using testing::cached_in;
using testing::deny_nobody;
using testing::huge_name;
using testing::wait_budget_stops;

// Walks: opens in two sibling directories stage the parent's other subdirectories
// that every user may list and enter, without an open; never a private one, nor a symlink.
TEST_F(BatchTest, AWalkOfTwoSiblingsStagesTheOtherSubdirectories) {
  for (const char* d : {"w/a", "w/b", "w/c", "w/d", "w/private", "w/nogroup", "w/acl"})
    small_dir(d, {"f0", "f1", "f2"});
  ASSERT_EQ(::chmod(path("src/w/private").c_str(), 0750), 0);
  ASSERT_EQ(::chmod(path("src/w/nogroup").c_str(), 0705), 0);              // its owner's group may not enter
  if (!deny_nobody(path("src/w/acl"))) fs::remove_all(path("src/w/acl"));  // no ACLs here
  fs::create_directory_symlink("../many", path("src/w/link"));
  write_file(path("src/w/plain"), small_[4]);
  // The listing itself: directories every user may list and enter (ugo+rx, no ACL) only, at
  // most max of them.
  auto all = source_->list_dirs("w", 100);
  ASSERT_TRUE(all) << all.error().message;
  std::vector<std::string> names = *all;
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"a", "b", "c", "d"}));
  auto two = source_->list_dirs("w", 2);
  ASSERT_TRUE(two);
  EXPECT_EQ(two->size(), 2U);
  EXPECT_FALSE(source_->list_dirs("w/plain", 100));
  EXPECT_FALSE(source_->list_dirs("w/link", 100));

  BatchEnds ends;
  auto cfg = config();
  ends.count_in(cfg);
  Mount mount(*this, *source_, cfg);
  GroupService& group = mount.group;
  make_core(group);
  const uint64_t w = lookup(StageFsCore::kRootId, "w");
  for (const char* d : {"a", "b"}) EXPECT_EQ(open_and_read(lookup(lookup(w, d), "f1")), small_[1]) << d;
  EXPECT_TRUE(ends.wait_for(4));  // c and d follow in the background
  EXPECT_TRUE(fs::exists(path("cache/data/w/c/f2")));
  EXPECT_TRUE(fs::exists(path("cache/data/w/d/f0")));
  EXPECT_FALSE(fs::exists(path("cache/data/w/private")));
  EXPECT_FALSE(fs::exists(path("cache/data/w/nogroup")));
  EXPECT_FALSE(fs::exists(path("cache/data/w/acl")));
  EXPECT_FALSE(fs::exists(path("cache/data/many")));
  // An open in c is a cache hit: no transfer.
  auto c = core_->open(lookup(lookup(w, "c"), "f2"), O_RDONLY);
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_TRUE(c->cache_hit);
  EXPECT_EQ(read_fd(c->fd.get()), small_[2]);
  core_->release(c->pinned);
  mount.end();  // the group's counters are final now (a batch counts itself after its hook)
  const auto s = group.stats();
  EXPECT_EQ(s.batches, 4U);
  EXPECT_EQ(s.batch_files, 12U);
  EXPECT_EQ(s.transfers, 4U);
  EXPECT_EQ(s.walks, 1U);
}

// A prefetched batch never evicts: its hook is told so (the daemon's then makes no room), and
// when it does not fit (here the store has no room for it) it fails quietly: the rest of the
// walk is dropped, nothing is marked failed, and opens in the skipped and the dropped
// directories get their batches as usual.
TEST_F(BatchTest, APrefetchThatDoesNotFitDropsTheWalkAndMarksNothingFailed) {
  const std::vector<std::string> dirs{"a", "b", "c", "d", "e"};
  for (const auto& d : dirs) small_dir("w/" + d, {"f0", "f1", "f2"});
  stage::testing::StoreFaults faults;
  stage::testing::FaultStore store(faults);
  std::mutex m;
  std::vector<std::pair<std::string, bool>> hooks;  // (dir, may_evict), in order
  auto cfg = config();
  group_hooks(cfg).on_before_batch = [&](const std::string& dir, const stage::SelectionSlice&,
                                         bool may_evict) {
    faults.free_bytes = may_evict ? -1 : 0;  // the service thread, as the store's free_bytes()
    std::lock_guard lk(m);
    hooks.emplace_back(dir, may_evict);
  };
  BatchEnds ends;
  ends.count_in(cfg);
  Mount mount(*this, *source_, store, cfg);
  GroupService& group = mount.group;
  make_core(group);
  const uint64_t w = lookup(StageFsCore::kRootId, "w");
  for (const char* d : {"a", "b"}) EXPECT_EQ(open_and_read(lookup(lookup(w, d), "f1")), small_[1]) << d;
  EXPECT_TRUE(ends.wait_for(3));  // the walk's first prefetch ended (it failed)
  std::string skipped;
  {
    std::lock_guard lk(m);
    ASSERT_EQ(hooks.size(), 3U);
    EXPECT_EQ(hooks[0], (std::pair<std::string, bool>{"w/a", true}));
    EXPECT_EQ(hooks[1], (std::pair<std::string, bool>{"w/b", true}));
    EXPECT_FALSE(hooks[2].second) << "a prefetched batch must not evict";
    skipped = hooks[2].first;
  }
  for (const char* d : {"c", "d", "e"}) {
    EXPECT_FALSE(fs::exists(path("cache/data/w/" + std::string(d) + "/f0"))) << d;
    EXPECT_EQ(open_and_read(lookup(lookup(w, d), "f2")), small_[2]) << d;
  }
  mount.end();
  const auto s = group.stats();
  EXPECT_EQ(s.prefetch_skipped, 1U);
  EXPECT_EQ(s.failures, 0U);
  EXPECT_EQ(s.batches, 6U);  // a, b, the skipped prefetch, then c, d, e asked for
  EXPECT_EQ(s.batch_files, 15U);
  std::lock_guard lk(m);
  ASSERT_EQ(hooks.size(), 6U);
  for (size_t i = 3; i < 6; ++i) EXPECT_TRUE(hooks[i].second) << hooks[i].first;
  EXPECT_TRUE(
      std::ranges::any_of(hooks.begin() + 3, hooks.end(), [&](const auto& h) { return h.first == skipped; }))
      << skipped << ": asked for after its prefetch failed, it is a batch again (not file by file)";
}

// An open that attached to a prefetch while it ran (its directory's batch was running here)
// is not failed when the prefetch is skipped: it asks again and gets an ordinary batch. The
// open attaches from inside the prefetch's hook, so the order is certain.
TEST_F(BatchTest, AnOpenThatAttachedToASkippedPrefetchGetsAnOrdinaryBatch) {
  for (const char* d : {"w/a", "w/b", "w/c"}) small_dir(d, {"f"});
  stage::SelfComm comm;
  LocalControlPlane ctl;
  stage::testing::StoreFaults faults;
  stage::testing::FaultStore store(faults);
  std::vector<std::pair<std::string, bool>> hooks;  // the service thread's, read after stop()
  std::promise<stage::Status> attached;
  GroupService* g = nullptr;
  auto cfg = config();
  group_hooks(cfg).on_before_batch = [&](const std::string& dir, const stage::SelectionSlice&,
                                         bool may_evict) {
    hooks.emplace_back(dir, may_evict);
    faults.free_bytes = may_evict ? -1 : 0;
    if (!may_evict)
      g->materialize_small_async(dir + "/f", 0, {}, [&](stage::Status st) { attached.set_value(st); });
  };
  GroupService group(comm, ctl, *source_, store, cfg);
  g = &group;
  std::thread service([&] { EXPECT_TRUE(group.run().ok()); });
  make_core(group);
  const uint64_t w = lookup(StageFsCore::kRootId, "w");
  for (const char* d : {"a", "b"}) EXPECT_EQ(open_and_read(lookup(lookup(w, d), "f")), small_[0]) << d;
  auto done = attached.get_future();
  ASSERT_EQ(done.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  const stage::Status st = done.get();
  EXPECT_TRUE(st.ok()) << st.error().message;
  EXPECT_EQ(read_file(path("cache/data/w/c/f")), small_[0]);
  stop(group, service);
  ASSERT_EQ(hooks.size(), 4U);
  EXPECT_EQ(hooks[2], (std::pair<std::string, bool>{"w/c", false}));
  EXPECT_EQ(hooks[3], (std::pair<std::string, bool>{"w/c", true}));  // asked again: may evict
  const auto s = group.stats();
  EXPECT_EQ(s.prefetch_skipped, 1U);
  EXPECT_EQ(s.failures, 0U);
}

// With prefetch_siblings off, only what opens ask for.
TEST_F(BatchTest, WithoutWalksOnlyOpenedDirectoriesAreStaged) {
  for (const char* d : {"w/a", "w/b", "w/c"}) small_dir(d, {"f"});
  auto cfg = config();
  cfg.batches.prefetch_siblings = false;
  Mount mount(*this, *source_, cfg);
  GroupService& group = mount.group;
  make_core(group);
  const uint64_t w = lookup(StageFsCore::kRootId, "w");
  for (const char* d : {"a", "b", "c"}) EXPECT_EQ(open_and_read(lookup(lookup(w, d), "f")), small_[0]) << d;
  // No walk was found (it is counted before b's batch is announced, so before b's open
  // returns), and each open asked for its own directory.
  const auto s = group.stats();
  EXPECT_EQ(s.walks, 0U);
  EXPECT_EQ(s.batches, 3U);
  EXPECT_EQ(s.requests_sent, 3U);
  mount.end();
}

// A walk counts its files too: with a budget of 250 files (or of 4 KiB: one empty file's copy
// is charged 8 KiB), the walk over three directories of 300 empty files stops after 250 files
// (the last slice listing only what is left), or one; the rest waits for its own opens.
TEST_F(BatchTest, AWalkOfEmptyFilesStopsAtItsFileOrByteBudget) {
  for (const char* d : {"w/a", "w/b", "w/c", "w/d", "w/e"}) {  // the reader's two, then three to prefetch
    fs::create_directories(path("src/") + d);
    for (int i = 0; i < (d[2] < 'c' ? 1 : 300); ++i) write_file(path("src/") + d + "/" + huge_name(i), "");
  }
  for (bool by_bytes : {false, true}) {
    SCOPED_TRACE(by_bytes ? "byte budget" : "file budget");
    fs::remove_all(path("cache/data/w"));
    auto cfg = config();
    cfg.batches.batch_max_files = 100;
    cfg.batches.prefetch_max_files = by_bytes ? 0 : 250;
    cfg.batches.prefetch_max_bytes = by_bytes ? 4096 : 0;
    cfg.file_charge = kCopyCharge;
    Mount mount(*this, *source_, cfg);
    make_core(mount.group);
    const uint64_t w = lookup(StageFsCore::kRootId, "w");
    for (const char* d : {"a", "b"}) EXPECT_EQ(open_and_read(lookup(lookup(w, d), huge_name(0))), "") << d;
    ASSERT_TRUE(wait_budget_stops(mount.group, 1));
    mount.end();
    size_t prefetched = 0;
    for (const char* d : {"c", "d", "e"}) prefetched += cached_in(path("cache/data/w/") + d);
    EXPECT_EQ(prefetched, by_bytes ? 1U : 250U);
  }
}

// A walk prefetches at most prefetch_max_dirs subdirectories of its parent.
TEST_F(BatchTest, AWalkPrefetchesAtMostItsBudgetOfDirectories) {
  for (const char* d : {"w/a", "w/b", "w/c", "w/d", "w/e", "w/f"}) small_dir(d, {"f0", "f1"});
  auto cfg = config();
  cfg.batches.prefetch_max_dirs = 2;
  Mount mount(*this, *source_, cfg);
  make_core(mount.group);
  const uint64_t w = lookup(StageFsCore::kRootId, "w");
  for (const char* d : {"a", "b"}) EXPECT_EQ(open_and_read(lookup(lookup(w, d), "f1")), small_[1]) << d;
  mount.end();
  const auto s = mount.group.stats();
  EXPECT_EQ(s.walks, 1U);
  EXPECT_EQ(s.prefetch_queued, 2U);
}

}  // namespace
}  // namespace stagefs
