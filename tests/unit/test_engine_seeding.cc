// Seeding (StageOptions::seed_from_copies): a node whose copy is proven current feeds the
// broadcast from its own disk; the shared source is read for metadata only. A seed that fails
// is replaced within the transfer by the next seed, else the source; a seed proves each
// chunk against its recorded CRCs before it sends it. The engine on in-process ranks
// (ThreadComm; FakeP2P for the chain) over real files, with counting and faulting readers of
// the source and of the seed's copy.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <filesystem>
#include <functional>
#include <memory>
#include <random>

#include "bcast/transfer/engine.h"
#include "fake_p2p.h"
#include "fakes.h"
#include "planted.h"
#include "thread_comm.h"
#include "tmpdir.h"

namespace stage::testing {
namespace {

namespace fs = std::filesystem;

constexpr int kRanks = 4;
constexpr uint64_t kChunk = 65536;

// A live copy's readers on one rank (LiveCopyReaders) that check every chunk as it is
// announced written, as a read during the copy would see it: the temporary file's bytes of
// that chunk against the source's. They want the chunks in `wants` first (tail, random
// offsets, head), as readers steer a live copy.
class CheckingReaders final : public LiveCopyReaders {
 public:
  CheckingReaders(const std::string& truth, std::vector<uint64_t> wants)
      : truth_(truth), wants_(std::move(wants)) {}
  ~CheckingReaders() override {
    if (fd_ >= 0) ::close(fd_);
  }
  CheckingReaders(const CheckingReaders&) = delete;
  CheckingReaders& operator=(const CheckingReaders&) = delete;
  void started(const FileMeta& /*source*/, uint64_t chunk, const std::vector<Extent>& /*holes*/,
               const Txn& txn) override {
    chunk_ = chunk;
    fd_ = ::open(txn.temp_path().c_str(), O_RDONLY | O_CLOEXEC);
  }
  // The writer thread: the chunk is in the temporary file now; a reader may read it.
  void chunk_written(uint64_t i, bool /*zero*/) override {
    const uint64_t off = i * chunk_;
    const size_t n = static_cast<size_t>(std::min<uint64_t>(chunk_, truth_.size() - off));
    std::string got(n, '\0');
    const bool read =
        fd_ >= 0 && ::pread(fd_, got.data(), n, static_cast<off_t>(off)) == static_cast<ssize_t>(n);
    ++checked;
    if (!read || got != truth_.substr(off, n)) ++mismatched;
  }
  void take_wanted(std::vector<uint64_t>& out) override {
    out.insert(out.end(), wants_.begin(), wants_.end());
    wants_.clear();
  }
  void restarted() override { ++restarts; }
  int checked = 0, mismatched = 0, restarts = 0;

 private:
  const std::string& truth_;
  std::vector<uint64_t> wants_;
  uint64_t chunk_ = 0;
  int fd_ = -1;
};

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
  // A proven current copy, as stage-bcast or stagefs leaves it: the source's bytes, its mtime,
  // the origin and (unless Record::none) the chunk record.
  void warm(const std::string& src, const std::string& copy, Record rec = Record::same) {
    fs::create_directories(fs::path(copy).parent_path());
    ASSERT_TRUE(plant_copy(copy, read_file(src), src, Planted{rec, kChunk, {}, false}));
  }
  // A file of unknown origin that is current by the size rule only: `bytes` (of the source's
  // size) with the source's mtime, no origin.
  void same_size_and_mtime(const std::string& src, const std::string& copy, const std::string& bytes) {
    write_file(copy, bytes);
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
  // per_rank: adjusts rank r's options (a live copy's readers).
  std::vector<StageReport> run(const StageOptions& opt, const std::string& source, bool chain = false,
                               const std::string& name = "copy.bin",
                               const std::function<void(int, StageOptions&)>& per_rank = {}) {
    World w(kRanks);
    FakeNet net(kRanks);
    std::vector<StageReport> reps(kRanks);
    run_ranks(w, [&](ThreadComm& c) {
      FakeP2P p2p(net, c.rank());
      if (chain) c.attach(&p2p);
      StageEndpoint ep{source, node(c.rank(), name), true};
      StageOptions mine = opt;
      if (per_rank) per_rank(c.rank(), mine);
      reps[static_cast<size_t>(c.rank())] =
          stage_transfer(c, &src_, *stores_[static_cast<size_t>(c.rank())], mine, ep);
    });
    return reps;
  }
  static StageOptions seeding() {
    StageOptions opt;
    opt.chunk_size = kChunk;
    opt.seed_from_copies = true;
    return opt;
  }
  static bool no_temps_under(const fs::path& d) {
    for (const auto& e : fs::recursive_directory_iterator(d))
      if (e.path().filename().string().find(".stage-tmp.") != std::string::npos) return false;
    return true;
  }
  static std::string first_error(const StageReport& r) { return r.errors.empty() ? "" : r.errors[0]; }

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
      EXPECT_EQ(read_file(node(r, "tree/d/f" + std::to_string(i))),
                read_file(path("tree/d/f" + std::to_string(i))));
  // Every node misses a different file: no node can seed, the source feeds.
  for (int r = 0; r < kRanks; ++r) fs::remove(node(r, "tree/d/f" + std::to_string(r)));
  reps = run(opt, path("tree"), true, "tree");
  ASSERT_TRUE(reps[0].ok) << (reps[0].errors.empty() ? "" : reps[0].errors[0]);
  EXPECT_EQ(reps[0].fed_by, 0);
  EXPECT_FALSE(reps[0].fed_from_copy);
  EXPECT_EQ(reps[0].bytes_read_source, 70000U + 70001U + 70002U + 70003U);
  EXPECT_EQ(reps[0].bytes_read_seed, 0U);
}

// A seed that fails mid-way (a short read of its copy) fails nothing: the transfer is fed
// again by the next seed and, when that one fails too, by the source; every node ends with the
// source's bytes, the failed seeds' nodes included (their copies are no longer trusted: they
// write new ones), and nothing else was published on the way.
TEST_F(SeedingTest, ASeedThatFailsMidWayIsReplacedByTheNextSeedThenTheSource) {
  const std::string data = random_bytes(400000, 2);
  write_file(path("src.bin"), data);
  copy_faults_.short_read_at = 200000;  // mid-file, in every seed's copy
  for (const bool chain : {false, true}) {
    SCOPED_TRACE(chain ? "chain" : "collective broadcast");
    for (int r = 0; r < kRanks; ++r) store_faults_[static_cast<size_t>(r)].bad_copies = 0;
    warm(path("src.bin"), node(1));
    warm(path("src.bin"), node(2));
    write_file(node(0), "old copy");
    write_file(node(3), "old copy");
    source_faults_.bytes_read = 0;
    auto reps = run(seeding(), path("src.bin"), chain);
    for (const auto& rep : reps) {
      ASSERT_TRUE(rep.ok) << first_error(rep);
      EXPECT_EQ(rep.fed_by, 0);  // the source rank, after rank 1 and rank 2 failed
      EXPECT_FALSE(rep.fed_from_copy);
      EXPECT_EQ(rep.feed_retries, 2);
    }
    for (int r = 0; r < kRanks; ++r) EXPECT_TRUE(read_file(node(r)) == data) << "node " << r;
    ASSERT_EQ(reps[0].feed_failures.size(), 2U);
    EXPECT_NE(reps[0].feed_failures[0].find("injected"), std::string::npos) << reps[0].feed_failures[0];
    EXPECT_TRUE(reps[1].feed_failures.empty()) << "the causes are the source rank's to report, once";
    EXPECT_TRUE(reps[0].errors.empty()) << first_error(reps[0]);
    EXPECT_EQ(source_faults_.bytes_read.load(), data.size());
    EXPECT_EQ(reps[0].nodes_written, 4);  // the failed seeds wrote fresh copies
    EXPECT_EQ(store_faults_[1].bad_copies, 1) << "the store did not hear of its unreadable copy";
    EXPECT_EQ(store_faults_[2].bad_copies, 1);
    EXPECT_TRUE(no_temps_under(dir_));
  }
}

// The seed's copy changes while it feeds (a new mtime at its end): the source feeds the
// transfer again, and every node gets the source's bytes.
TEST_F(SeedingTest, ASeedCopyThatChangesWhileItFeedsIsReplacedByTheSource) {
  const std::string data = random_bytes(300000, 3);
  write_file(path("src.bin"), data);
  warm(path("src.bin"), node(2));
  copy_faults_.changes_during_copy = true;  // the seed's copy reports a new mtime at its end
  auto reps = run(seeding(), path("src.bin"));
  for (const auto& rep : reps) {
    ASSERT_TRUE(rep.ok) << first_error(rep);
    EXPECT_EQ(rep.feed_retries, 1);
    EXPECT_EQ(rep.fed_by, 0);
  }
  for (const int r : {0, 1, 2, 3}) EXPECT_TRUE(read_file(node(r)) == data) << "node " << r;
  ASSERT_EQ(reps[0].feed_failures.size(), 1U);
  EXPECT_NE(reps[0].feed_failures[0].find("seed copy"), std::string::npos) << reps[0].feed_failures[0];
  EXPECT_NE(reps[0].feed_failures[0].find("node2"), std::string::npos) << reps[0].feed_failures[0];
  EXPECT_TRUE(no_temps_under(dir_));
}

// --pre-validate checksum: a seed judged current by its CRC whose bytes then read differently
// (each chunk's CRC is the seed's own, so every chunk checks) fails at the file's CRC, which
// must equal the source's; the source then feeds the transfer and nothing wrong is published.
TEST_F(SeedingTest, SeedBytesNotMatchingTheSourceChecksumAreReplacedByTheSourcesBytes) {
  const std::string data = random_bytes(300000, 4);
  write_file(path("src.bin"), data);
  write_file(node(0), data);  // same bytes, any mtime: current by checksum
  write_file(node(1), "old copy");
  copy_faults_.corrupt_at = 150000;
  StageOptions opt = seeding();
  opt.pre = Validate::checksum;
  auto reps = run(opt, path("src.bin"), true);
  for (const auto& rep : reps) {
    ASSERT_TRUE(rep.ok) << first_error(rep);
    EXPECT_EQ(rep.feed_retries, 1);
    EXPECT_EQ(rep.fed_by, 0);
    EXPECT_FALSE(rep.fed_from_copy);
  }
  for (const int r : {0, 1, 2, 3}) EXPECT_TRUE(read_file(node(r)) == data) << "node " << r;
  ASSERT_EQ(reps[0].feed_failures.size(), 1U);
  EXPECT_NE(reps[0].feed_failures[0].find("checksum"), std::string::npos) << reps[0].feed_failures[0];
  EXPECT_TRUE(no_temps_under(dir_));
}

// A seed without a chunk record proves only its whole file (an older copy; a transfer without
// reads during the copy): a copy corrupted on its disk passes every chunk check (each chunk's
// CRC is the seed's own) and fails at the end against its recorded CRC. The transfer is fed
// again by the source into temporary files that start over: no wrong byte is published, and
// the store hears of the bad copy.
TEST_F(SeedingTest, AWholeFileSeedThatReadsBackWrongIsReplacedAndNothingWrongIsPublished) {
  const std::string data = random_bytes(300000, 7);
  write_file(path("src.bin"), data);
  StageOptions opt = seeding();
  opt.pre = Validate::recorded;
  for (const bool chain : {false, true}) {
    SCOPED_TRACE(chain ? "chain" : "collective broadcast");
    for (int r = 0; r < kRanks; ++r) {
      fs::remove(node(r));
      store_faults_[static_cast<size_t>(r)].bad_copies = 0;
    }
    warm(path("src.bin"), node(1), Record::none);
    warm(path("src.bin"), node(2), Record::none);
    copy_faults_.corrupt_at = 150000;  // every seed's disk returns one flipped bit, no error
    source_faults_.bytes_read = 0;
    auto reps = run(opt, path("src.bin"), chain);
    for (const auto& rep : reps) {
      ASSERT_TRUE(rep.ok) << first_error(rep);
      EXPECT_EQ(rep.feed_retries, 2);
      EXPECT_FALSE(rep.fed_from_copy);
    }
    for (const int r : {0, 1, 2, 3}) EXPECT_TRUE(read_file(node(r)) == data) << "node " << r;
    ASSERT_EQ(reps[0].feed_failures.size(), 2U);
    EXPECT_NE(reps[0].feed_failures[0].find("checksum"), std::string::npos) << reps[0].feed_failures[0];
    EXPECT_EQ(source_faults_.bytes_read.load(), data.size());
    EXPECT_EQ(store_faults_[1].bad_copies, 1);
    EXPECT_EQ(store_faults_[2].bad_copies, 1);
    for (const int r : {0, 3}) EXPECT_EQ(store_faults_[static_cast<size_t>(r)].bad_copies, 0) << r;
    EXPECT_TRUE(no_temps_under(dir_));
  }
  copy_faults_.corrupt_at = -1;
}

// Reads during the copy (a live copy's readers on every rank, wanting the tail, random chunks
// and the head first): a seed whose disk returns a flipped bit never sends that chunk, whatever
// the unit of its chunk record (a chunk, four chunks, a quarter chunk): every chunk a reader
// could read is the source's, and the source feeds the rest.
TEST_F(SeedingTest, ReadsDuringTheCopyNeverGetAByteOfACorruptedSeed) {
  const std::string data = random_bytes(20 * kChunk + 123, 8);
  write_file(path("src.bin"), data);
  std::mt19937 g(8);
  std::vector<uint64_t> wants{20, 19};  // the tail first
  for (int k = 0; k < 5; ++k) wants.push_back(g() % 21);
  wants.push_back(0);
  for (const Record rec : {Record::same, Record::coarser, Record::finer}) {
    SCOPED_TRACE(rec == Record::same      ? "a unit per chunk"
                 : rec == Record::coarser ? "4 chunks a unit"
                                          : "4 units a chunk");
    for (int r = 0; r < kRanks; ++r) fs::remove(node(r));
    warm(path("src.bin"), node(1), rec);
    copy_faults_.corrupt_at = 11 * kChunk + 1000;
    std::vector<std::unique_ptr<CheckingReaders>> readers;
    for (int r = 0; r < kRanks; ++r) readers.push_back(std::make_unique<CheckingReaders>(data, wants));
    auto reps = run(seeding(), path("src.bin"), true, "copy.bin",
                    [&](int r, StageOptions& o) { o.live_copy = readers[static_cast<size_t>(r)].get(); });
    for (const auto& rep : reps) {
      ASSERT_TRUE(rep.ok) << first_error(rep);
      EXPECT_EQ(rep.feed_retries, 1);
      EXPECT_EQ(rep.fed_by, 0);
    }
    ASSERT_EQ(reps[0].feed_failures.size(), 1U);
    EXPECT_NE(reps[0].feed_failures[0].find("recorded"), std::string::npos) << reps[0].feed_failures[0];
    for (const int r : {0, 2, 3}) {
      EXPECT_EQ(readers[static_cast<size_t>(r)]->mismatched, 0)
          << "rank " << r << ": a reader got a wrong byte";
      EXPECT_GE(readers[static_cast<size_t>(r)]->checked, 21) << "rank " << r;
      EXPECT_EQ(readers[static_cast<size_t>(r)]->restarts, 1) << "rank " << r;
    }
    for (int r = 0; r < kRanks; ++r) EXPECT_TRUE(read_file(node(r)) == data) << "node " << r;
    EXPECT_TRUE(no_temps_under(dir_));
  }
  copy_faults_.corrupt_at = -1;
}

// A sparse file's copy, written by a transfer read during the copy, records its chunks by chunk
// of the file (a chunk in a hole: its zeros). The next transfer is fed by that copy, which
// proves each chunk of data it sends, the holes skipped; a bit flipped on its disk after the
// hole is caught before any reader gets it, and the source feeds instead.
TEST_F(SeedingTest, ASparseCopysChunkRecordProvesTheDataAroundItsHoles) {
  constexpr uint64_t kChunks = 24;
  const std::string head = random_bytes(3 * kChunk, 21), tail = random_bytes(4 * kChunk + 77, 22);
  {
    const int fd = ::open(path("src.bin").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::pwrite(fd, head.data(), head.size(), 0), static_cast<ssize_t>(head.size()));
    const off_t at = static_cast<off_t>((kChunks - 4) * kChunk);
    ASSERT_EQ(::pwrite(fd, tail.data(), tail.size(), at), static_cast<ssize_t>(tail.size()));
    ::close(fd);
  }
  struct stat st {};
  ASSERT_EQ(::stat(path("src.bin").c_str(), &st), 0);
  if (static_cast<uint64_t>(st.st_blocks) * 512U >= static_cast<uint64_t>(st.st_size) / 2)
    GTEST_SKIP() << "no sparse files here";
  const std::string data = read_file(path("src.bin"));
  const auto live = [&](std::vector<std::unique_ptr<CheckingReaders>>& readers, std::vector<uint64_t> wants) {
    readers.clear();
    for (int r = 0; r < kRanks; ++r) readers.push_back(std::make_unique<CheckingReaders>(data, wants));
    return [&readers](int r, StageOptions& o) { o.live_copy = readers[static_cast<size_t>(r)].get(); };
  };
  std::vector<std::unique_ptr<CheckingReaders>> readers;
  auto reps = run(seeding(), path("src.bin"), true, "copy.bin", live(readers, {}));
  ASSERT_TRUE(reps[0].ok) << first_error(reps[0]);
  for (const int keep : {1, 2}) {  // node 1: healthy; node 2: a bit flipped after the hole
    SCOPED_TRACE(keep == 1 ? "a healthy sparse seed" : "a sparse seed with a flipped bit");
    for (int r = 0; r < kRanks; ++r)
      if (r != keep) fs::remove(node(r));
    copy_faults_.corrupt_at = keep == 2 ? static_cast<int64_t>((kChunks - 2) * kChunk + 5) : -1;
    const uint64_t source_before = source_faults_.bytes_read;
    reps = run(seeding(), path("src.bin"), true, "copy.bin", live(readers, {kChunks - 1, 0}));
    for (const auto& rep : reps) ASSERT_TRUE(rep.ok) << first_error(rep);
    EXPECT_EQ(reps[0].feed_retries, keep == 1 ? 0 : 1);
    EXPECT_EQ(reps[0].fed_by, keep == 1 ? 1 : 0);
    if (keep == 1) {
      EXPECT_EQ(source_faults_.bytes_read, source_before) << "a proven seed reads no source byte";
    }
    for (int r = 0; r < kRanks; ++r) {
      if (r != keep) {
        EXPECT_EQ(readers[static_cast<size_t>(r)]->mismatched, 0) << "rank " << r;
      }
      EXPECT_TRUE(read_file(node(r)) == data) << "node " << r;
    }
  }
  copy_faults_.corrupt_at = -1;
}

// A copy without a chunk record (an older copy) never feeds a transfer whose copy may be read
// before it ends; it still feeds one without such readers, and it is still this node's copy.
TEST_F(SeedingTest, ACopyWithoutAChunkRecordFeedsOnlyTransfersWithoutReadsDuringTheCopy) {
  const std::string data = random_bytes(10 * kChunk + 5, 9);
  write_file(path("src.bin"), data);
  warm(path("src.bin"), node(2), Record::none);
  const ino_t kept = inode(node(2));
  std::vector<std::unique_ptr<CheckingReaders>> readers;
  for (int r = 0; r < kRanks; ++r)
    readers.push_back(std::make_unique<CheckingReaders>(data, std::vector<uint64_t>{}));
  auto reps = run(seeding(), path("src.bin"), true, "copy.bin", [&](int r, StageOptions& o) {
    if (r == 3) o.live_copy = readers[3].get();  // readers on one node are enough
  });
  ASSERT_TRUE(reps[0].ok) << first_error(reps[0]);
  EXPECT_EQ(reps[0].fed_by, 0);
  EXPECT_FALSE(reps[0].fed_from_copy);
  EXPECT_EQ(inode(node(2)), kept) << "the node's own copy still counts as current";
  for (const int r : {0, 1, 3}) fs::remove(node(r));
  reps = run(seeding(), path("src.bin"), true);  // no readers anywhere: it may seed
  ASSERT_TRUE(reps[0].ok) << first_error(reps[0]);
  EXPECT_EQ(reps[0].fed_by, 2);
  EXPECT_TRUE(reps[0].fed_from_copy);
  for (int r = 0; r < kRanks; ++r) EXPECT_TRUE(read_file(node(r)) == data) << "node " << r;
}

// --pre-validate size (stage-bcast's default): a same-size, same-mtime file of other bytes and
// unknown origin (bit rot, a rebuild with a fixed mtime) counts as present on its own node, as
// mpi-stage would leave it, but it never feeds another node: the source does.
TEST_F(SeedingTest, ASameSizeSameMtimeFileOfUnknownOriginStaysOnItsNodeButNeverFeeds) {
  const std::string data = random_bytes(300000, 10);
  write_file(path("src.bin"), data);
  const std::string other = random_bytes(data.size(), 11);
  same_size_and_mtime(path("src.bin"), node(1), other);
  auto reps = run(seeding(), path("src.bin"), true);
  for (const auto& rep : reps) {
    ASSERT_TRUE(rep.ok) << first_error(rep);
    EXPECT_EQ(rep.fed_by, 0);
    EXPECT_FALSE(rep.fed_from_copy);
    EXPECT_EQ(rep.nodes_needing, 3);
  }
  EXPECT_EQ(copy_faults_.bytes_read.load(), 0U);
  for (const int r : {0, 2, 3}) EXPECT_TRUE(read_file(node(r)) == data) << "node " << r;
  EXPECT_TRUE(read_file(node(1)) == other) << "present by the size rule: left as it is";
}

// Only the source's own failure fails the transfer, with its errno on every rank: a source
// that fails mid-way (EIO), alone or after a seed that failed first.
TEST_F(SeedingTest, AHealthySourceThatFailsMidWayFailsTheTransferWithItsErrno) {
  const std::string data = random_bytes(400000, 12);
  write_file(path("src.bin"), data);
  source_faults_.eio_at = 250000;
  for (const bool seeded_first : {false, true}) {
    SCOPED_TRACE(seeded_first ? "after a failed seed" : "the source alone");
    for (int r = 0; r < kRanks; ++r) fs::remove(node(r));
    if (seeded_first) warm(path("src.bin"), node(1));
    copy_faults_.short_read_at = seeded_first ? 100000 : -1;
    auto reps = run(seeding(), path("src.bin"), true);
    for (const auto& rep : reps) {
      EXPECT_FALSE(rep.ok);
      EXPECT_EQ(rep.source_error, std::error_code(EIO, std::generic_category()))
          << rep.source_error.message();
      EXPECT_FALSE(rep.local_error);
      EXPECT_EQ(rep.feed_retries, seeded_first ? 1 : 0);
    }
    for (const int r : {0, 2, 3}) EXPECT_FALSE(fs::exists(node(r))) << "node " << r;
    ASSERT_FALSE(reps[0].errors.empty());
    EXPECT_NE(reps[0].errors[0].find("injected"), std::string::npos) << reps[0].errors[0];
    EXPECT_TRUE(no_temps_under(dir_));
  }
  source_faults_.eio_at = -1;
  copy_faults_.short_read_at = -1;
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
