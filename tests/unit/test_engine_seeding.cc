// Seeding (StageOptions::seed_from_copies): a node whose copy is current feeds the broadcast
// from its own disk; the shared source is read for metadata only. The engine on in-process
// ranks (ThreadComm; FakeP2P for the chain) over real files, with counting and faulting
// readers of the source and of the seed's copy.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <array>
#include <filesystem>
#include <memory>

#include "bcast/engine.h"
#include "fake_p2p.h"
#include "fakes.h"
#include "thread_comm.h"
#include "tmpdir.h"

namespace stage::testing {
namespace {

namespace fs = std::filesystem;

constexpr int kRanks = 4;

class SeedingTest : public TmpDirTest {
 protected:
  void SetUp() override {
    TmpDirTest::SetUp();
    for (auto& f : store_faults_) f.copy = &copy_faults_;
    for (size_t r = 0; r < kRanks; ++r) stores_[r] = std::make_unique<FaultStore>(store_faults_[r]);
  }
  std::string node(int r, const std::string& name = "copy.bin") {
    return path("node" + std::to_string(r) + "/" + name);
  }
  // A current copy by the size rule: the source's bytes and mtime.
  void warm(const std::string& src, const std::string& copy) {
    write_file(copy, read_file(src));
    struct stat st {};
    ASSERT_EQ(::stat(src.c_str(), &st), 0);
    const timespec times[2] = {st.st_atim, st.st_mtim};
    ASSERT_EQ(::utimensat(AT_FDCWD, copy.c_str(), times, 0), 0);
  }
  static ino_t inode(const std::string& p) {
    struct stat st {};
    return ::stat(p.c_str(), &st) == 0 ? st.st_ino : 0;
  }
  // Runs a transfer on kRanks ranks; rank r's copy goes to node<r>/<name> through its own
  // FaultStore (the copy faults apply to reads of existing copies). chain: over FakeP2P.
  std::vector<StageReport> run(const StageOptions& opt, const std::string& source, bool chain = false,
                               const std::string& name = "copy.bin") {
    World w(kRanks);
    FakeNet net(kRanks);
    std::vector<StageReport> reps(kRanks);
    run_ranks(w, [&](ThreadComm& c) {
      FakeP2P p2p(net, c.rank());
      if (chain) c.attach(&p2p);
      StageEndpoint ep{source, node(c.rank(), name), true};
      reps[static_cast<size_t>(c.rank())] = stage_transfer(c, &src_, *stores_[static_cast<size_t>(c.rank())], opt, ep);
    });
    return reps;
  }
  static StageOptions seeding() {
    StageOptions opt;
    opt.chunk_size = 65536;
    opt.seed_from_copies = true;
    return opt;
  }
  static bool no_temps_under(const fs::path& d) {
    for (const auto& e : fs::recursive_directory_iterator(d))
      if (e.path().filename().string().find(".stage-tmp.") != std::string::npos) return false;
    return true;
  }

  SourceFaults source_faults_;  // counts the shared source's bytes
  FaultSource src_{source_faults_};
  SourceFaults copy_faults_;  // counts (and breaks) reads of the seed's copy
  std::array<StoreFaults, kRanks> store_faults_;
  std::array<std::unique_ptr<FaultStore>, kRanks> stores_;
};

TEST_F(SeedingTest, PartlyWarmTransferReadsNoSourceBytes) {
  for (const bool chain : {false, true}) {
    SCOPED_TRACE(chain ? "chain" : "collective broadcast");
    fs::remove_all(dir_);
    const std::string data = random_bytes(1000003, 1);
    write_file(path("src.bin"), data);
    warm(path("src.bin"), node(1));
    warm(path("src.bin"), node(3));
    write_file(node(2), "stale");
    source_faults_.bytes_read = 0;
    copy_faults_.bytes_read = 0;
    const ino_t warm1 = inode(node(1)), warm3 = inode(node(3));
    auto reps = run(seeding(), path("src.bin"), chain);
    for (int r = 0; r < kRanks; ++r) {
      const StageReport& rep = reps[static_cast<size_t>(r)];
      ASSERT_TRUE(rep.ok) << (rep.errors.empty() ? "" : rep.errors[0]);
      EXPECT_TRUE(read_file(node(r)) == data) << "node " << r;
      EXPECT_EQ(rep.fed_by, 1);  // the lowest rank with a current copy
      EXPECT_TRUE(rep.fed_from_copy);
      EXPECT_EQ(rep.bytes_read_source, 0U);
      EXPECT_EQ(rep.bytes_read_seed, data.size());
    }
    EXPECT_EQ(source_faults_.bytes_read.load(), 0U);
    EXPECT_EQ(copy_faults_.bytes_read.load(), data.size());
    EXPECT_EQ(reps[0].nodes_needing, 2);
    EXPECT_EQ(reps[0].nodes_written, 2);
    EXPECT_EQ(inode(node(1)), warm1);  // seeds and other current copies are left alone
    EXPECT_EQ(inode(node(3)), warm3);
  }
}

// -r: a seed must hold a current copy of every file any node needs; else the source feeds.
TEST_F(SeedingTest, TreeIsSeededOnlyByANodeWithEveryNeededFile) {
  for (int i = 0; i < 5; ++i)
    write_file(path("tree/d/f" + std::to_string(i)), random_bytes(70000 + static_cast<size_t>(i), 10 + i));
  StageOptions opt = seeding();
  opt.recursive = true;
  ASSERT_TRUE(run(opt, path("tree"), false, "tree")[0].ok);
  // Node 0 lost f1, node 2 holds a stale f3: rank 1 holds both and seeds.
  fs::remove(node(0, "tree/d/f1"));
  write_file(node(2, "tree/d/f3"), "stale");
  source_faults_.bytes_read = 0;
  auto reps = run(opt, path("tree"), true, "tree");
  ASSERT_TRUE(reps[0].ok) << (reps[0].errors.empty() ? "" : reps[0].errors[0]);
  EXPECT_EQ(reps[0].fed_by, 1);
  EXPECT_TRUE(reps[0].fed_from_copy);
  EXPECT_EQ(source_faults_.bytes_read.load(), 0U);
  EXPECT_EQ(reps[0].bytes_read_seed, 70001U + 70003U);
  for (int r = 0; r < kRanks; ++r)
    for (int i = 0; i < 5; ++i)
      EXPECT_EQ(read_file(node(r, "tree/d/f" + std::to_string(i))), read_file(path("tree/d/f" + std::to_string(i))));
  // Every node misses a different file: no node can seed, the source feeds.
  for (int r = 0; r < kRanks; ++r) fs::remove(node(r, "tree/d/f" + std::to_string(r)));
  reps = run(opt, path("tree"), true, "tree");
  ASSERT_TRUE(reps[0].ok) << (reps[0].errors.empty() ? "" : reps[0].errors[0]);
  EXPECT_EQ(reps[0].fed_by, 0);
  EXPECT_FALSE(reps[0].fed_from_copy);
  EXPECT_EQ(reps[0].bytes_read_source, 70000U + 70001U + 70002U + 70003U);
  EXPECT_EQ(reps[0].bytes_read_seed, 0U);
}

TEST_F(SeedingTest, SeedShortReadFailsEverywhereAndPublishesNothing) {
  const std::string data = random_bytes(400000, 2);
  write_file(path("src.bin"), data);
  warm(path("src.bin"), node(1));
  warm(path("src.bin"), node(2));
  write_file(node(0), "old copy");
  write_file(node(3), "old copy");
  copy_faults_.short_read_at = 200000;  // mid-file, in the seed's copy
  for (const bool chain : {false, true}) {
    SCOPED_TRACE(chain ? "chain" : "collective broadcast");
    auto reps = run(seeding(), path("src.bin"), chain);
    for (const auto& rep : reps) {
      EXPECT_FALSE(rep.ok);
      EXPECT_EQ(rep.exit_code, 1);
      EXPECT_EQ(rep.fed_by, 1);
    }
    EXPECT_EQ(read_file(node(0)), "old copy");
    EXPECT_EQ(read_file(node(3)), "old copy");
    EXPECT_TRUE(read_file(node(1)) == data);  // the seed's copy is left as it was
    ASSERT_EQ(reps[0].errors.size(), 1U);
    EXPECT_NE(reps[0].errors[0].find("injected"), std::string::npos) << reps[0].errors[0];
    EXPECT_EQ(source_faults_.bytes_read.load(), 0U);
    EXPECT_TRUE(no_temps_under(dir_));
  }
  EXPECT_EQ(store_faults_[1].bad_copies, 2) << "the store did not hear of its unreadable copy";
}

TEST_F(SeedingTest, SeedCopyChangingDuringTheReadPublishesNothing) {
  write_file(path("src.bin"), random_bytes(300000, 3));
  warm(path("src.bin"), node(2));
  copy_faults_.changes_during_copy = true;  // the seed's copy reports a new mtime at its end
  auto reps = run(seeding(), path("src.bin"));
  for (const auto& rep : reps) EXPECT_FALSE(rep.ok);
  for (const int r : {0, 1, 3}) EXPECT_FALSE(fs::exists(node(r)));
  ASSERT_FALSE(reps[0].errors.empty());
  EXPECT_NE(reps[0].errors[0].find("seed copy"), std::string::npos) << reps[0].errors[0];
  EXPECT_NE(reps[0].errors[0].find("node2"), std::string::npos) << reps[0].errors[0];
  EXPECT_TRUE(no_temps_under(dir_));
}

// --pre-validate checksum: a seed judged current by its CRC whose bytes then read differently
// (each chunk's CRC is the seed's own, so every chunk checks) fails at the file's CRC, which
// must equal the source's.
TEST_F(SeedingTest, SeedBytesNotMatchingTheSourceChecksumPublishNothing) {
  const std::string data = random_bytes(300000, 4);
  write_file(path("src.bin"), data);
  write_file(node(0), data);  // same bytes, any mtime: current by checksum
  write_file(node(1), "old copy");
  copy_faults_.corrupt_at = 150000;
  StageOptions opt = seeding();
  opt.pre = Validate::checksum;
  auto reps = run(opt, path("src.bin"), true);
  for (const auto& rep : reps) {
    EXPECT_FALSE(rep.ok);
    EXPECT_EQ(rep.fed_by, 0);
    EXPECT_TRUE(rep.fed_from_copy);
  }
  EXPECT_EQ(read_file(node(1)), "old copy");
  EXPECT_FALSE(fs::exists(node(2)));
  EXPECT_FALSE(fs::exists(node(3)));
  ASSERT_EQ(reps[0].errors.size(), 1U);
  EXPECT_NE(reps[0].errors[0].find("checksum"), std::string::npos) << reps[0].errors[0];
  EXPECT_TRUE(no_temps_under(dir_));
}

// The origin rule (the stagefs cache): a seed's copy must read back to the CRC it recorded
// when it was written. Each chunk's CRC is the seed's own, so a copy corrupted on the seed's
// disk passes every chunk check; its file CRC does not match its origin, the transfer fails on
// every rank, nothing is published, and the store hears of the bad copy (the cache drops it).
TEST_F(SeedingTest, OriginRuleSeedNotReadingBackToItsRecordedChecksumPublishesNothing) {
  const std::string data = random_bytes(300000, 7);
  write_file(path("src.bin"), data);
  StageOptions opt = seeding();
  opt.pre = Validate::origin;
  ASSERT_TRUE(run(opt, path("src.bin"), true)[0].ok);  // every node: a copy with its origin
  fs::remove(node(0));
  fs::remove(node(3));
  copy_faults_.corrupt_at = 150000;  // the seed's disk returns one flipped bit, no error
  for (const bool chain : {false, true}) {
    SCOPED_TRACE(chain ? "chain" : "collective broadcast");
    auto reps = run(opt, path("src.bin"), chain);
    for (const auto& rep : reps) {
      EXPECT_FALSE(rep.ok);
      EXPECT_EQ(rep.fed_by, 1);
      EXPECT_TRUE(rep.fed_from_copy);
    }
    EXPECT_FALSE(fs::exists(node(0)));
    EXPECT_FALSE(fs::exists(node(3)));
    ASSERT_EQ(reps[0].errors.size(), 1U);
    EXPECT_NE(reps[0].errors[0].find("checksum"), std::string::npos) << reps[0].errors[0];
    EXPECT_EQ(source_faults_.bytes_read.load(), data.size()) << "the source was read for data";
    EXPECT_TRUE(no_temps_under(dir_));
  }
  EXPECT_EQ(store_faults_[1].bad_copies, 2);
  for (const int r : {0, 2, 3}) EXPECT_EQ(store_faults_[static_cast<size_t>(r)].bad_copies, 0) << r;
}

// Seeding off (stage-bcast with an explicit --source-rank): the source rank reads.
TEST_F(SeedingTest, WithoutSeedingTheSourceRankReadsDespiteWarmNodes) {
  const std::string data = random_bytes(300000, 5);
  write_file(path("src.bin"), data);
  warm(path("src.bin"), node(0));
  warm(path("src.bin"), node(1));
  StageOptions opt = seeding();
  opt.seed_from_copies = false;
  opt.root = 2;
  auto reps = run(opt, path("src.bin"), true);
  ASSERT_TRUE(reps[0].ok);
  EXPECT_EQ(reps[0].fed_by, 2);
  EXPECT_FALSE(reps[0].fed_from_copy);
  EXPECT_EQ(source_faults_.bytes_read.load(), data.size());
  EXPECT_EQ(copy_faults_.bytes_read.load(), 0U);
  EXPECT_EQ(reps[3].bytes_read_source, data.size());
  for (int r = 0; r < kRanks; ++r) EXPECT_TRUE(read_file(node(r)) == data);
}

TEST_F(SeedingTest, NoWarmNodeMeansTheSourceFeedsAsBefore) {
  const std::string data = random_bytes(300000, 6);
  write_file(path("src.bin"), data);
  write_file(node(1), "stale");
  StageOptions opt = seeding();
  opt.root = 1;
  auto reps = run(opt, path("src.bin"), true);
  for (const auto& rep : reps) {
    ASSERT_TRUE(rep.ok);
    EXPECT_EQ(rep.fed_by, 1);
    EXPECT_FALSE(rep.fed_from_copy);
    EXPECT_EQ(rep.bytes_read_source, data.size());
    EXPECT_EQ(rep.bytes_read_seed, 0U);
  }
  EXPECT_EQ(source_faults_.bytes_read.load(), data.size());
  EXPECT_EQ(copy_faults_.bytes_read.load(), 0U);
  for (int r = 0; r < kRanks; ++r) EXPECT_TRUE(read_file(node(r)) == data);
  // Everyone current: nothing read, nothing fed.
  auto again = run(opt, path("src.bin"), true);
  EXPECT_TRUE(again[0].ok);
  EXPECT_EQ(again[0].fed_by, -1);
  EXPECT_EQ(source_faults_.bytes_read.load(), data.size());
}

}  // namespace
}  // namespace stage::testing
