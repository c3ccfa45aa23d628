// Bounded batches: a huge directory goes in slices with other users' opens served between
// them; a new file in a staged huge directory costs a slice, not a check of every name; one
// open's batch and the slices that follow stop at its budget.
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
using testing::huge_name;
using testing::wait_budget_stops;

// The mount's source reader, counting the small files its batch scans listed (checked with
// a stat): what each batch costs on the source and in every node's decision.
class CountingScans final : public stage::SourceReader {
 public:
  explicit CountingScans(BeneathSource& real) : real_(real) {}
  stage::Result<stage::Manifest> scan(const std::string& p, bool rec, const SkipFn& skip) override {
    return real_.scan(p, rec, skip);
  }
  stage::Result<stage::Selection> scan_selection(const std::string& dir, uint64_t max,
                                                 const stage::SelectionSlice& slice) override {
    auto r = real_.scan_selection(dir, max, slice);
    if (r) listed += r->manifest.entries.size() - 1;  // the directory's own entry left out
    return r;
  }
  stage::Result<std::vector<std::string>> list_dirs(const std::string& dir, size_t max) override {
    return real_.list_dirs(dir, max);
  }
  stage::Result<std::unique_ptr<stage::SourceFile>> open(const std::string& root,
                                                         const stage::Entry& e) override {
    return real_.open(root, e);
  }
  std::atomic<uint64_t> listed{0};

 private:
  BeneathSource& real_;
};

// One user's open of a file in a directory of 1,000 small files, with batches of at most 100
// files: ten slices, the opened file in the first; another user's open that asked during the
// first slice is served right after it, before the other nine.
TEST_F(BatchTest, AHugeDirectoryGoesInBoundedSlicesWithAnotherUsersOpenServedBetween) {
  constexpr int kFiles = 1000;
  fs::create_directories(path("src/huge"));
  for (int i = 0; i < kFiles; ++i) write_file(path("src/huge/" + huge_name(i)), std::string(100, 'a'));
  std::vector<std::string> order;  // the service thread's, read after the mount's end
  std::promise<stage::Status> other;
  GroupService* g = nullptr;
  auto cfg = config();
  cfg.batches.batch_max_files = 100;
  group_hooks(cfg).on_before_batch = [&](const std::string& dir, const stage::SelectionSlice&, bool) {
    order.push_back("batch " + dir);
    if (order.size() == 1)  // another user's open while the first slice runs
      g->materialize_async("many/large.bin", Want{2000, false},
                           [&](stage::Status st) { other.set_value(st); });
  };
  group_hooks(cfg).on_before_transfer = [&](const std::string& rel, bool) {
    order.push_back("file " + rel);
    return stage::Status{};
  };
  BatchEnds ends;
  ends.count_in(cfg);
  Mount mount(*this, *source_, cfg);
  g = &mount.group;
  make_core(mount.group);
  const uint64_t dir = lookup(StageFsCore::kRootId, "huge");
  auto r = core_->open(lookup(dir, huge_name(567)), O_RDONLY, Caller{1000, 1000, {}});
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(read_fd(r->fd.get()), std::string(100, 'a'));
  core_->release(r->pinned);
  auto done = other.get_future();
  ASSERT_EQ(done.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  EXPECT_TRUE(done.get().ok());
  ASSERT_TRUE(ends.wait_for(10));
  mount.end();
  ASSERT_EQ(order.size(), 11U);
  EXPECT_EQ(order[0], "batch huge");
  EXPECT_EQ(order[1], "file many/large.bin");
  EXPECT_EQ(std::count(order.begin(), order.end(), "batch huge"), 10);
  const auto s = mount.group.stats();
  EXPECT_EQ(s.batches, 10U);
  EXPECT_EQ(s.batch_files, static_cast<uint64_t>(kFiles));
  for (int i = 0; i < kFiles; i += 97) EXPECT_TRUE(fs::exists(path("cache/data/huge/" + huge_name(i)))) << i;
  EXPECT_TRUE(fs::exists(path("cache/data/huge/" + huge_name(kFiles - 1))));
}

// A new file in a big directory already staged costs a slice around it, and one more that
// finds nothing to copy: not a check of every name of the directory.
TEST_F(BatchTest, ANewFileInAStagedHugeDirectoryChecksASliceNotEveryName) {
  constexpr int kFiles = 1000;
  fs::create_directories(path("src/huge"));
  for (int i = 0; i < kFiles; ++i) write_file(path("src/huge/" + huge_name(i)), std::string(100, 'b'));
  CountingScans counting(*source_);
  auto cfg = config();
  cfg.batches.batch_max_files = 100;
  BatchEnds ends;
  ends.count_in(cfg);
  Mount mount(*this, counting, cfg);
  make_core(mount.group);
  const uint64_t dir = lookup(StageFsCore::kRootId, "huge");
  EXPECT_EQ(open_and_read(lookup(dir, huge_name(0))), std::string(100, 'b'));
  ASSERT_TRUE(ends.wait_for(10));  // the whole directory, in ten slices
  // ... and completed (the group counts a batch done after its after_batch hook): an open
  // that looked into the cache before that would be answered by it and go alone.
  ASSERT_TRUE(mount.group.wait_for_epoch(10, std::chrono::seconds(60)));
  ASSERT_EQ(mount.group.epoch(), 10U);
  EXPECT_EQ(counting.listed.load(), static_cast<uint64_t>(kFiles));
  write_file(path("src/huge/h9999"), "new");
  EXPECT_EQ(open_and_read(lookup(dir, "h9999")), "new");
  ASSERT_TRUE(ends.wait_for(12));
  mount.end();
  EXPECT_EQ(mount.group.stats().batches, 12U);  // the new file's slice, then one with nothing new
  EXPECT_EQ(counting.listed.load(), static_cast<uint64_t>(kFiles) + 200U);
}

// One open in a directory of 1,000 empty files, with batches of at most 100 files and a
// budget of 250 files: its batch and the slices that follow list 250 files (the last slice
// only what is left), then stop; an empty file counts (it is not free in the cache).
TEST_F(BatchTest, OneOpenInAHugeDirectoryOfEmptyFilesStagesItsBudgetNotTheDirectory) {
  fs::create_directories(path("src/empty"));
  for (int i = 0; i < 1000; ++i) write_file(path("src/empty/" + huge_name(i)), "");
  auto cfg = config();
  cfg.batches.batch_max_files = 100;
  cfg.batches.prefetch_max_files = 250;
  cfg.file_charge = kCopyCharge;
  Mount mount(*this, *source_, cfg);
  make_core(mount.group);
  EXPECT_EQ(open_and_read(lookup(lookup(StageFsCore::kRootId, "empty"), huge_name(567))), "");
  ASSERT_TRUE(wait_budget_stops(mount.group, 1));
  mount.end();
  EXPECT_EQ(cached_in(path("cache/data/empty")), 250U);
  EXPECT_EQ(mount.group.stats().batches, 3U);  // 100, 100, then the 50 left
}

}  // namespace
}  // namespace stagefs
