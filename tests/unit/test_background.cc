// Background transfers (a replayed profile, stagectl prefetch) in a GroupService of one rank
// (SelfComm + LocalControlPlane) over a real cache: they evict nothing, an open that joins one
// waiting on its node moves it ahead of the background queue, a wait that may not evict gets
// the error of a background transfer that found no room (one that may evict asks again as an
// open), and a replayed profile's chunks are the first the source reads.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <future>
#include <mutex>
#include <thread>

#include "bcast/comm/comm.h"
#include "bcast/io/store.h"
#include "fakes.h"
#include "fusefs/base/beneath.h"
#include "fusefs/cache/cache.h"
#include "fusefs/cache/copy_xattrs.h"
#include "fusefs/group/group.h"
#include "group_hooks.h"
#include "source_cache.h"
#include "tmpdir.h"

namespace stagefs {
namespace {

using stage::testing::TmpDirTest;
namespace fs = std::filesystem;

constexpr uint64_t kChunk = 64 * 1024;

// The mount's source reader, remembering at which offsets its files were read, in order.
class RecordingSource final : public stage::SourceReader {
 public:
  explicit RecordingSource(stage::SourceReader& real) : real_(real) {}
  stage::Result<stage::Manifest> scan(const std::string& p, bool rec, const SkipFn& skip) override {
    return real_.scan(p, rec, skip);
  }
  stage::Result<stage::Selection> scan_selection(const std::string& dir, uint64_t max,
                                                 const stage::SelectionSlice& slice) override {
    return real_.scan_selection(dir, max, slice);
  }
  stage::Result<std::unique_ptr<stage::SourceFile>> open(const std::string& root,
                                                         const stage::Entry& e) override {
    auto f = real_.open(root, e);
    if (!f) return f.error();
    return std::unique_ptr<stage::SourceFile>(new File(std::move(f.value()), *this));
  }
  std::vector<uint64_t> offsets() {
    std::lock_guard lk(m_);
    return offsets_;
  }

 private:
  class File final : public stage::SourceFile {
   public:
    File(std::unique_ptr<stage::SourceFile> in, RecordingSource& s) : in_(std::move(in)), s_(s) {}
    stage::Status read_at(uint64_t off, std::span<std::byte> buf) override {
      {
        std::lock_guard lk(s_.m_);
        s_.offsets_.push_back(off);
      }
      return in_->read_at(off, buf);
    }
    bool has_data(uint64_t off, uint64_t len) override { return in_->has_data(off, len); }
    stage::Result<stage::FileMeta> stat_now() override { return in_->stat_now(); }

   private:
    std::unique_ptr<stage::SourceFile> in_;
    RecordingSource& s_;
  };
  stage::SourceReader& real_;
  std::mutex m_;
  std::vector<uint64_t> offsets_;
};

// A Done that keeps its outcome for the test.
struct Outcome {
  std::promise<stage::Status> p;
  std::future<stage::Status> f = p.get_future();
  Materializer::Done done() {
    return [this](stage::Status st) { p.set_value(std::move(st)); };
  }
  stage::Status get() {
    if (f.wait_for(std::chrono::seconds(60)) != std::future_status::ready)
      return stage::sys_error(ETIMEDOUT, "no answer within 60 s");
    return f.get();
  }
};

class BackgroundTest : public testing::SourceCacheTest {
 protected:
  void SetUp() override {
    TmpDirTest::SetUp();
    fs::create_directories(path("src/d"));
    open_source_and_cache();
  }
  GroupConfig config() {
    GroupConfig g;
    g.source_dir = path("src");
    g.cache_dir = cache_->store_root();
    g.bcast.chunk_size = kChunk;
    g.idle_poll = std::chrono::milliseconds(5);
    return g;
  }
  // The group's service thread runs from start() to the end of the scope (also when a test
  // fails); wants queued before start() reach the coordinator together.
  struct Mount {
    Mount(stage::SourceReader& src, stage::LocalStore& store, const GroupConfig& cfg)
        : group(comm, ctl, src, store, cfg) {}
    void start() {
      service = std::thread([this] { EXPECT_TRUE(group.run().ok()); });
    }
    ~Mount() {
      group.request_shutdown();
      if (service.joinable()) service.join();
    }
    Mount(const Mount&) = delete;
    Mount& operator=(const Mount&) = delete;
    stage::SelfComm comm;
    LocalControlPlane ctl;
    GroupService group;
    std::thread service;
  };
  static constexpr Want kReplay{1000, /*background=*/true, /*may_evict=*/false};
  static constexpr Want kPrefetch{1000, /*background=*/true, /*may_evict=*/true};
  static constexpr Want kOpen{1000, /*background=*/false, /*may_evict=*/true};

  stage::PosixStore store_{stage::StoreOptions{.xattrs = stagefs::kCopyXattrs}};
};

// The replay queued r0, r1, r2; while r0 is copied the job opens r2: r2 goes next, ahead of r1.
TEST_F(BackgroundTest, AnOpenThatJoinsABackgroundWaitOnItsNodeGoesAheadOfTheQueue) {
  for (const char* n : {"r0", "r1", "r2"}) write_file(path("src/d/") + n, random_bytes(3 * kChunk, 7));
  std::vector<std::string> order;  // the service thread's, read after the mount's end
  Outcome opened;
  GroupService* g = nullptr;
  auto cfg = config();
  group_hooks(cfg).on_before_transfer = [&](const std::string& rel, bool may_evict) {
    order.push_back(rel + (may_evict ? "" : " (background)"));
    if (order.size() == 1) g->materialize_async("d/r2", kOpen, opened.done());
    return stage::Status{};
  };
  std::vector<std::unique_ptr<Outcome>> replayed;
  {
    Mount m(*source_, store_, cfg);
    g = &m.group;
    for (const char* n : {"d/r0", "d/r1", "d/r2"}) {
      replayed.push_back(std::make_unique<Outcome>());
      m.group.materialize_async(n, kReplay, replayed.back()->done());
    }
    m.start();
    EXPECT_TRUE(opened.get().ok());
    for (auto& r : replayed) EXPECT_TRUE(r->get().ok());
  }
  EXPECT_EQ(order, (std::vector<std::string>{"d/r0 (background)", "d/r2", "d/r1 (background)"}));
  for (const char* n : {"r0", "r1", "r2"})
    EXPECT_EQ(read_file(path("cache/data/d/") + n), read_file(path("src/d/") + n));
}

// A background file found no room without evicting: the replay's wait gets the error (it
// stays within the cache's limit), stagectl prefetch's asks again as an open, which may evict.
TEST_F(BackgroundTest, ABackgroundFileEvictsNothingAndOnlyAWaitThatMayEvictAsksAgain) {
  write_file(path("src/d/a"), random_bytes(3 * kChunk, 1));
  write_file(path("src/d/b"), random_bytes(3 * kChunk, 2));
  std::vector<std::string> order;
  auto cfg = config();
  group_hooks(cfg).on_before_transfer = [&](const std::string& rel, bool may_evict) -> stage::Status {
    order.push_back(rel + (may_evict ? "" : " (background)"));
    if (!may_evict) return stage::sys_error(ENOSPC, "no room without evicting (test)", rel);
    return {};
  };
  Outcome replay, prefetch;
  {
    Mount m(*source_, store_, cfg);
    m.group.materialize_async("d/a", kReplay, replay.done());
    m.group.materialize_async("d/b", kPrefetch, prefetch.done());
    m.start();
    const stage::Status r = replay.get();
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().to_errno(), ENOSPC) << r.error().message;
    EXPECT_TRUE(prefetch.get().ok());
  }
  EXPECT_EQ(order, (std::vector<std::string>{"d/a (background)", "d/b (background)", "d/b"}));
  EXPECT_FALSE(fs::exists(path("cache/data/d/a")));
  EXPECT_EQ(read_file(path("cache/data/d/b")), read_file(path("src/d/b")));
}

// A background batch that does not fit is skipped: the replay's wait gets its error and is not
// asked again (an open's wait would be, as an ordinary batch).
TEST_F(BackgroundTest, ASkippedBackgroundBatchFailsAWaitThatMayNotEvict) {
  for (const char* n : {"s0", "s1"}) write_file(path("src/d/") + n, "small");
  stage::testing::StoreFaults faults;
  stage::testing::FaultStore store(faults);
  std::vector<bool> hooks;  // may_evict of each batch
  auto cfg = config();
  cfg.small_file_size = kChunk;
  group_hooks(cfg).on_before_batch = [&](const std::string&, const stage::SelectionSlice&, bool may_evict) {
    hooks.push_back(may_evict);
    faults.free_bytes = may_evict ? -1 : 0;  // the engine's free-space check refuses a prefetch
  };
  Outcome replay;
  {
    Mount m(*source_, store, cfg);
    m.group.materialize_small_async("d/s0", 0, kReplay, replay.done());
    m.start();
    EXPECT_FALSE(replay.get().ok());
  }
  EXPECT_EQ(hooks, std::vector<bool>{false});
  EXPECT_FALSE(fs::exists(path("cache/data/d/s0")));
}

// A replayed profile's chunks go first, in its order, before any reader asked (then the rest,
// each chunk once).
TEST_F(BackgroundTest, AReplayedFilesRecordedChunksAreReadFirst) {
  const std::string data = random_bytes(8 * kChunk, 3);
  write_file(path("src/d/img"), data);
  RecordingSource recording(*source_);
  auto cfg = config();
  cfg.read_during_copy = true;
  uint64_t asked_chunk = 0;
  group_hooks(cfg).on_first_chunks = [&](const std::string& rel, uint64_t chunk_size) {
    asked_chunk = chunk_size;
    return rel == "d/img" ? std::vector<uint64_t>{5, 2} : std::vector<uint64_t>{};
  };
  Outcome replay;
  {
    Mount m(recording, store_, cfg);
    m.group.materialize_async("d/img", kReplay, replay.done());
    m.start();
    EXPECT_TRUE(replay.get().ok());
  }
  EXPECT_EQ(asked_chunk, kChunk);
  std::vector<uint64_t> chunks;
  for (uint64_t off : recording.offsets()) chunks.push_back(off / kChunk);
  ASSERT_EQ(chunks.size(), 8U);
  EXPECT_EQ((std::vector<uint64_t>{chunks[0], chunks[1]}), (std::vector<uint64_t>{5, 2}));
  std::sort(chunks.begin(), chunks.end());
  EXPECT_EQ(chunks, (std::vector<uint64_t>{0, 1, 2, 3, 4, 5, 6, 7}));  // each once
  EXPECT_EQ(read_file(path("cache/data/d/img")), data);
}

}  // namespace
}  // namespace stagefs
