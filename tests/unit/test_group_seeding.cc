// Warm nodes seed cold ones, in the group (group_ranks.h): ranks whose caches hold a copy of
// the file (as an earlier mount left it) take part through the cache's own store, with reads
// during the copy on, as in the daemon. A seed's feed is never broken by what its own mount
// does to the copy; a seed whose copy fails is replaced within the transfer, and the opens
// that wait for it (and reads during the copy) never see an error or a wrong byte from it.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <random>

#include "bcast/io/crc.h"
#include "fusefs/core/core.h"
#include "fusefs/core/live.h"
#include "group_ranks.h"
#include "planted.h"

namespace stagefs::testing {
namespace {

using stage::testing::Planted;
using stage::testing::Record;

constexpr uint64_t kChunk = 65536;  // GroupRanksTest's chunk size

class GroupSeedingTest : public GroupRanksTest {
 protected:
  [[nodiscard]] bool through_cache() const override { return true; }
  [[nodiscard]] bool read_during_copy() const override { return true; }
  // Puts `bytes` in rank r's cache as the copy of rel that a transfer of the source's current
  // version left (how: an older origin, a record or none, the bytes it recorded).
  void plant(int r, const std::string& rel, const std::string& bytes, Planted how = {}) {
    const std::string copy = cache_path(r, rel);
    fs::create_directories(fs::path(copy).parent_path());
    how.chunk = kChunk;
    ASSERT_TRUE(stage::testing::plant_copy(copy, bytes, path("src/" + rel), how));
    ranks_[static_cast<size_t>(r)].cache->added(rel);
  }
  std::string cache_path(int r, const std::string& rel) {
    return path("cache" + std::to_string(r) + "/data/" + rel);
  }
  bool has_temps(int r) {
    for (const auto& e : fs::recursive_directory_iterator(path("cache" + std::to_string(r) + "/data")))
      if (stage::is_temp_name(e.path().filename().string())) return true;
    return false;
  }
  // A mount's core on rank r, over its cache and group (the node's own opens).
  std::unique_ptr<StageFsCore> core_on(int r) {
    CoreConfig cfg;
    cfg.source_dir = path("src");
    auto& k = ranks_[static_cast<size_t>(r)];
    auto core = StageFsCore::create(cfg, *k.cache, *k.group);
    EXPECT_TRUE(core) << core.error().message;
    return core ? std::move(core.value()) : nullptr;
  }
};

// Rank 1's copy records an earlier version of the source (it was touched since): never used.
// Rank 2's is current: it feeds the transfer, and then a batch of small files, from its
// cache; the source is scanned but not read for data. Every copy equals the source.
TEST_F(GroupSeedingTest, AWarmCacheFeedsTheTransferAndTheSourceIsNotReadForData) {
  const std::string big = random_bytes((1 << 20) + 3, 31);
  write_file(path("src/big"), big);
  plant(1, "big", big, Planted{.truth = {}, .older_origin = true});
  plant(2, "big", big);
  std::vector<std::string> small;
  for (int i = 0; i < 10; ++i) {
    small.push_back(random_bytes(1000 + static_cast<size_t>(i) * 311, static_cast<uint32_t>(300 + i)));
    write_file(path("src/many/s" + std::to_string(i)), small.back());
  }
  for (int i = 0; i < 10; ++i)
    for (const int r : {2, 3})
      plant(r, "many/s" + std::to_string(i), small[static_cast<size_t>(i)],
            {.record = Record::none, .truth = {}});
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
    EXPECT_TRUE(read_file(cache_path(r, "big")) == big) << "rank " << r;
    for (int i = 0; i < 10; ++i)
      EXPECT_EQ(read_file(cache_path(r, "many/s" + std::to_string(i))), small[static_cast<size_t>(i)])
          << "rank " << r;
    const auto s = ranks_[static_cast<size_t>(r)].group->stats();
    EXPECT_EQ(s.failures, 0U) << "rank " << r;
    EXPECT_EQ(s.feed_retries, 0U) << "rank " << r;
    EXPECT_EQ(s.bytes_from_source, 0U) << "rank " << r;
    EXPECT_EQ(s.bytes_from_seeds, big.size() + small_total) << "rank " << r;
    EXPECT_EQ(s.seeded_here, r == 2 ? 2U : 0U) << "rank " << r;
    EXPECT_EQ(s.local_writes, r == 2 ? 0U : r == 3 ? 1U : 2U) << "rank " << r;
    EXPECT_EQ(ranks_[static_cast<size_t>(r)].cache->usage().pinned_files, 0U)
        << "rank " << r << ": a pin left";
  }
}

// The seed's own node opens the file while its copy feeds the others (every node of a job
// opens the file at once): its mount reads the copy back for its CRC (a copy from an earlier
// mount), serves it and moves its atime (the LRU order), which changes the copy's ctime. None
// of that is a change of the copy: the feed goes on, the waiting open succeeds, and the
// shared source is never read for data.
TEST_F(GroupSeedingTest, TheSeedNodesOwnOpenDuringItsFeedDoesNotBreakIt) {
  const std::string big = random_bytes(16 * kChunk + 77, 33);
  write_file(path("src/big"), big);
  plant(2, "big", big);
  copy_gate_.arm(3 * kChunk);  // the seed stops before its fourth chunk
  start();
  Outcomes cold;
  ranks_[3].group->materialize_async("big", {}, cold.add());
  ASSERT_TRUE(copy_gate_.wait_reached()) << "the seed never started";
  struct stat before {};
  ASSERT_EQ(::stat(cache_path(2, "big").c_str(), &before), 0);
  auto core = core_on(2);
  ASSERT_TRUE(core);
  auto node = core->lookup(StageFsCore::kRootId, "big");
  ASSERT_TRUE(node) << node.error().message;
  auto f = core->open(node->first, O_RDONLY);
  ASSERT_TRUE(f) << f.error().message;
  EXPECT_TRUE(f->cache_hit);
  struct stat after {};
  ASSERT_EQ(::stat(cache_path(2, "big").c_str(), &after), 0);
  EXPECT_NE(stage::to_ns(after.st_ctim), stage::to_ns(before.st_ctim))
      << "the open did not touch the copy: no test";
  copy_gate_.release();
  ASSERT_TRUE(cold.wait()) << "open not answered";
  EXPECT_TRUE(cold.errors().empty()) << cold.errors().front();
  core->release(f->pinned);
  f->fd.reset();
  core->stop();
  core.reset();
  stop(0);
  EXPECT_EQ(gate_.bytes_read.load(), 0U) << "the source was read for data";
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_TRUE(read_file(cache_path(r, "big")) == big) << "rank " << r;
    const auto s = ranks_[static_cast<size_t>(r)].group->stats();
    EXPECT_EQ(s.failures, 0U) << "rank " << r;
    EXPECT_EQ(s.feed_retries, 0U) << "rank " << r << ": the seed's feed was replaced";
    EXPECT_EQ(s.bytes_from_seeds, big.size()) << "rank " << r;
  }
}

// The seed's copy has the current origin and chunk record but not the bytes it recorded
// (corrupted on its disk): the seed never sends the bad chunk, the source feeds the transfer
// within the same open, which succeeds; the bad copy leaves the seed's cache and that node
// writes a good one. Counted once per node as a replaced feed, not as a failure.
TEST_F(GroupSeedingTest, ASeedCopyThatRottedOnItsDiskIsReplacedWithinTheOpen) {
  const std::string big = random_bytes((1 << 20) + 5, 32);
  write_file(path("src/big"), big);
  std::string rotten = big;
  rotten[700000] = static_cast<char>(rotten[700000] ^ 0x10);
  plant(2, "big", rotten, Planted{.truth = big});
  start();
  Outcomes first;
  ranks_[3].group->materialize_async("big", {}, first.add());
  ASSERT_TRUE(first.wait()) << "open not answered";
  EXPECT_TRUE(first.errors().empty()) << first.errors().front();
  stop(1);
  EXPECT_EQ(gate_.bytes_read.load(), big.size());
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_TRUE(read_file(cache_path(r, "big")) == big) << "rank " << r;
    EXPECT_FALSE(has_temps(r)) << "rank " << r;
    const auto s = ranks_[static_cast<size_t>(r)].group->stats();
    EXPECT_EQ(s.failures, 0U) << "rank " << r;
    EXPECT_EQ(s.feed_retries, 1U) << "rank " << r;
    EXPECT_EQ(s.bytes_from_source, big.size()) << "rank " << r;
    EXPECT_EQ(s.seeded_here, 0U) << "rank " << r;
  }
}

// Reads during the copy (a cold node's live copy: the head, the tail, random offsets, the
// rotten bytes' chunk), asked while the seed is held mid-file: every read returns the
// source's bytes. The seed proves each chunk before it sends it, so the rotten one never
// reaches a reader; the source feeds the rest, and the readers' waits are asked of it again.
TEST_F(GroupSeedingTest, ReadsDuringTheCopyOfARottenSeedGetOnlyTheSourcesBytes) {
  const std::string big = random_bytes(20 * kChunk + 999, 34);
  write_file(path("src/big"), big);
  std::string rotten = big;
  const uint64_t bad = 13 * kChunk + 4321;
  rotten[bad] = static_cast<char>(rotten[bad] ^ 0x01);
  plant(1, "big", rotten, Planted{.truth = big});
  copy_gate_.arm(2 * kChunk);
  start();
  std::mutex m;
  std::condition_variable cv;
  std::shared_ptr<LiveCopy> live;
  Outcomes never;  // materialize_live_async answers on_live instead
  ranks_[3].group->materialize_live_async("big", {}, never.add(), [&](std::shared_ptr<LiveCopy> l) {
    std::lock_guard lk(m);
    live = std::move(l);
    cv.notify_all();
  });
  ASSERT_TRUE(copy_gate_.wait_reached()) << "the seed never started";
  {
    std::unique_lock lk(m);
    ASSERT_TRUE(cv.wait_for(lk, std::chrono::seconds(60), [&] { return live != nullptr; })) << "no live copy";
  }
  std::vector<std::pair<uint64_t, size_t>> reads{{0, 4096}, {big.size() - 5000, 5000}, {bad - 100, 300}};
  std::mt19937 g(34);
  for (int k = 0; k < 6; ++k) reads.emplace_back(g() % big.size(), 1 + g() % 100000);
  int done = 0, wrong = 0, failed = 0;
  for (const auto& [off, n] : reads) {
    // Read as soon as the range is here: in the callback, on the engine's writer thread, so
    // the bytes are those a reader would get before the transfer ends.
    auto check = [&, off = off, n = n](std::error_code ec) {
      auto got = ec ? stage::Result<std::string>(stage::sys_error(ec.value(), "await")) : live->read(off, n);
      std::lock_guard lk(m);
      if (!got)
        ++failed;
      else if (*got != big.substr(off, n))
        ++wrong;
      ++done;
      cv.notify_all();
    };
    if (auto now = live->await(off, n, check)) check(*now);
  }
  copy_gate_.release();
  {
    std::unique_lock lk(m);
    ASSERT_TRUE(cv.wait_for(lk, std::chrono::seconds(60), [&] {
      return done == static_cast<int>(reads.size());
    })) << "reads not answered";
  }
  EXPECT_EQ(wrong, 0) << "a read during the copy returned bytes the source does not hold";
  EXPECT_EQ(failed, 0) << "a read during the copy failed although the source was healthy";
  Outcomes end;  // the transfer is over once an open on another node is answered
  ranks_[0].group->materialize_async("big", {}, end.add());
  ASSERT_TRUE(end.wait());
  EXPECT_TRUE(end.errors().empty()) << end.errors().front();
  live.reset();
  stop(0);
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_TRUE(read_file(cache_path(r, "big")) == big) << "rank " << r;
    EXPECT_EQ(ranks_[static_cast<size_t>(r)].group->stats().feed_retries, 1U) << "rank " << r;
    EXPECT_EQ(ranks_[static_cast<size_t>(r)].group->stats().failures, 0U) << "rank " << r;
  }
}

// A seed's disk fails mid-way (EIO on a read of its copy): the open succeeds from the source.
// The shared source failing mid-way fails the open, with the source's own errno.
TEST_F(GroupSeedingTest, OnlyTheSourcesOwnFailureFailsTheOpenWithItsErrno) {
  const std::string big = random_bytes(12 * kChunk + 1, 35);
  write_file(path("src/big"), big);
  write_file(path("src/other"), random_bytes(12 * kChunk + 2, 36));
  plant(2, "big", big);
  copy_gate_.fail_at = 5 * kChunk + 17;
  start();
  Outcomes seeded;
  ranks_[3].group->materialize_async("big", {}, seeded.add());
  ASSERT_TRUE(seeded.wait());
  EXPECT_TRUE(seeded.errors().empty()) << seeded.errors().front();
  gate_.fail_errno = EREMOTEIO;  // a network filesystem's error, not the engine's EIO
  gate_.fail_at = 7 * kChunk;
  Outcomes source;
  ranks_[1].group->materialize_async("other", {}, source.add());
  ranks_[3].group->materialize_async("other", {}, source.add());
  ASSERT_TRUE(source.wait());
  ASSERT_EQ(source.errnos().size(), 2U);
  for (int e : source.errnos()) EXPECT_EQ(e, EREMOTEIO) << std::strerror(e);
  stop(0);
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_TRUE(read_file(cache_path(r, "big")) == big) << "rank " << r;
    EXPECT_FALSE(fs::exists(cache_path(r, "other"))) << "rank " << r;
    EXPECT_FALSE(has_temps(r)) << "rank " << r;
    const auto s = ranks_[static_cast<size_t>(r)].group->stats();
    EXPECT_EQ(s.feed_retries, 1U) << "rank " << r;
    EXPECT_EQ(s.failures, 1U) << "rank " << r << ": the source's failure";
  }
}

}  // namespace
}  // namespace stagefs::testing
