// Replays of a profile (fusefs/profile/plan.h, replay.h): the plan (small files by directory,
// large ones alone with the chunks read during their copy) and the replay itself against a
// materializer that answers when the test says (a window of items outstanding, no room ends it).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <set>
#include <thread>

#include "bcast/io/crc.h"
#include "bcast/io/fd.h"
#include "bcast/io/manifest.h"
#include "fake_p2p.h"
#include "fusefs/profile/exchange.h"
#include "fusefs/profile/file.h"
#include "fusefs/profile/format.h"
#include "fusefs/profile/plan.h"
#include "fusefs/profile/recorder.h"
#include "fusefs/profile/replay.h"
#include "tmpdir.h"

namespace stagefs {
namespace {

FileProbe ok(mode_t mode, off_t size) {
  FileProbe p;
  p.state = FileProbe::State::ok;
  p.st.st_mode = S_IFREG | mode;
  p.st.st_size = size;
  return p;
}

TEST(ReplayPlanTest, SmallFilesGoByDirectoryLargeOnesAloneWithTheirChunks) {
  ReplayPlan plan(/*small=*/1000, /*profile chunk=*/4 << 20, /*transfer chunk=*/8 << 20);
  FileProbe gone, denied, dir;
  denied.state = FileProbe::State::denied;
  dir.state = FileProbe::State::ok;
  dir.st.st_mode = S_IFDIR | 0755;
  struct Step {
    ProfileFile f;
    FileProbe probe;
    std::optional<size_t> item;
  };
  const std::vector<Step> steps{
      {{"d/s2", 0, {}}, ok(0644, 100), 0},             // a small file: d's batch, from s2
      {{"img", 1, {3, 2}}, ok(0644, 5000), 1},         // large: alone, chunks in 8 MiB
      {{"d/s1", 2, {}}, ok(0644, 200), std::nullopt},  // d's batch again: counted in item 0
      {{"d/private", 3, {}}, ok(0600, 10), 2},         // not o+r: never in a batch, alone
      {{"gone", 4, {}}, gone, std::nullopt},
      {{"secret", 5, {}}, denied, std::nullopt},
      {{"adir", 6, {}}, dir, std::nullopt},
      {{"e/s", 7, {}}, ok(0644, 1), 3},
  };
  for (const Step& s : steps) EXPECT_EQ(plan.add(s.f, s.probe), s.item) << s.f.path;
  ASSERT_EQ(plan.items(), 4U);
  EXPECT_EQ(plan.item(0).kind, ReplayItem::Kind::batch);
  EXPECT_EQ(plan.item(0).path, "d/s2");
  EXPECT_EQ((std::pair{plan.item(0).files, plan.item(0).bytes}), (std::pair{uint64_t{2}, uint64_t{300}}));
  EXPECT_EQ(plan.item(1).kind, ReplayItem::Kind::file);
  EXPECT_EQ(plan.item(1).chunks, (std::vector<uint64_t>{1}));
  EXPECT_EQ(plan.item(2).kind, ReplayItem::Kind::file);
  EXPECT_EQ(plan.item(3).path, "e/s");
  const PlanCounts& c = plan.counts();
  EXPECT_EQ((std::tuple{c.files, c.bytes, c.gone, c.denied, c.other}),
            (std::tuple{uint64_t{5}, uint64_t{5311}, uint64_t{1}, uint64_t{1}, uint64_t{1}}));
}

// The materializer's side of a replay: what it was asked, in order, answered when the test says.
class AskedFor final : public Materializer {
 public:
  struct Ask {
    std::string what;  // "file PATH" or "batch PATH"
    Want want;
    Done done;
  };
  void materialize_async(const std::string& rel, const Want& want, Done done) override {
    add("file " + rel, want, std::move(done));
  }
  void materialize_small_async(const std::string& rel, uint64_t since, const Want& want, Done done) override {
    EXPECT_EQ(since, 0U);  // a batch this mount already made answers at once
    add("batch " + rel, want, std::move(done));
  }
  // Waits until n asks came (60 s bound): false if they did not.
  bool wait_asks(size_t n) {
    std::unique_lock lk(m_);
    return cv_.wait_for(lk, std::chrono::seconds(60), [&] { return asks_.size() >= n; });
  }
  void answer(size_t i, stage::Status st = {}) {
    Done d;
    {
      std::lock_guard lk(m_);
      d = std::move(asks_[i].done);
      ++answered_;
    }
    d(std::move(st));
  }
  // Asks not yet answered.
  size_t outstanding() {
    std::lock_guard lk(m_);
    return asks_.size() - answered_;
  }
  std::vector<std::string> asked() {
    std::lock_guard lk(m_);
    std::vector<std::string> out;
    for (const auto& a : asks_) out.push_back(a.what);
    return out;
  }
  Want want(size_t i) {
    std::lock_guard lk(m_);
    return asks_[i].want;
  }

 private:
  void add(std::string what, const Want& want, Done done) {
    std::lock_guard lk(m_);
    asks_.push_back(Ask{std::move(what), want, std::move(done)});
    cv_.notify_all();
  }
  std::mutex m_;
  std::condition_variable cv_;
  std::vector<Ask> asks_;
  size_t answered_ = 0;
};

// A probe of a source where every name is a regular file of 1000 bytes (o+r), "big*" of 10 MB,
// and "gone*" does not exist.
FileProbe fake_probe(const std::string& rel) {
  if (rel.rfind("gone", 0) == 0) return FileProbe{};
  return ok(0644, rel.rfind("big", 0) == 0 ? 10'000'000 : 1000);
}

Profile replay_profile(int big_files) {
  Profile p;
  p.chunk_size = 1 << 20;
  for (int i = 0; i < big_files; ++i)
    p.files.push_back({"big" + std::to_string(i), static_cast<uint64_t>(i), {}});
  return p;
}

void wait_state(Replay& r, const std::string& state) {
  EXPECT_TRUE(r.wait_for_end(std::chrono::seconds(60))) << "the replay did not end";
  EXPECT_EQ(r.stats().state, state);
}

constexpr Want kReplayWant{1234, true, false};

TEST(ReplayTest, AtMostAWindowOfItemsIsOutstandingAndEveryFileIsCountedWhenDone) {
  Profile p = replay_profile(5);
  p.files.push_back({"d/s1", 9, {}});
  p.files.push_back({"gone1", 9, {}});
  p.files.push_back({"d/s2", 9, {}});
  AskedFor mat;
  // The probe of a file comes after the replay waited for room in its window: never with
  // `window` asks outstanding.
  std::mutex seen_m;
  std::vector<size_t> outstanding_at_probe;
  auto probe = [&](const std::string& rel) {
    std::lock_guard lk(seen_m);
    outstanding_at_probe.push_back(mat.outstanding());
    return fake_probe(rel);
  };
  Replay replay(p, "/p", Replay::Config{4096, 1 << 20, 2}, mat, probe, kReplayWant);
  replay.start();
  ASSERT_TRUE(mat.wait_asks(2));
  EXPECT_EQ(replay.stats().state, "running");
  for (size_t i = 0; i < 6; ++i) {
    ASSERT_TRUE(mat.wait_asks(i + 1));
    mat.answer(i);
  }
  wait_state(replay, "done");
  {
    std::lock_guard lk(seen_m);
    ASSERT_EQ(outstanding_at_probe.size(), 8U);
    for (size_t k = 0; k < 8; ++k)
      EXPECT_LT(outstanding_at_probe[k], 2U) << "file " << k << ": the window was full";
  }
  EXPECT_EQ(mat.asked(), (std::vector<std::string>{"file big0", "file big1", "file big2", "file big3",
                                                   "file big4", "batch d/s1"}));
  const Want w = mat.want(0);
  EXPECT_EQ((std::tuple{w.uid, w.background, w.may_evict}), (std::tuple{1234U, true, false}));
  const ReplayStats s = replay.stats();
  EXPECT_EQ((std::tuple{s.files, s.files_queued, s.files_done, s.files_skipped}),
            (std::tuple{uint64_t{8}, uint64_t{7}, uint64_t{7}, uint64_t{1}}));
  EXPECT_EQ(s.bytes_done, 5 * 10'000'000U + 2000U);
  // The job then opened big0, big1 and d/s2 (any node): used; the rest is the waste.
  Profile job;
  job.files = {{"big0", 0, {}}, {"d/s2", 1, {}}, {"big1", 2, {}}, {"other", 3, {}}};
  replay.account(job);
  const ReplayStats a = replay.stats();
  EXPECT_TRUE(a.accounted);
  EXPECT_EQ((std::tuple{a.files_used, a.bytes_used, a.files_unused, a.bytes_unused}),
            (std::tuple{uint64_t{3}, 20'001'000U, uint64_t{4}, 30'001'000U}));
}

TEST(ReplayTest, AnItemWithoutRoomEndsTheReplayAndSoDoesTheMountsEnd) {
  AskedFor mat;
  {
    Replay replay(replay_profile(10), "/p", Replay::Config{4096, 1 << 20, 2}, mat, fake_probe, kReplayWant);
    replay.start();
    ASSERT_TRUE(mat.wait_asks(2));
    mat.answer(0, stage::sys_error(ENOSPC, "no room (test)"));
    mat.answer(1);
    wait_state(replay, "full");
    EXPECT_EQ(mat.asked().size(), 2U);
    EXPECT_EQ(replay.stats().files_skipped, 1U);
  }
  AskedFor mat2;
  auto replay = std::make_unique<Replay>(replay_profile(10), "/p", Replay::Config{4096, 1 << 20, 2}, mat2,
                                         fake_probe, kReplayWant);
  replay->start();
  ASSERT_TRUE(mat2.wait_asks(2));
  replay->stop();  // the mount ends: the walk stops; the group answers what is outstanding
  EXPECT_EQ(replay->stats().state, "stopped");
  replay.reset();
  mat2.answer(0, stage::sys_error(ESHUTDOWN, "shutting down (test)"));  // after the Replay is gone
  mat2.answer(1, stage::sys_error(ESHUTDOWN, "shutting down (test)"));
  EXPECT_EQ(mat2.asked().size(), 2U);
}

TEST(ReplayTest, ARecordedFilesChunksAreWantedFirstInTheTransfersChunkSize) {
  Profile p = replay_profile(1);
  p.files[0].chunks = {9, 2};
  AskedFor mat;
  Replay replay(p, "/p", Replay::Config{4096, 2 << 20, 1}, mat, fake_probe, kReplayWant);
  EXPECT_EQ(replay.first_chunks("big0", 2 << 20), (std::vector<uint64_t>{4, 1}));
  EXPECT_EQ(replay.first_chunks("big0", 512 << 10), (std::vector<uint64_t>{18, 19, 4, 5}));
  EXPECT_TRUE(replay.first_chunks("other", 1 << 20).empty());
}

// stage-bcast --profile: the profile's files first in a tree's stream, in its order; the
// directories and symlinks ahead of every file (each directory before what it holds).
TEST(ProfileOrderTest, AProfilesFilesGoFirstInATreesStreamAndDirectoriesKeepTheirPlaces) {
  stage::Manifest m;
  m.tree = true;
  for (const auto& [path, type] :
       std::vector<std::pair<std::string, stage::EntryType>>{{"", stage::EntryType::dir},
                                                             {"a", stage::EntryType::dir},
                                                             {"a/1", stage::EntryType::file},
                                                             {"a/2", stage::EntryType::file},
                                                             {"b", stage::EntryType::dir},
                                                             {"b/3", stage::EntryType::file},
                                                             {"b/l", stage::EntryType::symlink},
                                                             {"b/4", stage::EntryType::file}})
    m.entries.push_back(stage::Entry{path, type, {}, type == stage::EntryType::symlink ? "target" : "", 0});
  stage::order_files_first(m, {"b/4", "nope", "a", "a/2", "b/4"});
  std::vector<std::string> order;
  for (const auto& e : m.entries) order.push_back(e.path);
  EXPECT_EQ(order, (std::vector<std::string>{"", "a", "b", "b/l", "b/4", "a/2", "a/1", "b/3"}));
  const std::string bytes = stage::encode(m);  // every parent still before what it holds
  EXPECT_TRUE(stage::decode(std::as_bytes(std::span(bytes.data(), bytes.size()))));
}

TEST(ProfileOrderTest, PathsAreTakenRelativeToASourceInsideTheProfilesSource) {
  Profile p;
  p.source = "/shared/data";
  p.files = {{"ds/a", 0, {}}, {"img", 1, {}}, {"ds/b/c", 2, {}}, {"dsx/d", 3, {}}};
  EXPECT_EQ(profile_paths_under(p, "/shared/data"),
            (std::vector<std::string>{"ds/a", "img", "ds/b/c", "dsx/d"}));
  EXPECT_EQ(profile_paths_under(p, "/shared/data/ds"), (std::vector<std::string>{"a", "b/c"}));
  EXPECT_EQ(profile_paths_under(p, "/elsewhere"),
            (std::vector<std::string>{"ds/a", "img", "ds/b/c", "dsx/d"}));
}

}  // namespace
}  // namespace stagefs
