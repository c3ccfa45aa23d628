// UnsyncedLog (fusefs/cache/unsynced.h): what record() writes, what flush() and close() leave, and
// what recover() does with a log an earlier daemon left: sync its copies on the same boot,
// remove them after a reboot, never touch a name outside CACHE/data. And NodeCache's store:
// a batch published through it is recorded, not synced.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "bcast/comm/comm.h"
#include "bcast/transfer/engine.h"
#include "fusefs/base/beneath.h"
#include "fusefs/cache/cache.h"
#include "fusefs/cache/unsynced.h"
#include "tmpdir.h"

namespace stagefs {
namespace {

namespace fs = std::filesystem;
using stage::testing::TmpDirTest;
using namespace std::chrono_literals;

class UnsyncedLogTest : public TmpDirTest {
 protected:
  void SetUp() override {
    TmpDirTest::SetUp();
    fs::create_directories(path("cache/data/d"));
    root_ = stage::Fd(::open(path("cache").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    data_ = stage::Fd(::open(path("cache/data").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    ASSERT_TRUE(root_.valid() && data_.valid());
    for (const char* n : {"a", "d/b", "c"}) write_file(path(std::string("cache/data/") + n), n);
  }
  void TearDown() override {
    root_ = stage::Fd();
    data_ = stage::Fd();
    TmpDirTest::TearDown();
  }
  [[nodiscard]] std::string log_bytes() const { return read_file(path("cache/unsynced")); }
  void write_log(const std::string& bytes) const {
    std::ofstream(path("cache/unsynced"), std::ios::binary) << bytes;
  }
  static std::string header(const std::string& boot) {
    return "stagefs-unsynced 1 boot " + boot + std::string(1, '\0');
  }
  [[nodiscard]] bool cached(const std::string& rel) const { return fs::exists(path("cache/data/" + rel)); }

  stage::Fd root_, data_;
};

TEST_F(UnsyncedLogTest, RecordsNamesDurablyBeforeReturningAndEmptiesTheLogOnceSynced) {
  UnsyncedLog log(root_.get(), data_.get(), 3600s, nullptr);  // the background sync never comes
  const std::vector<std::string> names{"a", "d/b"};
  ASSERT_TRUE(log.record(names).ok());
  const std::string boot = UnsyncedLog::current_boot_id();
  ASSERT_FALSE(boot.empty());
  const std::string recorded = header(boot) + "a" + std::string(1, '\0') + "d/b" + std::string(1, '\0');
  EXPECT_EQ(log_bytes(), recorded);
  EXPECT_EQ(log.pending(), 2U);
  // Not renamed yet (published() not called): a flush must neither sync them nor drop them.
  log.flush();
  EXPECT_EQ(log.pending(), 2U);
  EXPECT_EQ(log.synced(), 0U);
  EXPECT_EQ(log_bytes(), recorded);
  log.published(names);
  log.flush();
  EXPECT_EQ(log.pending(), 0U);
  EXPECT_EQ(log.synced(), 2U);
  EXPECT_EQ(log_bytes(), header(boot));  // nothing left to recover
  // One batch published, the next one recorded only: the flush keeps the second's names.
  ASSERT_TRUE(log.record(std::vector<std::string>{"c"}).ok());
  log.published(std::vector<std::string>{"c"});
  ASSERT_TRUE(log.record(std::vector<std::string>{"a"}).ok());
  log.flush();
  EXPECT_EQ(log_bytes(), header(boot) + "a" + std::string(1, '\0'));  // rewritten without "c"
  EXPECT_EQ(log.pending(), 1U);
  log.published(std::vector<std::string>{"a"});
  log.close();
  EXPECT_FALSE(fs::exists(path("cache/unsynced")));
  EXPECT_FALSE(fs::exists(path("cache/unsynced.new")));
  EXPECT_EQ(log.synced(), 4U);
  EXPECT_TRUE(cached("a") && cached("d/b") && cached("c"));
}

TEST_F(UnsyncedLogTest, TheBackgroundThreadSyncsPublishedCopiesAfterTheDelay) {
  UnsyncedLog log(root_.get(), data_.get(), 1ms, nullptr);
  const std::vector<std::string> names{"a", "d/b", "c"};
  ASSERT_TRUE(log.record(names).ok());
  log.published(names);
  // Nothing timed is asserted: the thread's flush wakes the wait (60 s is only a bound).
  EXPECT_TRUE(log.wait_synced(3, 60s));
  EXPECT_EQ(log.synced(), 3U);
  EXPECT_EQ(log.pending(), 0U);
  EXPECT_EQ(log_bytes(), header(UnsyncedLog::current_boot_id()));
}

// A flush of many copies: one syncfs() instead of a sync per copy; if syncfs() fails, each
// copy is synced on its own (which names the failed ones); a flush of few copies never calls
// syncfs(). A fake syncfs behind the log's SyncFs seam counts the calls and fails them on demand.
class SyncfsFlushTest : public UnsyncedLogTest {
 protected:
  std::vector<std::string> make_copies(size_t n) {
    std::vector<std::string> names;
    fs::create_directories(path("cache/data/many"));
    for (size_t i = 0; i < n; ++i) {
      names.push_back("many/f" + std::to_string(i));
      write_file(path("cache/data/" + names.back()), names.back());
    }
    return names;
  }
  SyncFs counting_syncfs(bool fails) {
    return [this, fails](int fd) {
      ++calls_;
      if (!fails) return ::syncfs(fd);
      errno = EIO;
      return -1;
    };
  }
  static void flush_all(UnsyncedLog& log, const std::vector<std::string>& names) {
    ASSERT_TRUE(log.record(names).ok());
    log.published(names);
    log.flush();
  }
  int calls_ = 0;
};

TEST_F(SyncfsFlushTest, ManyCopiesAreSyncedByOneSyncfs) {
  const auto names = make_copies(UnsyncedLog::kSyncfsFrom);
  UnsyncedLog log(root_.get(), data_.get(), 3600s, nullptr, counting_syncfs(false));
  flush_all(log, names);
  EXPECT_EQ(calls_, 1);
  EXPECT_EQ(log.synced(), names.size());
  EXPECT_EQ(log.pending(), 0U);
  EXPECT_EQ(log_bytes(), header(UnsyncedLog::current_boot_id()));
}

TEST_F(SyncfsFlushTest, AFailedSyncfsSyncsEachCopyOnItsOwnAndKeepsTheGoodOnes) {
  const auto names = make_copies(UnsyncedLog::kSyncfsFrom + 1);
  std::vector<std::string> removed;
  UnsyncedLog log(
      root_.get(), data_.get(), 3600s, [&](const std::string& n) { removed.push_back(n); },
      counting_syncfs(true));
  flush_all(log, names);
  EXPECT_EQ(calls_, 1);
  EXPECT_EQ(log.synced(), names.size());  // each fdatasync succeeded
  EXPECT_TRUE(removed.empty());
  for (const auto& n : names) EXPECT_TRUE(cached(n)) << n;
  EXPECT_EQ(log_bytes(), header(UnsyncedLog::current_boot_id()));
}

TEST_F(SyncfsFlushTest, AFewCopiesAreSyncedOnTheirOwn) {
  const auto names = make_copies(UnsyncedLog::kSyncfsFrom - 1);
  UnsyncedLog log(root_.get(), data_.get(), 3600s, nullptr, counting_syncfs(false));
  flush_all(log, names);
  EXPECT_EQ(calls_, 0);
  EXPECT_EQ(log.synced(), names.size());
}

TEST_F(UnsyncedLogTest, ZeroDelayWritesNoLog) {
  UnsyncedLog log(root_.get(), data_.get(), 0ms, nullptr);
  ASSERT_TRUE(log.record(std::vector<std::string>{"a"}).ok());  // synced (syncfs) at once
  EXPECT_FALSE(fs::exists(path("cache/unsynced")));
  EXPECT_EQ(log.pending(), 0U);
}

TEST_F(UnsyncedLogTest, ALogThatCannotBeWrittenFallsBackToSyncing) {
  fs::create_directories(path("cache/unsynced.new"));  // the log cannot be created beside it
  UnsyncedLog log(root_.get(), data_.get(), 3600s, nullptr);
  ASSERT_TRUE(log.record(std::vector<std::string>{"a"}).ok());  // synced (syncfs) instead
  EXPECT_EQ(log.pending(), 0U);
  EXPECT_FALSE(fs::exists(path("cache/unsynced")));
}

// What a killed daemon leaves: the log as record() wrote it, read back by the next start.
TEST_F(UnsyncedLogTest, AfterAKillOnTheSameBootTheCopiesAreSyncedAndKept) {
  std::string left;
  {
    UnsyncedLog log(root_.get(), data_.get(), 3600s, nullptr);
    ASSERT_TRUE(log.record(std::vector<std::string>{"a", "d/b"}).ok());
    left = log_bytes();
  }  // close() removes the log; a kill -9 would not have: put it back
  write_log(left);
  const auto r = UnsyncedLog::recover(root_.get(), data_.get(), UnsyncedLog::current_boot_id());
  EXPECT_TRUE(r.found);
  EXPECT_FALSE(r.other_boot);
  EXPECT_EQ(r.synced, 2U);
  EXPECT_EQ(r.removed, 0U);
  EXPECT_TRUE(cached("a") && cached("d/b") && cached("c"));
  EXPECT_FALSE(fs::exists(path("cache/unsynced")));
}

TEST_F(UnsyncedLogTest, AfterARebootTheListedCopiesAreRemovedAndATornRecordIsIgnored) {
  // "c" has no terminating NUL: it was being written when the machine stopped (its batch was
  // never renamed), so it names nothing to remove.
  write_log(header("an-earlier-boot") + "a" + std::string(1, '\0') + "d/b" + std::string(1, '\0') + "c");
  const auto r = UnsyncedLog::recover(root_.get(), data_.get(), UnsyncedLog::current_boot_id());
  EXPECT_TRUE(r.found);
  EXPECT_TRUE(r.other_boot);
  EXPECT_EQ(r.removed, 2U);
  EXPECT_FALSE(cached("a"));
  EXPECT_FALSE(cached("d/b"));
  EXPECT_TRUE(cached("c"));
  EXPECT_FALSE(fs::exists(path("cache/unsynced")));
  // Nothing left: the next start finds no log.
  EXPECT_FALSE(UnsyncedLog::recover(root_.get(), data_.get(), UnsyncedLog::current_boot_id()).found);
}

TEST_F(UnsyncedLogTest, AnUnreadableLogEmptiesTheCache) {
  write_log(std::string("garbage") + '\0' + "a" + '\0');
  const auto r = UnsyncedLog::recover(root_.get(), data_.get(), UnsyncedLog::current_boot_id());
  EXPECT_TRUE(r.unreadable);  // the caller (NodeCache::open) must not trust any copy
  // Through the cache: every copy goes, the log too.
  fs::create_directories(path("node/data/d"));
  ::chmod(path("node").c_str(), 0700);
  write_file(path("node/data/d/x"), "x");
  write_file(path("node/unsynced"), std::string("\0\0\0", 3));
  auto c = NodeCache::open(path("node"));
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_TRUE((*c)->recovered().unreadable);
  EXPECT_FALSE(fs::exists(path("node/data/d/x")));
  EXPECT_FALSE(fs::exists(path("node/unsynced")));
  EXPECT_EQ((*c)->usage().files, 0U);
}

TEST_F(UnsyncedLogTest, NamesNeverReachOutsideTheCache) {
  write_file(path("victim"), "outside");
  write_file(path("cache/victim"), "beside data");
  fs::create_symlink(path(""), path("cache/data/up"));
  write_log(header("an-earlier-boot") + "../victim" + '\0' + "../../victim" + '\0' + "up/victim" + '\0' +
            "/" + path("victim") + '\0' + "d" + '\0');
  const auto r = UnsyncedLog::recover(root_.get(), data_.get(), UnsyncedLog::current_boot_id());
  EXPECT_EQ(r.removed, 0U);
  EXPECT_TRUE(fs::exists(path("victim")));
  EXPECT_TRUE(fs::exists(path("cache/victim")));
  EXPECT_TRUE(fs::is_directory(path("cache/data/d")));
}

TEST_F(UnsyncedLogTest, AnInterruptedRewriteLeavesTheOldLogInForce) {
  write_log(header("an-earlier-boot") + "a" + '\0');
  write_file(path("cache/unsynced.new"), "half a rewrite");
  const auto r = UnsyncedLog::recover(root_.get(), data_.get(), UnsyncedLog::current_boot_id());
  EXPECT_EQ(r.removed, 1U);
  EXPECT_FALSE(fs::exists(path("cache/unsynced.new")));
}

// The cache's store: a batch's copies are published with their names in the log and none of
// them synced; sync_unsynced() syncs them; a restart after a "reboot" removes them.
TEST_F(UnsyncedLogTest, ABatchThroughTheCacheIsRecordedNotSynced) {
  fs::create_directories(path("src/many"));
  for (int i = 0; i < 20; ++i) write_file(path("src/many/f" + std::to_string(i)), std::string(100 + i, 'x'));
  stage::Fd src(::open(path("src").c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  BeneathSource source(src.get());
  std::string left;
  {
    auto c = NodeCache::open(path("node"), {.direct_io = false, .parent_mode = 0700}, 3600s);
    ASSERT_TRUE(c) << c.error().message;
    stage::SelfComm comm;
    stage::StageOptions opt;
    opt.pre = stage::Validate::recorded;
    opt.selection.max_file_size = 1024;
    const stage::StageEndpoint ep{"many", stage::join_path((*c)->store_root(), "many"), true};
    auto rep = stage::stage_transfer(comm, &source, (*c)->store(), opt, ep);
    ASSERT_TRUE(rep.ok) << (rep.errors.empty() ? "" : rep.errors.front());
    EXPECT_EQ(rep.published.size(), 20U);
    EXPECT_EQ((*c)->usage().unsynced, 20U);
    left = read_file(path("node/unsynced"));
    EXPECT_NE(left.find("many/f7" + std::string(1, '\0')), std::string::npos);
    (*c)->sync_unsynced();
    EXPECT_EQ((*c)->usage().unsynced, 0U);
    EXPECT_EQ((*c)->usage().synced_later, 20U);
  }
  EXPECT_FALSE(fs::exists(path("node/unsynced")));  // a clean stop leaves no log
  // As if the machine had crashed before the background sync: the next start after a reboot
  // removes the batch's copies (and drops them from the index).
  const std::string boot = UnsyncedLog::current_boot_id();
  left.replace(left.find(boot), boot.size(), "an-earlier-boot");
  std::ofstream(path("node/unsynced"), std::ios::binary) << left;
  auto c = NodeCache::open(path("node"));
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_TRUE((*c)->recovered().other_boot);
  EXPECT_EQ((*c)->recovered().removed, 20U);
  EXPECT_EQ((*c)->usage().files, 0U);
  EXPECT_FALSE(fs::exists(path("node/data/many/f7")));
}

}  // namespace
}  // namespace stagefs
