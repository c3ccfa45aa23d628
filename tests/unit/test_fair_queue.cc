// Turns between users on the direct Coordinator (one rank, no simulated group): by the cost
// of what each uid's transfers moved, background requests behind every open, the slices of a
// bounded batch queued behind other users, and the walks' budgets.
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

#include "fusefs/group/control.h"
#include "fusefs/group/coordinator.h"

namespace stagefs {
namespace {

// Fairness: the direct Coordinator, one rank. A request of uid `uid`, as a node sends it.
Message user_req(uint32_t uid, const std::string& path, MsgType type = MsgType::materialize,
                 uint8_t flags = 0, const std::string& from = {}) {
  return Message{type, 0, path, uid, flags, from, {}};
}
// Announces what the coordinator decides next, runs it at once on its node, and returns it.
std::optional<Message> run_next(Coordinator& c) {
  auto m = c.next_announcement();
  if (!m) return m;
  c.on_announced(*m);
  c.on_started(*m);
  c.on_finished(*m);
  return m;
}

// One user's backlog (a prefetch of hundreds of names) delays another user's open by the one
// transfer announced before it arrived: the uids take turns, each uid's requests in order.
TEST(FairQueueTest, AnotherUsersOpenIsServedBeforeTheRestOfOneUsersBacklog) {
  Coordinator c;
  for (int i = 0; i < 200; ++i) c.on_request(user_req(1000, "big/f" + std::to_string(i)));
  auto first = run_next(c);
  ASSERT_TRUE(first);
  EXPECT_EQ(first->path, "big/f0");
  c.on_request(user_req(2000, "other"));
  c.on_request(user_req(2000, "other2"));
  std::vector<std::string> order;
  while (auto m = run_next(c)) order.push_back(m->path);
  ASSERT_EQ(order.size(), 201U);
  EXPECT_EQ(order[0], "big/f1");  // 1000's turn had come before 2000 asked
  EXPECT_EQ(order[1], "other");
  EXPECT_EQ(order[2], "big/f2");
  EXPECT_EQ(order[3], "other2");
  // Within a uid: first come, first served.
  for (size_t i = 4; i < order.size(); ++i) EXPECT_EQ(order[i], "big/f" + std::to_string(i - 1));
}

// Announces, runs and charges what the coordinator decides next, as GroupService does.
std::optional<Message> run_charged(Coordinator& c, const std::function<uint64_t(const Message&)>& cost) {
  auto m = c.next_announcement();
  if (!m) return m;
  c.on_announced(*m);
  c.on_started(*m);
  c.charge(*m, cost(*m));
  c.on_finished(*m);
  return m;
}

// Turns by cost: a user whose transfers move 10 GiB each gets one of them, then another
// user's 20 MiB opens all go before its next one (by turns alone they would alternate, and
// the last small open would wait for three 10 GiB copies).
TEST(FairQueueTest, AUsersExpensiveTransfersDoNotStarveAnothersCheapOnes) {
  Coordinator c;
  for (int i = 0; i < 4; ++i) c.on_request(user_req(1000, "big" + std::to_string(i)));
  for (int i = 0; i < 4; ++i) c.on_request(user_req(2000, "small" + std::to_string(i)));
  const auto cost = [](const Message& m) {
    return m.path.starts_with("big") ? transfer_cost(uint64_t{10} << 30, 640, 1)
                                     : transfer_cost(20 << 20, 2, 1);
  };
  std::vector<std::string> order;
  while (auto m = run_charged(c, cost)) order.push_back(m->path);
  EXPECT_EQ(order, (std::vector<std::string>{"big0", "small0", "small1", "small2", "small3", "big1", "big2",
                                             "big3"}));
  // A 1 TiB sparse file with one written byte moves one chunk: it costs about what a small
  // file does, not what 65,536 chunks of zeros would.
  EXPECT_LT(transfer_cost(16 << 20, 1, 1), transfer_cost(20 << 20, 2, 1));
}

// A user who had the mount alone banks nothing: when another user comes, both start level,
// and with equal costs they take turns (the newcomer does not get its whole backlog first).
TEST(FairQueueTest, AUserWhoHadTheMountAloneBanksNoCredit) {
  Coordinator c;
  const auto cost = [](const Message&) { return transfer_cost(uint64_t{10} << 30, 640, 1); };
  for (int i = 0; i < 5; ++i) c.on_request(user_req(1000, "a" + std::to_string(i)));
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(run_charged(c, cost));
  for (int i = 0; i < 3; ++i) c.on_request(user_req(2000, "b" + std::to_string(i)));
  for (int i = 5; i < 7; ++i) c.on_request(user_req(1000, "a" + std::to_string(i)));
  std::vector<std::string> order;
  while (auto m = run_charged(c, cost)) order.push_back(m->path);
  EXPECT_EQ(order, (std::vector<std::string>{"b0", "a4", "b1", "a5", "b2", "a6"}));
}

// The turn order is by uid, not by key: a batch asked for by one user and merged with another
// user's request keeps its first place; three users alternate.
TEST(FairQueueTest, ThreeUsersTakeTurnsAndAMergedRequestKeepsItsPlace) {
  Coordinator c;
  for (int i = 0; i < 3; ++i) c.on_request(user_req(1, "a" + std::to_string(i)));
  for (int i = 0; i < 3; ++i) c.on_request(user_req(2, "b" + std::to_string(i)));
  c.on_request(user_req(3, "c0"));
  c.on_request(user_req(3, "a2"));  // merged into uid 1's
  std::vector<std::string> order;
  while (auto m = run_next(c)) order.push_back(m->path);
  EXPECT_EQ(order, (std::vector<std::string>{"a0", "b0", "c0", "a1", "b1", "a2", "b2"}));
  EXPECT_EQ(c.stats().merged, 1U);
}

// A background request (stagectl prefetch) waits behind every request, whatever its uid; an
// open of the same file promotes it.
TEST(FairQueueTest, BackgroundRequestsRunBehindOpensAndAnOpenPromotesOne) {
  Coordinator c;
  for (int i = 0; i < 5; ++i)
    c.on_request(user_req(1000, "p" + std::to_string(i), MsgType::materialize, kBackground));
  c.on_request(user_req(2000, "open1"));
  c.on_request(user_req(2000, "p3"));  // an open of a prefetched file
  c.on_request(user_req(3000, "open2"));
  std::vector<std::string> order;
  while (auto m = run_next(c)) order.push_back(m->path);
  EXPECT_EQ(order, (std::vector<std::string>{"open1", "open2", "p3", "p0", "p1", "p2", "p4"}));
  EXPECT_EQ(c.stats().promoted, 1U);
}

// Bounded batches: a slice that left names out queues the rest of its range behind the
// requests of other users that arrived meanwhile; the ranges chain round the directory back
// to where the first slice began, and end when a slice leaves nothing out.
TEST(FairQueueTest, TheNextSliceQueuesBehindOtherUsersAndCoversTheRestOfTheCircle) {
  Coordinator c;
  c.on_request(user_req(1000, "huge", MsgType::batch, 0, "f500"));
  auto s1 = run_next(c);
  ASSERT_TRUE(s1);
  EXPECT_EQ(*s1, (Message{MsgType::batch, 1, "huge", 1000, 0, "f500", ""}));
  c.on_request(user_req(2000, "other"));
  c.continue_batch(*s1, "f700");
  auto o = run_next(c);
  ASSERT_TRUE(o);
  EXPECT_EQ(o->path, "other");
  auto s2 = run_next(c);
  ASSERT_TRUE(s2);
  EXPECT_EQ(*s2, (Message{MsgType::batch, 3, "huge", 1000, 0, "f700", "f500"}));  // round to f500
  c.continue_batch(*s2, "f100");  // wrapped past the last name
  auto s3 = run_next(c);
  ASSERT_TRUE(s3);
  EXPECT_EQ(*s3, (Message{MsgType::batch, 4, "huge", 1000, 0, "f100", "f500"}));
  c.continue_batch(*s3, "");  // nothing left out: the end
  EXPECT_FALSE(c.next_announcement());
  // A directory staged from its first name: the rest runs to the last name, not round again.
  c.on_request(user_req(1000, "d", MsgType::batch));
  auto t1 = run_next(c);
  ASSERT_TRUE(t1);
  c.continue_batch(*t1, "g");
  auto t2 = run_next(c);
  ASSERT_TRUE(t2);
  EXPECT_EQ(*t2, (Message{MsgType::batch, 6, "d", 1000, kToEnd, "g", ""}));
  c.continue_batch(*t2, "k");
  auto t3 = run_next(c);
  ASSERT_TRUE(t3);
  EXPECT_EQ(*t3, (Message{MsgType::batch, 7, "d", 1000, kToEnd, "k", ""}));
  EXPECT_EQ(c.stats().continued, 4U);
}

// Walk budget: once one walk's prefetched slices listed its bytes, its queued prefetches go;
// another walk's and the requests stay.
TEST(FairQueueTest, AWalkOverItsByteBudgetDropsItsOwnPrefetchesOnly) {
  Coordinator c;
  c.set_walks(true);
  c.set_budget(1000, 0);
  c.on_request(user_req(1, "w/a", MsgType::batch));
  c.on_request(user_req(1, "w/b", MsgType::batch));
  c.on_request(user_req(1, "v/a", MsgType::batch));
  c.on_request(user_req(1, "v/b", MsgType::batch));
  ASSERT_EQ(c.take_walks(), (std::vector<std::string>{"w", "v"}));
  for (const char* d : {"w/c", "w/d", "w/e", "v/c", "v/d"}) c.prefetch(d);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(run_next(c));  // the four asked for
  auto p = run_next(c);
  ASSERT_TRUE(p);
  EXPECT_EQ(*p, (Message{MsgType::batch_prefetch, 5, "w/c"}));
  EXPECT_EQ(c.slice_left(*p)->bytes, 1000U);
  EXPECT_FALSE(c.batch_ran(*p, 600, 3).over);
  auto q = run_next(c);
  ASSERT_TRUE(q);
  EXPECT_EQ(q->path, "w/d");
  EXPECT_EQ(c.slice_left(*q)->bytes, 400U) << "what the walk has left";
  EXPECT_EQ(c.slice_left(*q)->files, UINT64_MAX) << "no file budget";
  const auto t = c.batch_ran(*q, 600, 3);  // 1200 > 1000: w/e goes
  EXPECT_TRUE(t.over);
  EXPECT_EQ(t.dropped, 1U);
  c.continue_batch(*q, "n", t.spent);  // nor is the rest of w/d queued
  std::vector<std::string> rest;
  while (auto m = run_next(c)) rest.push_back(m->path);
  EXPECT_EQ(rest, (std::vector<std::string>{"v/c", "v/d"}));
  EXPECT_EQ(c.stats().prefetch_dropped, 1U);
}

// Walks count files too: a walk of empty files (no bytes, 8 KiB charged each by the group,
// here 0) stops at its file budget.
TEST(FairQueueTest, AWalkOverItsFileBudgetDropsItsPrefetches) {
  Coordinator c;
  c.set_walks(true);
  c.set_budget(0, 100);
  c.on_request(user_req(1, "w/a", MsgType::batch));
  c.on_request(user_req(1, "w/b", MsgType::batch));
  ASSERT_EQ(c.take_walks(), (std::vector<std::string>{"w"}));
  for (const char* d : {"w/c", "w/d", "w/e"}) c.prefetch(d);
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(run_next(c));
  auto p = run_next(c);
  ASSERT_TRUE(p);
  EXPECT_EQ(c.slice_left(*p)->files, 100U);
  const auto t = c.batch_ran(*p, 0, 100);
  EXPECT_TRUE(t.over);
  EXPECT_EQ(t.dropped, 2U);
  EXPECT_FALSE(run_next(c));
}

// One open's batch and the slices that follow it list at most the budget: each slice after
// the first lists at most what is left, and once it is spent no further slice is queued (the
// rest waits for its own opens, each of which starts a sequence of its own). A background
// request's batch (stagectl prefetch of a small file) is held to the same.
TEST(FairQueueTest, TheSlicesThatFollowABatchStopAtTheBudget) {
  for (uint8_t flags : {uint8_t{0}, kBackground}) {
    Coordinator c;
    c.set_budget(0, 1000);
    c.on_request(user_req(1000, "huge", MsgType::batch, flags, "f0"));
    auto s1 = run_next(c);
    ASSERT_TRUE(s1);
    EXPECT_FALSE(c.slice_left(*s1)) << "the slice the open asked for: the batch limits only";
    auto t = c.batch_ran(*s1, 0, 400);
    EXPECT_TRUE(c.continue_batch(*s1, "f400", t.spent));
    auto s2 = run_next(c);
    ASSERT_TRUE(s2);
    EXPECT_EQ(s2->from, "f400");
    EXPECT_EQ(c.slice_left(*s2)->files, 600U);
    t = c.batch_ran(*s2, 0, 400);
    EXPECT_TRUE(c.continue_batch(*s2, "f800", t.spent));
    auto s3 = run_next(c);
    ASSERT_TRUE(s3);
    EXPECT_EQ(c.slice_left(*s3)->files, 200U);
    t = c.batch_ran(*s3, 0, 200);
    EXPECT_TRUE(t.over);
    EXPECT_FALSE(c.continue_batch(*s3, "f1000", t.spent)) << "the budget is spent";
    EXPECT_FALSE(c.next_announcement());
    EXPECT_EQ(c.stats().budget_stopped, 1U);
    // An open further on (its node has seen s3) starts a sequence of its own.
    Message further = user_req(1000, "huge", MsgType::batch, flags, "f1500");
    further.id = s3->id;
    c.on_request(further);
    auto again = run_next(c);
    ASSERT_TRUE(again);
    EXPECT_FALSE(c.slice_left(*again));
    EXPECT_TRUE(c.continue_batch(*again, "f1900", c.batch_ran(*again, 0, 400).spent));
  }
}

}  // namespace
}  // namespace stagefs
