// GroupService with 4 in-process ranks, for the group tests (test_group_ranks.cc,
// test_group_seeding.cc): ThreadComm for the data plane, ThreadControlPlane for requests and
// announcements, a cache per rank, one source read by rank 0, with gates that hold the
// source's reads or a seed's reads of its copy at a known offset (or fail them there).
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <optional>
#include <thread>

#include "bcast/io/source.h"
#include "bcast/io/store.h"
#include "fake_p2p.h"
#include "fusefs/base/beneath.h"
#include "fusefs/cache/cache.h"
#include "fusefs/cache/copy_xattrs.h"
#include "fusefs/group/group.h"
#include "thread_comm.h"
#include "thread_control.h"
#include "tmpdir.h"

namespace stagefs::testing {

using stage::testing::ThreadComm;
using stage::testing::TmpDirTest;
using stage::testing::World;
namespace fs = std::filesystem;

constexpr int kRanks = 4;

// Reads at or past `at` wait while the gate is armed (a source that stalls in the middle of
// a large file, or a seed's copy held mid-read), so a test knows the transfer is still running.
class Gate {
 public:
  void arm(uint64_t at) {
    std::lock_guard lk(m_);
    at_ = at;
    armed_ = true;
  }
  void release() {
    std::lock_guard lk(m_);
    armed_ = false;
    cv_.notify_all();
  }
  bool wait_reached() {
    std::unique_lock lk(m_);
    return cv_.wait_for(lk, std::chrono::seconds(60), [&] { return reached_; });
  }
  std::atomic<uint64_t> bytes_read{0};  // data read through the gate
  // A read covering this offset fails with fail_errno (a source or a disk that fails mid-way).
  std::atomic<int64_t> fail_at{-1};
  int fail_errno = EIO;
  void pass(uint64_t off) {
    std::unique_lock lk(m_);
    if (!armed_ || off < at_) return;
    reached_ = true;
    cv_.notify_all();
    cv_.wait(lk, [&] { return !armed_; });
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  uint64_t at_ = 0;
  bool armed_ = false;
  bool reached_ = false;
};

// A file whose reads go through a Gate.
class GatedFile final : public stage::SourceFile {
 public:
  GatedFile(std::unique_ptr<stage::SourceFile> in, Gate& g) : in_(std::move(in)), g_(g) {}
  stage::Status read_at(uint64_t off, std::span<std::byte> buf) override {
    g_.pass(off);
    const int64_t bad = g_.fail_at.load();
    if (bad >= 0 && static_cast<uint64_t>(bad) >= off && static_cast<uint64_t>(bad) < off + buf.size())
      return stage::sys_error(g_.fail_errno, "read (injected)");
    g_.bytes_read += buf.size();
    return in_->read_at(off, buf);
  }
  bool has_data(uint64_t off, uint64_t len) override { return in_->has_data(off, len); }
  stage::Result<stage::FileMeta> stat_now() override { return in_->stat_now(); }

 private:
  std::unique_ptr<stage::SourceFile> in_;
  Gate& g_;
};

class GatedSource final : public stage::SourceReader {
 public:
  GatedSource(stage::SourceReader& in, Gate& g) : in_(in), g_(g) {}
  stage::Result<stage::Manifest> scan(const std::string& p, bool rec, const SkipFn& skip) override {
    return in_.scan(p, rec, skip);
  }
  stage::Result<stage::Selection> scan_selection(const std::string& dir, uint64_t max_size,
                                                 const stage::SelectionSlice& slice) override {
    return in_.scan_selection(dir, max_size, slice);
  }
  stage::Result<std::unique_ptr<stage::SourceFile>> open(const std::string& root,
                                                         const stage::Entry& e) override {
    auto f = in_.open(root, e);
    if (!f) return f.error();
    return std::unique_ptr<stage::SourceFile>(new GatedFile(std::move(f.value()), g_));
  }

 private:
  stage::SourceReader& in_;
  Gate& g_;
};

// A rank's store (the cache's) whose seed copies are read through a Gate: a seed held
// mid-read, or its disk failing there. Everything else goes to the store.
class GatedStore final : public stage::LocalStore {
 public:
  GatedStore(stage::LocalStore& in, Gate& g) : in_(in), g_(g) {}
  stage::Result<stage::LocalState> inspect(const std::string& p) override { return in_.inspect(p); }
  stage::Result<uint64_t> checksum(const std::string& p) override { return in_.checksum(p); }
  stage::Result<std::optional<stage::CopyRecord>> chunk_record(const std::string& p) override {
    return in_.chunk_record(p);
  }
  stage::Result<std::unique_ptr<stage::SourceFile>> open_copy(const std::string& p) override {
    auto f = in_.open_copy(p);
    if (!f) return f.error();
    return std::unique_ptr<stage::SourceFile>(new GatedFile(std::move(f.value()), g_));
  }
  void bad_copy(const std::string& p, const stage::FileMeta& seen) override { in_.bad_copy(p, seen); }
  stage::Result<uint64_t> free_bytes(const std::string& p) override { return in_.free_bytes(p); }
  stage::Status sync_filesystem(const std::string& p) override { return in_.sync_filesystem(p); }
  std::unique_ptr<stage::Publication> publication(const std::string& dir,
                                                  std::vector<std::string> paths) override {
    return in_.publication(dir, std::move(paths));
  }
  stage::Result<std::unique_ptr<stage::Txn>> begin(const std::string& p) override { return in_.begin(p); }
  stage::Status make_dir(const std::string& p, uint32_t mode) override { return in_.make_dir(p, mode); }
  stage::Status make_parents(const std::string& p) override { return in_.make_parents(p); }
  stage::Status make_symlink(const std::string& p, const std::string& t) override {
    return in_.make_symlink(p, t);
  }
  int remove_stale_temps(const std::string& d) override { return in_.remove_stale_temps(d); }

 private:
  stage::LocalStore& in_;
  Gate& g_;
};

struct Rank {
  std::unique_ptr<NodeCache> cache;
  std::unique_ptr<stage::PosixStore> store;
  std::unique_ptr<GatedStore> seed_store;  // the cache's store, its seed copies read through copy_gate_
  std::unique_ptr<ThreadComm> comm;
  std::unique_ptr<ThreadComm> nested;                        // batches nested in a transfer
  std::unique_ptr<stage::testing::FakeP2P> p2p, nested_p2p;  // chunks go through the chain, as with MPI
  std::unique_ptr<ThreadControlPlane> ctl;
  std::unique_ptr<GroupService> group;  // last: destroyed first
  std::thread service;
  stage::Status result;
};

// Counts callbacks; wait() gives up after a deadline rather than hang the test.
class Outcomes {
 public:
  Materializer::Done add() {
    std::lock_guard lk(m_);
    ++expected_;
    return [this](stage::Status st) {
      std::lock_guard lk2(m_);
      if (!st) errors_.push_back(st.error().message);
      if (!st) errnos_.push_back(st.error().to_errno());
      ++done_;
      cv_.notify_all();
    };
  }
  bool wait() {
    std::unique_lock lk(m_);
    return cv_.wait_for(lk, std::chrono::seconds(60), [&] { return done_ == expected_; });
  }
  std::vector<std::string> errors() {
    std::lock_guard lk(m_);
    return errors_;
  }
  std::vector<int> errnos() {
    std::lock_guard lk(m_);
    return errnos_;
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  int expected_ = 0;
  int done_ = 0;
  std::vector<std::string> errors_;
  std::vector<int> errnos_;
};

class GroupRanksTest : public TmpDirTest {
 protected:
  // The store each rank's engine writes through: a plain PosixStore, or (as in the daemon) the
  // cache's own store, which seeds from the cache's copies.
  [[nodiscard]] virtual bool through_cache() const { return false; }
  [[nodiscard]] virtual bool read_during_copy() const { return false; }
  void SetUp() override {
    TmpDirTest::SetUp();
    // spdlog's registry is a lazily built static of an uninstrumented library: build it here,
    // before the ranks' threads log at once (as the daemon does in main), or TSan reports it.
    spdlog::default_logger_raw();
    for (size_t i = 0; i < files_.size(); ++i) {
      data_.push_back(random_bytes(i * 70001, static_cast<uint32_t>(i + 1)));  // 0 to 280 KB
      write_file(path("src/" + files_[i]), data_.back());
    }
    root_ = stage::Fd(::open(path("src").c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    source_ = std::make_unique<BeneathSource>(root_.get());
    gated_ = std::make_unique<GatedSource>(*source_, gate_);
    for (int r = 0; r < kRanks; ++r) {
      auto& k = ranks_[static_cast<size_t>(r)];
      auto c = NodeCache::open(path("cache" + std::to_string(r)));
      ASSERT_TRUE(c) << c.error().message;
      k.cache = std::move(c.value());
      k.store = std::make_unique<stage::PosixStore>(stage::StoreOptions{.xattrs = stagefs::kCopyXattrs});
      k.comm = std::make_unique<ThreadComm>(world_, r);
      k.nested = std::make_unique<ThreadComm>(nested_world_, r);
      k.p2p = std::make_unique<stage::testing::FakeP2P>(net_, r);
      k.nested_p2p = std::make_unique<stage::testing::FakeP2P>(nested_net_, r);
      k.comm->attach(k.p2p.get());
      k.nested->attach(k.nested_p2p.get());
      k.ctl = std::make_unique<ThreadControlPlane>(control_, r);
      GroupConfig g;
      g.source_dir = path("src");
      g.cache_dir = k.cache->store_root();
      g.bcast.chunk_size = 65536;
      g.idle_poll = std::chrono::milliseconds(5);
      g.small_file_size = 64 * 1024;  // only materialize_small_async() makes batches
      g.read_during_copy = read_during_copy();
      k.seed_store = std::make_unique<GatedStore>(k.cache->store(), copy_gate_);
      stage::LocalStore& store = through_cache() ? static_cast<stage::LocalStore&>(*k.seed_store) : *k.store;
      k.group = std::make_unique<GroupService>(*k.comm, *k.ctl, *gated_, store, g, k.nested.get());
    }
  }
  void TearDown() override {
    gate_.release();
    copy_gate_.release();
    for (auto& k : ranks_) {
      if (k.service.joinable()) {
        k.group->request_shutdown();
        k.service.join();
      }
      k.group.reset();
      k.cache.reset();
    }
    gated_.reset();
    source_.reset();
    root_.reset();
    TmpDirTest::TearDown();
  }
  void start() {
    for (auto& k : ranks_) k.service = std::thread([&k] { k.result = k.group->run(); });
  }
  void stop(int asking_rank) {
    ranks_[static_cast<size_t>(asking_rank)].group->request_shutdown();
    for (auto& k : ranks_) k.service.join();
  }

  const std::vector<std::string> files_{"empty", "a", "dir/b", "dir/c", "d/e/f"};
  std::vector<std::string> data_;
  World world_{kRanks};
  World nested_world_{kRanks};
  stage::testing::FakeNet net_{kRanks}, nested_net_{kRanks};
  ControlWorld control_;
  stage::Fd root_;
  std::unique_ptr<BeneathSource> source_;
  Gate gate_;       // the shared source's reads
  Gate copy_gate_;  // the seeds' reads of their copies (through_cache())
  std::unique_ptr<GatedSource> gated_;
  std::array<Rank, kRanks> ranks_;
};

}  // namespace stagefs::testing
