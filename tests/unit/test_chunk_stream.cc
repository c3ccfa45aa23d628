// ChunkStream (bcast/transfer/pipeline.h): the chunks of a transfer as one pipeline over the fake
// point-to-point seam (fake_p2p.h): every chunk in order on every rank, no drain between
// chunks, flow control, aborts, refused headers, and readers' wants travelling to the root.
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
#include "thread_comm.h"
#include "tmpdir.h"

namespace stage::testing {
namespace {

using std::chrono::milliseconds;

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

}  // namespace
}  // namespace stage::testing
