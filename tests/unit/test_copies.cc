// NodeCopies as the daemon wires it: one object that is both the core's cache room and the
// group's Admission. What the group tells it around a transfer or a batch is what the core's
// next open finds.
#include <fcntl.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>

#include "bcast/comm/comm.h"
#include "fusefs/cache/cache.h"
#include "fusefs/cache/copies.h"
#include "fusefs/core/core.h"
#include "fusefs/group/group.h"
#include "source_cache.h"
#include "tmpdir.h"

namespace stagefs {
namespace {

constexpr uint64_t kSmallFile = 65536;

class CopiesTest : public testing::SourceCacheTest {
 protected:
  void SetUp() override {
    TmpDirTest::SetUp();
    for (const char* n : {"a", "b", "c"})
      write_file(path(std::string("src/dir/") + n), random_bytes(1000, 1));
    write_file(path("src/dir/large"), random_bytes(3 * kSmallFile, 2));
    open_source_and_cache();
  }
  // A group of one rank and a core over one NodeCopies, as the daemon makes them; the service
  // thread runs while it lives (also when a test fails).
  struct Mount {
    explicit Mount(CopiesTest& t)
        : copies(std::make_shared<NodeCopies>(*t.cache_, room_config(t))),
          group(comm, ctl, *t.source_, t.cache_->store(), group_config(t, copies)),
          service([this] { EXPECT_TRUE(group.run().ok()); }) {
      CoreConfig cc{t.path("src"), StallPolicy::eio};
      cc.small_file_size = kSmallFile;
      auto c = StageFsCore::create(cc, *copies, group);
      EXPECT_TRUE(c) << c.error().message;
      if (c) core = std::move(c.value());
    }
    ~Mount() {
      if (core) core->stop();
      core.reset();
      group.request_shutdown();
      service.join();
    }
    Mount(const Mount&) = delete;
    Mount& operator=(const Mount&) = delete;
    static NodeCopies::Config room_config(CopiesTest& t) {
      NodeCopies::Config c;
      c.source_root = t.root_.get();
      c.small_file_size = kSmallFile;
      return c;
    }
    static GroupConfig group_config(CopiesTest& t, std::shared_ptr<NodeCopies> admission) {
      GroupConfig g;
      g.source_dir = t.path("src");
      g.cache_dir = t.cache_->store_root();
      g.bcast.chunk_size = kSmallFile;
      g.idle_poll = std::chrono::milliseconds(5);
      g.small_file_size = kSmallFile;
      g.admission = std::move(admission);
      return g;
    }
    uint64_t lookup(uint64_t parent, const std::string& name) {
      auto r = core->lookup(parent, name);
      EXPECT_TRUE(r) << name << ": " << r.error().message;
      return r ? r->first : 0;
    }
    std::shared_ptr<NodeCopies> copies;
    stage::SelfComm comm;
    LocalControlPlane ctl;
    GroupService group;
    std::thread service;
    std::unique_ptr<StageFsCore> core;
  };
};

// The batch's copies were checked while written: its admission trusts them, so the open of a
// second file of the batch is served at once, with no CRC read-back.
TEST_F(CopiesTest, ABatchsCopiesAreTrustedThroughItsAdmissionNotReadBack) {
  Mount m(*this);
  ASSERT_TRUE(m.core);
  const uint64_t dir = m.lookup(StageFsCore::kRootId, "dir");
  auto a = m.core->open(m.lookup(dir, "a"), O_RDONLY);
  ASSERT_TRUE(a) << a.error().message;
  auto b = m.core->open(m.lookup(dir, "b"), O_RDONLY);
  ASSERT_TRUE(b) << b.error().message;
  EXPECT_TRUE(b->cache_hit);
  EXPECT_EQ(m.group.stats().batches, 1U);
  EXPECT_EQ(m.core->copy_counters().verified.load(), 0U) << "a batch's copy was read back for its CRC";
  m.core->release(a->pinned);
  m.core->release(b->pinned);
}

// A transfer's copy joins the cache's index through the admission after it (its bytes count
// against the limit, it may be evicted).
TEST_F(CopiesTest, ATransfersCopyJoinsTheIndexThroughItsAdmission) {
  Mount m(*this);
  ASSERT_TRUE(m.core);
  const uint64_t dir = m.lookup(StageFsCore::kRootId, "dir");
  auto f = m.core->open(m.lookup(dir, "large"), O_RDONLY);
  ASSERT_TRUE(f) << f.error().message;
  EXPECT_EQ(m.group.stats().batches, 0U);
  EXPECT_EQ(cache_->usage().files, 1U);
  m.core->release(f->pinned);
}

}  // namespace
}  // namespace stagefs
