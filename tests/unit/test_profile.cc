// Profiles (fusefs/profile/): the codec against round trips and hostile bytes (truncated,
// flipped, edited with a fresh checksum, paths outside the source), the recorder and the merge
// of the nodes' profiles, the profile's file (default path, atomic write, the checks on read),
// and the exchange at unmount over a fake network.
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

}  // namespace
}  // namespace stagefs
