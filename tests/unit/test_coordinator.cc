// The coordinator's decisions with N in-process ranks and no MPI: a simulated group delivers
// requests (FIFO per rank, as MPI point-to-point between two ranks) and announcements (the
// same sequence to every rank, each rank at its own pace, at most one outstanding) in random
// interleavings, and checks the group's promises against a reference model (a plain, slow
// restatement of the rules, as mountpoint-s3's reftests):
//   - every wait (a node's first open of a path) is answered exactly once: by a transfer of
//     its path announced after the node sent it, or by the shutdown;
//   - every transfer announcement answers at least one wait (no transfer twice for one need);
//   - every rank sees the same announcements in the same order, ids increasing;
//   - a shutdown goes before any further transfer and is the last announcement;
//   - walks (prefetch of sibling directories): a prefetched batch is announced only when no
//     request waits, never for a key announced before, and a request for it moves it ahead;
//   - turns between users by cost: the next request is the first of the uid with the lowest
//     tally of what its transfers cost (ties: the uid served longest ago), a uid that asks
//     again starts at the tally of the uid served last.
//   - background requests (a replay, stagectl prefetch) are announced only when no request
//     waits (a file as file_prefetch), and an open's request for one moves it ahead;
//   - nesting: in a transfer of one file only a batch nests; in a background one (file_prefetch)
//     the next request nests, a batch or a file; one nested transfer at a time.
// Keys: a node waits per (materialize, file) or (batch, directory): an open of a small file
// waits for its directory's batch, so small files of one directory merge into one
// batch transfer, and a batch never answers a wait for a large file of the same directory.
#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "coordinator_model.h"
#include "fusefs/group/control.h"
#include "fusefs/group/coordinator.h"

namespace stagefs {
namespace {

using testing::dir_of;
using testing::Group;
using testing::req;
using testing::shutdown_req;

TEST(CoordinatorTest, ABurstOfOpensOnEveryRankCostsOneTransfer) {
  Group g(4);
  for (int r = 0; r < 4; ++r) g.open(r, "img.sqsh");
  g.drain();
  ASSERT_EQ(g.log().size(), 1U);
  EXPECT_EQ(g.log()[0], (Message{MsgType::materialize, 1, "img.sqsh"}));
  EXPECT_EQ(g.coordinator().stats().merged, 3U);
  g.check_quiescent();
  for (int r = 0; r < 4; ++r) EXPECT_EQ(g.rank(r).answered, 1U);
}

TEST(CoordinatorTest, ARequestThatRacedWithItsAnnouncementIsDropped) {
  Group g(2);
  g.open(0, "a");
  ASSERT_TRUE(g.step_coordinator());  // "a" announced (id 1); rank 1 has not seen it...
  g.open(1, "a");                     // ...and asks with last seen id 0
  ASSERT_TRUE(g.deliver_request(1));
  EXPECT_EQ(g.coordinator().stats().already_answered, 1U);
  g.drain();
  EXPECT_EQ(g.log().size(), 1U);  // announcement 1 answers rank 1 too
  g.check_quiescent();
  EXPECT_EQ(g.rank(1).answered, 1U);
}

TEST(CoordinatorTest, AnOpenAfterSeeingTheTransferGetsANewOne) {
  Group g(2);
  g.open(1, "a");
  g.drain();
  g.open(1, "a");  // e.g. the source changed: the node needs it again, having seen id 1
  g.drain();
  ASSERT_EQ(g.log().size(), 2U);
  EXPECT_EQ(g.log()[1], (Message{MsgType::materialize, 2, "a"}));
  g.check_quiescent();
}

TEST(CoordinatorTest, OneAnnouncementOutstandingAtATime) {
  Group g(3);
  g.open(0, "a");
  g.open(0, "b");
  ASSERT_TRUE(g.step_coordinator());
  EXPECT_FALSE(g.step_coordinator());  // rank 0 has not completed "a"
  ASSERT_TRUE(g.deliver_announcement(0));
  EXPECT_FALSE(g.step_coordinator());  // rank 0 runs "a"
  ASSERT_TRUE(g.finish0());
  ASSERT_TRUE(g.step_coordinator());
  g.drain();
  g.check_quiescent();
}

TEST(CoordinatorTest, ShutdownJumpsTheQueueAndIsLast) {
  Group g(3);
  for (const char* p : {"a", "b", "c"}) g.open(1, p);
  ASSERT_TRUE(g.deliver_request(1));
  ASSERT_TRUE(g.step_coordinator());  // "a" outstanding
  while (g.deliver_request(1)) {
  }
  g.request_shutdown(2);
  g.request_shutdown(1);
  g.drain();
  ASSERT_EQ(g.log().size(), 2U);
  EXPECT_EQ(g.log()[1].type, MsgType::shutdown);
  EXPECT_TRUE(g.coordinator().shut_down());
  g.open(2, "d");  // too late: stopped
  g.check_quiescent();
  EXPECT_EQ(g.rank(1).answered, 1U);
  EXPECT_EQ(g.rank(1).failed, 2U);
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(g.stopped(r));
}

TEST(CoordinatorTest, SmallFilesOfOneDirectoryOnEveryRankCostOneBatch) {
  Group g(4);
  // Every rank opens 50 small files of d and the large file of d; rank 2 also a small file
  // of the root and of d/sub (other directories: other batches).
  for (int r = 0; r < 4; ++r) {
    for (int i = 0; i < 50; ++i) g.open_small(r, "d/s" + std::to_string((i + r * 7) % 50));
    g.open(r, "d/large");
  }
  g.open_small(2, "top");
  g.open_small(2, "d/sub/x");
  g.drain();
  ASSERT_EQ(g.log().size(), 4U);
  EXPECT_EQ(g.log()[0], (Message{MsgType::batch, 1, "d"}));
  EXPECT_EQ(g.log()[1], (Message{MsgType::materialize, 2, "d/large"}));
  EXPECT_EQ(g.log()[2], (Message{MsgType::batch, 3, ""}));
  EXPECT_EQ(g.log()[3], (Message{MsgType::batch, 4, "d/sub"}));
  EXPECT_EQ(g.coordinator().stats().batches, 3U);
  EXPECT_EQ(g.coordinator().stats().announced, 4U);
  // Each node asked once per key: 3 other ranks' requests for "d" and for "d/large" merged.
  EXPECT_EQ(g.coordinator().stats().merged, 6U);
  g.check_quiescent();
  EXPECT_EQ(g.rank(0).answered, 2U);
  EXPECT_EQ(g.rank(2).answered, 4U);
}

TEST(CoordinatorTest, ASmallFileRequestThatRacedWithItsBatchIsDropped) {
  Group g(2);
  g.open_small(0, "d/a");
  ASSERT_TRUE(g.step_coordinator());  // batch "d" announced (id 1); rank 1 has not seen it
  g.open_small(1, "d/b");             // another file of d, asked with last seen id 0
  ASSERT_TRUE(g.deliver_request(1));
  EXPECT_EQ(g.coordinator().stats().already_answered, 1U);
  g.open(1, "d");  // a *file* named like the directory's key is another key: not answered by it
  g.drain();
  ASSERT_EQ(g.log().size(), 2U);
  EXPECT_EQ(g.log()[1], (Message{MsgType::materialize, 2, "d"}));
  g.check_quiescent();
  // After seeing the batch, a new small-file open (a file created since) gets a new batch.
  g.open_small(1, "d/new");
  g.drain();
  ASSERT_EQ(g.log().size(), 3U);
  EXPECT_EQ(g.log()[2], (Message{MsgType::batch, 3, "d"}));
  g.check_quiescent();
}

// Nesting: while rank 0 runs a file's transfer, the first queued batch (and only a batch) is
// announced nested, one at a time; the file queued before it waits for the transfer's end,
// and so does a shutdown.
TEST(CoordinatorTest, WhileAFileIsCopiedOnlyABatchIsAnnouncedNested) {
  Group g(2, /*nesting=*/true);
  g.open(1, "big");
  ASSERT_TRUE(g.deliver_request(1));
  ASSERT_TRUE(g.step_coordinator());
  ASSERT_TRUE(g.deliver_announcement(0));  // rank 0 runs "big"
  g.open(1, "other");
  g.open_small(1, "d/s1");
  g.open_small(1, "e/s2");
  while (g.deliver_request(1)) {
  }
  ASSERT_TRUE(g.step_coordinator());
  EXPECT_EQ(g.log().back(), (Message{MsgType::batch_nested, 2, "d"}));
  EXPECT_FALSE(g.step_coordinator());      // outstanding
  ASSERT_TRUE(g.deliver_announcement(0));  // runs the nested batch
  EXPECT_FALSE(g.step_coordinator());      // one nested batch at a time
  ASSERT_TRUE(g.finish0());                // the nested batch ends
  ASSERT_TRUE(g.step_coordinator());
  EXPECT_EQ(g.log().back(), (Message{MsgType::batch_nested, 3, "e"}));
  ASSERT_TRUE(g.deliver_announcement(0));
  ASSERT_TRUE(g.finish0());
  g.request_shutdown(1);
  ASSERT_TRUE(g.deliver_request(1));
  EXPECT_FALSE(g.step_coordinator());  // "other" and the shutdown wait for "big"
  ASSERT_TRUE(g.finish0());            // "big" ends
  ASSERT_TRUE(g.step_coordinator());
  EXPECT_EQ(g.log().back().type, MsgType::shutdown);
  g.drain();
  g.check_quiescent();
  EXPECT_EQ(g.coordinator().stats().nested, 2U);
  EXPECT_EQ(g.rank(1).answered, 3U);  // big, d, e; "other" failed with the shutdown
  EXPECT_EQ(g.rank(1).failed, 1U);
}

// Without nesting (or with nesting, inside a batch) nothing is announced while rank 0 runs.
// A background copy of a large file (a replay's, stagectl prefetch's) never holds up an open:
// the next request runs nested in it, a file as well as a batch, one at a time; the background
// file's own open joins it (no second transfer), and a shutdown waits for its end.
TEST(CoordinatorTest, WhileABackgroundFileIsCopiedAnOpensFileRunsNested) {
  Group g(3, /*nesting=*/true);
  g.open(0, "replayed", MsgType::materialize, 0, /*background=*/true);
  ASSERT_TRUE(g.step_coordinator());
  EXPECT_EQ(g.log().back(), (Message{MsgType::file_prefetch, 1, "replayed"}));
  ASSERT_TRUE(g.deliver_announcement(0));  // rank 0 runs it
  g.open(1, "wanted");
  g.open_small(2, "d/s1");
  g.open(2, "second");
  while (g.deliver_request(1) || g.deliver_request(2)) {
  }
  ASSERT_TRUE(g.step_coordinator());
  EXPECT_EQ(g.log().back(), (Message{MsgType::file_nested, 2, "wanted"}));
  ASSERT_TRUE(g.deliver_announcement(0));
  EXPECT_FALSE(g.step_coordinator());  // one nested transfer at a time
  ASSERT_TRUE(g.finish0());            // "wanted" ends, "replayed" goes on
  ASSERT_TRUE(g.step_coordinator());
  EXPECT_EQ(g.log().back(), (Message{MsgType::batch_nested, 3, "d"}));
  ASSERT_TRUE(g.deliver_announcement(0));
  ASSERT_TRUE(g.finish0());
  ASSERT_TRUE(g.step_coordinator());
  EXPECT_EQ(g.log().back(), (Message{MsgType::file_nested, 4, "second"}));
  ASSERT_TRUE(g.deliver_announcement(0));
  ASSERT_TRUE(g.finish0());
  g.request_shutdown(1);
  ASSERT_TRUE(g.deliver_request(1));
  EXPECT_FALSE(g.step_coordinator());  // the shutdown waits for "replayed"
  ASSERT_TRUE(g.finish0());
  g.drain();
  EXPECT_EQ(g.log().back().type, MsgType::shutdown);
  EXPECT_EQ(g.coordinator().stats().nested, 3U);
  g.check_quiescent();
  EXPECT_EQ(g.rank(0).answered, 1U);  // the background wait, answered by its transfer
}

// An open joins a background wait of its own node: it asks as an open, and the key goes
// ahead of the rest of the background queue; with nesting off, a background file runs alone.
TEST(CoordinatorTest, AnOpenMovesABackgroundFileAheadAndWithoutNestingWaitsForTheRunningOne) {
  Group g(2, /*nesting=*/false);
  for (const char* p : {"r0", "r1", "r2"}) g.open(0, p, MsgType::materialize, 0, /*background=*/true);
  ASSERT_TRUE(g.step_coordinator());
  EXPECT_EQ(g.log().back(), (Message{MsgType::file_prefetch, 1, "r0"}));
  ASSERT_TRUE(g.deliver_announcement(0));
  g.open(0, "r2");  // the job opens a file the replay queued last
  g.open(1, "other");
  ASSERT_TRUE(g.deliver_request(1));
  EXPECT_FALSE(g.step_coordinator());  // nesting off: "r0" runs alone
  ASSERT_TRUE(g.finish0());
  std::vector<std::string> order;
  while (g.step_coordinator()) {
    order.push_back(g.log().back().path);
    ASSERT_TRUE(g.deliver_announcement(0));
    ASSERT_TRUE(g.finish0());
  }
  EXPECT_EQ(order, (std::vector<std::string>{"r2", "other", "r1"}));
  EXPECT_EQ(g.coordinator().stats().promoted, 1U);
  g.drain();
  g.check_quiescent();
}

TEST(CoordinatorTest, NothingIsAnnouncedWhileABatchRunsOrWithNestingOff) {
  for (bool nesting : {false, true}) {
    Group g(2, nesting);
    if (nesting) {
      g.open_small(1, "d/s");
    } else {
      g.open(1, "big");
    }
    ASSERT_TRUE(g.deliver_request(1));
    ASSERT_TRUE(g.step_coordinator());
    ASSERT_TRUE(g.deliver_announcement(0));
    g.open_small(1, "e/s");
    ASSERT_TRUE(g.deliver_request(1));
    EXPECT_FALSE(g.step_coordinator()) << nesting;
    ASSERT_TRUE(g.finish0());
    ASSERT_TRUE(g.step_coordinator());
    EXPECT_EQ(g.log().back(), (Message{MsgType::batch, 2, "e"}));
    g.drain();
    g.check_quiescent();
  }
  // A request can never name a nested batch (announcements only): dropped.
  Coordinator c;
  c.on_request(Message{MsgType::batch_nested, 0, "d"});
  EXPECT_FALSE(c.next_announcement());
}

// Walks: opens in two sibling directories make their parent a walk; the other subdirectories
// are prefetched behind every request, one at a time, and a request promotes one.
TEST(CoordinatorTest, TwoSiblingDirectoriesStageTheOthersBehindEveryRequest) {
  Group g(2, /*nesting=*/true, {{"data", {"a", "b", "c", "d", "e"}}});
  g.open_small(1, "data/a/x");
  g.drain();
  EXPECT_EQ(g.walks(), 0U);  // one directory is not a walk
  g.open_small(1, "data/a/y");
  g.drain();
  EXPECT_EQ(g.walks(), 0U);  // nor twice the same one
  g.open_small(1, "data/b/x");
  ASSERT_TRUE(g.deliver_request(1));
  EXPECT_EQ(g.walks(), 1U);
  ASSERT_TRUE(g.step_coordinator());  // what was asked for goes first
  EXPECT_EQ(g.log().back(), (Message{MsgType::batch, 3, "data/b"}));
  ASSERT_TRUE(g.deliver_announcement(0));
  EXPECT_FALSE(g.step_coordinator());  // nothing while it runs
  ASSERT_TRUE(g.finish0());
  ASSERT_TRUE(g.deliver_announcement(1));
  ASSERT_TRUE(g.step_coordinator());  // then c, the first not announced yet (a and b were)
  EXPECT_EQ(g.log().back(), (Message{MsgType::batch_prefetch, 4, "data/c"}));
  // While c runs, rank 1 opens a file of e and a large file: both go before d.
  ASSERT_TRUE(g.deliver_announcement(0));
  g.open_small(1, "data/e/x");
  g.open(1, "data/big");
  while (g.deliver_request(1)) {
  }
  EXPECT_EQ(g.coordinator().stats().promoted, 1U);
  EXPECT_FALSE(g.step_coordinator());  // c runs
  ASSERT_TRUE(g.finish0());
  ASSERT_TRUE(g.step_coordinator());
  EXPECT_EQ(g.log().back(), (Message{MsgType::batch, 5, "data/e"}));  // promoted
  ASSERT_TRUE(g.deliver_announcement(0));
  ASSERT_TRUE(g.finish0());
  ASSERT_TRUE(g.step_coordinator());
  EXPECT_EQ(g.log().back(), (Message{MsgType::materialize, 6, "data/big"}));
  ASSERT_TRUE(g.deliver_announcement(0));  // rank 0 runs the large file: a prefetch never nests
  EXPECT_FALSE(g.step_coordinator());
  ASSERT_TRUE(g.finish0());
  ASSERT_TRUE(g.step_coordinator());
  EXPECT_EQ(g.log().back(), (Message{MsgType::batch_prefetch, 7, "data/d"}));
  g.drain();
  g.check_quiescent();
  const auto& st = g.coordinator().stats();
  EXPECT_EQ(st.prefetched, 2U);  // c and d; e was asked for
  EXPECT_EQ(st.walks, 1U);
  ASSERT_EQ(g.log().size(), 7U);
  // A later open in a third, fourth directory of the same parent is no new walk.
  g.open_small(1, "data/c/new");
  g.drain();
  EXPECT_EQ(g.walks(), 1U);
  g.check_quiescent();
}

// A shutdown drops what was prefetched; nothing is prefetched after it.
TEST(CoordinatorTest, AShutdownDropsThePrefetchedBatches) {
  Group g(2, false, {{"", {"a", "b", "c", "d"}}});
  g.open_small(1, "a/x");
  g.open_small(1, "b/x");
  while (g.deliver_request(1)) {
  }
  g.request_shutdown(1);
  ASSERT_TRUE(g.deliver_request(1));
  g.drain();
  ASSERT_EQ(g.log().size(), 1U);
  EXPECT_EQ(g.log().back().type, MsgType::shutdown);
  EXPECT_EQ(g.coordinator().stats().prefetched, 0U);
  g.check_quiescent();
}

// A prefetched batch that found no room drops the queue: the other siblings are not
// announced; what readers ask for still is, and so is a later walk's prefetch.
TEST(CoordinatorTest, DroppedPrefetchesAreNotAnnouncedButRequestsAndLaterWalksAre) {
  Group g(2, false, {{"data", {"a", "b", "c", "d", "e"}}, {"more", {"x", "y", "z"}}});
  g.open_small(1, "data/a/f");
  g.open_small(1, "data/b/f");
  g.drain();  // a, b asked for; c, d, e prefetched
  ASSERT_EQ(g.log().size(), 5U);
  EXPECT_EQ(g.log()[2], (Message{MsgType::batch_prefetch, 3, "data/c"}));
  g.open_small(1, "more/x/f");
  g.open_small(1, "more/y/f");
  while (g.deliver_request(1)) {
  }
  ASSERT_TRUE(g.step_coordinator());
  ASSERT_TRUE(g.deliver_announcement(0));
  ASSERT_TRUE(g.finish0());
  EXPECT_EQ(g.drop_prefetches(), 1U);  // z, behind x and y
  g.drain();
  ASSERT_EQ(g.log().size(), 7U);
  EXPECT_EQ(g.log()[5], (Message{MsgType::batch, 6, "more/x"}));
  EXPECT_EQ(g.log()[6], (Message{MsgType::batch, 7, "more/y"}));
  g.open_small(0, "more/z/f");  // asked for: announced as usual
  g.drain();
  ASSERT_EQ(g.log().size(), 8U);
  EXPECT_EQ(g.log()[7], (Message{MsgType::batch, 8, "more/z"}));
  EXPECT_EQ(g.coordinator().stats().prefetch_dropped, 1U);
  EXPECT_EQ(g.drop_prefetches(), 0U);
  g.check_quiescent();
}

// Random interleavings of opens (large files, small files by directory), deliveries and
// shutdowns on 1 to 7 ranks.
TEST(CoordinatorTest, RandomInterleavingsKeepThePromises) {
  uint64_t nested = 0;                                 // the runs with nesting on do nest
  uint64_t nested_files = 0, background_files = 0;     // files nest in background ones
  uint64_t prefetched = 0, promoted = 0, dropped = 0;  // and the runs with walks do prefetch (and drop)
  for (uint32_t seed = 1; seed <= 300; ++seed) {
    std::mt19937 rng(seed);
    const int n = 1 + static_cast<int>(seed % 7);
    const int paths = 1 + static_cast<int>(rng() % 6);
    const bool with_shutdown = seed % 3 == 0;
    const bool walks = seed % 5 < 2;
    Group g(n, /*nesting=*/seed % 2 == 0,
            walks ? std::map<std::string, std::vector<std::string>>{{"", {"d3", "d0", "d1", "d2"}}}
                  : std::map<std::string, std::vector<std::string>>{});
    auto pick = [&](int k) { return static_cast<int>(rng() % static_cast<uint32_t>(k)); };
    const int users = 1 + static_cast<int>(seed % 4);  // one to four users take turns by cost
    auto uid = [&] { return static_cast<uint32_t>(1000 + pick(users)); };
    // Three runs in four also make background requests (a replay, stagectl prefetch).
    auto background = [&] { return seed % 4 != 3 && pick(3) == 0; };
    for (int step = 0; step < 400; ++step) {
      const int r = pick(n);
      switch (pick(10)) {
        case 0:
          g.open(r, "f" + std::to_string(pick(paths)), MsgType::materialize, uid(), background());
          break;
        case 1:  // a large file in a directory: its own transfer
          g.open(r, "d" + std::to_string(pick(3)) + "/f" + std::to_string(pick(paths)), MsgType::materialize,
                 uid(), background());
          break;
        case 2:  // a small file (in the root or a directory): its directory's batch
          g.open_small(r,
                       (pick(4) == 0 ? std::string() : "d" + std::to_string(pick(3)) + "/") + "s" +
                           std::to_string(pick(paths)),
                       uid(), background());
          break;
        case 3:
        case 4:
          g.deliver_request(r);
          break;
        case 5:
        case 6:
          g.step_coordinator();
          break;
        case 7:
        case 8:
          g.deliver_announcement(r);
          break;
        default:
          if (pick(2) == 0) g.finish0();
          if (with_shutdown && pick(40) == 0) g.request_shutdown(r);
          if (walks && pick(30) == 0) dropped += g.drop_prefetches();
      }
      if (::testing::Test::HasFailure()) FAIL() << "seed " << seed << " step " << step;
    }
    g.drain();
    g.check_quiescent();
    if (!with_shutdown) {
      for (int r = 0; r < n; ++r) EXPECT_EQ(g.rank(r).failed, 0U) << "seed " << seed;
    }
    g.request_shutdown(pick(n));
    g.drain();
    g.check_quiescent();
    ASSERT_FALSE(g.log().empty());
    EXPECT_EQ(g.log().back().type, MsgType::shutdown) << "seed " << seed;
    for (int r = 0; r < n; ++r) EXPECT_TRUE(g.stopped(r)) << "seed " << seed;
    if (::testing::Test::HasFailure()) FAIL() << "seed " << seed;
    nested += g.coordinator().stats().nested;
    for (const Message& m : g.log()) {
      nested_files += m.type == MsgType::file_nested ? 1 : 0;
      background_files += m.type == MsgType::file_prefetch ? 1 : 0;
    }
    prefetched += g.coordinator().stats().prefetched;
    promoted += g.coordinator().stats().promoted;
  }
  EXPECT_GT(nested, 100U);
  EXPECT_GT(background_files, 50U);
  EXPECT_GT(nested_files, 10U);
  EXPECT_GT(prefetched, 20U);
  EXPECT_GT(promoted, 5U);
  EXPECT_GT(dropped, 5U);
}

}  // namespace
}  // namespace stagefs
