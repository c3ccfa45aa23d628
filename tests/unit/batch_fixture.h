// BatchTest: StageFsCore over a GroupService of one rank (SelfComm + LocalControlPlane) and a
// real cache, over a source directory of 50 small files and one large one (src/many); with
// what the tests of batches, walks, bounded slices and CRC read-backs share: a mount that ends
// in order (core, then group), a count of the batches that ended, names that sort as numbers.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bcast/comm/comm.h"
#include "bcast/io/store.h"
#include "fakes.h"
#include "fusefs/cache/copy_xattrs.h"
#include "fusefs/core/core.h"
#include "fusefs/group/group.h"
#include "group_hooks.h"
#include "source_cache.h"
#include "tmpdir.h"

namespace stagefs::testing {

using stage::testing::TmpDirTest;
namespace fs = std::filesystem;

constexpr uint64_t kSmall = 64 * 1024;

// Rewrites a file in place (same inode; new bytes, mtime and ctime).
inline void rewrite(const std::string& p, const std::string& data) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << data;
}

// Counts the batches that ended (a walk's run in the background) and waits for them.
struct BatchEnds {
  std::mutex m;
  std::condition_variable cv;
  int ended = 0;
  void count_in(GroupConfig& cfg) {
    group_hooks(cfg).on_after_batch = [this, inner = group_hooks(cfg).on_after_batch](
                                          const std::string& dir, const std::vector<std::string>& published,
                                          bool ok) {
      if (inner) inner(dir, published, ok);
      std::lock_guard lk(m);
      ++ended;
      cv.notify_all();
    };
  }
  bool wait_for(int n) {  // 60 s is only a bound
    std::unique_lock lk(m);
    return cv.wait_for(lk, std::chrono::seconds(60), [&] { return ended >= n; });
  }
};

class BatchTest : public testing::SourceCacheTest {
 protected:
  void SetUp() override {
    TmpDirTest::SetUp();
    spdlog::default_logger_raw();
    fs::create_directories(path("src/many"));
    for (int i = 0; i < 50; ++i) {
      small_.push_back(random_bytes(4096 + static_cast<size_t>(i) * 1200, static_cast<uint32_t>(i + 1)));
      write_file(path("src/many") + "/" + name(i), small_.back());
    }
    large_ = random_bytes(kSmall + 1, 99);  // one byte over the threshold
    write_file(path("src/many/large.bin"), large_);
    open_source_and_cache();
  }
  void TearDown() override {
    if (core_) {  // a test that failed before its own end of the mount
      core_->stop();
      core_.reset();
    }
    SourceCacheTest::TearDown();
  }
  // The end of a test's mount: the core first (it calls into the group), then the group's
  // service thread, after a shutdown.
  void stop(GroupService& group, std::thread& service) {
    if (core_) core_->stop();
    {
      const std::lock_guard lk(core_m_);  // the group's hooks may still be running
      core_.reset();
    }
    group.request_shutdown();
    service.join();
  }
  // A mount of one rank (SelfComm): its group's service thread runs while it lives; end() (or
  // the end of its scope, also when a test fails) stops the core first, then the group.
  struct Mount {
    Mount(BatchTest& t, stage::SourceReader& src, GroupConfig cfg)
        : Mount(t, src, t.store_, std::move(cfg)) {}
    Mount(BatchTest& t, stage::SourceReader& src, stage::LocalStore& store, GroupConfig cfg)
        : test(t),
          group(comm, ctl, src, store, std::move(cfg)),
          service([this] { EXPECT_TRUE(group.run().ok()); }) {}
    ~Mount() { end(); }
    Mount(const Mount&) = delete;
    Mount& operator=(const Mount&) = delete;
    void end() {
      if (service.joinable()) test.stop(group, service);
    }
    BatchTest& test;
    stage::SelfComm comm;
    LocalControlPlane ctl;
    GroupService group;
    std::thread service;
  };
  // A mount before the test's copies src/DIR/NAMES into the cache (with their CRC recorded).
  void copy_in_an_earlier_mount(const std::string& dir, const std::vector<std::string>& names) {
    Mount mount(*this, *source_, config());
    make_core(mount.group);
    const uint64_t d = lookup(StageFsCore::kRootId, dir);
    for (const auto& n : names) EXPECT_FALSE(open_and_read(lookup(d, n)).empty()) << n;
  }
  // Opens id through the core and returns its bytes (the test fails on an error).
  std::string open_and_read(uint64_t id) {
    auto r = core_->open(id, O_RDONLY);
    EXPECT_TRUE(r) << (r ? std::string() : r.error().message);
    if (!r) return {};
    std::string out = read_fd(r->fd.get());
    core_->release(r->pinned);
    return out;
  }
  static std::string name(int i) { return std::string(i < 10 ? "s0" : "s").append(std::to_string(i)); }
  // src/DIR (created) holding small files named NAMES, with the bytes of small_[0], [1]...
  void small_dir(const std::string& dir, const std::vector<std::string>& names) {
    fs::create_directories(path("src/" + dir));
    for (size_t i = 0; i < names.size(); ++i) write_file(path("src/" + dir + "/" + names[i]), small_[i]);
  }
  GroupConfig config() {
    GroupConfig g;
    g.source_dir = path("src");
    g.cache_dir = cache_->store_root();
    g.bcast.chunk_size = 65536;
    g.idle_poll = std::chrono::milliseconds(5);
    g.small_file_size = kSmall;
    // As the daemon: published copies join the index and count as verified in this mount.
    group_hooks(g).on_after_batch = [this](const std::string& dir, const std::vector<std::string>& published,
                                           bool) {
      const auto copies = cache_->added_in(dir, published);
      const std::lock_guard lk(core_m_);  // stop() may be ending the core on the test's thread
      if (core_) core_->copies_made(copies);
    };
    return g;
  }
  void make_core(Materializer& mat) {
    CoreConfig cc{path("src"), StallPolicy::eio};
    cc.small_file_size = kSmall;
    auto c = StageFsCore::create(cc, *cache_, mat);
    ASSERT_TRUE(c) << c.error().message;
    core_ = std::move(c.value());
  }
  uint64_t lookup(uint64_t parent, const std::string& n) {
    auto r = core_->lookup(parent, n);
    EXPECT_TRUE(r) << n << ": " << r.error().message;
    return r ? r->first : 0;
  }
  static std::string read_fd(int fd) {
    std::string out;
    char buf[65536];
    for (off_t off = 0;;) {
      const ssize_t n = ::pread(fd, buf, sizeof buf, off);
      if (n <= 0) break;
      out.append(buf, static_cast<size_t>(n));
      off += n;
    }
    return out;
  }

  std::vector<std::string> small_;
  std::string large_;
  std::unique_ptr<StageFsCore> core_;  // destroyed before the group (declared in each test)
  std::mutex core_m_;                  // core_ as config()'s after_batch hook reads it
  stage::PosixStore store_{stage::StoreOptions{.xattrs = stagefs::kCopyXattrs}};
};

// Names that sort as numbers, for directories of a thousand files.
inline std::string huge_name(int i) {
  std::string n = std::to_string(i);
  return "h" + std::string(4 - n.size(), '0') + n;
}

// Waits (60 s is only a bound) until the group counts n budget stops.
inline bool wait_budget_stops(GroupService& g, uint64_t n) {
  return g.wait_for_budget_stops(n, std::chrono::seconds(60));
}

inline size_t cached_in(const std::string& dir) {
  if (!fs::exists(dir)) return 0;
  return static_cast<size_t>(std::distance(fs::directory_iterator(dir), fs::directory_iterator()));
}

}  // namespace stagefs::testing
