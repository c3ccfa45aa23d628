// LiveFile (fusefs/live.h): reads of a copy in progress, without a mount or MPI. The
// temporary file is a real one (PosixStore's Txn); the test plays the engine's writer.
#include "fusefs/live.h"

#include <gtest/gtest.h>

#include <optional>

#include "bcast/store.h"
#include "tmpdir.h"

namespace stagefs {
namespace {

using stage::testing::TmpDirTest;

class LiveFileTest : public TmpDirTest {
 protected:
  static constexpr uint64_t kChunk = 4096;
  void SetUp() override {
    TmpDirTest::SetUp();
    data_ = random_bytes(10 * kChunk + 123, 3);  // 11 chunks, the last one short
    auto t = store_.begin(path("copy"));
    ASSERT_TRUE(t);
    txn_ = std::move(t.value());
    meta_.size = data_.size();
    live_->started(meta_, kChunk, *txn_);
  }
  void TearDown() override {
    live_.reset();
    txn_.reset();
    TmpDirTest::TearDown();
  }
  // The writer: chunk i into the temporary file (or a hole), then tells the LiveFile.
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
    LiveFile* live = live_.get();
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

  stage::PosixStore store_{stage::StoreOptions{false, 0700}};
  std::unique_ptr<stage::Txn> txn_;
  stage::FileMeta meta_{};
  std::string data_;
  std::unique_ptr<LiveFile> live_ = std::make_unique<LiveFile>();
};

TEST_F(LiveFileTest, AWrittenRangeIsReadAtOnceAndTheRestWaitsForItsChunks) {
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

TEST_F(LiveFileTest, AHoleReadsAsZeros) {
  write_chunk(3, true);
  auto r = read(3 * kChunk, kChunk);
  ASSERT_TRUE(r->got && r->got->ok());
  EXPECT_EQ(r->got->value(), std::string(kChunk, '\0'));
}

// A failed copy: the reads that wait fail (EIO), later reads too, and the temporary file's
// descriptor is closed at once, so its space is freed while handles stay open.
TEST_F(LiveFileTest, AFailedCopyFailsItsReadsAndFreesItsSpace) {
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

TEST_F(LiveFileTest, NotReadyBeforeTheTransferStarts) {
  LiveFile fresh;
  EXPECT_FALSE(fresh.ready());
  int started = 0;
  LiveFile counted([&] { ++started; });
  counted.started(meta_, kChunk, *txn_);
  EXPECT_EQ(started, 1);
  EXPECT_TRUE(counted.ready());
  // One chunk or less: the copy is complete one chunk later anyway; opens wait for it.
  LiveFile one([&] { ++started; });
  stage::FileMeta small = meta_;
  small.size = kChunk;
  one.started(small, kChunk, *txn_);
  EXPECT_FALSE(one.ready());
  EXPECT_EQ(started, 1);
}

}  // namespace
}  // namespace stagefs
