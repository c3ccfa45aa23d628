// A source directory (src/) and a node cache (cache/) in a test's temporary directory: what the
// group and the core stand on in the unit tests. A test's SetUp makes its source files, then
// calls open_source_and_cache(); TearDown closes them in the order they depend on each other.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>

#include <memory>

#include "bcast/io/fd.h"
#include "fusefs/base/beneath.h"
#include "fusefs/cache/cache.h"
#include "tmpdir.h"

namespace stagefs::testing {

class SourceCacheTest : public stage::testing::TmpDirTest {
 protected:
  void open_source_and_cache() {
    auto c = NodeCache::open(path("cache"));
    ASSERT_TRUE(c) << c.error().message;
    cache_ = std::move(c.value());
    root_ = stage::Fd(::open(path("src").c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    source_ = std::make_unique<BeneathSource>(root_.get());
  }
  void TearDown() override {
    source_.reset();
    cache_.reset();
    root_.reset();
    TmpDirTest::TearDown();
  }

  std::unique_ptr<NodeCache> cache_;
  stage::Fd root_;
  std::unique_ptr<BeneathSource> source_;
};

}  // namespace stagefs::testing
