// The holding decorators (bcast/holds/holds.h) around a real one-rank transfer: where each point
// stops the copy, what is on disk there, and how the environment selects them.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "bcast/comm/comm.h"
#include "bcast/holds/holds.h"
#include "bcast/transfer/engine.h"
#include "fakes.h"
#include "fusefs/cache/copy_xattrs.h"
#include "tmpdir.h"

namespace stage::testing {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kHoldChunk = 65536;

class HoldingTest : public TmpDirTest {
 protected:
  void SetUp() override {
    TmpDirTest::SetUp();
    data_ = random_bytes(5 * kHoldChunk + 123, 7);  // six chunks
    write_file(path("src.bin"), data_);
  }
  void TearDown() override {
    for (const char* v :
         {"STAGE_TEST_HOLD", "STAGE_TEST_HOLD_RANK", "STAGE_TEST_HOLD_FILE", "STAGE_TEST_HOLD_BLOCK"})
      ::unsetenv(v);
    TmpDirTest::TearDown();
  }
  StageReport copy(SourceReader& src, LocalStore& store, const std::string& name = "copy.bin") {
    SelfComm comm;
    StageOptions opt;
    opt.chunk_size = kHoldChunk;
    return stage_transfer(comm, &src, store, opt, StageEndpoint{path("src.bin"), path("node/" + name), true});
  }
  // What the node's directory holds while the copy is held.
  struct Seen {
    std::string temp;  // the temporary file's bytes ("" none)
    int temps = 0;
    bool published = false;
  };
  Seen look(const std::string& name = "copy.bin") const {
    Seen s;
    if (!fs::exists(path("node"))) return s;
    for (const auto& e : fs::directory_iterator(path("node"))) {
      if (!is_temp_name(e.path().filename().string())) continue;
      ++s.temps;
      s.temp = read_file(e.path().string());
    }
    s.published = fs::exists(path("node/" + name));
    return s;
  }
  // Copies the source through a store held at `at`: held once, on one temporary file and
  // nothing published, then the whole copy published. Returns the temporary file's bytes then.
  std::string temp_when_held_at(StoreHold at) {
    std::vector<Seen> seen;
    HoldingStore store(posix_store_, at, [&] { seen.push_back(look()); });
    EXPECT_TRUE(copy(posix_src_, store).ok);
    EXPECT_EQ(read_file(path("node/copy.bin")), data_);
    if (seen.size() != 1) {
      ADD_FAILURE() << "held " << seen.size() << " times";
      return "(not held once)";
    }
    EXPECT_EQ(seen[0].temps, 1);
    EXPECT_FALSE(seen[0].published);
    return seen[0].temp;
  }
  std::string data_;
  PosixSource posix_src_;
  PosixStore posix_store_{StoreOptions{.xattrs = stagefs::kCopyXattrs}};
};

TEST_F(HoldingTest, BeforeFirstChunkHoldsTheWriterOnAnEmptyTemporaryFile) {
  EXPECT_EQ(temp_when_held_at(StoreHold::before_first_write), "");
}

TEST_F(HoldingTest, MidFileHoldsTheWriterWithTwoChunksWritten) {
  EXPECT_EQ(temp_when_held_at(StoreHold::before_third_write), data_.substr(0, 2 * kHoldChunk));
}

TEST_F(HoldingTest, BeforeRenameHoldsOnACompleteUnpublishedCopy) {
  EXPECT_EQ(temp_when_held_at(StoreHold::before_commit), data_);
}

TEST_F(HoldingTest, ReaderMidFileHoldsTheSourceAfterTwoChunks) {
  SourceFaults counted;
  FaultSource src(counted);
  std::vector<uint64_t> read_at_hold;
  HoldingSource held(src, [&] { read_at_hold.push_back(counted.bytes_read); });
  ASSERT_TRUE(copy(held, posix_store_).ok);
  EXPECT_EQ(read_at_hold, std::vector<uint64_t>{2 * kHoldChunk});
  EXPECT_EQ(read_file(path("node/copy.bin")), data_);
}

TEST_F(HoldingTest, EveryCopyOfAFileHoldsAgainAndSmallCopiesPassMidFile) {
  int holds = 0;
  HoldingStore store(posix_store_, StoreHold::before_third_write, [&] { ++holds; });
  ASSERT_TRUE(copy(posix_src_, store, "a.bin").ok);
  ASSERT_TRUE(copy(posix_src_, store, "b.bin").ok);
  EXPECT_EQ(holds, 2);
  write_file(path("src.bin"), data_.substr(0, 2 * kHoldChunk));  // two chunks: never a third write
  ASSERT_TRUE(copy(posix_src_, store, "c.bin").ok);
  EXPECT_EQ(holds, 2);
}

TEST_F(HoldingTest, TheEnvironmentChoosesThePointAndTheRank) {
  ::setenv("STAGE_TEST_HOLD", "mid-file", 1);
  ::setenv("STAGE_TEST_HOLD_RANK", "1", 1);
  {
    TestHolds other_rank(posix_store_, posix_src_, 0);
    EXPECT_EQ(&other_rank.store(), &posix_store_);
    EXPECT_EQ(&other_rank.source(), &posix_src_);
  }
  TestHolds mid(posix_store_, posix_src_, 1);
  EXPECT_NE(&mid.store(), &posix_store_);
  EXPECT_EQ(&mid.source(), &posix_src_);
  ::setenv("STAGE_TEST_HOLD", "reader-mid-file", 1);
  TestHolds reader(posix_store_, posix_src_, 1);
  EXPECT_EQ(&reader.store(), &posix_store_);
  EXPECT_NE(&reader.source(), &posix_src_);
  ::setenv("STAGE_TEST_HOLD", "no-such-point", 1);
  TestHolds unknown(posix_store_, posix_src_, 1);
  EXPECT_EQ(&unknown.store(), &posix_store_);
  EXPECT_EQ(&unknown.source(), &posix_src_);
  ::unsetenv("STAGE_TEST_HOLD");
  EXPECT_FALSE(hold_request_from_env(1));
}

TEST_F(HoldingTest, ABlockingHoldWaitsOnlyItsThreadUntilTheFileIsRemoved) {
  ::setenv("STAGE_TEST_HOLD", "before-rename", 1);
  ::setenv("STAGE_TEST_HOLD_FILE", path("held").c_str(), 1);
  ::setenv("STAGE_TEST_HOLD_BLOCK", "1", 1);
  const auto req = hold_request_from_env(0);
  ASSERT_TRUE(req);
  EXPECT_TRUE(req->block);
  std::atomic<bool> returned{false};
  std::thread t([&, hold = hold_action(*req)] {
    hold();
    returned = true;
  });
  // Bounded wait for the hold to be reached (it creates the file).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!fs::exists(path("held")) && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  const bool reached = fs::exists(path("held"));
  EXPECT_FALSE(returned);
  fs::remove(path("held"));
  t.join();
  EXPECT_TRUE(reached);
  EXPECT_TRUE(returned);
}

}  // namespace
}  // namespace stage::testing
