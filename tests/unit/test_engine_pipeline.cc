// The whole engine with its chunk data on the chain and the tree (bcast/transfer/pipeline.h) over
// in-process ranks (thread_comm.h): the same files as over Comm::bcast, the source rank's chunk
// size followed by every rank, readers steering the chunk order, nested transfers.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <deque>
#include <filesystem>
#include <functional>
#include <mutex>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include "bcast/transfer/engine.h"
#include "bcast/transfer/pipeline.h"
#include "fake_p2p.h"
#include "fakes.h"
#include "fusefs/cache/copy_xattrs.h"
#include "thread_comm.h"
#include "tmpdir.h"

namespace stage::testing {
namespace {

using std::chrono::milliseconds;

// The whole engine with its chunk data on the chain and the tree: same files as over Comm::bcast.
class EnginePipelineTest : public TmpDirTest {};

TEST_F(EnginePipelineTest, StagesThroughChainAndTree) {
  const std::string data = random_bytes(1000003, 5);
  write_file(path("src.bin"), data);
  PosixSource src;
  PosixStore store{StoreOptions{.xattrs = stagefs::kCopyXattrs}};
  for (auto algo : {BcastAlgorithm::chain, BcastAlgorithm::tree}) {
    const int n = 5;
    World w(n);
    FakeNet net(n);
    StageOptions opt;
    opt.chunk_size = 65536 * 3 + 5;
    opt.bcast_algorithm = algo;
    opt.pipeline.segment = 8192;
    opt.root = 3;
    opt.pre = Validate::none;
    std::vector<StageReport> reports(n);
    run_ranks(w, [&](ThreadComm& c) {
      FakeP2P p(net, c.rank());
      c.attach(&p);
      StageEndpoint ep{path("src.bin"), path(std::string(to_string(algo)) + std::to_string(c.rank()) + "/f"),
                       true};
      reports[static_cast<size_t>(c.rank())] = stage_transfer(c, &src, store, opt, ep);
    });
    for (int r = 0; r < n; ++r) {
      EXPECT_TRUE(reports[static_cast<size_t>(r)].ok) << to_string(algo) << " rank " << r;
      EXPECT_EQ(read_file(path(std::string(to_string(algo)) + std::to_string(r) + "/f")), data);
    }
    // the chunk data went over the seam as one stream: the root sent it once (chain) or twice
    // (tree) with each chunk's header, and the tree's release (one byte per child) once per
    // transfer, not once per chunk
    const uint64_t chunks = chunk_count(data.size(), opt.chunk_size);
    const uint64_t hdr = sizeof(ChunkHeader);
    if (algo == BcastAlgorithm::chain)
      EXPECT_EQ(net.bytes_sent(3), data.size() + chunks * hdr);
    else
      EXPECT_EQ(net.bytes_sent(3), 2 * (data.size() + chunks * hdr) + 2);
  }
}

// Ranks started with different chunk sizes: every rank cuts the stream by the source rank's
// (it travels in the manifest), on the chain and the tree (Comm::bcast: tests/mpi).
TEST_F(EnginePipelineTest, EveryRankFollowsTheSourceRanksChunkSize) {
  const std::string data = random_bytes(700001, 9);
  write_file(path("src.bin"), data);
  PosixSource src;
  PosixStore store{StoreOptions{.xattrs = stagefs::kCopyXattrs}};
  const std::array<uint64_t, 4> chunk_of_rank{4096, 100000, 65536 * 3, 16 * kMiB};
  const int root = 1;
  for (auto algo : {BcastAlgorithm::chain, BcastAlgorithm::tree}) {
    const int n = static_cast<int>(chunk_of_rank.size());
    World w(n);
    FakeNet net(n);
    std::vector<StageReport> reports(n);
    const std::string dir = "follow-" + std::string(to_string(algo));
    run_ranks(w, [&](ThreadComm& c) {
      FakeP2P p(net, c.rank());
      c.attach(&p);
      StageOptions opt;
      opt.chunk_size = chunk_of_rank[static_cast<size_t>(c.rank())];
      opt.bcast_algorithm = algo;
      opt.pipeline.segment = 8192;
      // A rank that cut the stream otherwise would refuse a header and leave the others
      // waiting: they then give up instead of hanging the test.
      opt.pipeline.stall_timeout = std::chrono::seconds(10);
      opt.root = root;
      opt.pre = Validate::none;
      StageEndpoint ep{path("src.bin"), path(dir + std::to_string(c.rank()) + "/f"), true};
      reports[static_cast<size_t>(c.rank())] = stage_transfer(c, &src, store, opt, ep);
    });
    for (int r = 0; r < n; ++r) {
      const StageReport& rep = reports[static_cast<size_t>(r)];
      EXPECT_TRUE(rep.ok) << to_string(algo) << " rank " << r << ": "
                          << (rep.errors.empty() ? "" : rep.errors.front());
      EXPECT_TRUE(read_file(path(dir + std::to_string(r) + "/f")) == data)
          << to_string(algo) << " rank " << r;
      EXPECT_EQ(rep.chunks, chunk_count(data.size(), chunk_of_rank[root]))
          << to_string(algo) << " rank " << r;
    }
  }
}

// A live copy: LiveCopyReaders that record the order in which chunks are written
// and, on one rank, wants the last chunk from the start.
class RecordingLive final : public LiveCopyReaders {
 public:
  explicit RecordingLive(std::optional<uint64_t> want) : want_(want) {}
  void started(const FileMeta& source, uint64_t chunk_size, const std::vector<Extent>& file_holes,
               const Txn& /*txn*/) override {
    holes = file_holes;
    size = source.size;
    chunk = chunk_size;
    ++starts;
  }
  void chunk_written(uint64_t index, bool /*zero*/) override {
    const std::lock_guard lk(m);
    order.push_back(index);
  }
  void take_wanted(std::vector<uint64_t>& out) override {
    if (want_) out.push_back(*std::exchange(want_, std::nullopt));
  }
  std::mutex m;
  std::vector<uint64_t> order;
  std::vector<Extent> holes;
  uint64_t size = 0, chunk = 0;
  int starts = 0;

 private:
  std::optional<uint64_t> want_;
};

// A transfer of `source` on n ranks (one rank: the MPI path), each with a RecordingLive, the
// last one wanting chunk `want` from the start; rank r writes (dir + r)/f.
struct LiveRun {
  std::vector<std::unique_ptr<RecordingLive>> live;
  std::vector<StageReport> reports;
};
LiveRun run_live(int n, const StageOptions& opt, const std::string& source, const std::string& dir,
                 uint64_t want) {
  World w(n);
  FakeNet net(n);
  PosixSource src;
  PosixStore store{StoreOptions{.xattrs = stagefs::kCopyXattrs}};
  LiveRun out;
  for (int r = 0; r < n; ++r)
    out.live.push_back(
        std::make_unique<RecordingLive>(r == n - 1 ? std::optional<uint64_t>(want) : std::nullopt));
  out.reports.resize(static_cast<size_t>(n));
  run_ranks(w, [&](ThreadComm& c) {
    FakeP2P p(net, c.rank());
    if (n > 1) c.attach(&p);
    StageOptions mine = opt;
    mine.live_copy = out.live[static_cast<size_t>(c.rank())].get();
    StageEndpoint ep{source, dir + std::to_string(c.rank()) + "/f", true};
    out.reports[static_cast<size_t>(c.rank())] = stage_transfer(c, &src, store, mine, ep);
  });
  return out;
}

// The last chunk, wanted by the chain's last rank (or, alone, by the source rank itself),
// is written long before its turn in file order; every chunk is written once, and the copy
// is the source byte for byte.
TEST_F(EnginePipelineTest, ReadersSteerTheChunkOrder) {
  const uint64_t chunk = 4096;
  const uint64_t nchunks = 64;
  const std::string data = random_bytes(chunk * nchunks, 9);
  write_file(path("src.bin"), data);
  for (int n : {1, 3}) {
    for (auto algo : {BcastAlgorithm::chain, BcastAlgorithm::tree}) {
      if (n == 1 && algo == BcastAlgorithm::tree) continue;  // one rank: the MPI path
      StageOptions opt;
      opt.chunk_size = chunk;
      opt.bcast_algorithm = algo;
      opt.pipeline.segment = 1024;
      opt.pre = Validate::none;
      const std::string tag = std::to_string(n) + to_string(algo);
      auto [live, reports] = run_live(n, opt, path("src.bin"), path("live" + tag), nchunks - 1);
      for (int r = 0; r < n; ++r) {
        const auto i = static_cast<size_t>(r);
        ASSERT_TRUE(reports[i].ok) << tag << " rank " << r << ": "
                                   << (reports[i].errors.empty() ? "" : reports[i].errors.front());
        EXPECT_EQ(read_file(path("live" + tag + std::to_string(r) + "/f")), data);
        EXPECT_EQ(live[i]->starts, 1);
        EXPECT_EQ(live[i]->size, data.size());
        auto sorted = live[i]->order;
        std::sort(sorted.begin(), sorted.end());
        std::vector<uint64_t> all(nchunks);
        std::iota(all.begin(), all.end(), 0);
        EXPECT_EQ(sorted, all) << tag << " rank " << r << ": every chunk written exactly once";
      }
      // The wanted chunk overtook the middle of the file: the source's reader holds at most a
      // few buffers ahead, and each link at most a few chunks (flow control).
      const auto& order = live[static_cast<size_t>(n - 1)]->order;
      const auto pos = std::find(order.begin(), order.end(), nchunks - 1) - order.begin();
      EXPECT_LT(pos, static_cast<std::ptrdiff_t>(nchunks / 2)) << tag;
    }
  }
}

// A sparse file read during its copy: its holes of whole chunks never travel (the readers
// have them from the start), the chunks that do are named as chunks of the file, a reader's
// want of the file's last chunk still overtakes the rest, and the copy keeps its holes.
TEST_F(EnginePipelineTest, ASparseFilesLiveCopyNamesChunksOfTheFile) {
  const uint64_t chunk = 4096;
  const uint64_t nchunks = 128;  // data in the first and the last 24 chunks
  const std::string head = random_bytes(24 * chunk, 12), tail = random_bytes(24 * chunk, 13);
  {
    const int fd = ::open(path("sparse.bin").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::pwrite(fd, head.data(), head.size(), 0), static_cast<ssize_t>(head.size()));
    ASSERT_EQ(::pwrite(fd, tail.data(), tail.size(), 104 * chunk), static_cast<ssize_t>(tail.size()));
    ::close(fd);
  }
  struct stat st {};
  ASSERT_EQ(::stat(path("sparse.bin").c_str(), &st), 0);
  if (static_cast<uint64_t>(st.st_blocks) * 512U >= 64 * chunk) GTEST_SKIP() << "no sparse files here";
  const int n = 3;
  StageOptions opt;
  opt.chunk_size = chunk;
  opt.bcast_algorithm = BcastAlgorithm::chain;
  opt.pipeline.segment = 1024;
  opt.pre = Validate::none;
  auto [live, reports] = run_live(n, opt, path("sparse.bin"), path("sparse"), nchunks - 1);
  std::vector<uint64_t> data_chunks;
  for (uint64_t k = 0; k < nchunks; ++k)
    if (k < 24 || k >= 104) data_chunks.push_back(k);
  for (int r = 0; r < n; ++r) {
    const auto i = static_cast<size_t>(r);
    ASSERT_TRUE(reports[i].ok) << r << ": " << (reports[i].errors.empty() ? "" : reports[i].errors.front());
    EXPECT_EQ(reports[i].chunks, 48U) << "only the chunks that hold data travel";
    EXPECT_EQ(read_file(path("sparse" + std::to_string(r) + "/f")), read_file(path("sparse.bin")));
    EXPECT_EQ(live[i]->holes, (std::vector<Extent>{{24 * chunk, 80 * chunk}}));
    auto sorted = live[i]->order;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, data_chunks) << "rank " << r << ": chunks of the file, each once";
    struct stat cst {};
    ASSERT_EQ(::stat(path("sparse" + std::to_string(r) + "/f").c_str(), &cst), 0);
    EXPECT_LT(static_cast<uint64_t>(cst.st_blocks) * 512U, 64 * chunk) << "the copy keeps its hole";
  }
  const auto& order = live[static_cast<size_t>(n - 1)]->order;
  const auto pos = std::find(order.begin(), order.end(), nchunks - 1) - order.begin();
  EXPECT_LT(pos, 24) << "the wanted chunk (file chunk 127, stream chunk 47) overtook the middle";
}

// More than one transfer at a time: a Nest whose root marks the stream once 10 chunks are
// done there; every rank then runs a second transfer on a second world (its own Comm and
// network), from the same thread, in the middle of the first.
class OneNest final : public Nest {
 public:
  OneNest(bool root, const uint64_t& done, std::function<Status()> nested)
      : root_(root), done_(done), nested_(std::move(nested)) {}
  Status poll() override {
    ++polls;
    return {};
  }
  uint32_t mark() override {
    if (!root_ || marked_ || done_ < 10) return 0;
    marked_ = true;
    return 77;
  }
  Status run(uint32_t token) override {
    tokens.push_back(token);
    done_at_run = done_;
    return nested_();
  }
  uint64_t polls = 0, done_at_run = 0;
  std::vector<uint32_t> tokens;

 private:
  bool root_;
  bool marked_ = false;
  const uint64_t& done_;
  std::function<Status()> nested_;
};

// Every rank runs the nested transfer exactly once, after the same number of the outer
// transfer's chunks, at least one chunk before its end; both copies are the sources byte for
// byte; the mark costs the source one header on the chain (not a chunk).
TEST_F(EnginePipelineTest, ATransferRunsNestedAtTheSameChunkOnEveryRank) {
  const uint64_t chunk = 4096;
  const uint64_t nchunks = 40;
  const std::string outer = random_bytes(chunk * nchunks, 3);
  const std::string inner = random_bytes(50000, 4);
  write_file(path("outer.bin"), outer);
  write_file(path("inner.bin"), inner);
  PosixSource src;
  PosixStore store{StoreOptions{.xattrs = stagefs::kCopyXattrs}};
  const std::vector<std::pair<int, BcastAlgorithm>> cases = {{1, BcastAlgorithm::mpi},
                                                             {3, BcastAlgorithm::chain},
                                                             {3, BcastAlgorithm::tree},
                                                             {3, BcastAlgorithm::mpi}};
  for (const auto& [n, algo] : cases) {
    const std::string tag = std::to_string(n) + to_string(algo);
    World w(n), w2(n);
    FakeNet net(n), net2(n);
    StageOptions opt;
    opt.chunk_size = chunk;
    opt.bcast_algorithm = algo;
    opt.pipeline.segment = 1024;
    opt.pre = Validate::none;
    std::vector<StageReport> reports(static_cast<size_t>(n)), nested(static_cast<size_t>(n));
    std::vector<uint64_t> done_at_run(static_cast<size_t>(n)), polls(static_cast<size_t>(n));
    std::vector<std::vector<uint32_t>> tokens(static_cast<size_t>(n));
    run_ranks(w, [&](ThreadComm& c) {
      const auto i = static_cast<size_t>(c.rank());
      FakeP2P p(net, c.rank()), p2(net2, c.rank());
      ThreadComm c2(w2, c.rank());
      if (n > 1) {
        c.attach(&p);
        c2.attach(&p2);
      }
      uint64_t done = 0;
      OneNest nest(c.rank() == 0, done, [&]() -> Status {
        StageOptions o2 = opt;
        o2.nest = nullptr;
        StageEndpoint ep2{path("inner.bin"), path("in" + tag + std::to_string(c.rank()) + "/f"), true};
        nested[i] = stage_transfer(c2, &src, store, o2, ep2);
        return {};
      });
      StageOptions mine = opt;
      mine.nest = &nest;
      StageEndpoint ep{path("outer.bin"), path("out" + tag + std::to_string(c.rank()) + "/f"), true};
      reports[i] = stage_transfer(c, &src, store, mine, ep, [&](uint64_t, uint64_t) { ++done; });
      done_at_run[i] = nest.done_at_run;
      polls[i] = nest.polls;
      tokens[i] = nest.tokens;
    });
    for (int r = 0; r < n; ++r) {
      const auto i = static_cast<size_t>(r);
      ASSERT_TRUE(reports[i].ok) << tag << " rank " << r << ": "
                                 << (reports[i].errors.empty() ? "" : reports[i].errors.front());
      ASSERT_TRUE(nested[i].ok) << tag << " rank " << r;
      EXPECT_EQ(read_file(path("out" + tag + std::to_string(r) + "/f")), outer) << tag;
      EXPECT_EQ(read_file(path("in" + tag + std::to_string(r) + "/f")), inner) << tag;
      EXPECT_EQ(tokens[i], std::vector<uint32_t>{77}) << tag << " rank " << r;
      EXPECT_EQ(done_at_run[i], done_at_run[0]) << tag << " rank " << r << ": the same point of the stream";
      EXPECT_GE(done_at_run[i], 10U) << tag;
      EXPECT_LT(done_at_run[i], nchunks) << tag << ": the mark is never after the last chunk";
      EXPECT_GT(polls[i], 0U) << tag;
      EXPECT_EQ(reports[i].chunks, nchunks) << tag << ": the mark is not a chunk";
    }
    if (algo == BcastAlgorithm::chain) {
      EXPECT_EQ(net.bytes_sent(0), outer.size() + (nchunks + 1) * sizeof(ChunkHeader)) << tag;
    }
  }
}

// A nested transfer whose Comm broke (its run() fails on every rank) fails the outer one as
// a broken data path on every rank: no further collective, nothing published.
TEST_F(EnginePipelineTest, ANestedTransferThatBreaksFailsTheOuterOne) {
  // The ranks log the failure at once: spdlog's registry (a lazily built static of an
  // uninstrumented library) is built here first, or TSan reports its construction.
  spdlog::default_logger_raw();
  const uint64_t chunk = 4096;
  const std::string outer = random_bytes(chunk * 40, 6);
  write_file(path("outer.bin"), outer);
  PosixSource src;
  PosixStore store{StoreOptions{.xattrs = stagefs::kCopyXattrs}};
  const int n = 3;
  World w(n);
  FakeNet net(n);
  StageOptions opt;
  opt.chunk_size = chunk;
  opt.bcast_algorithm = BcastAlgorithm::chain;
  opt.pipeline.segment = 1024;
  opt.pre = Validate::none;
  std::vector<StageReport> reports(static_cast<size_t>(n));
  run_ranks(w, [&](ThreadComm& c) {
    FakeP2P p(net, c.rank());
    c.attach(&p);
    uint64_t done = 0;
    OneNest nest(c.rank() == 0, done, [] { return stage_error(Errc::comm_failed, "nested (injected)"); });
    StageOptions mine = opt;
    mine.nest = &nest;
    StageEndpoint ep{path("outer.bin"), path("broken" + std::to_string(c.rank()) + "/f"), true};
    reports[static_cast<size_t>(c.rank())] =
        stage_transfer(c, &src, store, mine, ep, [&](uint64_t, uint64_t) { ++done; });
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_FALSE(reports[static_cast<size_t>(r)].ok) << "rank " << r;
    EXPECT_TRUE(reports[static_cast<size_t>(r)].comm_broken) << "rank " << r;
    EXPECT_FALSE(std::filesystem::exists(path("broken" + std::to_string(r) + "/f"))) << "rank " << r;
  }
}

}  // namespace
}  // namespace stage::testing
