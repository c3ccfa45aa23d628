// The mount's read-mode policy without a mount: the decision table (choose_read_mode) and the
// per-node counts that feed it (NodeReadModes, with a fake backing-file registration).
#include <gtest/gtest.h>

#include <vector>

#include "fusefs/edge/read_mode.h"

namespace stagefs {
namespace {

struct Row {
  OpenFacts facts;
  ReadMode mode;
  bool counted;
  bool keep_cache;
  ReadPath reported;
};

TEST(ReadMode, DecisionTable) {
  // during_copy, from_source, cache_hit, passthrough handles, cached-mode handles
  const std::vector<Row> rows = {
      // An open during the copy: from the copy in progress, counted as cached-mode ...
      {{true, false, false, false, false}, ReadMode::during_copy, true, false, ReadPath::unknown},
      {{true, false, false, false, true}, ReadMode::during_copy, true, false, ReadPath::unknown},
      // ... unless the node has passthrough handles: over their backing file.
      {{true, false, false, true, false}, ReadMode::passthrough, false, false, ReadPath::passthrough},
      // A stall fallback to the source: spliced, never passed through, not counted.
      {{false, true, false, false, false}, ReadMode::splice, false, false, ReadPath::unknown},
      {{false, true, false, true, false}, ReadMode::splice, false, false, ReadPath::unknown},
      // The local copy next to cached-mode handles: spliced and counted; page cache on a hit.
      {{false, false, true, false, true}, ReadMode::splice, true, true, ReadPath::unknown},
      {{false, false, false, false, true}, ReadMode::splice, true, false, ReadPath::unknown},
      // Otherwise the local copy asks for passthrough.
      {{false, false, true, false, false}, ReadMode::passthrough, false, false, ReadPath::passthrough},
      {{false, false, false, true, false}, ReadMode::passthrough, false, false, ReadPath::passthrough},
  };
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    const ReadChoice c = choose_read_mode(r.facts);
    EXPECT_EQ(c.mode, r.mode) << "row " << i;
    EXPECT_EQ(c.counted, r.counted) << "row " << i;
    EXPECT_EQ(c.keep_cache, r.keep_cache) << "row " << i;
    EXPECT_EQ(c.reported, r.reported) << "row " << i;
  }
  // A refused passthrough splices, uncounted, keeps the page cache on a hit and says so.
  for (const bool hit : {false, true}) {
    const ReadChoice c = refused_passthrough({false, false, hit, false, false});
    EXPECT_EQ(c.mode, ReadMode::splice);
    EXPECT_FALSE(c.counted);
    EXPECT_EQ(c.keep_cache, hit);
    EXPECT_EQ(c.reported, ReadPath::splice);
  }
}

// Backing files registered with a fake: ids from 7, or refused.
struct FakeBacking {
  bool refuse = false;
  int next = 7;
  std::vector<int> opened, closed;
  NodeReadModes::Backing backing() {
    return {[this](int fd) {
              opened.push_back(fd);
              return refuse ? -95 : next++;
            },
            [this](int id) { closed.push_back(id); }};
  }
};

const OpenFacts kLocalCopy{false, false, true, false, false};
const OpenFacts kDuringCopy{true, false, false, false, false};

TEST(ReadMode, PassthroughHandlesOfANodeShareOneBackingFile) {
  FakeBacking fake;
  NodeReadModes modes(fake.backing());
  const ReadChoice a = modes.open(1, 30, kLocalCopy);
  const ReadChoice b = modes.open(1, 31, kLocalCopy);
  const ReadChoice early = modes.open(1, -1, kDuringCopy);  // over the same backing file
  EXPECT_EQ(a.mode, ReadMode::passthrough);
  EXPECT_EQ(b.mode, ReadMode::passthrough);
  EXPECT_EQ(early.mode, ReadMode::passthrough);
  EXPECT_EQ(a.backing_id, 7);
  EXPECT_EQ(b.backing_id, 7);
  EXPECT_EQ(early.backing_id, 7);
  EXPECT_EQ(fake.opened, std::vector<int>{30});
  modes.close(1, a);
  modes.close(1, early);
  EXPECT_TRUE(fake.closed.empty());
  modes.close(1, b);
  EXPECT_EQ(fake.closed, std::vector<int>{7});
  EXPECT_EQ(modes.open(1, 32, kLocalCopy).backing_id, 8);  // a new one once all closed
}

TEST(ReadMode, CachedModeHandlesKeepANodeFromPassthroughUntilTheLastCloses) {
  FakeBacking fake;
  NodeReadModes modes(fake.backing());
  const ReadChoice early = modes.open(2, -1, kDuringCopy);
  EXPECT_EQ(early.mode, ReadMode::during_copy);
  const ReadChoice next = modes.open(2, 40, kLocalCopy);  // the kernel would refuse passthrough
  EXPECT_EQ(next.mode, ReadMode::splice);
  EXPECT_TRUE(next.counted);
  EXPECT_TRUE(fake.opened.empty());
  EXPECT_EQ(modes.open(3, 41, kLocalCopy).mode, ReadMode::passthrough);  // another node
  modes.close(2, early);
  const ReadChoice more = modes.open(2, 42, kLocalCopy);  // `next` is still open
  EXPECT_EQ(more.mode, ReadMode::splice);
  EXPECT_TRUE(more.counted);
  modes.close(2, next);
  modes.close(2, more);
  EXPECT_EQ(modes.open(2, 43, kLocalCopy).mode, ReadMode::passthrough);
}

TEST(ReadMode, ARefusedBackingFileSplicesWithoutCounting) {
  FakeBacking fake;
  fake.refuse = true;
  NodeReadModes modes(fake.backing());
  const ReadChoice c = modes.open(4, 50, kLocalCopy);
  EXPECT_EQ(c.mode, ReadMode::splice);
  EXPECT_FALSE(c.counted);
  EXPECT_TRUE(c.keep_cache);
  EXPECT_EQ(c.reported, ReadPath::splice);
  fake.refuse = false;
  EXPECT_EQ(modes.open(4, 51, kLocalCopy).mode, ReadMode::passthrough);  // asked again per open
  modes.close(4, c);
  EXPECT_TRUE(fake.closed.empty());
}

}  // namespace
}  // namespace stagefs
