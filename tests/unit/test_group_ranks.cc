// GroupService with 4 in-process ranks: ThreadComm for the data plane, ThreadControlPlane for
// requests and announcements, a cache per rank, one source read by rank 0. Checks the whole
// path the mount uses (member -> Coordinator -> announcement -> engine on every rank -> the
// waiting opens), which the MPI tests only reach through real mounts.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <sys/xattr.h>

#include <condition_variable>
#include <mutex>
#include <filesystem>
#include <thread>

#include "bcast/crc.h"
#include "bcast/source.h"
#include "bcast/store.h"
#include "fusefs/beneath.h"
#include "fusefs/cache/cache.h"
#include "fusefs/group.h"
#include "fake_p2p.h"
#include "thread_comm.h"
#include "thread_control.h"
#include "tmpdir.h"

namespace stagefs {
namespace {

using stage::testing::ThreadComm;
using stage::testing::TmpDirTest;
using stage::testing::World;
using testing::ControlWorld;
using testing::ThreadControlPlane;
namespace fs = std::filesystem;

constexpr int kRanks = 4;

// A source whose reads at or past `at` wait while the gate is armed (a source that stalls in
// the middle of a large file), so a test knows the transfer is still running.
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
  std::atomic<uint64_t> bytes_read{0};  // data read from the source
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

class GatedSource final : public stage::SourceReader {
 public:
  GatedSource(stage::SourceReader& in, Gate& g) : in_(in), g_(g) {}
  stage::Result<stage::Manifest> scan(const std::string& p, bool rec, const SkipFn& skip) override {
    return in_.scan(p, rec, skip);
  }
  stage::Result<stage::SmallFiles> scan_small_files(const std::string& dir, uint64_t max_size,
                                                    const stage::SmallFilesSlice& slice) override {
    return in_.scan_small_files(dir, max_size, slice);
  }
  stage::Result<std::unique_ptr<stage::SourceFile>> open(const std::string& root, const stage::Entry& e) override {
    auto f = in_.open(root, e);
    if (!f) return f.error();
    return std::unique_ptr<stage::SourceFile>(new File(std::move(f.value()), g_));
  }

 private:
  class File final : public stage::SourceFile {
   public:
    File(std::unique_ptr<stage::SourceFile> in, Gate& g) : in_(std::move(in)), g_(g) {}
    stage::Status read_at(uint64_t off, std::span<std::byte> buf) override {
      g_.pass(off);
      g_.bytes_read += buf.size();
      return in_->read_at(off, buf);
    }
    bool has_data(uint64_t off, uint64_t len) override { return in_->has_data(off, len); }
    stage::Result<stage::FileMeta> stat_now() override { return in_->stat_now(); }

   private:
    std::unique_ptr<stage::SourceFile> in_;
    Gate& g_;
  };
  stage::SourceReader& in_;
  Gate& g_;
};

struct Rank {
  std::unique_ptr<NodeCache> cache;
  std::unique_ptr<stage::PosixStore> store;
  std::unique_ptr<ThreadComm> comm;
  std::unique_ptr<ThreadComm> nested;  // batches nested in a transfer
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

 private:
  std::mutex m_;
  std::condition_variable cv_;
  int expected_ = 0;
  int done_ = 0;
  std::vector<std::string> errors_;
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
      k.store = std::make_unique<stage::PosixStore>();
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
      stage::LocalStore& store = through_cache() ? k.cache->store() : *k.store;
      k.group = std::make_unique<GroupService>(*k.comm, *k.ctl, *gated_, store, g, k.nested.get());
    }
  }
  void TearDown() override {
    gate_.release();
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
  Gate gate_;
  std::unique_ptr<GatedSource> gated_;
  std::array<Rank, kRanks> ranks_;
};

TEST_F(GroupRanksTest, EveryRankGetsEveryFileFromOneTransferEach) {
  // Every rank opens every file twice before the group runs: one request per file per rank,
  // merged by the coordinator into one transfer per file.
  Outcomes first;
  for (auto& k : ranks_)
    for (const auto& f : files_)
      for (int i = 0; i < 2; ++i) k.group->materialize_async(f, {}, first.add());
  start();
  ASSERT_TRUE(first.wait()) << "opens not answered";
  EXPECT_TRUE(first.errors().empty()) << first.errors().front();
  for (int r = 0; r < kRanks; ++r)
    for (size_t i = 0; i < files_.size(); ++i)
      EXPECT_EQ(read_file(path("cache" + std::to_string(r) + "/data/" + files_[i])), data_[i])
          << "rank " << r << " " << files_[i];

  // Opens again on every rank at once, while running: their transfers find valid copies.
  std::vector<std::thread> openers;
  for (auto& k : ranks_) openers.emplace_back([&k] { EXPECT_TRUE(k.group->materialize("dir/b").ok()); });
  for (auto& t : openers) t.join();

  stop(2);
  const auto s0 = ranks_[0].group->stats();
  EXPECT_GE(s0.transfers, files_.size() + 1);
  EXPECT_LE(s0.transfers, files_.size() + kRanks);
  for (int r = 0; r < kRanks; ++r) {
    auto& k = ranks_[static_cast<size_t>(r)];
    EXPECT_TRUE(k.result.ok()) << "rank " << r << ": " << k.result.error().message;
    EXPECT_EQ(k.group->state(), GroupState::shut_down);
    const auto s = k.group->stats();
    EXPECT_EQ(s.transfers, s0.transfers) << "rank " << r << " ran other announcements";
    EXPECT_EQ(s.local_writes, files_.size()) << "rank " << r << " rewrote a valid copy";
    EXPECT_EQ(s.failures, 0U);
    EXPECT_EQ(s.requests_sent, files_.size() + 1) << "rank " << r;
    EXPECT_EQ(k.group->materialize("a").error().to_errno(), ESHUTDOWN);
  }
}

// Every rank opens small files of one directory of 50 small files and one large
// file, each rank different ones, all before the group runs: one batch transfer (one request
// per rank, merged) gives every rank all 50 small files and not the large one.
TEST_F(GroupRanksTest, SmallFilesOnEveryRankCostOneBatchForTheWholeDirectory) {
  std::vector<std::string> small;
  for (int i = 0; i < 50; ++i) {
    small.push_back(random_bytes(4096 + static_cast<size_t>(i) * 1000, static_cast<uint32_t>(100 + i)));
    write_file(path("src/many/s" + std::to_string(i)), small.back());
  }
  write_file(path("src/many/large"), random_bytes(64 * 1024 + 1, 7));
  Outcomes opens;
  for (int r = 0; r < kRanks; ++r)
    for (int i = r; i < 50; i += kRanks)
      ranks_[static_cast<size_t>(r)].group->materialize_small_async("many/s" + std::to_string(i), 0, {},
                                                                    opens.add());
  start();
  ASSERT_TRUE(opens.wait()) << "opens not answered";
  EXPECT_TRUE(opens.errors().empty()) << opens.errors().front();
  for (int r = 0; r < kRanks; ++r) {
    const auto s = ranks_[static_cast<size_t>(r)].group->stats();
    EXPECT_EQ(s.transfers, 1U) << "rank " << r;
    EXPECT_EQ(s.batches, 1U) << "rank " << r;
    EXPECT_EQ(s.batch_files, 50U) << "rank " << r;
    EXPECT_EQ(s.requests_sent, 1U) << "rank " << r;
    for (int i = 0; i < 50; ++i)
      EXPECT_EQ(read_file(path("cache" + std::to_string(r) + "/data/many/s" + std::to_string(i))),
                small[static_cast<size_t>(i)])
          << "rank " << r << " s" << i;
    EXPECT_FALSE(fs::exists(path("cache" + std::to_string(r) + "/data/many/large"))) << "rank " << r;
  }
  // Again on every rank: the batch finds every copy current, nothing is written.
  std::vector<std::thread> openers;
  for (auto& k : ranks_)
    openers.emplace_back([&k] {
      Outcomes again;
      k.group->materialize_small_async("many/s1", k.group->epoch(), {}, again.add());
      EXPECT_TRUE(again.wait());
      EXPECT_TRUE(again.errors().empty());
    });
  for (auto& t : openers) t.join();
  stop(1);
  for (int r = 0; r < kRanks; ++r) {
    auto& k = ranks_[static_cast<size_t>(r)];
    EXPECT_TRUE(k.result.ok()) << "rank " << r;
    EXPECT_EQ(k.group->stats().batch_files, 50U) << "rank " << r << " rewrote current copies";
    EXPECT_EQ(k.group->stats().failures, 0U);
  }
}

// A large file's transfer waits for its source in the middle; meanwhile
// every rank opens a small file: their directory's batch runs nested in the transfer on every
// rank and answers them, while the large transfer is still held. Released, the large file completes.
TEST_F(GroupRanksTest, ABatchRunsNestedWhileALargeTransferWaitsForItsSource) {
  const std::string big = random_bytes(4 << 20, 21);
  write_file(path("src/big"), big);
  std::vector<std::string> small;
  for (int i = 0; i < 20; ++i) {
    small.push_back(random_bytes(1000 + static_cast<size_t>(i) * 997, static_cast<uint32_t>(200 + i)));
    write_file(path("src/many/s" + std::to_string(i)), small.back());
  }
  gate_.arm(1 << 20);
  start();
  Outcomes large;
  ranks_[1].group->materialize_async("big", {}, large.add());
  ASSERT_TRUE(gate_.wait_reached()) << "the large transfer never reached the gate";
  Outcomes opens;  // rank 3 asks first; every rank waits for its answer (its stats are then final)
  ranks_[3].group->materialize_small_async("many/s3", 0, {}, opens.add());
  for (int r = 0; r < 3; ++r)
    ranks_[static_cast<size_t>(r)].group->materialize_small_async("many/s" + std::to_string(r), 0, {},
                                                                  opens.add());
  ASSERT_TRUE(opens.wait()) << "the batch waited behind the large transfer";
  EXPECT_TRUE(opens.errors().empty()) << opens.errors().front();
  for (int r = 0; r < kRanks; ++r) {
    const auto s = ranks_[static_cast<size_t>(r)].group->stats();
    EXPECT_EQ(s.batches, 1U) << "rank " << r;
    EXPECT_EQ(s.nested, 1U) << "rank " << r;
    EXPECT_EQ(s.transfers, 1U) << "rank " << r << ": the large transfer ended";
    EXPECT_EQ(s.current, "big") << "rank " << r << ": the running transfer is shown again";
    for (int i = 0; i < 20; ++i)
      EXPECT_EQ(read_file(path("cache" + std::to_string(r) + "/data/many/s" + std::to_string(i))),
                small[static_cast<size_t>(i)])
          << "rank " << r << " s" << i;
  }
  gate_.release();
  ASSERT_TRUE(large.wait());
  EXPECT_TRUE(large.errors().empty()) << large.errors().front();
  stop(0);
  for (int r = 0; r < kRanks; ++r) {
    auto& k = ranks_[static_cast<size_t>(r)];
    EXPECT_TRUE(k.result.ok()) << "rank " << r;
    EXPECT_EQ(k.group->stats().transfers, 2U) << "rank " << r;
    EXPECT_EQ(k.group->stats().failures, 0U) << "rank " << r;
    EXPECT_EQ(read_file(path("cache" + std::to_string(r) + "/data/big")), big) << "rank " << r;
  }
}

// A node that opens a file while that file's transfer already runs there waits for that
// transfer; it must not ask for the file again (the request would carry that transfer's id,
// and the coordinator would queue a second, useless transfer). Rank 2 opens "big" while its
// transfer is held mid-file, then "a": "a" comes right after "big" on every rank, with no
// second transfer of "big" between them (requests leave a node in order, so a second
// request for "big" would have been announced before "a").
TEST_F(GroupRanksTest, AnOpenDuringItsFilesTransferDoesNotAskAgain) {
  write_file(path("src/big"), random_bytes(4 << 20, 22));
  gate_.arm(1 << 20);
  start();
  Outcomes first;
  ranks_[1].group->materialize_async("big", {}, first.add());
  ASSERT_TRUE(gate_.wait_reached()) << "the transfer never reached the gate";
  Outcomes later;
  ranks_[2].group->materialize_async("big", {}, later.add());
  ranks_[2].group->materialize_async("a", {}, later.add());
  gate_.release();
  ASSERT_TRUE(first.wait());
  ASSERT_TRUE(later.wait());
  EXPECT_TRUE(later.errors().empty()) << later.errors().front();
  stop(0);
  for (int r = 0; r < kRanks; ++r)
    EXPECT_EQ(ranks_[static_cast<size_t>(r)].group->stats().transfers, 2U) << "rank " << r << ": big, a";
}

// Opens on ranks 0-2 and a shutdown from rank 3, all before the group runs: whichever reaches
// the coordinator first, every open is answered once (the copy, or ESHUTDOWN) and every rank
// stops after the same announcements.
TEST_F(GroupRanksTest, AShutdownRacingWithOpensAnswersEveryOpenOnce) {
  Outcomes opens;
  ranks_[3].group->request_shutdown();
  for (int r = 0; r < 3; ++r)
    ranks_[static_cast<size_t>(r)].group->materialize_async("dir/c", {}, opens.add());
  EXPECT_EQ(ranks_[3].group->materialize("dir/c").error().to_errno(), ESHUTDOWN);
  start();
  for (auto& k : ranks_) k.service.join();
  ASSERT_TRUE(opens.wait());
  for (const auto& e : opens.errors()) EXPECT_NE(e.find("shut"), std::string::npos) << e;
  const auto transfers = ranks_[0].group->stats().transfers;
  EXPECT_LE(transfers, 1U);
  EXPECT_EQ(opens.errors().size(), transfers == 0 ? 3U : 0U);
  for (int r = 0; r < kRanks; ++r) {
    auto& k = ranks_[static_cast<size_t>(r)];
    EXPECT_TRUE(k.result.ok()) << "rank " << r;
    EXPECT_EQ(k.group->state(), GroupState::shut_down);
    EXPECT_EQ(k.group->stats().transfers, transfers) << "rank " << r;
  }
}

// Warm nodes seed cold ones: ranks whose caches hold a copy of the file (as an earlier mount
// left it) take part through the cache's own store, reads during the copy on.
class GroupSeedingTest : public GroupRanksTest {
 protected:
  [[nodiscard]] bool through_cache() const override { return true; }
  [[nodiscard]] bool read_during_copy() const override { return true; }
  // Puts `bytes` in rank r's cache as the copy of rel that a transfer of the source's current
  // version (older_origin: of an earlier version, its ctime) would have left, recording
  // `recorded_crc` as its CRC.
  void plant(int r, const std::string& rel, const std::string& bytes, uint64_t recorded_crc,
             bool older_origin = false) {
    const std::string copy = path("cache" + std::to_string(r) + "/data/" + rel);
    write_file(copy, bytes);
    struct stat st {};
    ASSERT_EQ(::stat(path("src/" + rel).c_str(), &st), 0);
    stage::FileMeta meta = stage::meta_from_stat(st);
    if (older_origin) meta.ctime_ns -= 1000000000;
    const std::string origin = stage::encode_origin(meta, recorded_crc);
    ASSERT_EQ(::setxattr(copy.c_str(), stage::kOriginXattr, origin.data(), origin.size(), 0), 0);
    const timespec times[2] = {st.st_atim, st.st_mtim};
    ASSERT_EQ(::utimensat(AT_FDCWD, copy.c_str(), times, 0), 0);
    ranks_[static_cast<size_t>(r)].cache->added(rel);
  }
  static uint64_t crc(const std::string& s) { return stage::crc64(std::as_bytes(std::span(s.data(), s.size()))); }
  bool has_temps(int r) {
    for (const auto& e : fs::recursive_directory_iterator(path("cache" + std::to_string(r) + "/data")))
      if (stage::is_temp_name(e.path().filename().string())) return true;
    return false;
  }
};

// Rank 1's copy records an earlier version of the source (it was touched since): never used.
// Rank 2's is current: it feeds the transfer, and then a batch of small files, from its
// cache; the source is scanned but not read for data. Every copy equals the source.
TEST_F(GroupSeedingTest, AWarmCacheFeedsTheTransferAndTheSourceIsNotReadForData) {
  const std::string big = random_bytes((1 << 20) + 3, 31);
  write_file(path("src/big"), big);
  plant(1, "big", big, crc(big), /*older_origin=*/true);
  plant(2, "big", big, crc(big));
  std::vector<std::string> small;
  for (int i = 0; i < 10; ++i) {
    small.push_back(random_bytes(1000 + static_cast<size_t>(i) * 311, static_cast<uint32_t>(300 + i)));
    write_file(path("src/many/s" + std::to_string(i)), small.back());
  }
  for (int i = 0; i < 10; ++i)
    for (const int r : {2, 3}) plant(r, "many/s" + std::to_string(i), small[static_cast<size_t>(i)], crc(small[static_cast<size_t>(i)]));
  start();
  Outcomes opens;
  ranks_[3].group->materialize_async("big", {}, opens.add());
  ASSERT_TRUE(opens.wait()) << "open not answered";
  EXPECT_TRUE(opens.errors().empty()) << opens.errors().front();
  EXPECT_EQ(gate_.bytes_read.load(), 0U) << "the source was read for data";
  Outcomes batch;
  ranks_[0].group->materialize_small_async("many/s4", 0, {}, batch.add());
  ASSERT_TRUE(batch.wait()) << "open not answered";
  EXPECT_TRUE(batch.errors().empty()) << batch.errors().front();
  EXPECT_EQ(gate_.bytes_read.load(), 0U) << "the batch read the source for data";
  uint64_t small_total = 0;
  for (const auto& s : small) small_total += s.size();
  stop(0);
  for (int r = 0; r < kRanks; ++r) {
    const std::string cache = path("cache" + std::to_string(r) + "/data/");
    EXPECT_TRUE(read_file(cache + "big") == big) << "rank " << r;
    for (int i = 0; i < 10; ++i)
      EXPECT_EQ(read_file(cache + "many/s" + std::to_string(i)), small[static_cast<size_t>(i)]) << "rank " << r;
    const auto s = ranks_[static_cast<size_t>(r)].group->stats();
    EXPECT_EQ(s.failures, 0U) << "rank " << r;
    EXPECT_EQ(s.bytes_from_source, 0U) << "rank " << r;
    EXPECT_EQ(s.bytes_from_seeds, big.size() + small_total) << "rank " << r;
    EXPECT_EQ(s.seeded_here, r == 2 ? 2U : 0U) << "rank " << r;
    EXPECT_EQ(s.local_writes, r == 2 ? 0U : r == 3 ? 1U : 2U) << "rank " << r;
    EXPECT_EQ(ranks_[static_cast<size_t>(r)].cache->usage().pinned_files, 0U) << "rank " << r << ": a pin left";
  }
}

// The seed's copy has the current origin but not the bytes it recorded (corrupted on its
// disk): the transfer fails on every rank, no cold rank publishes anything, the bad copy
// leaves the seed's cache, and the next open is fed by the source.
TEST_F(GroupSeedingTest, ASeedCopyReadingBackWrongFailsEverywhereAndTheNextOpenReadsTheSource) {
  const std::string big = random_bytes((1 << 20) + 5, 32);
  write_file(path("src/big"), big);
  std::string rotten = big;
  rotten[700000] = static_cast<char>(rotten[700000] ^ 0x10);
  plant(2, "big", rotten, crc(big));
  start();
  Outcomes first;
  ranks_[3].group->materialize_async("big", {}, first.add());
  ASSERT_TRUE(first.wait()) << "open not answered";
  ASSERT_EQ(first.errors().size(), 1U) << "a copy that reads back wrong fed the transfer";
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_FALSE(fs::exists(path("cache" + std::to_string(r) + "/data/big"))) << "rank " << r;
    EXPECT_FALSE(has_temps(r)) << "rank " << r;
  }
  Outcomes second;
  ranks_[3].group->materialize_async("big", {}, second.add());
  ASSERT_TRUE(second.wait()) << "open not answered";
  EXPECT_TRUE(second.errors().empty()) << second.errors().front();
  stop(1);
  EXPECT_EQ(gate_.bytes_read.load(), big.size());
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_TRUE(read_file(path("cache" + std::to_string(r) + "/data/big")) == big) << "rank " << r;
    const auto s = ranks_[static_cast<size_t>(r)].group->stats();
    EXPECT_EQ(s.failures, 1U) << "rank " << r;
    EXPECT_EQ(s.bytes_from_source, big.size()) << "rank " << r;
    EXPECT_EQ(s.seeded_here, 0U) << "rank " << r;
  }
}

}  // namespace
}  // namespace stagefs
