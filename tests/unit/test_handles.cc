// HandleLimits (fusefs/core/handles.h): a user's handles (files and directories) up to its limit
// (EMFILE), the descriptors of every user's files up to the room (ENFILE), root without a
// limit of its own, slots given back when dropped (also after the limits are gone); the
// budget made from a descriptor limit; and through StageFsCore, a user's opens and opendirs.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <filesystem>
#include <vector>

#include "core_fixture.h"
#include "fusefs/core/handles.h"

namespace stagefs {
namespace {

namespace fs = std::filesystem;

int err_of(const stage::Result<HandleLimits::Slot>& r) {
  return r ? 0 : r.error().to_errno();
}

TEST(HandleLimitsTest, AUserPastItsLimitGetsEmfileOthersGoOn) {
  HandleLimits limits({3, 100});
  std::vector<HandleLimits::Slot> mine;
  for (int i = 0; i < 3; ++i) mine.push_back(limits.take(1000, i % 2 == 0).value());
  const auto over = limits.take(1000, true);
  EXPECT_EQ(err_of(over), EMFILE);
  EXPECT_NE(over.error().message.find("--max-open-per-user"), std::string::npos) << over.error().message;
  EXPECT_EQ(err_of(limits.take(1000, false)), EMFILE);             // directories count too
  EXPECT_TRUE(limits.take(1001, true));                            // another user
  for (int i = 0; i < 10; ++i) EXPECT_TRUE(limits.take(0, true));  // root: no limit of its own
  EXPECT_EQ(limits.held(1000), 3U);
  EXPECT_EQ(limits.descriptors(), 2U);  // the slots taken and dropped above are back
  mine.pop_back();                      // a handle closed: room for one more
  EXPECT_TRUE(limits.take(1000, true));
}

TEST(HandleLimitsTest, TheRoomForDescriptorsIsSharedAndRootIsInIt) {
  HandleLimits limits({10, 4});
  std::vector<HandleLimits::Slot> held;
  held.push_back(limits.take(1000, true).value());
  held.push_back(limits.take(1001, true).value());
  held.push_back(limits.take(0, true).value());
  held.push_back(limits.take(1002, true).value());
  EXPECT_EQ(err_of(limits.take(1003, true)), ENFILE);
  EXPECT_EQ(err_of(limits.take(0, true)), ENFILE);  // the reserve is the daemon's, root's opens included
  EXPECT_TRUE(limits.take(1003, false));            // a directory holds no descriptor
  held.erase(held.begin());
  EXPECT_TRUE(limits.take(1003, true));
}

TEST(HandleLimitsTest, ASlotMayOutliveItsLimits) {
  HandleLimits::Slot kept;
  {
    HandleLimits limits({1, 1});
    kept = limits.take(1000, true).value();
    HandleLimits::Slot moved = std::move(kept);
    EXPECT_FALSE(kept.held());
    kept = std::move(moved);
  }
  EXPECT_TRUE(kept.held());
  kept.reset();  // no crash, no leak (ASan)
}

TEST(HandleLimitsTest, TheBudgetKeepsAReserveAndRoomForFourUsers) {
  std::string why;
  auto c = descriptor_budget(20000, 4096, why);
  EXPECT_EQ(c.room, 20000U - 2500U);  // an eighth kept
  EXPECT_EQ(c.per_user, 4096U);
  EXPECT_TRUE(why.empty()) << why;
  c = descriptor_budget(1024, 4096, why);  // the usual soft limit, had it not been raised
  EXPECT_EQ(c.room, 512U);                 // at most half kept
  EXPECT_EQ(c.per_user, 128U);             // a quarter of the room
  EXPECT_NE(why.find("lowered to 128"), std::string::npos) << why;
  EXPECT_NE(why.find("ulimit -Hn"), std::string::npos) << why;
  c = descriptor_budget(1 << 20, 4096, why);
  EXPECT_EQ(c.room, (1U << 20) - (1U << 17));
  EXPECT_EQ(c.per_user, 4096U);
}

TEST(HandleLimitsTest, TheSoftDescriptorLimitIsRaisedToTheHardOne) {
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &saved), 0);
  if (saved.rlim_max == RLIM_INFINITY || saved.rlim_max < 2048)
    GTEST_SKIP() << "hard limit " << saved.rlim_max;
  const rlimit low{1024, saved.rlim_max};
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  const uint64_t now = raise_descriptor_limit();
  rlimit after{};
  ::getrlimit(RLIMIT_NOFILE, &after);
  ::setrlimit(RLIMIT_NOFILE, &saved);
  EXPECT_EQ(now, saved.rlim_max);
  EXPECT_EQ(after.rlim_cur, saved.rlim_max);
}

// Through the core: failed opens give their slot back; handles and directory handles count.
class CoreHandlesTest : public testing::CoreFixture {
 protected:
  void SetUp() override {
    CoreFixture::SetUp();
    fs::create_directories(path("src/d"));
    CoreConfig cfg;
    cfg.handles = {2, 100};
    make_core(cfg);
  }
};

TEST_F(CoreHandlesTest, OpensAndOpendirsCountFailedOnesDoNot) {
  // A user (root has no limit of its own): checked as that user when the test runs as root.
  const Caller user = ::geteuid() == 0 ? Caller{1000, 1000, {}} : Caller{::geteuid(), ::getegid(), {}};
  auto d = core_->lookup(StageFsCore::kRootId, "d", user);
  ASSERT_TRUE(d);
  for (int i = 0; i < 5; ++i) {  // failed opens (no materializer) hold nothing
    auto f = core_->open(d->first, O_RDONLY, user);
    ASSERT_FALSE(f);
    EXPECT_NE(f.error().to_errno(), EMFILE);
  }
  auto a = core_->opendir(d->first, user);
  auto b = core_->opendir(d->first, user);
  ASSERT_TRUE(a && b);
  auto c = core_->opendir(d->first, user);
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error().to_errno(), EMFILE);
  auto f = core_->open(d->first, O_RDONLY, user);
  ASSERT_FALSE(f);
  EXPECT_EQ(f.error().to_errno(), EMFILE);
  a->slot.reset();  // released
  EXPECT_TRUE(core_->opendir(d->first, user));
}

}  // namespace
}  // namespace stagefs
