// LiveCopy (fusefs/core/live.h): reads of a copy in progress, without a mount or MPI. The
// temporary file is a real one (PosixStore's Txn); the test plays the engine's writer.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <functional>
#include <optional>

#include "bcast/io/store.h"
#include "fusefs/cache/cache.h"
#include "fusefs/cache/copy_xattrs.h"
#include "fusefs/core/core.h"
#include "fusefs/core/live.h"
#include "tmpdir.h"

namespace stagefs {
namespace {

using stage::testing::TmpDirTest;

class LiveCopyTest : public TmpDirTest {
 protected:
  static constexpr uint64_t kChunk = 4096;
  void SetUp() override {
    TmpDirTest::SetUp();
    data_ = random_bytes(10 * kChunk + 123, 3);  // 11 chunks, the last one short
    auto t = store_.begin(path("copy"));
    ASSERT_TRUE(t);
    txn_ = std::move(t.value());
    meta_.size = data_.size();
    live_->started(meta_, kChunk, {}, *txn_);
  }
  void TearDown() override {
    live_.reset();
    txn_.reset();
    TmpDirTest::TearDown();
  }
  // The writer: chunk i into the temporary file (or a hole), then tells the LiveCopy.
  void write_chunk(uint64_t i, bool zero = false) {
    const uint64_t off = i * kChunk;
    const uint64_t len = std::min<uint64_t>(kChunk, data_.size() - off);
    if (!zero) {
      ASSERT_TRUE(txn_->write(off, std::as_bytes(std::span(data_.data() + off, len))));
    }
    live_->chunk_written(i, zero);
  }
  // A read's outcome: nullopt while it waits.
  struct Reader {
    std::optional<stage::Result<std::string>> got;
  };
  // As the core does: read at once if the range is here, else when `ready` says so.
  std::shared_ptr<Reader> read(uint64_t off, size_t n) {
    auto r = std::make_shared<Reader>();
    LiveCopy* live = live_.get();
    auto finish = [live, off, n](std::error_code ec) -> stage::Result<std::string> {
      if (ec) return stage::Error{ec, "read"};
      return live->read(off, n);
    };
    auto now = live_->await(off, n, [r, finish](std::error_code ec) { r->got = finish(ec); });
    if (now) r->got = finish(*now);
    return r;
  }
  std::vector<uint64_t> wanted() {
    std::vector<uint64_t> w;
    live_->take_wanted(w);
    return w;
  }

  stage::PosixStore store_{stage::StoreOptions{false, 0700, stagefs::kCopyXattrs}};
  std::unique_ptr<stage::Txn> txn_;
  stage::FileMeta meta_{};
  std::string data_;
  std::unique_ptr<LiveCopy> live_ = std::make_unique<LiveCopy>();
};

TEST_F(LiveCopyTest, AWrittenRangeIsReadAtOnceAndTheRestWaitsForItsChunks) {
  EXPECT_TRUE(live_->ready());
  write_chunk(0);
  write_chunk(1);
  auto head = read(100, 5000);  // within chunks 0 and 1
  ASSERT_TRUE(head->got && head->got->ok());
  EXPECT_EQ(head->got->value(), data_.substr(100, 5000));
  EXPECT_TRUE(wanted().empty());
  // Straddling the written edge: waits for chunk 2 only, and asks for it once.
  auto edge = read(2 * kChunk - 10, 20);
  auto again = read(2 * kChunk + 5, 10);
  EXPECT_FALSE(edge->got);
  EXPECT_FALSE(again->got);
  EXPECT_EQ(wanted(), std::vector<uint64_t>{2});
  // The tail first: asks for the last chunk (before the middle).
  auto tail = read(data_.size() - 50, 4096);
  EXPECT_EQ(wanted(), std::vector<uint64_t>{10});
  write_chunk(10);
  ASSERT_TRUE(tail->got && tail->got->ok());
  EXPECT_EQ(tail->got->value(), data_.substr(data_.size() - 50));  // short at the end of the file
  EXPECT_FALSE(edge->got);
  write_chunk(2);
  ASSERT_TRUE(edge->got && edge->got->ok());
  EXPECT_EQ(edge->got->value(), data_.substr(2 * kChunk - 10, 20));
  ASSERT_TRUE(again->got && again->got->ok());
  EXPECT_EQ(again->got->value(), data_.substr(2 * kChunk + 5, 10));
  auto past = read(data_.size(), 100);
  ASSERT_TRUE(past->got && past->got->ok());
  EXPECT_EQ(past->got->value(), "");
  EXPECT_EQ(live_->stats().reads_waited, 3U);
}

TEST_F(LiveCopyTest, AHoleReadsAsZeros) {
  write_chunk(3, true);
  auto r = read(3 * kChunk, kChunk);
  ASSERT_TRUE(r->got && r->got->ok());
  EXPECT_EQ(r->got->value(), std::string(kChunk, '\0'));
}

// A failed copy: the reads that wait fail (EIO), later reads too, and the temporary file's
// descriptor is closed at once, so its space is freed while handles stay open.
TEST_F(LiveCopyTest, AFailedCopyFailsItsReadsAndFreesItsSpace) {
  write_chunk(0);
  write_chunk(5);
  auto present = read(5 * kChunk + 1, 100);
  ASSERT_TRUE(present->got && present->got->ok());
  EXPECT_EQ(present->got->value(), data_.substr(5 * kChunk + 1, 100));
  auto waiting = read(6 * kChunk, 100);
  EXPECT_FALSE(waiting->got);
  txn_->abort();  // the engine removes the temporary file
  const int fds = stage::testing::open_fd_count();
  live_->end(false);
  EXPECT_EQ(stage::testing::open_fd_count(), fds - 1);  // nothing holds the unlinked copy
  ASSERT_TRUE(waiting->got);
  ASSERT_FALSE(waiting->got->ok());
  EXPECT_EQ(waiting->got->error().to_errno(), EIO);
  for (uint64_t off : {7 * kChunk, 5 * kChunk}) {
    auto later = read(off, 100);
    ASSERT_TRUE(later->got && !later->got->ok());
    EXPECT_EQ(later->got->error().to_errno(), EIO);
  }
  EXPECT_FALSE(live_->ready());  // no new open takes a failed copy
  EXPECT_EQ(live_->stats().reads_failed, 3U);
}

// A late failure (the watchdog's, after the transfer ended well) must not close a good copy.
TEST_F(LiveCopyTest, TheFirstOutcomeStands) {
  for (uint64_t i = 0; i < 11; ++i) write_chunk(i);
  live_->end(true);
  live_->end(false);
  EXPECT_TRUE(live_->ready());
  auto r = read(3 * kChunk + 7, 100);
  ASSERT_TRUE(r->got && r->got->ok());
  EXPECT_EQ(r->got->value(), data_.substr(3 * kChunk + 7, 100));
}

TEST_F(LiveCopyTest, NotReadyBeforeTheTransferStarts) {
  LiveCopy fresh;
  EXPECT_FALSE(fresh.ready());
  int started = 0;
  LiveCopy counted([&] { ++started; });
  counted.started(meta_, kChunk, {}, *txn_);
  EXPECT_EQ(started, 1);
  EXPECT_TRUE(counted.ready());
  // One chunk or less: the copy is complete one chunk later anyway; opens wait for it.
  LiveCopy one([&] { ++started; });
  stage::FileMeta small = meta_;
  small.size = kChunk;
  one.started(small, kChunk, {}, *txn_);
  EXPECT_FALSE(one.ready());
  EXPECT_EQ(started, 1);
}

}  // namespace
}  // namespace stagefs

namespace stagefs {
namespace {

// The core's early open (StageFsCore::materialize) over a materializer that answers
// with a LiveCopy of a given version: a node compares the version being copied with the one
// it looked up by size, times and inode. The device number is each node's own (NFS, Lustre),
// so a different one must not make early opens fail with ESTALE; a different inode must.
class EarlyMaterializer final : public Materializer {
 public:
  EarlyMaterializer(stage::LocalStore& store, std::string temp, stage::FileMeta meta)
      : store_(store), temp_(std::move(temp)), meta_(meta) {}
  void materialize_async(const std::string& rel, const Want&, Done done) override {
    done(stage::sys_error(EIO, "not in this test", rel));
  }
  void materialize_live_async(const std::string& rel, const Want&, Done done, LiveStarted on_live) override {
    auto t = store_.begin(temp_);
    if (!t)
      return done(stage::Error{t.error().code, "begin " + temp_ + " for " + rel + ": " + t.error().message});
    txn_ = std::move(t.value());
    live_ = std::make_shared<LiveCopy>();
    live_->started(meta_, 4096, {}, *txn_);
    on_live(live_);
  }
  std::shared_ptr<LiveCopy> live_;
  std::unique_ptr<stage::Txn> txn_;

 private:
  stage::LocalStore& store_;
  std::string temp_;
  stage::FileMeta meta_;
};

using stage::testing::TmpDirTest;

class LiveOpenTest : public TmpDirTest {
 protected:
  // Opens src/f through a core whose materializer copies `meta` (this node's stat of f, changed
  // by `change`); returns the open's outcome.
  stage::Result<OpenFile> open_with(const std::function<void(stage::FileMeta&)>& change) {
    write_file(path("src/f"), random_bytes(5 * 4096, 4));
    struct stat st {};
    EXPECT_EQ(::stat(path("src/f").c_str(), &st), 0);
    stage::FileMeta meta = stage::meta_from_stat(st);
    change(meta);
    auto cache = NodeCache::open(path("cache"));
    EXPECT_TRUE(cache);
    stage::PosixStore store{stage::StoreOptions{.xattrs = stagefs::kCopyXattrs}};
    std::filesystem::create_directories(path("tmpcopy"));
    EarlyMaterializer mat(store, path("tmpcopy/f"), meta);
    CoreConfig cfg{path("src")};
    cfg.read_during_copy = true;
    auto core = StageFsCore::create(cfg, **cache, mat);
    EXPECT_TRUE(core);
    auto f = (*core)->lookup(StageFsCore::kRootId, "f");
    EXPECT_TRUE(f);
    auto r = (*core)->open(f->first, O_RDONLY);
    if (r) (*core)->release(r->pinned);
    (*core)->stop();
    return r;
  }
};

TEST_F(LiveOpenTest, ADeviceNumberOfAnotherNodeIsTheSameVersion) {
  auto r = open_with([](stage::FileMeta& m) { m.dev += 1; });
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_TRUE(r->live);
}

TEST_F(LiveOpenTest, AnotherInodeIsAnotherVersion) {
  auto r = open_with([](stage::FileMeta& m) { m.ino += 1; });
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().to_errno(), ESTALE);
}

// What readers read is remembered for a profile: each chunk once, in the order readers first
// asked for it, whether it was here or waited; chunks wanted first (a replayed profile's) come
// before any reader's wants.
TEST_F(LiveCopyTest, ReadersFirstReadsAreRememberedInOrderAndChunksWantedFirstLeadTheWants) {
  live_->want_first({9, 4});
  write_chunk(0);
  read(0, 100);                   // here
  read(7 * kChunk + 10, kChunk);  // chunks 7 and 8, waiting
  read(5, 10);                    // chunk 0 again: not repeated
  read(meta_.size + 10, 10);      // past the end: nothing
  EXPECT_EQ(wanted(), (std::vector<uint64_t>{9, 4, 7, 8}));
  const LiveCopy::ReadOrder order = live_->read_order();
  EXPECT_EQ(order.chunk_size, kChunk);
  EXPECT_EQ(order.chunks, (std::vector<uint64_t>{0, 7, 8}));
  for (uint64_t i = 1; i < 11; ++i) write_chunk(i);
  live_->end(true);
  read(3 * kChunk, 1);  // after the copy: still remembered
  EXPECT_EQ(live_->read_order().chunks, (std::vector<uint64_t>{0, 7, 8, 3}));
}

}  // namespace
}  // namespace stagefs
