// Copies found in the cache from an earlier mount are read back for their CRC before they are
// first served: on the core's verifier threads, once however many opens ask; a corrupted or
// unreadable copy is removed and its waiters go on to a new copy; a stop answers the read-backs
// not started without reading them.
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
#include "tmpdir.h"

namespace stagefs {
namespace {

using testing::BatchEnds;
using testing::BatchTest;
namespace fs = std::filesystem;
using testing::kSmall;

// A copy from an earlier mount is read back for its CRC on the core's verifier threads, once
// however many opens ask: the opens of that copy wait for the one read, and the completion
// pool (here one thread) keeps answering other files meanwhile. The read-backs are held by the
// core's CopyReader (a fake), so nothing depends on timing.
class NoCopies final : public Materializer {
 public:
  void materialize_async(const std::string& rel, const Want&, Done done) override {
    asked.push_back(rel);  // the completion pool's one thread
    done(stage::sys_error(EIO, "no copies in this test", rel));
  }
  std::vector<std::string> asked;
};

// A core over the cache (into `core`) whose CRC read-backs (it is their CopyReader) wait until
// let_go(), with one completion thread and NoCopies as its materializer. Its end lets them go
// and stops the core before the answers and the materializer go, however the test ends.
class HeldReadBacks final : public CopyReader {
 public:
  HeldReadBacks(std::unique_ptr<StageFsCore>& core, const std::string& src, NodeCache& cache,
                int verify_threads = 2)
      : core_(core) {
    CoreConfig cc{src, StallPolicy::eio};
    cc.completion_threads = 1;
    cc.verify_threads = verify_threads;
    auto c = StageFsCore::create(cc, cache, mat, *this);
    if (c)
      core_ = std::move(c.value());
    else
      ADD_FAILURE() << c.error().message;
  }
  ~HeldReadBacks() override {
    let_go();
    core_.reset();  // stopped and gone with the reader it uses
  }
  stage::Result<uint64_t> crc(int fd, const std::string& rel) override {
    {
      std::unique_lock lk(m_);
      started_.push_back(rel);
      cv_.notify_all();
      cv_.wait(lk, [&] { return go_; });
      if (unreadable_.contains(rel)) return stage::sys_error(EIO, "read back (injected)", rel);
    }
    return disk_copy_reader().crc(fd, rel);
  }
  void stopping() override { let_go(); }  // a stop lets the held read-backs go
  HeldReadBacks(const HeldReadBacks&) = delete;
  HeldReadBacks& operator=(const HeldReadBacks&) = delete;
  // Whether n read-backs have started (60 s is only a bound).
  bool started(size_t n) {
    std::unique_lock lk(m_);
    return cv_.wait_for(lk, std::chrono::seconds(60), [&] { return started_.size() >= n; });
  }
  std::vector<std::string> names() {
    std::lock_guard lk(m_);
    return started_;
  }
  void let_go() {
    std::lock_guard lk(m_);
    go_ = true;
    cv_.notify_all();
  }
  // The read-back of rel's copy fails as an I/O error would (before the core starts).
  void unreadable(const std::string& rel) {
    std::lock_guard lk(m_);
    unreadable_.insert(rel);
  }
  std::future<stage::Result<OpenFile>> open(uint64_t id) {
    auto& p = answers_.emplace_back();  // a deque: the promises already handed out stay put
    core_->open_async(id, O_RDONLY, Caller{}, [&p](stage::Result<OpenFile> r) { p.set_value(std::move(r)); });
    return p.get_future();
  }
  NoCopies mat;

 private:
  std::unique_ptr<StageFsCore>& core_;
  std::mutex m_;
  std::condition_variable cv_;
  std::vector<std::string> started_;
  bool go_ = false;
  std::set<std::string> unreadable_;
  std::deque<std::promise<stage::Result<OpenFile>>> answers_;
};

TEST_F(BatchTest, CrcReadBacksRunApartFromOtherOpensAndOncePerCopy) {
  fs::create_directories(path("src/big"));
  const std::string a = random_bytes(3 * kSmall, 7), b = random_bytes(2 * kSmall, 8);
  write_file(path("src/big/a"), a);
  write_file(path("src/big/b"), b);
  write_file(path("src/big/c"), random_bytes(2 * kSmall, 9));
  copy_in_an_earlier_mount("big", {"a", "b"});
  HeldReadBacks held(core_, path("src"), *cache_);
  ASSERT_TRUE(core_);
  const uint64_t dir = lookup(StageFsCore::kRootId, "big");
  const uint64_t ida = lookup(dir, "a"), idb = lookup(dir, "b"), idc = lookup(dir, "c");
  auto a1 = held.open(ida);
  auto b1 = held.open(idb);
  ASSERT_TRUE(held.started(2)) << "the read-backs did not both start: they hold the completion pool";
  auto a2 = held.open(ida);
  auto a3 = held.open(ida);
  auto c1 = held.open(idc);
  // The pool's one thread took a2 and a3 before c1: c1's answer means they have been seen.
  ASSERT_EQ(c1.wait_for(std::chrono::seconds(60)), std::future_status::ready)
      << "an open of another file waited for the CRC read-backs";
  auto rc = c1.get();
  ASSERT_FALSE(rc);
  EXPECT_EQ(rc.error().to_errno(), EIO);
  EXPECT_EQ(held.mat.asked, std::vector<std::string>{"big/c"});
  EXPECT_EQ(core_->copy_counters().verify_waits.load(), 2U);
  EXPECT_EQ(a2.wait_for(std::chrono::seconds(0)), std::future_status::timeout)
      << "served before its CRC was read";
  held.let_go();
  for (auto* f : {&a1, &a2, &a3, &b1}) {
    ASSERT_EQ(f->wait_for(std::chrono::seconds(60)), std::future_status::ready)
        << "an open was never answered";
    auto r = f->get();
    ASSERT_TRUE(r) << r.error().message;
    EXPECT_EQ(read_fd(r->fd.get()), f == &b1 ? b : a);
    EXPECT_TRUE(r->cache_hit);
    core_->release(r->pinned);
  }
  auto checked = held.names();
  std::sort(checked.begin(), checked.end());
  EXPECT_EQ(checked, (std::vector<std::string>{"big/a", "big/b"})) << "a copy was read back more than once";
  EXPECT_EQ(core_->copy_counters().verified.load(), 2U);
  EXPECT_EQ(core_->counters().materializations.load(), 1U);  // c only
}

// Three opens of a copy (ida) while its read-back is held (the first starts it; the two others are
// known to wait for it once an open of another file (idc), answered by the pool's one thread
// after them, is answered), then the read-back is let go. Each must be answered with NoCopies' EIO: sent
// on to a new copy, not served.
void three_opens_go_to_new_copies(HeldReadBacks& held, uint64_t ida, uint64_t idc, const char* served) {
  std::vector<std::future<stage::Result<OpenFile>>> f;
  f.push_back(held.open(ida));
  ASSERT_TRUE(held.started(1));  // the read-back runs before the others ask
  f.push_back(held.open(ida));
  f.push_back(held.open(ida));
  auto c = held.open(idc);
  ASSERT_EQ(c.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  held.let_go();
  for (auto& x : f) {
    ASSERT_EQ(x.wait_for(std::chrono::seconds(60)), std::future_status::ready)
        << "an open was never answered";
    auto r = x.get();
    ASSERT_FALSE(r) << served;
    EXPECT_EQ(r.error().to_errno(), EIO);
  }
}

// A corrupted copy from an earlier mount, asked for by three opens while its one read-back
// runs: it is removed once, and every one of them goes on to a new copy; none reads it back.
TEST_F(BatchTest, ACorruptedCopyFoundByOneReadBackSendsItsWaitersToANewCopy) {
  fs::create_directories(path("src/big"));
  write_file(path("src/big/a"), random_bytes(3 * kSmall, 7));
  write_file(path("src/big/c"), random_bytes(2 * kSmall, 9));
  copy_in_an_earlier_mount("big", {"a"});
  {  // one byte of the copy changed, its times kept: to the cache's validity rule it is current
    stage::Fd f(::open((cache_->store_root() + "/big/a").c_str(), O_RDWR | O_CLOEXEC));
    ASSERT_TRUE(f.valid());
    struct stat st {};
    ASSERT_EQ(::fstat(f.get(), &st), 0);
    char byte = 0;
    ASSERT_EQ(::pread(f.get(), &byte, 1, 1000), 1);
    byte = static_cast<char>(~byte);
    ASSERT_EQ(::pwrite(f.get(), &byte, 1, 1000), 1);
    const struct timespec times[2] = {st.st_atim, st.st_mtim};
    ASSERT_EQ(::futimens(f.get(), times), 0);
  }
  HeldReadBacks held(core_, path("src"), *cache_);
  ASSERT_TRUE(core_);
  const uint64_t dir = lookup(StageFsCore::kRootId, "big");
  ASSERT_NO_FATAL_FAILURE(
      three_opens_go_to_new_copies(held, lookup(dir, "a"), lookup(dir, "c"), "a corrupted copy was served"));
  EXPECT_EQ(held.names().size(), 1U);
  EXPECT_EQ(core_->copy_counters().corrupt.load(), 1U);
  EXPECT_EQ(core_->copy_counters().verify_waits.load(), 2U);
  EXPECT_EQ(held.mat.asked, (std::vector<std::string>{"big/c", "big/a", "big/a", "big/a"}));
  EXPECT_FALSE(fs::exists(cache_->store_root() + "/big/a")) << "the corrupted copy was left in the cache";
}

// A mount that stops while a read-back runs and another waits for a verifier: the running one
// ends (a read in progress is not cut), the waiting one is never started, and its open is
// answered ESHUTDOWN instead of holding the unmount for the read of a whole copy.
TEST_F(BatchTest, AStopAnswersTheReadBacksNotStartedWithoutReadingThem) {
  fs::create_directories(path("src/big"));
  const std::string a = random_bytes(3 * kSmall, 7);
  write_file(path("src/big/a"), a);
  write_file(path("src/big/b"), random_bytes(2 * kSmall, 8));
  copy_in_an_earlier_mount("big", {"a", "b"});
  HeldReadBacks held(core_, path("src"), *cache_, /*verify_threads=*/1);
  ASSERT_TRUE(core_);
  const uint64_t dir = lookup(StageFsCore::kRootId, "big");
  auto fa = held.open(lookup(dir, "a"));
  ASSERT_TRUE(held.started(1));  // the one verifier holds a's read-back: b's waits behind it
  auto fb = held.open(lookup(dir, "b"));
  std::thread stopper([&] { core_->stop(); });  // lets a's read-back go once none may start
  stopper.join();
  ASSERT_EQ(fa.wait_for(std::chrono::seconds(0)), std::future_status::ready);
  ASSERT_EQ(fb.wait_for(std::chrono::seconds(0)), std::future_status::ready)
      << "the stop left an open unanswered";
  auto ra = fa.get();
  ASSERT_TRUE(ra) << ra.error().message;
  EXPECT_EQ(read_fd(ra->fd.get()), a);
  core_->release(ra->pinned);
  auto rb = fb.get();
  ASSERT_FALSE(rb) << "a read-back started after the stop";
  EXPECT_EQ(rb.error().to_errno(), ESHUTDOWN);
  EXPECT_EQ(held.names(), std::vector<std::string>{"big/a"});
  EXPECT_TRUE(held.mat.asked.empty());
  EXPECT_TRUE(fs::exists(cache_->store_root() + "/big/b")) << "a copy that was not read was removed";
}

// A copy whose read-back fails (an I/O error on the cache's disk), asked for by three opens:
// it is removed (nothing is served from a disk that cannot read it), and every one of them
// goes on to a new copy; none reads it back again.
TEST_F(BatchTest, AnUnreadableCopySendsItsWaitersToANewCopy) {
  fs::create_directories(path("src/big"));
  write_file(path("src/big/a"), random_bytes(3 * kSmall, 7));
  write_file(path("src/big/c"), random_bytes(2 * kSmall, 9));
  copy_in_an_earlier_mount("big", {"a"});
  HeldReadBacks held(core_, path("src"), *cache_);
  ASSERT_TRUE(core_);
  held.unreadable("big/a");
  const uint64_t dir = lookup(StageFsCore::kRootId, "big");
  ASSERT_NO_FATAL_FAILURE(three_opens_go_to_new_copies(held, lookup(dir, "a"), lookup(dir, "c"),
                                                       "a copy that could not be read back was served"));
  EXPECT_EQ(held.names().size(), 1U);
  EXPECT_EQ(core_->copy_counters().corrupt.load(), 0U);  // not counted as corrupted: it was not read
  EXPECT_EQ(core_->copy_counters().verified.load(), 0U);
  EXPECT_EQ(held.mat.asked, (std::vector<std::string>{"big/c", "big/a", "big/a", "big/a"}));
  EXPECT_FALSE(fs::exists(cache_->store_root() + "/big/a")) << "the unreadable copy was left in the cache";
}

}  // namespace
}  // namespace stagefs
