// Profiles (fusefs/profile/): the codec against round trips and hostile bytes (truncated,
// flipped, edited with a fresh checksum, paths outside the source), the recorder and the merge
// of the nodes' profiles, the replay's plan, the profile's file (default path, atomic write,
// the checks on read), and the exchange at unmount over a fake network.
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

using stage::testing::TmpDirTest;
namespace fs = std::filesystem;

Profile sample() {
  Profile p;
  p.chunk_size = 16 << 20;
  p.uid = 1000;
  p.created = 1'700'000'000;
  p.source = "/shared/datasets/imagenet";
  p.files = {{"img.sqsh", 0, {0, 63, 1, 2, 40}},
             {"train/d001/a.jpg", 3000, {}},
             {"train/d001/b.jpg", 3000, {}},
             {"train/d000/z.jpg", 3012, {}},
             {"top", 4000, {}},
             {"val/x/y/z/deep.bin", 999999, {7}}};
  return p;
}

std::span<const std::byte> bytes_of(const std::string& s) {
  return std::as_bytes(std::span(s.data(), s.size()));
}

TEST(ProfileFormatTest, RoundTripKeepsEveryField) {
  Profile p = sample();
  p.truncated = true;
  const std::string bytes = encode_profile(p);
  auto back = decode_profile(bytes_of(bytes));
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(*back, p);
  EXPECT_EQ(decode_profile(bytes_of(encode_profile(Profile{})))->files.size(), 0U);
}

// What the encoder cannot express is left out, not written wrong: unsafe paths, a path twice.
TEST(ProfileFormatTest, TheEncoderLeavesOutWhatADecoderWouldRefuse) {
  Profile p = sample();
  for (const std::string& bad :
       {std::string("../etc/passwd"), std::string("/etc/passwd"), std::string("a//b"), std::string("a/./b"),
        std::string("a/"), std::string(), std::string("a/.."), std::string("x/y\0z", 5)})
    p.files.push_back({bad, 5, {}});
  p.files.push_back({"top", 6, {}});
  auto back = decode_profile(bytes_of(encode_profile(p)));
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(back->files, sample().files);
}

// A million files of a dataset, in the shuffled order of a first epoch: about 14 bytes each
// (names like d0042/f000123.jpg: the directory's index and the name, and a time increment).
TEST(ProfileFormatTest, ADatasetProfileIsSmall) {
  constexpr int kDirs = 1000, kPerDir = 200;
  Profile p;
  p.chunk_size = 16 << 20;
  for (int d = 0; d < kDirs; ++d)
    for (int f = 0; f < kPerDir; ++f) {
      char name[64];
      std::snprintf(name, sizeof name, "train/d%04d/f%06d.jpg", d, f);
      p.files.push_back({name, 0, {}});
    }
  std::shuffle(p.files.begin(), p.files.end(), std::mt19937(1));
  for (size_t i = 0; i < p.files.size(); ++i) p.files[i].first_ms = i / 7;
  const std::string bytes = encode_profile(p);
  const double per_file = static_cast<double>(bytes.size()) / static_cast<double>(p.files.size());
  EXPECT_LT(per_file, 16.0) << bytes.size() << " bytes";
  auto back = decode_profile(bytes_of(bytes));
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(back->files, p.files);
}

TEST(ProfileFormatTest, EveryTruncationAndEveryFlippedByteIsRefused) {
  const std::string bytes = encode_profile(sample());
  for (size_t n = 0; n < bytes.size(); ++n)
    EXPECT_FALSE(decode_profile(bytes_of(bytes.substr(0, n)))) << "cut at " << n;
  EXPECT_FALSE(decode_profile(bytes_of(bytes + "x"))) << "a byte appended";
  for (size_t i = 0; i < bytes.size(); ++i)
    for (int bit : {0, 7}) {
      std::string b = bytes;
      b[i] = static_cast<char>(b[i] ^ (1 << bit));
      EXPECT_FALSE(decode_profile(bytes_of(b))) << "byte " << i << " bit " << bit;
    }
}

// A profile written by hand, with a checksum that matches: the header, then the body as the
// format says (docs/profile-format.md).
class Raw {
 public:
  Raw& varint(uint64_t v) {
    while (v >= 0x80) {
      body_.push_back(static_cast<char>((v & 0x7f) | 0x80));
      v >>= 7;
    }
    body_.push_back(static_cast<char>(v));
    return *this;
  }
  Raw& str(const std::string& s) {
    varint(s.size());
    body_ += s;
    return *this;
  }
  Raw& raw(const std::string& s) {
    body_ += s;
    return *this;
  }
  // chunk size, uid, created, source: a header a file list follows.
  static Raw with_header(uint64_t chunk = 1 << 20) {
    Raw r;
    r.varint(chunk).varint(1000).varint(0).str("/src");
    return r;
  }
  [[nodiscard]] std::string bytes(uint8_t version = 1, uint8_t flags = 0) const {
    std::string out = "STGPROF";
    out.push_back(static_cast<char>(version));
    out.push_back(static_cast<char>(flags));
    out.append(3, '\0');
    const auto len = static_cast<uint32_t>(body_.size());
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((len >> (8 * i)) & 0xff));
    out += body_;
    const uint64_t crc = stage::crc64(bytes_of(out));
    for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((crc >> (8 * i)) & 0xff));
    return out;
  }

 private:
  std::string body_;
};

// One directory and one file, written by hand: the reference for the edits below.
Raw one_file(const std::string& dir, const std::string& name) {
  Raw r = Raw::with_header();
  r.varint(1).varint(0).str(dir);             // 1 directory: shared 0, the whole name
  r.varint(1).varint(0).str(name).varint(5);  // 1 file: directory 0, its name, 5 ms
  r.varint(0);                                // no chunks
  return r;
}

TEST(ProfileFormatTest, AProfileWrittenByHandIsReadAsTheFormatSays) {
  auto p = decode_profile(bytes_of(one_file("a/b", "c").bytes()));
  ASSERT_TRUE(p) << p.error().message;
  ASSERT_EQ(p->files.size(), 1U);
  EXPECT_EQ(p->files[0], (ProfileFile{"a/b/c", 5, {}}));
  EXPECT_EQ(p->chunk_size, 1U << 20);
  EXPECT_EQ(p->source, "/src");
}

// Edited by hand with a fresh checksum: anything that names a path outside the source, or is
// not what the format says, refuses the whole profile.
TEST(ProfileFormatTest, EditedProfilesWithAValidChecksumAreRefused) {
  for (const auto& [dir, name] :
       std::vector<std::pair<std::string, std::string>>{{"..", "passwd"},
                                                        {"/etc", "passwd"},
                                                        {"a/../..", "x"},
                                                        {"a//b", "x"},
                                                        {"a/./b", "x"},
                                                        {std::string("a\0b", 3), "x"},
                                                        {"a", ".."},
                                                        {"a", "."},
                                                        {"a", "b/c"},
                                                        {"a", std::string("b\0c", 3)},
                                                        {"a", ""},
                                                        {"a", std::string(256, 'n')}})
    EXPECT_FALSE(decode_profile(bytes_of(one_file(dir, name).bytes())))
        << "dir '" << dir << "' name '" << name << "'";
  EXPECT_FALSE(decode_profile(bytes_of(one_file("a", "b").bytes(2)))) << "a later version";
  EXPECT_FALSE(decode_profile(bytes_of(one_file("a", "b").bytes(1, 2)))) << "an unknown flag";
  EXPECT_FALSE(decode_profile(bytes_of(Raw::with_header(100).varint(0).varint(0).bytes())))
      << "chunk size 100";
  {  // a directory index past the table
    Raw r = Raw::with_header();
    r.varint(1).varint(0).str("a").varint(1).varint(1).str("f").varint(0).varint(0);
    EXPECT_FALSE(decode_profile(bytes_of(r.bytes())));
  }
  {  // front coding that shares more than the previous directory has
    Raw r = Raw::with_header();
    r.varint(2).varint(0).str("a").varint(5).str("b").varint(1).varint(1).str("f").varint(0).varint(0);
    EXPECT_FALSE(decode_profile(bytes_of(r.bytes())));
  }
  {  // directories out of order (or twice)
    Raw r = Raw::with_header();
    r.varint(2).varint(0).str("b").varint(0).str("a").varint(0);
    EXPECT_FALSE(decode_profile(bytes_of(r.bytes())));
  }
  {  // a file twice
    Raw r = Raw::with_header();
    r.varint(1).varint(0).str("a");
    r.varint(2).varint(0).str("f").varint(0).varint(0).varint(0).str("f").varint(0).varint(0);
    EXPECT_FALSE(decode_profile(bytes_of(r.bytes())));
  }
  {  // counts far beyond what the bytes can hold, and a varint past 64 bits
    EXPECT_FALSE(decode_profile(bytes_of(Raw::with_header().varint(uint64_t{1} << 40).bytes())));
    Raw r = Raw::with_header();
    r.varint(1).varint(0).str("a").varint(1).varint(0).str("f").varint(0).varint(1u << 30);
    EXPECT_FALSE(decode_profile(bytes_of(r.bytes())));
    EXPECT_FALSE(
        decode_profile(bytes_of(Raw::with_header().raw(std::string(10, '\xff')).raw("\x01").bytes())));
  }
  {  // a chunk index below 0 or past 32 bits
    Raw r = Raw::with_header();
    r.varint(1).varint(0).str("a").varint(1).varint(0).str("f").varint(0).varint(1).varint(3);  // -1 + (-2)
    EXPECT_FALSE(decode_profile(bytes_of(r.bytes())));
  }
  {  // bytes after the last file
    Raw r = one_file("a", "b");
    r.raw("x");
    EXPECT_FALSE(decode_profile(bytes_of(r.bytes())));
  }
}

TEST(ProfileFormatTest, ChunksConvertBetweenChunkSizesInOrderEachOnce) {
  EXPECT_EQ(convert_chunks({3, 0, 1}, 4 << 20, 8 << 20), (std::vector<uint64_t>{1, 0}));
  EXPECT_EQ(convert_chunks({1, 0}, 8 << 20, 4 << 20), (std::vector<uint64_t>{2, 3, 0, 1}));
  EXPECT_EQ(convert_chunks({1}, 6, 4), (std::vector<uint64_t>{1, 2}));  // bytes 6..11
  EXPECT_TRUE(convert_chunks({1}, 0, 4).empty());
  EXPECT_EQ(convert_chunks({0}, uint64_t{1} << 30, 4096).size(), kMaxProfileChunks);
}

TEST(ProfileRecorderTest, FirstAccessesInOrderWithTheChunksReadDuringTheCopy) {
  AccessRecorder rec(1 << 20, AccessRecorder::Clock::now(), 3);
  rec.opened("a");
  rec.opened("b");
  rec.opened("a");  // not again
  rec.live_reads("b", 2 << 20, {3, 0, 3});
  rec.live_reads("b", 1 << 20, {7, 6});
  rec.opened("c");
  rec.opened("d");  // past max_files: left out, and said so
  Profile p = rec.snapshot();
  ASSERT_EQ(p.files.size(), 3U);
  EXPECT_EQ(p.files[0].path, "a");
  EXPECT_EQ(p.files[1].path, "b");
  EXPECT_EQ(p.files[1].chunks, (std::vector<uint32_t>{6, 7, 0, 1}));
  EXPECT_EQ(p.files[2].path, "c");
  EXPECT_TRUE(p.truncated);
  EXPECT_TRUE(rec.contains("b"));
  EXPECT_FALSE(rec.contains("d"));
  for (size_t i = 1; i < p.files.size(); ++i) EXPECT_LE(p.files[i - 1].first_ms, p.files[i].first_ms);
}

TEST(ProfileRecorderTest, TheNodesProfilesMergeByFirstAccess) {
  Profile n0, n1, n2;
  n0.chunk_size = 1 << 20;
  n0.uid = 7;
  n0.files = {{"img", 10, {0, 5}}, {"d/a", 20, {}}, {"d/c", 40, {}}};
  n1.chunk_size = 2 << 20;  // another chunk size: converted to the first's
  n1.files = {{"d/b", 5, {}}, {"img", 8, {3, 0}}};
  n2.chunk_size = 1 << 20;
  n2.truncated = true;
  n2.files = {{"d/a", 20, {}}, {"e", 40, {}}};
  Profile m = merge_profiles({n0, n1, n2});
  EXPECT_EQ(m.uid, 7U);
  EXPECT_EQ(m.chunk_size, 1U << 20);
  EXPECT_TRUE(m.truncated);
  std::vector<std::string> order;
  for (const auto& f : m.files) order.push_back(f.path);
  EXPECT_EQ(order,
            (std::vector<std::string>{"d/b", "img", "d/a", "d/c", "e"}));  // ties: the earlier node's first
  EXPECT_EQ(m.files[1].first_ms, 8U);
  EXPECT_EQ(m.files[1].chunks,
            (std::vector<uint32_t>{6, 7, 0, 1, 5}));  // node 1's (earliest) first, then node 0's
}

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

class ProfileFileTest : public TmpDirTest {};

TEST_F(ProfileFileTest, WrittenAtomicallyAndReadBack) {
  const std::string path = this->path("a/b/job.profile");
  ASSERT_TRUE(write_profile(path, sample()));
  struct stat st {};
  ASSERT_EQ(::stat(this->path("a/b").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700U);
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600U);
  auto back = read_profile(path, ::geteuid());
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(back->profile, sample());
  EXPECT_EQ(back->owner, ::geteuid());
  Profile next = sample();
  next.files.resize(1);
  ASSERT_TRUE(write_profile(path, next));  // replaced whole
  EXPECT_EQ(read_profile(path, std::nullopt)->profile, next);
  EXPECT_EQ(std::distance(fs::directory_iterator(this->path("a/b")), fs::directory_iterator()), 1)
      << "a temporary file was left beside it";
  auto none = read_profile(this->path("a/none"), std::nullopt);
  ASSERT_FALSE(none);
  EXPECT_EQ(none.error().to_errno(), ENOENT);
}

TEST_F(ProfileFileTest, ReadRefusesSymlinksOtherOwnersWritableAndHugeFiles) {
  const std::string real = path("real.profile");
  ASSERT_TRUE(write_profile(real, sample()));
  fs::create_symlink(real, path("link.profile"));
  EXPECT_FALSE(read_profile(path("link.profile"), std::nullopt)) << "a symlink is not followed";
  EXPECT_FALSE(read_profile(real, ::geteuid() + 1)) << "another user's";
  if (::geteuid() == 0) {
    ASSERT_EQ(::chown(real.c_str(), 4242, 4242), 0);
    EXPECT_FALSE(read_profile(real, 0));
    auto any = read_profile(real, std::nullopt);  // a root daemon: any owner, who is named
    ASSERT_TRUE(any) << any.error().message;
    EXPECT_EQ(any->owner, 4242U);
  }
  ASSERT_EQ(::chmod(real.c_str(), 0620), 0);
  EXPECT_FALSE(read_profile(real, std::nullopt)) << "its group may write it";
  ASSERT_EQ(::chmod(real.c_str(), 0602), 0);
  EXPECT_FALSE(read_profile(real, std::nullopt)) << "anyone may write it";
  {
    stage::Fd fd(::open(path("huge.profile").c_str(), O_CREAT | O_WRONLY, 0600));
    ASSERT_EQ(::ftruncate(fd.get(), static_cast<off_t>(kMaxProfileBytes + 1)), 0);
  }
  auto huge = read_profile(path("huge.profile"), std::nullopt);
  ASSERT_FALSE(huge);
  EXPECT_EQ(huge.error().to_errno(), EFBIG);
  ASSERT_EQ(::mkfifo(path("fifo.profile").c_str(), 0600), 0);
  EXPECT_FALSE(read_profile(path("fifo.profile"), std::nullopt)) << "a FIFO (and the read does not block)";
}

TEST_F(ProfileFileTest, TheDefaultPathIsUnderTheUsersCacheKeyedByTheSource) {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const std::string saved_xdg = xdg != nullptr ? xdg : "";
  ::setenv("XDG_CACHE_HOME", path("xdg").c_str(), 1);
  const std::string a = default_profile_path("/shared/data sets/imagenet");
  const std::string b = default_profile_path("/other/imagenet");
  ::unsetenv("XDG_CACHE_HOME");
  const std::string c = default_profile_path("/shared/data sets/imagenet");
  if (xdg != nullptr) ::setenv("XDG_CACHE_HOME", saved_xdg.c_str(), 1);
  EXPECT_EQ(a.rfind(path("xdg") + "/stagefs/profiles/imagenet-", 0), 0U) << a;
  EXPECT_EQ(a.substr(a.size() - 8), ".profile");
  EXPECT_NE(a, b) << "two sources share a profile";
  EXPECT_NE(c.find("/.cache/stagefs/profiles/imagenet-"), std::string::npos) << c;
}

// Ranks as threads over a fake network: every rank's files reach rank 0, merged; a rank that
// never takes part is left out once its parent's time is up, the others still arrive.
TEST(ProfileExchangeTest, EveryRanksProfileReachesRankZeroAndASilentRankIsLeftOut) {
  for (const int absent : {-1, 2}) {
    constexpr int kRanks = 5;
    stage::testing::FakeNet net(kRanks);
    std::vector<std::unique_ptr<stage::testing::FakeP2P>> p2p;
    for (int r = 0; r < kRanks; ++r) p2p.push_back(std::make_unique<stage::testing::FakeP2P>(net, r, 3));
    std::vector<GatherResult> out(kRanks);
    std::vector<std::thread> ranks;
    for (int r = 0; r < kRanks; ++r) {
      if (r == absent) continue;
      ranks.emplace_back([&, r] {
        Profile mine;
        mine.chunk_size = 1 << 20;
        mine.files = {{"shared", static_cast<uint64_t>(10 - r), {}}, {"r" + std::to_string(r), 100, {}}};
        out[static_cast<size_t>(r)] = gather_profiles(p2p[static_cast<size_t>(r)].get(), mine,
                                                      std::chrono::milliseconds(absent < 0 ? 30000 : 1500));
      });
    }
    for (auto& t : ranks) t.join();
    std::set<std::string> got;
    for (const auto& f : out[0].merged.files) got.insert(f.path);
    if (absent < 0) {
      EXPECT_EQ(got, (std::set<std::string>{"shared", "r0", "r1", "r2", "r3", "r4"}));
      EXPECT_EQ(out[0].missing, 0);
      for (const auto& o : out) EXPECT_TRUE(o.clean);
    } else {  // rank 2 held rank 3's files: both gone; 1 and 4 arrive
      EXPECT_EQ(got, (std::set<std::string>{"shared", "r0", "r1", "r4"}));
      EXPECT_EQ(out[0].missing, 1);
    }
    ASSERT_FALSE(out[0].merged.files.empty());
    EXPECT_EQ(out[0].merged.files[0].path, "shared");
    EXPECT_EQ(out[0].merged.files[0].first_ms, 6U);  // rank 4's, the earliest
  }
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
