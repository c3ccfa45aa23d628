// The engine on N in-process ranks (ThreadComm) over real files, with injected faults.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <array>
#include <filesystem>
#include <mutex>

#include "bcast/transfer/engine.h"
#include "fakes.h"
#include "fusefs/cache/copy_xattrs.h"
#include "thread_comm.h"
#include "tmpdir.h"

namespace stage::testing {
namespace {

namespace fs = std::filesystem;

class EngineTest : public TmpDirTest {
 protected:
  struct Run {
    std::vector<StageReport> reports;
  };
  // Runs a transfer on n ranks; rank r writes to node<r>/<name>.
  Run run(int n, const StageOptions& opt, SourceReader& src, const std::function<LocalStore&(int)>& store,
          const std::string& source, const std::string& name = "copy.bin") {
    World w(n);
    Run out;
    out.reports.resize(static_cast<size_t>(n));
    run_ranks(w, [&](ThreadComm& c) {
      StageEndpoint ep{source, path("node" + std::to_string(c.rank()) + "/" + name), true};
      out.reports[static_cast<size_t>(c.rank())] = stage_transfer(c, &src, store(c.rank()), opt, ep);
    });
    return out;
  }
  std::string node_file(int r, const std::string& name = "copy.bin") {
    return path("node" + std::to_string(r) + "/" + name);
  }
  static bool no_temps_under(const fs::path& d) {
    for (const auto& e : fs::recursive_directory_iterator(d))
      if (e.path().filename().string().find(".stage-tmp.") != std::string::npos) return false;
    return true;
  }
  PosixStore posix_{StoreOptions{.xattrs = stagefs::kCopyXattrs}};
  std::function<LocalStore&(int)> plain_ = [this](int) -> LocalStore& { return posix_; };
};

TEST_F(EngineTest, CopiesToEveryNodeThenSkipsCurrentCopies) {
  const std::string data = random_bytes(1000003, 1);
  write_file(path("src.bin"), data);
  PosixSource src;
  StageOptions opt;
  opt.chunk_size = 65536;
  auto r1 = run(3, opt, src, plain_, path("src.bin"));
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(r1.reports[static_cast<size_t>(r)].ok);
    EXPECT_EQ(read_file(node_file(r)), data);
  }
  EXPECT_EQ(r1.reports[0].nodes_needing, 3);
  EXPECT_EQ(r1.reports[0].chunks, chunk_count(data.size(), opt.chunk_size));
  // Where the copy went: measured, and the slowest rank's figures everywhere.
  EXPECT_GT(r1.reports[0].pipe.read, 0);
  EXPECT_GT(r1.reports[0].pipe.write, 0);
  EXPECT_GT(r1.reports[0].pipe.sync, 0);
  EXPECT_EQ(r1.reports[2].pipe.write, r1.reports[0].pipe.write);
  EXPECT_EQ(r1.reports[2].pipe.read, r1.reports[0].pipe.read);
  struct stat before {};
  ASSERT_EQ(stat(node_file(1).c_str(), &before), 0);
  auto r2 = run(3, opt, src, plain_, path("src.bin"));
  EXPECT_TRUE(r2.reports[0].ok);
  EXPECT_EQ(r2.reports[0].nodes_needing, 0);
  EXPECT_EQ(r2.reports[0].bytes_streamed, 0U);
  struct stat after {};
  ASSERT_EQ(stat(node_file(1).c_str(), &after), 0);
  EXPECT_EQ(before.st_ino, after.st_ino);
}

TEST_F(EngineTest, OnlyTheStaleNodeWrites) {
  const std::string data = random_bytes(300000, 2);
  write_file(path("src.bin"), data);
  PosixSource src;
  StageOptions opt;
  opt.chunk_size = 65536;
  ASSERT_TRUE(run(3, opt, src, plain_, path("src.bin")).reports[0].ok);
  write_file(node_file(2), random_bytes(data.size(), 3));  // same size, new mtime
  struct stat keep {};
  ASSERT_EQ(stat(node_file(0).c_str(), &keep), 0);
  auto r = run(3, opt, src, plain_, path("src.bin"));
  EXPECT_TRUE(r.reports[0].ok);
  EXPECT_EQ(r.reports[0].nodes_needing, 1);
  EXPECT_TRUE(r.reports[2].this_node_wrote);
  EXPECT_EQ(read_file(node_file(2)), data);
  struct stat now {};
  ASSERT_EQ(stat(node_file(0).c_str(), &now), 0);
  EXPECT_EQ(keep.st_ino, now.st_ino);
}

TEST_F(EngineTest, CorruptedChunkIsCaughtAndNotPublished) {
  const std::string data = random_bytes(500000, 4);
  write_file(path("src.bin"), data);
  PosixSource src;
  StageOptions opt;
  opt.chunk_size = 65536;
  World w(3);
  w.corrupt_rank = 1;
  w.corrupt_nth = 2;  // the third payload rank 1 receives (after the manifest)
  std::vector<StageReport> reps(3);
  run_ranks(w, [&](ThreadComm& c) {
    StageEndpoint ep{path("src.bin"), node_file(c.rank()), true};
    reps[static_cast<size_t>(c.rank())] = stage_transfer(c, &src, posix_, opt, ep);
  });
  for (const auto& rep : reps) EXPECT_FALSE(rep.ok);  // the same outcome everywhere
  EXPECT_FALSE(fs::exists(node_file(1)));             // never published
  EXPECT_EQ(read_file(node_file(0)), data);           // healthy nodes keep a verified copy
  EXPECT_EQ(read_file(node_file(2)), data);
  ASSERT_FALSE(reps[0].errors.empty());
  EXPECT_NE(reps[0].errors[0].find("checksum"), std::string::npos);
  EXPECT_TRUE(no_temps_under(dir_));
}

TEST_F(EngineTest, ShortReadPublishesNothingAndKeepsOldCopies) {
  const std::string data = random_bytes(400000, 5);
  write_file(path("src.bin"), data);
  for (int r = 0; r < 3; ++r) write_file(node_file(r), "old copy");
  SourceFaults f;
  f.short_read_at = 200000;
  FaultSource src(f);
  StageOptions opt;
  opt.chunk_size = 65536;
  auto r = run(3, opt, src, plain_, path("src.bin"));
  for (int k = 0; k < 3; ++k) {
    EXPECT_FALSE(r.reports[static_cast<size_t>(k)].ok);
    EXPECT_EQ(r.reports[static_cast<size_t>(k)].exit_code, 1);
    EXPECT_EQ(read_file(node_file(k)), "old copy");
  }
  EXPECT_TRUE(no_temps_under(dir_));
}

TEST_F(EngineTest, SourceChangedDuringCopyIsNotPublished) {
  write_file(path("src.bin"), random_bytes(200000, 6));
  SourceFaults f;
  f.changes_during_copy = true;
  FaultSource src(f);
  StageOptions opt;
  opt.chunk_size = 65536;
  auto r = run(2, opt, src, plain_, path("src.bin"));
  EXPECT_FALSE(r.reports[1].ok);
  EXPECT_FALSE(fs::exists(node_file(0)));
  EXPECT_FALSE(fs::exists(node_file(1)));
  ASSERT_FALSE(r.reports[0].errors.empty());
  EXPECT_NE(r.reports[0].errors[0].find("changed"), std::string::npos);
}

TEST_F(EngineTest, CancelAbandonsTheTransferAtTheNextChunk) {
  write_file(path("src.bin"), random_bytes(2000000, 7));
  for (int r = 0; r < 3; ++r) write_file(node_file(r), "old copy");
  PosixSource src;
  StageOptions opt;
  opt.chunk_size = 65536;
  std::atomic<int> asked{0};
  opt.cancelled = [&] { return ++asked > 3; };  // a stop arrives after three chunks were read
  auto r = run(3, opt, src, plain_, path("src.bin"));
  for (int k = 0; k < 3; ++k) {
    EXPECT_FALSE(r.reports[static_cast<size_t>(k)].ok);
    EXPECT_EQ(read_file(node_file(k)), "old copy");
    EXPECT_LE(r.reports[static_cast<size_t>(k)].chunks, 3U);  // 31 chunks in the file
  }
  EXPECT_EQ(asked.load(), 4);  // the source rank's reader asks once per chunk, and stops there
  EXPECT_TRUE(no_temps_under(dir_));
}

TEST_F(EngineTest, UnwritableNodeStopsEveryoneBeforeAnyDataMoves) {
  write_file(path("src.bin"), random_bytes(300000, 7));
  for (int r = 0; r < 3; ++r) write_file(node_file(r), "valid old copy");
  SourceFaults sf;
  FaultSource src(sf);
  StoreFaults bad;
  bad.fail_begin = true;
  FaultStore broken(bad);
  auto store = [&](int r) -> LocalStore& { return r == 1 ? static_cast<LocalStore&>(broken) : posix_; };
  StageOptions opt;
  auto r = run(3, opt, src, store, path("src.bin"));
  for (const auto& rep : r.reports) EXPECT_FALSE(rep.ok);
  EXPECT_EQ(sf.bytes_read.load(), 0U);  // nothing was read or sent
  for (int k = 0; k < 3; ++k) EXPECT_EQ(read_file(node_file(k)), "valid old copy");
  ASSERT_EQ(r.reports[0].errors.size(), 1U);
  EXPECT_NE(r.reports[0].errors[0].find("node1"), std::string::npos);
  EXPECT_TRUE(no_temps_under(dir_));
}

TEST_F(EngineTest, DiskFullOnOneNodeFailsThatNodeOnly) {
  const std::string data = random_bytes(400000, 8);
  write_file(path("src.bin"), data);
  write_file(node_file(1), "old");
  PosixSource src;
  StoreFaults full;
  full.enospc_after_bytes = 100000;
  FaultStore small(full);
  auto store = [&](int r) -> LocalStore& { return r == 1 ? static_cast<LocalStore&>(small) : posix_; };
  StageOptions opt;
  opt.chunk_size = 65536;
  auto r = run(3, opt, src, store, path("src.bin"));
  for (const auto& rep : r.reports) EXPECT_FALSE(rep.ok);
  EXPECT_EQ(read_file(node_file(1)), "old");
  EXPECT_EQ(read_file(node_file(0)), data);
  ASSERT_FALSE(r.reports[0].errors.empty());
  EXPECT_NE(r.reports[0].errors[0].find("No space left"), std::string::npos);
  EXPECT_TRUE(no_temps_under(dir_));
}

// The up-front free-space check counts what a copy will occupy: a sparse source needs its
// data, not its apparent size; a dense one its size.
TEST_F(EngineTest, FreeSpaceCheckCountsAllocatedBytesNotHoles) {
  const uint64_t apparent = 64ULL << 20U;
  {
    const std::string chunk = random_bytes(1 << 20, 21);
    const int fd = ::open(path("sparse.bin").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::pwrite(fd, chunk.data(), chunk.size(), 8 << 20), static_cast<ssize_t>(chunk.size()));
    ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(apparent)), 0);
    ::close(fd);
  }
  struct stat st {};
  ASSERT_EQ(::stat(path("sparse.bin").c_str(), &st), 0);
  if (static_cast<uint64_t>(st.st_blocks) * 512U >= apparent / 2) GTEST_SKIP() << "no sparse files here";
  write_file(path("dense.bin"), random_bytes(16 << 20, 22));
  PosixSource src;
  // 8 MiB free on each node: room for the sparse file's data, not for 16 MiB. One fake per
  // rank: a FaultStore counts its writes and is not meant to be shared between threads.
  std::array<StoreFaults, 2> f;
  for (auto& x : f) x.free_bytes = 8LL << 20;
  FaultStore s0(f[0]), s1(f[1]);
  auto tight = [&](int r) -> LocalStore& { return r == 0 ? s0 : s1; };
  StageOptions opt;
  opt.chunk_size = 1 << 20;
  auto sparse = run(2, opt, src, tight, path("sparse.bin"), "sparse.bin");
  EXPECT_TRUE(sparse.reports[0].ok) << (sparse.reports[0].errors.empty() ? "" : sparse.reports[0].errors[0]);
  EXPECT_TRUE(read_file(node_file(1, "sparse.bin")) ==
              read_file(path("sparse.bin")));  // 64 MiB: no diff print
  auto dense = run(2, opt, src, tight, path("dense.bin"), "dense.bin");
  EXPECT_FALSE(dense.reports[0].ok);
  ASSERT_FALSE(dense.reports[0].errors.empty());
  EXPECT_NE(dense.reports[0].errors[0].find("not enough free space"), std::string::npos)
      << dense.reports[0].errors[0];
  EXPECT_EQ(dense.reports[1].bytes_streamed, 0U);  // refused before any data moved
  EXPECT_TRUE(no_temps_under(dir_));
}

// A user's file with one 4 KiB block of data in every chunk: its reservation is its allocation
// (the free-space check and --cache-size count that), so its copy must not write the zeros
// around the data (a 1 TiB file of this shape would write 1 TiB on every node).
TEST_F(EngineTest, AZeroBlockInAChunkThatHoldsDataStaysAHole) {
  constexpr uint64_t kChunk = 1 << 20, kChunks = 32;
  const std::string data = random_bytes(4096, 23);
  {
    const int fd = ::open(path("dotted.bin").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ASSERT_GE(fd, 0);
    for (uint64_t k = 0; k < kChunks; ++k)  // mid-chunk, on a 4 KiB boundary
      ASSERT_EQ(::pwrite(fd, data.data(), data.size(), static_cast<off_t>(k * kChunk + 256 * 1024)), 4096);
    ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(kChunks * kChunk)), 0);
    ::close(fd);
  }
  struct stat st {};
  ASSERT_EQ(::stat(path("dotted.bin").c_str(), &st), 0);
  const uint64_t allocated = static_cast<uint64_t>(st.st_blocks) * 512U;
  if (allocated >= kChunks * kChunk / 2) GTEST_SKIP() << "no sparse files here";
  PosixSource src;
  StageOptions opt;
  opt.chunk_size = kChunk;
  auto r = run(2, opt, src, plain_, path("dotted.bin"), "dotted.bin");
  ASSERT_TRUE(r.reports[0].ok && r.reports[1].ok);
  for (int node = 0; node < 2; ++node) {
    EXPECT_TRUE(read_file(node_file(node, "dotted.bin")) == read_file(path("dotted.bin")));
    struct stat cst {};
    ASSERT_EQ(::stat(node_file(node, "dotted.bin").c_str(), &cst), 0);
    // The source's allocation, plus room for a filesystem's own rounding; 32 MiB without holes.
    EXPECT_LE(static_cast<uint64_t>(cst.st_blocks) * 512U, allocated + (256U << 10)) << "node " << node;
  }
}

// A sparse file costs its data: its holes of whole chunks never travel (a chunk count, not
// its size over the chunk size), every copy keeps them, and the CRC each copy records (the
// whole file's, zeros included) is the source's. A file that is all hole sends nothing.
TEST_F(EngineTest, HolesOfWholeChunksNeverTravel) {
  constexpr uint64_t kChunk = 4 << 20, kSize = uint64_t{64} << 30;
  const std::string a = random_bytes(4096, 31), b = random_bytes(1 << 20, 32);
  {
    const int fd = ::open(path("huge.bin").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::pwrite(fd, a.data(), a.size(), 0), 4096);
    ASSERT_EQ(::pwrite(fd, b.data(), b.size(), static_cast<off_t>(kSize / 3)), 1 << 20);  // inside one chunk
    ASSERT_EQ(::pwrite(fd, "z", 1, static_cast<off_t>(kSize - 1)), 1);
    ::close(fd);
    const int hf = ::open(path("holes.bin").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ASSERT_GE(hf, 0);
    ASSERT_EQ(::ftruncate(hf, static_cast<off_t>(kSize / 8)), 0);
    ::close(hf);
  }
  struct stat st {};
  ASSERT_EQ(::stat(path("huge.bin").c_str(), &st), 0);
  if (static_cast<uint64_t>(st.st_blocks) * 512U >= kSize / 2) GTEST_SKIP() << "no sparse files here";
  PosixSource src;
  StageOptions opt;
  opt.chunk_size = kChunk;
  auto r = run(3, opt, src, plain_, path("huge.bin"), "huge.bin");
  ASSERT_TRUE(r.reports[0].ok) << (r.reports[0].errors.empty() ? "" : r.reports[0].errors[0]);
  EXPECT_EQ(r.reports[0].chunks, 3U) << "the three chunks that hold data, not " << kSize / kChunk;
  EXPECT_EQ(r.reports[0].bytes_streamed, 3 * kChunk);
  EXPECT_EQ(r.reports[0].bytes_total, kSize);
  Fd sfd(::open(path("huge.bin").c_str(), O_RDONLY | O_CLOEXEC));
  auto want = crc_of_fd(sfd.get(), "huge.bin", false);
  ASSERT_TRUE(want);
  for (int node = 0; node < 3; ++node) {
    Fd cfd(::open(node_file(node, "huge.bin").c_str(), O_RDONLY | O_CLOEXEC));
    ASSERT_TRUE(cfd.valid());
    struct stat cst {};
    ASSERT_EQ(::fstat(cfd.get(), &cst), 0);
    EXPECT_EQ(static_cast<uint64_t>(cst.st_size), kSize);
    EXPECT_LE(static_cast<uint64_t>(cst.st_blocks) * 512U, 4 * (1 << 20)) << "node " << node;
    auto origin = origin_of_fd(cfd.get(), stagefs::kCopyXattrs.origin);
    ASSERT_TRUE(origin && origin->crc_known);
    EXPECT_EQ(origin->crc, *want) << "node " << node << ": the whole file's CRC, holes included";
    auto got = crc_of_fd(cfd.get(), "copy", false);
    ASSERT_TRUE(got);
    EXPECT_EQ(*got, *want);
    std::string head(4096, '\0');
    ASSERT_EQ(::pread(cfd.get(), head.data(), head.size(), 0), 4096);
    EXPECT_TRUE(head == a);
    std::string mid(b.size(), '\0');
    ASSERT_EQ(::pread(cfd.get(), mid.data(), mid.size(), static_cast<off_t>(kSize / 3)), 1 << 20);
    EXPECT_TRUE(mid == b);
  }
  auto h = run(3, opt, src, plain_, path("holes.bin"), "holes.bin");
  ASSERT_TRUE(h.reports[0].ok) << (h.reports[0].errors.empty() ? "" : h.reports[0].errors[0]);
  EXPECT_EQ(h.reports[0].chunks, 0U);
  for (int node = 0; node < 3; ++node) {
    struct stat cst {};
    ASSERT_EQ(::stat(node_file(node, "holes.bin").c_str(), &cst), 0);
    EXPECT_EQ(static_cast<uint64_t>(cst.st_size), kSize / 8);
    EXPECT_LE(cst.st_blocks * 512, 4096) << "no data (a block for the origin record at most)";
  }
}

TEST_F(EngineTest, ChecksumPreAndPostValidation) {
  const std::string data = random_bytes(300000, 9);
  write_file(path("src.bin"), data);
  PosixSource src;
  StageOptions opt;
  opt.chunk_size = 65536;
  opt.post = Validate::checksum;
  ASSERT_TRUE(run(2, opt, src, plain_, path("src.bin")).reports[0].ok);
  // Same size and mtime, different bytes: only checksum pre-validation notices.
  struct stat st {};
  ASSERT_EQ(stat(node_file(1).c_str(), &st), 0);
  write_file(node_file(1), random_bytes(data.size(), 10));
  const timespec times[2] = {st.st_atim, st.st_mtim};
  ASSERT_EQ(utimensat(AT_FDCWD, node_file(1).c_str(), times, 0), 0);
  EXPECT_EQ(run(2, opt, src, plain_, path("src.bin")).reports[0].nodes_needing, 0);
  opt.pre = Validate::checksum;
  auto r = run(2, opt, src, plain_, path("src.bin"));
  EXPECT_TRUE(r.reports[0].ok);
  EXPECT_EQ(r.reports[0].nodes_needing, 1);
  EXPECT_EQ(read_file(node_file(1)), data);
}

TEST_F(EngineTest, TreeWithSmallFilesTravelsPacked) {
  fs::create_directories(path("tree/a/b"));
  for (int i = 0; i < 200; ++i)
    write_file(path("tree/a/b/f" + std::to_string(i)),
               random_bytes(static_cast<size_t>(i * 37), static_cast<uint32_t>(i)));
  write_file(path("tree/empty"), "");
  fs::create_symlink("a/b/f1", path("tree/link"));
  PosixSource src;
  StageOptions opt;
  opt.recursive = true;
  opt.chunk_size = 65536;
  World w(2);
  std::vector<StageReport> reps(2);
  run_ranks(w, [&](ThreadComm& c) {
    StageEndpoint ep{path("tree"), path("node" + std::to_string(c.rank()) + "/tree"), true};
    reps[static_cast<size_t>(c.rank())] = stage_transfer(c, &src, posix_, opt, ep);
  });
  ASSERT_TRUE(reps[0].ok) << (reps[0].errors.empty() ? "" : reps[0].errors[0]);
  EXPECT_LT(reps[0].chunks, 20U);
  for (int r = 0; r < 2; ++r) {
    const std::string base = path("node" + std::to_string(r) + "/tree");
    EXPECT_EQ(read_file(base + "/a/b/f150"), read_file(path("tree/a/b/f150")));
    EXPECT_TRUE(fs::exists(base + "/empty"));
    EXPECT_EQ(fs::read_symlink(base + "/link"), "a/b/f1");
  }
}

TEST_F(EngineTest, MissingSourceFailsEverywhereWithItsPath) {
  PosixSource src;
  auto r = run(2, StageOptions{}, src, plain_, path("nope.bin"));
  for (const auto& rep : r.reports) {
    EXPECT_FALSE(rep.ok);
    ASSERT_FALSE(rep.errors.empty());
    EXPECT_NE(rep.errors[0].find("nope.bin"), std::string::npos);
  }
  EXPECT_FALSE(fs::exists(node_file(0)));
}

}  // namespace
}  // namespace stage::testing
