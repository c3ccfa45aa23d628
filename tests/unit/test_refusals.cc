// What the tools and the engine refuse: path relations, pseudo
// filesystems, special files as destinations, sources that read longer than their size,
// and how fuse.conf is read.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "bcast/io/paths.h"
#include "bcast/io/source.h"
#include "bcast/transfer/engine.h"
#include "fusefs/base/beneath.h"
#include "fusefs/cache/copy_xattrs.h"
#include "fusefs/edge/privilege.h"
#include "thread_comm.h"
#include "tmpdir.h"

namespace stage::testing {
namespace {

namespace fs = std::filesystem;

// ---- paths ------------------------------------------------------------------------------

TEST(PathWithin, ComparesWholeComponents) {
  EXPECT_TRUE(path_within("/a/b", "/a/b"));
  EXPECT_TRUE(path_within("/a/b/c", "/a/b"));
  EXPECT_TRUE(path_within("/a/b/c/d", "/a"));
  EXPECT_TRUE(path_within("/x", "/"));
  EXPECT_FALSE(path_within("/a/bc", "/a/b"));
  EXPECT_FALSE(path_within("/a", "/a/b"));
  EXPECT_FALSE(path_within("/a/b", ""));
}

class PathsTest : public TmpDirTest {};

TEST_F(PathsTest, ResolveFollowsSymlinksOfTheExistingPrefix) {
  fs::create_directories(path("real/src"));
  fs::create_symlink(path("real"), path("link"));
  const std::string real = fs::canonical(path("real")).string();
  EXPECT_EQ(resolve_path(path("link/src")), real + "/src");
  EXPECT_EQ(resolve_path(path("link/src/not/yet/there")), real + "/src/not/yet/there");
  EXPECT_EQ(resolve_path(path("link/src/../src/./x/")), real + "/src/x");
  EXPECT_TRUE(path_within(resolve_path(path("link/src/deeper")), resolve_path(path("real"))));
  const std::string cwd = fs::current_path().string();
  EXPECT_EQ(resolve_path("relative-name"), fs::weakly_canonical(cwd + "/relative-name").string());
}

TEST_F(PathsTest, PseudoFilesystemsAreNamed) {
  EXPECT_STREQ(pseudo_fs_name(0x9fa0), "proc");
  EXPECT_STREQ(pseudo_fs_name(0x62656572), "sysfs");
  EXPECT_STREQ(pseudo_fs_name(0x63677270), "cgroup2");
  EXPECT_EQ(pseudo_fs_name(0xEF53), nullptr);      // ext4
  EXPECT_EQ(pseudo_fs_name(0x01021994), nullptr);  // tmpfs: real files
  EXPECT_STREQ(pseudo_fs_of("/proc/self/status"), "proc");
  EXPECT_EQ(pseudo_fs_of(dir_.string()), nullptr);
  EXPECT_EQ(pseudo_fs_of(path("missing")), nullptr);
}

TEST_F(PathsTest, SpecialFileKinds) {
  struct stat st {};
  ASSERT_EQ(::stat("/dev/null", &st), 0);
  EXPECT_STREQ(special_file_kind(st.st_mode), "character device");
  ASSERT_EQ(::mkfifo(path("fifo").c_str(), 0600), 0);
  ASSERT_EQ(::lstat(path("fifo").c_str(), &st), 0);
  EXPECT_STREQ(special_file_kind(st.st_mode), "FIFO");
  EXPECT_EQ(special_file_kind(S_IFREG | 0644), nullptr);
  EXPECT_EQ(special_file_kind(S_IFDIR | 0755), nullptr);
  EXPECT_EQ(special_file_kind(S_IFLNK | 0777), nullptr);
  EXPECT_STREQ(special_file_kind(S_IFBLK | 0660), "block device");
  EXPECT_STREQ(special_file_kind(S_IFSOCK | 0755), "socket");
}

// ---- a source file swapped for a FIFO --------------------------------------------------------

// A user who may write in the source replaces a file, between the open that queued it and the
// staging thread's open, with a FIFO. open(2) of a FIFO for reading waits for a writer: the
// thread that stages for every node would hang there, and the watchdog would break the whole
// mount group. Every reader of the source must refuse it at once instead. (Without the fix,
// this test hangs in open(2) until ctest's timeout fails it.)
TEST_F(PathsTest, ASourceFileSwappedForAFifoIsRefusedWithoutWaiting) {
  fs::create_directories(path("src/a"));
  write_file(path("src/a/f"), "bytes");
  const stage::Fd root(::open(path("src").c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  ASSERT_TRUE(root.valid());
  stagefs::BeneathSource beneath(root.get());
  PosixSource posix;
  auto scanned = beneath.scan("a/f", false, {});
  ASSERT_TRUE(scanned) << scanned.error().message;
  const Entry e = scanned->entries.at(0);
  {  // a regular file is opened blocking as before
    struct stat st {};
    auto fd = stagefs::open_regular_beneath(root.get(), "a/f", st);
    ASSERT_TRUE(fd);
    EXPECT_EQ(::fcntl(fd->get(), F_GETFL) & O_NONBLOCK, 0);
    EXPECT_TRUE(S_ISREG(st.st_mode));
  }
  ASSERT_EQ(::unlink(path("src/a/f").c_str()), 0);
  ASSERT_EQ(::mkfifo(path("src/a/f").c_str(), 0644), 0);

  struct stat st {};
  auto fd = stagefs::open_regular_beneath(root.get(), "a/f", st);
  ASSERT_FALSE(fd);
  EXPECT_EQ(fd.error().code, make_error_code(Errc::unsupported));
  auto rescanned = beneath.scan("a/f", false, {});
  ASSERT_FALSE(rescanned);
  EXPECT_EQ(rescanned.error().code, make_error_code(Errc::unsupported));
  auto opened = beneath.open("a/f", e);
  ASSERT_FALSE(opened);
  EXPECT_EQ(opened.error().code, make_error_code(Errc::source_changed));
  // stage-bcast's reader, for a tree whose file is swapped after the scan
  Entry named = e;
  named.path = "f";
  auto posix_opened = posix.open(path("src/a"), named);
  ASSERT_FALSE(posix_opened);
  EXPECT_EQ(posix_opened.error().code, make_error_code(Errc::source_changed));
  // and for a single source named directly
  auto posix_scanned = posix.scan(path("src/a/f"), false, {});
  ASSERT_FALSE(posix_scanned);
}

// stage-bcast --recursive: a source file named like a temporary file of the copy would be
// written over the temporary file of its neighbour's copy in the destination. Skipped, said.
TEST_F(PathsTest, ATreeFileNamedLikeATemporaryFileIsSkippedAndReported) {
  fs::create_directories(path("tree"));
  write_file(path("tree/a"), "a");
  write_file(path("tree/.a.stage-tmp.host.123"), "planted");
  std::vector<std::string> skipped;
  PosixSource posix;
  auto m =
      posix.scan(path("tree"), true, [&](const std::string& p, const std::string&) { skipped.push_back(p); });
  ASSERT_TRUE(m) << m.error().message;
  std::vector<std::string> names;
  for (const Entry& e : m->entries) names.push_back(e.path);
  EXPECT_EQ(names, (std::vector<std::string>{"", "a"}));
  EXPECT_EQ(skipped, std::vector<std::string>{path("tree/.a.stage-tmp.host.123")});
}

// ---- fuse.conf ----------------------------------------------------------------------------

TEST(FuseConf, UserAllowOtherAsFusermount3ReadsIt) {
  EXPECT_FALSE(stagefs::fuse_conf_allows_other(""));
  EXPECT_FALSE(stagefs::fuse_conf_allows_other("#user_allow_other\n"));  // Debian's stock file
  EXPECT_FALSE(stagefs::fuse_conf_allows_other("# user_allow_other - Using the allow_other ...\n"));
  EXPECT_FALSE(stagefs::fuse_conf_allows_other("user_allow_other_not\nmount_max = 10\n"));
  EXPECT_TRUE(stagefs::fuse_conf_allows_other("user_allow_other"));
  EXPECT_TRUE(stagefs::fuse_conf_allows_other("mount_max = 10\n  user_allow_other \t\n"));
  EXPECT_TRUE(stagefs::fuse_conf_allows_other("user_allow_other # shared mounts\r\n"));
}

TEST(FuseConf, WhoMayAskForAllowOther) {
  stagefs::Privileges p;
  p.uid = 0;
  EXPECT_TRUE(p.may_allow_other());
  p.uid = 1000;
  EXPECT_FALSE(p.may_allow_other());
  p.cap_sys_admin = true;  // fusermount3 looks at the real uid, not at capabilities
  EXPECT_FALSE(p.may_allow_other());
  p.user_allow_other = true;
  EXPECT_TRUE(p.may_allow_other());
}

// ---- the engine -------------------------------------------------------------------------

// A source whose scan (and stat) says `hide` bytes fewer than a read returns: what a pseudo
// file looks like (/proc: 0 bytes by stat), or a file that grew without its stat telling.
class ShortStatSource final : public SourceReader {
 public:
  // Lies about every file, or only about the entry `only` (a path in the tree).
  explicit ShortStatSource(uint64_t hide, std::string only = {}) : hide_(hide), only_(std::move(only)) {}
  Result<Manifest> scan(const std::string& p, bool rec, const SkipFn& skip) override {
    auto m = real_.scan(p, rec, skip);
    if (!m) return m;
    for (auto& e : m->entries)
      if (e.type == EntryType::file && (only_.empty() || e.path == only_))
        e.meta.size -= std::min(hide_, e.meta.size);
    return m;
  }
  Result<std::unique_ptr<SourceFile>> open(const std::string& root, const Entry& e) override {
    const std::string p = join_path(root, e.path);
    Fd fd(::open(p.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) return sys_error(errno, "open source", p);
    return std::unique_ptr<SourceFile>(new File(posix_source_file(std::move(fd), p, e.meta.size), e.meta));
  }

 private:
  class File final : public SourceFile {
   public:
    File(std::unique_ptr<SourceFile> in, FileMeta m) : in_(std::move(in)), meta_(m) {}
    Status read_at(uint64_t off, std::span<std::byte> buf) override { return in_->read_at(off, buf); }
    bool has_data(uint64_t off, uint64_t len) override { return in_->has_data(off, len); }
    Result<FileMeta> stat_now() override { return meta_; }
    Result<bool> data_past(uint64_t size) override { return in_->data_past(size); }

   private:
    std::unique_ptr<SourceFile> in_;
    FileMeta meta_;
  };
  PosixSource real_;
  uint64_t hide_;
  std::string only_;
};

class RefusalTest : public TmpDirTest {
 protected:
  std::vector<StageReport> run(int n, SourceReader& src, const std::string& source, bool recursive = false) {
    World w(n);
    std::vector<StageReport> out(static_cast<size_t>(n));
    StageOptions opt;
    opt.chunk_size = 65536;
    opt.recursive = recursive;
    run_ranks(w, [&](ThreadComm& c) {
      StageEndpoint ep{source, node_file(c.rank()), true};
      out[static_cast<size_t>(c.rank())] = stage_transfer(c, &src, store_, opt, ep);
    });
    return out;
  }
  std::string node_file(int r) { return path("node" + std::to_string(r) + "/copy"); }
  static bool mentions(const StageReport& r, const std::string& word) {
    for (const auto& e : r.errors)
      if (e.find(word) != std::string::npos) return true;
    return false;
  }
  PosixStore store_{StoreOptions{.xattrs = stagefs::kCopyXattrs}};
};

TEST_F(RefusalTest, SourceLongerThanItsSizeIsNotPublished) {
  write_file(path("src.bin"), random_bytes(300000, 11));
  for (int r = 0; r < 2; ++r) write_file(node_file(r), "old copy");
  for (const uint64_t hide : {uint64_t{1}, uint64_t{70000}}) {  // the last byte; a whole chunk and more
    ShortStatSource src(hide);
    auto reps = run(2, src, path("src.bin"));
    for (int r = 0; r < 2; ++r) {
      EXPECT_FALSE(reps[static_cast<size_t>(r)].ok) << "hide " << hide;
      EXPECT_EQ(reps[static_cast<size_t>(r)].exit_code, 1);
      EXPECT_EQ(read_file(node_file(r)), "old copy") << "a truncated copy was published";
    }
    EXPECT_TRUE(mentions(reps[0], "longer than its size"))
        << (reps[0].errors.empty() ? "" : reps[0].errors[0]);
  }
}

TEST_F(RefusalTest, EmptyByStatButNotByReadIsNotPublished) {
  write_file(path("src.bin"), "text that stat does not count\n");
  ShortStatSource src(1000);  // size 0: no chunk at all carries this file
  auto reps = run(2, src, path("src.bin"));
  for (int r = 0; r < 2; ++r) {
    EXPECT_FALSE(reps[static_cast<size_t>(r)].ok);
    EXPECT_FALSE(fs::exists(node_file(r))) << "an empty copy was published";
  }
  EXPECT_TRUE(mentions(reps[0], "longer than its size"));
}

TEST_F(RefusalTest, EmptyFileInATreeIsChecked) {
  write_file(path("tree/a.bin"), random_bytes(100000, 12));
  write_file(path("tree/b.txt"), "grows unseen");
  write_file(path("tree/c.bin"), random_bytes(5000, 13));
  // b.txt reads 12 bytes past a recorded size of 0 and travels in no chunk; the others are fine.
  ShortStatSource src(1000, "b.txt");
  auto reps = run(1, src, path("tree"), true);
  EXPECT_FALSE(reps[0].ok);
  EXPECT_TRUE(mentions(reps[0], "longer than its size"));
  EXPECT_FALSE(fs::exists(node_file(0) + "/a.bin"));
  EXPECT_FALSE(fs::exists(node_file(0) + "/b.txt"));
}

TEST_F(RefusalTest, ProcFileIsNotCopiedEmpty) {
  PosixSource src;
  auto reps = run(1, src, "/proc/self/status");
  EXPECT_FALSE(reps[0].ok);
  EXPECT_EQ(reps[0].exit_code, 1);
  EXPECT_TRUE(mentions(reps[0], "source changed")) << (reps[0].errors.empty() ? "" : reps[0].errors[0]);
  EXPECT_FALSE(fs::exists(node_file(0)));
}

TEST_F(RefusalTest, SpecialDestinationIsNeverReplaced) {
  write_file(path("src.bin"), random_bytes(100000, 14));
  fs::create_directories(path("node1"));
  ASSERT_EQ(::mkfifo(node_file(1).c_str(), 0600), 0);
  PosixSource src;
  auto reps = run(2, src, path("src.bin"));
  for (int r = 0; r < 2; ++r) EXPECT_FALSE(reps[static_cast<size_t>(r)].ok);
  EXPECT_TRUE(mentions(reps[0], "destination is a FIFO"))
      << (reps[0].errors.empty() ? "" : reps[0].errors[0]);
  struct stat st {};
  ASSERT_EQ(::lstat(node_file(1).c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode)) << "the FIFO was replaced";
  EXPECT_FALSE(fs::exists(node_file(0))) << "a node published though another refused";
}

}  // namespace
}  // namespace stage::testing
