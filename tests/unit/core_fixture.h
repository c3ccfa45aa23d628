// A StageFsCore over a fresh source directory (TmpDirTest's SOURCE/src) and cache, for the
// tests of what the core answers without a mount group: the materializer fails every copy.
#pragma once

#include <memory>
#include <string>

#include "fusefs/cache/cache.h"
#include "fusefs/core/core.h"
#include "tmpdir.h"

namespace stagefs::testing {

// Every copy fails: for tests of lookups, listings, access and limits.
class NoMaterializer final : public Materializer {
 public:
  void materialize_async(const std::string& rel, const Want&, Done done) override {
    done(stage::sys_error(EIO, "no group in this test", rel));
  }
};

class CoreFixture : public stage::testing::TmpDirTest {
 protected:
  // The cache (SetUp); the core with `cfg` (its source_dir set to src/ when empty).
  void SetUp() override {
    TmpDirTest::SetUp();
    auto c = NodeCache::open(path("cache"));
    ASSERT_TRUE(c) << c.error().message;
    cache_ = std::move(c.value());
  }
  void make_core(CoreConfig cfg = {}) {
    if (cfg.source_dir.empty()) cfg.source_dir = path("src");
    auto core = StageFsCore::create(cfg, *cache_, mat_);
    ASSERT_TRUE(core) << core.error().message;
    core_ = std::move(core.value());
  }
  void TearDown() override {
    core_.reset();
    cache_.reset();
    TmpDirTest::TearDown();
  }
  NoMaterializer mat_;
  std::unique_ptr<NodeCache> cache_;
  std::unique_ptr<StageFsCore> core_;
};

}  // namespace stagefs::testing
