// GroupService with 4 in-process ranks (group_ranks.h): the whole path the mount uses
// (member -> Coordinator -> announcement -> engine on every rank -> the waiting opens), which
// the MPI tests only reach through real mounts. Seeds: test_group_seeding.cc.
#include <gtest/gtest.h>

#include <thread>

#include "group_ranks.h"

namespace stagefs::testing {
namespace {

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
  EXPECT_EQ(s0.nothing_to_copy, s0.transfers - files_.size()) << "the opens again found every copy current";
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

}  // namespace
}  // namespace stagefs::testing
