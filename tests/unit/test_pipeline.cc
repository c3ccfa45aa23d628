// The pipelined chain and tree broadcasts (bcast/transfer/pipeline.h) over the fake point-to-point seam
// (fake_p2p.h: threads, random completion order, links that go silent or fail).
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

std::vector<std::byte> pattern(size_t n, unsigned seed) {
  std::vector<std::byte> v(n);
  std::mt19937 g(seed);
  for (auto& b : v) b = static_cast<std::byte>(g());
  return v;
}

struct Outcome {
  std::vector<Status> status;
  std::vector<std::vector<std::byte>> bufs;
  std::vector<int> live_after;  // requests a rank left pending (must be 0)
  double seconds = 0;
};

// Every rank broadcasts a buffer of `bytes` from `root` over `net`.
Outcome run_bcast(FakeNet& net, int root, size_t bytes, BcastAlgorithm shape, const PipelineOptions& opt,
                  unsigned seed = 1) {
  const int n = net.size();
  Outcome o;
  o.status.resize(static_cast<size_t>(n));
  o.bufs.assign(static_cast<size_t>(n), std::vector<std::byte>(bytes));
  o.live_after.assign(static_cast<size_t>(n), 0);
  o.bufs[static_cast<size_t>(root)] = pattern(bytes, seed);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      FakeP2P p(net, r, seed);
      o.status[static_cast<size_t>(r)] =
          pipeline_bcast(p, std::span(o.bufs[static_cast<size_t>(r)]), root, shape, opt);
      o.live_after[static_cast<size_t>(r)] = p.live_requests();
    });
  for (auto& t : ts) t.join();
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return o;
}

TEST(PipelineTest, ParsesAlgorithms) {
  EXPECT_EQ(parse_bcast_algorithm("auto"), BcastAlgorithm::automatic);
  EXPECT_EQ(parse_bcast_algorithm("chain"), BcastAlgorithm::chain);
  EXPECT_EQ(parse_bcast_algorithm("tree"), BcastAlgorithm::tree);
  EXPECT_EQ(parse_bcast_algorithm("mpi"), BcastAlgorithm::mpi);
  EXPECT_FALSE(parse_bcast_algorithm("ring").has_value());
  for (auto a : {BcastAlgorithm::automatic, BcastAlgorithm::chain, BcastAlgorithm::tree, BcastAlgorithm::mpi})
    EXPECT_EQ(parse_bcast_algorithm(to_string(a)), a);
}

TEST(PipelineTest, OrderPutsTheRootFirstAndNeighboursTogether) {
  // ranks 0..5 on hosts b, a, b, node10, a, node9: sorted a(1,4) b(0,2) node9(5) node10(3)
  const std::vector<std::string> hosts{"b", "a", "b", "node10", "a", "node9"};
  EXPECT_EQ(broadcast_order(hosts, 1), (std::vector<int>{1, 4, 0, 2, 5, 3}));
  // rotation: the root first, the cyclic neighbourhood kept
  EXPECT_EQ(broadcast_order(hosts, 2), (std::vector<int>{2, 5, 3, 1, 4, 0}));
  EXPECT_EQ(broadcast_order({"x"}, 0), (std::vector<int>{0}));
  // topology addresses: one switch's nodes stay adjacent
  const std::vector<std::string> topo{"s1.n3", "s0.n1", "s1.n2", "s0.n0"};
  EXPECT_EQ(broadcast_order(topo, 3), (std::vector<int>{3, 1, 2, 0}));
}

TEST(PipelineTest, LinksFormAChainAndABinaryTree) {
  for (int n = 1; n <= 17; ++n) {
    std::vector<std::string> keys;
    for (int r = 0; r < n; ++r) keys.push_back(std::string("h").append(std::to_string((r * 7) % n)));
    for (int root = 0; root < n; ++root) {
      const auto order = broadcast_order(keys, root);
      ASSERT_EQ(order.front(), root);
      for (auto shape : {BcastAlgorithm::chain, BcastAlgorithm::tree}) {
        // every rank but the root has one parent, whose children list it; all reach the root
        int edges = 0;
        for (int r = 0; r < n; ++r) {
          const Links l = links_of(shape, order, r);
          EXPECT_LE(l.children.size(), shape == BcastAlgorithm::chain ? 1U : 2U);
          edges += static_cast<int>(l.children.size());
          if (r == root) {
            EXPECT_EQ(l.parent, -1);
            continue;
          }
          ASSERT_GE(l.parent, 0);
          const auto pc = links_of(shape, order, l.parent).children;
          EXPECT_NE(std::find(pc.begin(), pc.end(), r), pc.end());
          int hops = 0;
          for (int x = r; x != root && hops <= n; ++hops) x = links_of(shape, order, x).parent;
          EXPECT_LE(hops, n - 1);
        }
        EXPECT_EQ(edges, n - 1);
      }
    }
  }
}

TEST(PipelineTest, SegmentSize) {
  EXPECT_EQ(segment_for(16 * kMiB), kDefaultSegment);
  EXPECT_EQ(segment_for(4096), 4096U);
  EXPECT_EQ(segment_for(1), 1U);
  EXPECT_LT(kDefaultSegment + 64, 64 * 1024U);  // under Open MPI's TCP eager limit, with headers
}

// N = 1..9, 12 and 15..17 (around a power of two), both shapes: every rank ends with the root's
// bytes, no request left. Every root up to 9 ranks; beyond, the first two, the middle and the
// last two (the broadcast order is the placement rotated to start at the root). Every N and
// every root made this the suite's longest test under ThreadSanitizer (77 s).
TEST(PipelineTest, EveryRankGetsTheRootsBytes) {
  PipelineOptions opt;
  opt.segment = 1000;  // odd, and many segments per buffer
  opt.window_bytes = 3000;
  opt.stall_timeout = milliseconds(20000);
  for (int n = 1; n <= 17; ++n) {
    if (n > 9 && n != 12 && n < 15) continue;
    for (int root = 0; root < n; ++root) {
      if (n > 9 && root > 1 && root != n / 2 && root < n - 2) continue;
      for (auto shape : {BcastAlgorithm::chain, BcastAlgorithm::tree}) {
        // odd sizes: one byte, a partial last segment, exactly k segments; all sizes on a few roots
        std::vector<size_t> sizes{7777};
        if (root == 0 || root == n - 1) sizes = {1, 999, 1000, 1001, 7777, 16384};
        for (size_t bytes : sizes) {
          FakeNet net(n);
          auto o = run_bcast(net, root, bytes, shape, opt, static_cast<unsigned>(n * 100 + root));
          for (int r = 0; r < n; ++r) {
            const auto i = static_cast<size_t>(r);
            ASSERT_TRUE(o.status[i]) << "n=" << n << " root=" << root << " " << to_string(shape)
                                     << " bytes=" << bytes << " rank " << r << ": "
                                     << o.status[i].error().message;
            ASSERT_EQ(o.bufs[i], o.bufs[static_cast<size_t>(root)])
                << "n=" << n << " root=" << root << " rank=" << r << " " << to_string(shape);
            EXPECT_EQ(o.live_after[i], 0);
          }
        }
      }
    }
  }
}

TEST(PipelineTest, ZeroLengthSendsNothing) {
  FakeNet net(5);
  auto o = run_bcast(net, 2, 0, BcastAlgorithm::chain, PipelineOptions{});
  for (int r = 0; r < 5; ++r) {
    EXPECT_TRUE(o.status[static_cast<size_t>(r)]);
    EXPECT_EQ(net.bytes_sent(r), 0U);
  }
}

TEST(PipelineTest, TheSourceSendsTheBufferOnceInAChainTwiceInATree) {
  PipelineOptions opt;
  opt.segment = 4096;
  const size_t bytes = 100000;
  for (auto shape : {BcastAlgorithm::chain, BcastAlgorithm::tree}) {
    FakeNet net(9);
    auto o = run_bcast(net, 0, bytes, shape, opt);
    for (const auto& st : o.status) ASSERT_TRUE(st);
    // + the 32-byte header per child, two 8-byte counts up (handed back, subtree holds), and
    // in the tree one release byte per child
    const uint64_t hdr = sizeof(ChunkHeader);
    const uint64_t per_rank = shape == BcastAlgorithm::chain ? bytes + hdr + 16 : 2 * (bytes + hdr) + 16 + 2;
    EXPECT_EQ(net.bytes_sent(0), shape == BcastAlgorithm::chain ? bytes + hdr : 2 * (bytes + hdr) + 2);
    for (int r = 1; r < 9; ++r) EXPECT_LE(net.bytes_sent(r), per_rank);
  }
}

TEST(PipelineTest, RejectsABadRoot) {
  FakeNet net(3);
  FakeP2P p(net, 0);
  std::vector<std::byte> b(10);
  EXPECT_FALSE(pipeline_bcast(p, std::span(b), 3, BcastAlgorithm::chain, PipelineOptions{}));
  EXPECT_FALSE(pipeline_bcast(p, std::span(b), -1, BcastAlgorithm::chain, PipelineOptions{}));
}

// A link that goes silent mid-transfer (a pulled cable): every rank returns an error within
// about one stall timeout (in the tree too: the other subtrees wait for the release), and no
// request stays pending.
TEST(PipelineTest, ASilentLinkFailsEveryRankWithinTheStallTimeout) {
  PipelineOptions opt;
  opt.segment = 1024;
  opt.stall_timeout = milliseconds(300);
  const int n = 8;
  for (auto shape : {BcastAlgorithm::chain, BcastAlgorithm::tree}) {
    for (int cut_pos : {1, 4, 7}) {
      FakeNet net(n);
      const auto order = broadcast_order(net.placement(), 0);
      const int child = order[static_cast<size_t>(cut_pos)];
      const int parent = links_of(shape, order, child).parent;
      net.cut(parent, child, 5);  // 5 segments get through, then nothing
      auto o = run_bcast(net, 0, 64 * 1024, shape, opt);
      for (int r = 0; r < n; ++r) {
        const auto i = static_cast<size_t>(r);
        EXPECT_FALSE(o.status[i]) << to_string(shape) << " cut at " << cut_pos << ": rank " << r
                                  << " succeeded";
        EXPECT_EQ(o.live_after[i], 0);
      }
      // bounded, not hung (generous: sanitizer builds on a loaded machine run ~10x slower)
      EXPECT_LT(o.seconds, 20.0) << "took " << o.seconds << " s";
    }
  }
}

// A link whose requests complete in error: every rank fails, none hangs.
TEST(PipelineTest, AFailingLinkFailsEveryRank) {
  PipelineOptions opt;
  opt.segment = 1024;
  opt.stall_timeout = milliseconds(300);
  FakeNet net(6);
  net.fail(2, 3, 3);
  auto o = run_bcast(net, 0, 50000, BcastAlgorithm::chain, opt);
  for (int r = 0; r < 6; ++r) {
    EXPECT_FALSE(o.status[static_cast<size_t>(r)]) << "rank " << r;
    EXPECT_EQ(o.live_after[static_cast<size_t>(r)], 0);
  }
  // ranks next to the failed link see the error itself, not a timeout
  EXPECT_EQ(o.status[2].error().code, make_error_code(Errc::comm_failed));
}

// --- ChunkStream: the chunks of a transfer as one pipeline -----------------------------------

struct StreamOutcome {
  std::vector<Status> status;
  std::vector<std::vector<ChunkHeader>> headers;            // per rank, in the order handed back
  std::vector<std::vector<std::vector<std::byte>>> chunks;  // per rank, per chunk: its payload
  std::vector<int> live_after;
};

// The root streams `chunks` (a header each: its payload's length and flags) to every rank;
// each other rank receives into `slots` buffers of the largest chunk's size, reusing a buffer
// once its chunk is handed back.
StreamOutcome run_stream(FakeNet& net, int root, const std::vector<std::pair<size_t, uint32_t>>& chunks,
                         BcastAlgorithm shape, const PipelineOptions& opt, size_t slots = 3) {
  const int n = net.size();
  StreamOutcome o;
  o.status.resize(static_cast<size_t>(n));
  o.headers.resize(static_cast<size_t>(n));
  o.chunks.resize(static_cast<size_t>(n));
  o.live_after.assign(static_cast<size_t>(n), 0);
  size_t biggest = 1;
  for (auto [len, flags] : chunks) biggest = std::max(biggest, len);
  std::vector<std::vector<std::byte>> payload;
  for (size_t i = 0; i < chunks.size(); ++i)
    payload.push_back((chunks[i].second & (kChunkZero | kChunkAbort)) != 0
                          ? std::vector<std::byte>{}
                          : pattern(chunks[i].first, 7 + static_cast<unsigned>(i)));
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      const auto me = static_cast<size_t>(r);
      FakeP2P p(net, r, 11 + static_cast<unsigned>(r));
      auto run = [&]() -> Status {
        ChunkStream s(p, root, shape, opt);
        std::deque<std::vector<std::byte>> free_bufs(r == root ? 0 : slots, std::vector<std::byte>(biggest));
        std::deque<std::vector<std::byte>> inflight;
        size_t next = 0;
        bool aborted = false;
        std::vector<ChunkHeader> done;
        while (o.headers[me].size() < chunks.size() && !aborted) {
          if (r == root) {
            while (next < chunks.size() && s.pending() < slots) {
              inflight.push_back(payload[next]);
              const ChunkHeader h{next, chunks[next].first, 0, chunks[next].second, 0};
              if (auto st = s.submit(std::span(inflight.back()), h); !st) return st;
              ++next;
            }
          } else {
            while (next < chunks.size() && !free_bufs.empty()) {
              inflight.push_back(std::move(free_bufs.front()));
              free_bufs.pop_front();
              if (auto st = s.submit(std::span(inflight.back()), ChunkHeader{}); !st) return st;
              ++next;
            }
          }
          done.clear();
          auto moved = s.progress(done);
          if (!moved) return moved.error();
          for (const ChunkHeader& h : done) {
            o.headers[me].push_back(h);
            const bool empty = (h.flags & (kChunkZero | kChunkAbort)) != 0;
            auto& b = inflight.front();
            o.chunks[me].emplace_back(b.begin(),
                                      b.begin() + static_cast<std::ptrdiff_t>(empty ? 0 : h.length));
            if (r != root) free_bufs.push_back(std::move(b));
            inflight.pop_front();
            aborted = aborted || (h.flags & kChunkAbort) != 0;
          }
          if (!*moved) s.idle();
        }
        return s.finish();
      };
      o.status[me] = run();
      o.live_after[me] = p.live_requests();
    });
  for (auto& t : ts) t.join();
  return o;
}

// Chunks of every kind (odd sizes, a hole chunk without payload, one byte, more chunks than
// buffers) arrive on every rank, in order, with the root's headers and bytes, chain and tree.
TEST(ChunkStreamTest, EveryRankGetsEveryChunkInOrder) {
  PipelineOptions opt;
  opt.segment = 1000;
  opt.window_bytes = 4000;
  opt.stall_timeout = milliseconds(20000);
  const std::vector<std::pair<size_t, uint32_t>> chunks{{10000, 0}, {4096, kChunkZero}, {1, 0},  {70001, 0},
                                                        {5000, 0},  {3000, 0},          {999, 0}};
  for (auto shape : {BcastAlgorithm::chain, BcastAlgorithm::tree}) {
    for (int n : {2, 3, 6, 9}) {
      FakeNet net(n);
      const int root = n / 2;
      auto o = run_stream(net, root, chunks, shape, opt);
      const auto rt = static_cast<size_t>(root);
      for (int r = 0; r < n; ++r) {
        const auto i = static_cast<size_t>(r);
        ASSERT_TRUE(o.status[i]) << to_string(shape) << " n=" << n << " rank " << r << ": "
                                 << o.status[i].error().message;
        ASSERT_EQ(o.headers[i].size(), chunks.size());
        for (size_t c = 0; c < chunks.size(); ++c) {
          EXPECT_EQ(o.headers[i][c].index, c);
          EXPECT_EQ(o.headers[i][c].length, chunks[c].first);
          EXPECT_EQ(o.headers[i][c].flags, chunks[c].second);
          EXPECT_EQ(o.chunks[i][c], o.chunks[rt][c]) << "rank " << r << " chunk " << c;
        }
        EXPECT_EQ(o.live_after[i], 0);
      }
    }
  }
}

// The pipeline does not drain between chunks: with the link into the last rank of the chain
// silent after a few messages, the source still sends every chunk (one pipeline per chunk
// would hold the source at the end of chunk 0, waiting for the last rank's confirmation).
// Every rank then fails within the stall timeout, no request left behind.
TEST(ChunkStreamTest, TheSourceDoesNotWaitForTheEndOfTheChainBetweenChunks) {
  PipelineOptions opt;
  opt.segment = 1024;
  opt.stall_timeout = milliseconds(300);
  const int n = 5;
  FakeNet net(n);
  const auto order = broadcast_order(net.placement(), 0);
  net.cut(order[static_cast<size_t>(n - 2)], order.back(), 3);
  const std::vector<std::pair<size_t, uint32_t>> chunks{{8192, 0}, {8192, 0}, {8192, 0}, {8192, 0}};
  auto o = run_stream(net, 0, chunks, BcastAlgorithm::chain, opt, 4);
  EXPECT_EQ(net.bytes_sent(0), 4 * (8192 + sizeof(ChunkHeader)));  // every chunk left the source
  EXPECT_EQ(o.headers[0].size(), 4U);
  for (int r = 0; r < n; ++r) {
    EXPECT_FALSE(o.status[static_cast<size_t>(r)]) << "rank " << r << " succeeded";
    EXPECT_EQ(o.live_after[static_cast<size_t>(r)], 0);
  }
}

// Flow control: a child that takes nothing (no buffer posted) gets at most kCreditChunks (4)
// chunks' data from its parent, whatever the parent has ready (eager sends complete without
// the receiver: without credits the whole stream would pile up at a slow node). The parent
// then reports the stall, naming the child.
TEST(ChunkStreamTest, ASlowChildGetsAtMostFourChunksAhead) {
  PipelineOptions opt;
  opt.segment = 1024;
  opt.stall_timeout = milliseconds(300);
  FakeNet net(2);
  Status root_status;
  std::thread root([&] {
    FakeP2P p(net, 0);
    ChunkStream s(p, 0, BcastAlgorithm::chain, opt);
    std::vector<std::vector<std::byte>> bufs(10, std::vector<std::byte>(4096));
    for (uint64_t k = 0; k < 10; ++k)
      if (auto st = s.submit(std::span(bufs[k]), ChunkHeader{k, 4096, 0, 0, 0}); !st) root_status = st;
    std::vector<ChunkHeader> done;
    for (;;) {
      auto r = s.progress(done);
      if (!r) {
        root_status = r.error();
        return;
      }
      if (!*r) s.idle();
    }
  });
  root.join();
  ASSERT_FALSE(root_status);
  EXPECT_NE(root_status.error().message.find("rank 1 (node1) to take chunk 0"), std::string::npos)
      << root_status.error().message;
  EXPECT_EQ(net.bytes_sent(0), 4 * 4096 + 10 * sizeof(ChunkHeader));
}

// A healthy but slow node (its writer holds each chunk 250 ms, one buffer) at the end of a
// chain: the ranks above it are done long before it and wait 4 s in all, more than the
// stall timeout (3 s, far above any scheduling gap of a loaded machine); its progress
// reaches them through the subtree counts, so nobody reports a stall (with one confirmation
// at the end, every rank but the slow one failed).
TEST(ChunkStreamTest, ASlowButHealthyNodeDoesNotFailTheOthers) {
  PipelineOptions opt;
  opt.segment = 1024;
  opt.stall_timeout = milliseconds(3000);
  const int n = 4;
  const uint64_t nch = 16, len = 8192;
  FakeNet net(n);
  const auto order = broadcast_order(net.placement(), 0);
  std::vector<Status> res(n);
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      FakeP2P p(net, r, 3 + static_cast<unsigned>(r));
      ChunkStream s(p, 0, BcastAlgorithm::chain, opt);
      const bool slow = r == order.back();
      std::deque<std::vector<std::byte>> free_bufs(slow ? 1 : 4, std::vector<std::byte>(len)), inflight;
      uint64_t next = 0, got = 0;
      std::vector<ChunkHeader> done;
      auto busy_until = std::chrono::steady_clock::now();
      while (got < nch) {
        if (r == 0) {
          while (next < nch && s.pending() < 4) {
            inflight.emplace_back(len);
            if (auto st = s.submit(std::span(inflight.back()), ChunkHeader{next, len, 0, 0, 0}); !st) {
              res[static_cast<size_t>(r)] = st;
              return;
            }
            ++next;
          }
        } else if (std::chrono::steady_clock::now() >= busy_until) {
          while (next < nch && !free_bufs.empty()) {
            inflight.push_back(std::move(free_bufs.front()));
            free_bufs.pop_front();
            if (auto st = s.submit(std::span(inflight.back()), ChunkHeader{}); !st) {
              res[static_cast<size_t>(r)] = st;
              return;
            }
            ++next;
          }
        }
        done.clear();
        auto m = s.progress(done);
        if (!m) {
          res[static_cast<size_t>(r)] = m.error();
          return;
        }
        for (size_t k = 0; k < done.size(); ++k) {
          if (r != 0) free_bufs.push_back(std::move(inflight.front()));
          inflight.pop_front();
          ++got;
          if (slow) busy_until = std::chrono::steady_clock::now() + milliseconds(250);
        }
        if (!*m) s.idle();
      }
      res[static_cast<size_t>(r)] = s.finish();
    });
  for (auto& t : ts) t.join();
  for (int r = 0; r < n; ++r)
    EXPECT_TRUE(res[static_cast<size_t>(r)])
        << "rank " << r << ": " << res[static_cast<size_t>(r)].error().message;
}

// The source's abort (its read failed) ends the stream at the same chunk on every rank: the
// chunks before it arrive, the receives posted for later chunks are dropped, finish() is OK.
TEST(ChunkStreamTest, AnAbortEndsTheStreamEverywhere) {
  PipelineOptions opt;
  opt.segment = 1000;
  for (auto shape : {BcastAlgorithm::chain, BcastAlgorithm::tree}) {
    FakeNet net(7);
    const std::vector<std::pair<size_t, uint32_t>> chunks{
        {5000, 0}, {5000, kChunkAbort}, {5000, 0}, {5000, 0}};
    // the root stops at the abort: it submits only two chunks
    auto o = run_stream(net, 3, {chunks[0], chunks[1]}, shape, opt, 4);
    for (int r = 0; r < 7; ++r) {
      const auto i = static_cast<size_t>(r);
      ASSERT_TRUE(o.status[i]) << to_string(shape) << " rank " << r << ": " << o.status[i].error().message;
      ASSERT_EQ(o.headers[i].size(), 2U);
      EXPECT_EQ(o.headers[i][1].flags, kChunkAbort);
      EXPECT_EQ(o.chunks[i][0], o.chunks[3][0]);
      EXPECT_EQ(o.live_after[i], 0);
    }
  }
}

// A header that claims more than the receiver's buffer is refused, not written past its end.
TEST(ChunkStreamTest, RefusesAChunkLargerThanTheBuffer) {
  PipelineOptions opt;
  opt.stall_timeout = milliseconds(300);
  FakeNet net(2);
  std::vector<Status> st(2);
  std::thread root([&] {
    FakeP2P p(net, 0);
    ChunkStream s(p, 0, BcastAlgorithm::chain, opt);
    std::vector<std::byte> big(5000);
    st[0] = s.submit(std::span(big), ChunkHeader{0, 5000, 0, 0, 0});
    std::vector<ChunkHeader> done;
    while (st[0] && done.empty()) {  // until its header and data are sent
      auto r = s.progress(done);
      if (!r) st[0] = r.error();
      s.idle();
    }
  });
  std::thread other([&] {
    FakeP2P p(net, 1);
    ChunkStream s(p, 0, BcastAlgorithm::chain, opt);
    std::vector<std::byte> small(4000);
    st[1] = s.submit(std::span(small), ChunkHeader{});
    std::vector<ChunkHeader> done;
    for (;;) {
      auto r = s.progress(done);
      if (!r) {
        st[1] = r.error();
        return;
      }
      if (!done.empty()) return;
      s.idle();
    }
  });
  root.join();
  other.join();
  ASSERT_FALSE(st[1]);
  EXPECT_EQ(st[1].error().code, make_error_code(Errc::bad_message));
}

// Reads before the copy ends: a rank's wants travel up the chain or tree to the root, each
// chunk index once however many ranks below ask for it (and however often).
TEST(ChunkStreamTest, WantsReachTheRootOncePerChunk) {
  PipelineOptions opt;
  opt.segment = 1000;
  opt.stall_timeout = milliseconds(20000);
  for (auto shape : {BcastAlgorithm::chain, BcastAlgorithm::tree}) {
    const int n = 6;
    FakeNet net(n);
    std::vector<uint64_t> at_root;
    std::vector<Status> st(static_cast<size_t>(n));
    std::vector<std::thread> ts;
    for (int r = 0; r < n; ++r)
      ts.emplace_back([&, r] {
        FakeP2P p(net, r, 5 + static_cast<unsigned>(r));
        ChunkStream s(p, 0, shape, opt);
        std::vector<std::byte> buf(3000);
        std::vector<ChunkHeader> done;
        auto run = [&]() -> Status {
          if (r == 0) {  // every want first (each rank asks for 5 and 7, rank 1 also for 9)
            s.want(7);   // the root's own want counts once too
            while (at_root.size() < 3) {
              auto m = s.progress(done);
              if (!m) return m.error();
              while (auto w = s.take_want()) at_root.push_back(*w);
              if (!*m) s.idle();
            }
            if (auto sub = s.submit(std::span(buf), ChunkHeader{0, buf.size(), 0, 0, 0}); !sub) return sub;
          } else {
            if (auto sub = s.submit(std::span(buf), ChunkHeader{}); !sub) return sub;
            for (int k = 0; k < 2; ++k) {
              s.want(5);
              s.want(7);
            }
            if (r == 1) s.want(9);
          }
          while (done.empty()) {
            auto m = s.progress(done);
            if (!m) return m.error();
            if (!*m) s.idle();
          }
          return s.finish();
        };
        st[static_cast<size_t>(r)] = run();
      });
    for (auto& t : ts) t.join();
    for (int r = 0; r < n; ++r) EXPECT_TRUE(st[static_cast<size_t>(r)]) << to_string(shape) << " rank " << r;
    std::sort(at_root.begin(), at_root.end());
    EXPECT_EQ(at_root, (std::vector<uint64_t>{5, 7, 9})) << to_string(shape);
  }
}

TEST(PipelineTest, ResolveKeepsSmallBuffersAndSeamlessCommsOnMpi) {
  World w(1);
  ThreadComm one(w, 0);
  EXPECT_EQ(resolve(BcastAlgorithm::chain, one, kMiB), BcastAlgorithm::mpi);  // one rank
  World w3(3);
  ThreadComm c(w3, 0);
  EXPECT_EQ(resolve(BcastAlgorithm::automatic, c, kMiB), BcastAlgorithm::mpi);  // no seam
  FakeNet net(3);
  FakeP2P p(net, 0);
  c.attach(&p);
  EXPECT_EQ(resolve(BcastAlgorithm::automatic, c, kMiB), BcastAlgorithm::chain);
  EXPECT_EQ(resolve(BcastAlgorithm::automatic, c, 100), BcastAlgorithm::mpi);
  EXPECT_EQ(resolve(BcastAlgorithm::tree, c, 100), BcastAlgorithm::tree);
  EXPECT_EQ(resolve(BcastAlgorithm::mpi, c, kMiB), BcastAlgorithm::mpi);
}

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
