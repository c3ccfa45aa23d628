// NodeCache (fusefs/cache/cache.h): what it refuses, what its sweep removes, its validity rule.
// Runs as root (the suite does); ownership cases chown to uid 65534 (nobody).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <filesystem>
#include <future>

#include "bcast/io/crc.h"
#include "bcast/io/paths.h"
#include "bcast/io/source.h"
#include "bcast/io/store.h"
#include "fusefs/base/batch_rules.h"
#include "fusefs/cache/cache.h"
#include "fusefs/cache/copy_xattrs.h"
#include "fusefs/cache/links.h"
#include "fusefs/cache/verify.h"
#include "tmpdir.h"

namespace stagefs {
namespace {

namespace fs = std::filesystem;
using stage::testing::TmpDirTest;

class NodeCacheTest : public TmpDirTest {
 protected:
  void SetUp() override {
    TmpDirTest::SetUp();
    if (::geteuid() != 0) GTEST_SKIP() << "needs root (ownership cases)";
    ::chmod(dir_.c_str(), 0755);
  }
};

// The names of one version: the first open materializes, the others wait for it and are then
// served from its copy; a copy that could not be served is forgotten.
TEST(LinkedCopiesTest, OneNameMaterializesTheOthersWaitThenShareItsCopy) {
  struct stat st {};
  st.st_dev = 1;
  st.st_ino = 42;
  st.st_size = 100;
  const auto key = LinkedCopies::key_of(st);
  LinkedCopies links;
  int made_waiters = 0;
  auto waiter = [&] { return std::function<void()>([&made_waiters] { ++made_waiters; }); };
  EXPECT_EQ(links.ask(key, "a", waiter).kind, LinkedCopies::Answer::materialize);
  EXPECT_EQ(links.ask(key, "a", waiter).kind, LinkedCopies::Answer::same_name);
  EXPECT_EQ(links.ask(key, "b", waiter).kind, LinkedCopies::Answer::waiting);
  EXPECT_EQ(links.ask(key, "c", waiter).kind, LinkedCopies::Answer::waiting);
  auto waiters = links.materialized(key, "a", true);
  ASSERT_EQ(waiters.size(), 2U);
  for (auto& w : waiters) w();
  EXPECT_EQ(made_waiters, 2);
  const auto b = links.ask(key, "b", waiter);
  EXPECT_EQ(b.kind, LinkedCopies::Answer::other_copy);
  EXPECT_EQ(b.other, "a");
  EXPECT_EQ(links.ask(key, "a", waiter).kind, LinkedCopies::Answer::materialize);  // its own name: copy it
  EXPECT_TRUE(links.materialized(key, "a", false).empty());  // a failed copy records nothing new
  links.forget(key, "a");
  EXPECT_EQ(links.ask(key, "b", waiter).kind, LinkedCopies::Answer::materialize);
  st.st_mtim.tv_sec = 5;  // another version of the inode: nothing in common
  EXPECT_EQ(links.ask(LinkedCopies::key_of(st), "c", waiter).kind, LinkedCopies::Answer::materialize);
}

// The one rule every room applies to a batch of small files (the scan, the room-making, the
// core's choice between a batch and a transfer of one file).
TEST(BatchRule, TakesSmallRegularFilesEveryUserMayReadExceptTemporaryNames) {
  struct stat st {};
  st.st_mode = S_IFREG | 0644;
  st.st_size = 100;
  EXPECT_TRUE(batch_eligible(st, "a.txt", 100));
  EXPECT_FALSE(batch_eligible(st, "a.txt", 99));                  // larger than the limit
  EXPECT_FALSE(batch_eligible(st, "a.txt", 0));                   // no batches
  EXPECT_FALSE(batch_eligible(st, ".a.txt.stage-tmp.h.1", 100));  // a copy's temporary name
  EXPECT_TRUE(batch_eligible(st, "a.txt.stage-tmp.h.1", 100));    // not the store's shape
  st.st_mode = S_IFREG | 0640;
  EXPECT_FALSE(batch_eligible(st, "a.txt", 100));  // not readable by every user
  st.st_mode = S_IFREG | 0604;
  EXPECT_FALSE(batch_eligible(st, "a.txt", 100));  // nor by its owner's group
  st.st_mode = S_IFREG | 0444;
  EXPECT_TRUE(batch_eligible(st, "a.txt", 100));
  st.st_mode = S_IFDIR | 0755;
  EXPECT_FALSE(batch_eligible(st, "a.txt", 100));
  st.st_mode = S_IFLNK | 0777;
  EXPECT_FALSE(batch_eligible(st, "a.txt", 100));
}

TEST_F(NodeCacheTest, CreatesAPrivateCacheAndLocksIt) {
  auto c = NodeCache::open(path("a/b/cache"));
  ASSERT_TRUE(c) << c.error().message;
  struct stat st {};
  ASSERT_EQ(::stat(path("a/b/cache").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700U);
  ASSERT_EQ(::stat(path("a/b/cache/data").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700U);
  EXPECT_TRUE((*c)->alive().ok());
  auto second = NodeCache::open(path("a/b/cache"));
  ASSERT_FALSE(second);
  EXPECT_NE(second.error().message.find("in use by another stagefs"), std::string::npos);
  // the refusal names the holder, which the lock file records
  EXPECT_NE(second.error().message.find("(pid " + std::to_string(::getpid()) + " on " + stage::host_name()),
            std::string::npos)
      << second.error().message;
}

TEST_F(NodeCacheTest, RefusesSymlinksForeignOwnersAndUnsafeParents) {
  fs::create_directories(path("real"));
  fs::create_symlink(path("real"), path("link"));
  auto sym = NodeCache::open(path("link"));
  ASSERT_FALSE(sym);
  EXPECT_NE(sym.error().message.find("is a symlink"), std::string::npos) << sym.error().message;
  EXPECT_TRUE(fs::is_empty(path("real")));

  fs::create_directories(path("theirs"));
  ASSERT_EQ(::chown(path("theirs").c_str(), 65534, 65534), 0);
  auto foreign = NodeCache::open(path("theirs"));
  ASSERT_FALSE(foreign);
  EXPECT_NE(foreign.error().message.find("owned by " + stage::owner_text(65534)), std::string::npos)
      << foreign.error().message;

  fs::create_directories(path("open/c"));
  ::chmod(path("open").c_str(), 0777);  // writable by all, not sticky: c could be swapped
  auto unsafe = NodeCache::open(path("open/c"));
  ASSERT_FALSE(unsafe);
  EXPECT_NE(unsafe.error().message.find("not sticky"), std::string::npos) << unsafe.error().message;

  fs::create_directories(path("tmp"));
  ::chmod(path("tmp").c_str(), 01777);  // like /tmp: fine, the cache below is ours
  EXPECT_TRUE(NodeCache::open(path("tmp/c")));
  fs::create_symlink(path("real"), path("tmp/usersym"));
  ASSERT_EQ(::lchown(path("tmp/usersym").c_str(), 65534, 65534), 0);
  EXPECT_FALSE(NodeCache::open(path("tmp/usersym/c")));  // a user's symlink is never followed
  EXPECT_TRUE(fs::is_empty(path("real")));
}

TEST_F(NodeCacheTest, SweepRemovesWhatTheDaemonDidNotWrite) {
  fs::create_directories(path("c/data/sub"));
  fs::create_directories(path("victim"));
  write_file(path("c/data/mine"), "ok");
  write_file(path("c/data/planted"), "evil");
  ASSERT_EQ(::chown(path("c/data/planted").c_str(), 65534, 65534), 0);
  fs::create_symlink(path("victim"), path("c/data/sub/escape"));
  write_file(path("c/data/sub/.x.stage-tmp.host.1"), "partial");
  write_file(path("elsewhere"), "x");
  ASSERT_EQ(::link(path("elsewhere").c_str(), path("c/data/hardlink").c_str()), 0);
  ::chmod(path("c/data/sub").c_str(), 0777);
  auto c = NodeCache::open(path("c"));
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_TRUE(fs::exists(path("c/data/mine")));
  EXPECT_FALSE(fs::exists(path("c/data/planted")));
  EXPECT_FALSE(fs::symlink_status(path("c/data/sub/escape")).type() == fs::file_type::symlink);
  EXPECT_FALSE(fs::exists(path("c/data/sub/.x.stage-tmp.host.1")));
  EXPECT_FALSE(fs::exists(path("c/data/hardlink")));
  EXPECT_TRUE(fs::exists(path("elsewhere")));
  EXPECT_EQ((*c)->swept().untrusted, 3);
  EXPECT_EQ((*c)->swept().temps, 1);
  struct stat st {};
  ASSERT_EQ(::stat(path("c/data/sub").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700U);
}

TEST_F(NodeCacheTest, ServesOnlyCurrentCopiesItWroteAndNoticesRemoval) {
  write_file(path("src"), "hello world");
  struct stat src {};
  ASSERT_EQ(::stat(path("src").c_str(), &src), 0);
  auto c = NodeCache::open(path("c"));
  ASSERT_TRUE(c);
  stage::PosixStore store(
      stage::StoreOptions{.direct_io = false, .parent_mode = 0700, .xattrs = stagefs::kCopyXattrs});
  const std::string dest = (*c)->store_root() + "/d/f";
  ASSERT_TRUE(store.make_parents(dest));
  auto txn = store.begin(dest);
  ASSERT_TRUE(txn);
  const std::string data = "hello world";
  ASSERT_TRUE((*txn)->write(0, std::as_bytes(std::span(data.data(), data.size()))));
  ASSERT_TRUE((*txn)->finish(stage::meta_from_stat(src), 0, nullptr));
  ASSERT_TRUE((*txn)->commit());
  EXPECT_TRUE((*c)->open_current("d/f", src));
  struct stat other = src;
  other.st_size += 1;
  EXPECT_FALSE((*c)->open_current("d/f", other));
  EXPECT_FALSE((*c)->remove_stale("d/f", src));  // current: kept
  ASSERT_EQ(::chown(path("c/data/d/f").c_str(), 65534, 65534), 0);
  EXPECT_FALSE((*c)->open_current("d/f", src));  // not written by us
  ASSERT_EQ(::chown(path("c/data/d/f").c_str(), 0, 0), 0);
  EXPECT_TRUE((*c)->remove_stale("d/f", other));
  EXPECT_FALSE(fs::exists(path("c/data/d/f")));
  fs::remove_all(path("c"));
  EXPECT_FALSE((*c)->alive().ok());
  EXPECT_FALSE(store.make_parents((*c)->store_root() + "/e/f"));  // nothing is recreated
  EXPECT_FALSE(fs::exists(path("c")));
}

// A copy in the cache, written as the engine would (through the cache's store).
void put(NodeCache& c, const std::string& rel, size_t bytes) {
  const std::string dest = c.store_root() + "/" + rel;
  ASSERT_TRUE(c.store().make_parents(dest));
  auto txn = c.store().begin(dest);
  ASSERT_TRUE(txn);
  const std::string data(bytes, 'x');
  ASSERT_TRUE((*txn)->write(0, std::as_bytes(std::span(data.data(), data.size()))));
  ASSERT_TRUE((*txn)->finish(stage::FileMeta{bytes, 1, 1, 1, 1, 0644}, 0, nullptr));
  ASSERT_TRUE((*txn)->commit());
  c.added(rel);
}

// What a batch's plan and publication use: keep_current() is open_current() and
// remove_stale() in one look, has_dir() says whether a directory has copies at all, and
// added_in() indexes a directory's new copies as added() does, name by name.
TEST_F(NodeCacheTest, BatchLookupsAgreeWithTheOneFileCalls) {
  auto c = NodeCache::open(path("c"));
  ASSERT_TRUE(c);
  NodeCache& cache = **c;
  write_file(path("src"), std::string(100, 'x'));
  struct stat src {};
  ASSERT_EQ(::stat(path("src").c_str(), &src), 0);
  EXPECT_FALSE(cache.has_dir("d"));
  EXPECT_TRUE(cache.has_dir(""));
  EXPECT_FALSE(cache.keep_current("d/f", src));  // nothing there: nothing removed, no error
  // A current copy is kept; a stale one is removed and leaves the index.
  const std::string dest = cache.store_root() + "/d/f";
  ASSERT_TRUE(cache.store().make_parents(dest));
  auto txn = cache.store().begin(dest);
  ASSERT_TRUE(txn);
  const std::string data(100, 'x');
  ASSERT_TRUE((*txn)->write(0, std::as_bytes(std::span(data.data(), data.size()))));
  ASSERT_TRUE((*txn)->finish(stage::meta_from_stat(src), 0, nullptr));
  ASSERT_TRUE((*txn)->commit());
  put(cache, "d/g", 4096);  // indexed
  EXPECT_TRUE(cache.has_dir("d"));
  const auto copies = cache.added_in("d", {"f", "g", "missing", "../x"});
  ASSERT_EQ(copies.size(), 2U);
  struct stat f {};
  ASSERT_EQ(::stat(path("c/data/d/f").c_str(), &f), 0);
  EXPECT_EQ(copies[0].st_ino, f.st_ino);
  EXPECT_EQ(cache.usage().files, 2U);
  EXPECT_TRUE(cache.keep_current("d/f", src));
  EXPECT_TRUE(fs::exists(path("c/data/d/f")));
  struct stat other = src;
  other.st_mtim.tv_sec += 1;
  EXPECT_FALSE(cache.keep_current("d/f", other));
  EXPECT_FALSE(fs::exists(path("c/data/d/f")));
  EXPECT_EQ(cache.usage().files, 1U);
  // A name that went away since is dropped from the index by added_in too.
  ASSERT_TRUE(fs::remove(path("c/data/d/g")));
  EXPECT_TRUE(cache.added_in("d", {"g"}).empty());
  EXPECT_EQ(cache.usage().files, 0U);
}

// Room-making before a batch counts the files the batch takes (batch_eligible), and only
// those: a large file named like a copy's temporary file, or one that not every user may read,
// is never staged by the batch and must not cost this node its cached copies.
TEST_F(NodeCacheTest, AdmittingABatchMakesRoomForTheFilesTheBatchTakesOnly) {
  auto c = NodeCache::open(path("c"));
  ASSERT_TRUE(c);
  NodeCache& cache = **c;
  put(cache, "old", 65536);
  fs::create_directories(path("src/d"));
  write_file(path("src/d/a"), std::string(4096, 'a'));
  write_file(path("src/d/.big.stage-tmp.h.1"), std::string(65536, 't'));  // a temporary name
  write_file(path("src/d/private"), std::string(65536, 'p'));
  ASSERT_EQ(::chmod(path("src/d/a").c_str(), 0644), 0);
  ASSERT_EQ(::chmod(path("src/d/.big.stage-tmp.h.1").c_str(), 0644), 0);
  ASSERT_EQ(::chmod(path("src/d/private").c_str(), 0600), 0);  // not o+r
  struct stat a {};
  ASSERT_EQ(::stat(path("src/d/a").c_str(), &a), 0);
  // Room for "old" and "a", not for one more 64 KiB file.
  cache.set_limit(cache.usage().bytes + stage::allocated_from_stat(a) + cache.copy_overhead() + 4096);
  stage::Fd root(::open(path("src").c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  ASSERT_TRUE(root.valid());
  cache.admit_batch(root.get(), "d", 1 << 20, stage::SelectionSlice{}, /*may_evict=*/true);
  EXPECT_EQ(cache.usage().evictions, 0U);
  EXPECT_TRUE(fs::exists(path("c/data/old")));
  (void)cache.batch_done("d", {});
  // A file the batch does take, and that does not fit: "old" makes room for it.
  write_file(path("src/d/b"), std::string(65536, 'b'));
  ASSERT_EQ(::chmod(path("src/d/b").c_str(), 0644), 0);
  cache.admit_batch(root.get(), "d", 1 << 20, stage::SelectionSlice{}, /*may_evict=*/false);
  EXPECT_EQ(cache.usage().evictions, 0U);  // a prefetch never evicts
  cache.admit_batch(root.get(), "d", 1 << 20, stage::SelectionSlice{}, /*may_evict=*/true);
  EXPECT_EQ(cache.usage().evictions, 1U);
  EXPECT_FALSE(fs::exists(path("c/data/old")));
  (void)cache.batch_done("d", {});
}

// Before a transfer of one file, the file's outdated copy goes first (its space counts as
// free), then room is made; no room under the limit is an error (this node relays the
// transfer without writing).
TEST_F(NodeCacheTest, AdmittingATransferRemovesTheOutdatedCopyAndMakesRoom) {
  auto c = NodeCache::open(path("c"));
  ASSERT_TRUE(c);
  NodeCache& cache = **c;
  put(cache, "f", 65536);  // recorded as made from another version than src/f
  put(cache, "other", 65536);
  write_file(path("src/f"), std::string(65536, 'f'));
  cache.set_limit(cache.usage().bytes + cache.copy_overhead());  // room once f's old copy went
  stage::Fd root(::open(path("src").c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  ASSERT_TRUE(root.valid());
  ASSERT_TRUE(cache.admit_transfer(root.get(), "f"));
  EXPECT_FALSE(fs::exists(path("c/data/f")));     // outdated: removed
  EXPECT_TRUE(fs::exists(path("c/data/other")));  // the freed space was enough
  EXPECT_EQ(cache.usage().evictions, 0U);
  cache.transfer_done("f");
  cache.pin("other");
  cache.set_limit(cache.usage().bytes + 4096);
  auto full = cache.admit_transfer(root.get(), "f");
  ASSERT_FALSE(full);
  EXPECT_EQ(full.error().to_errno(), ENOSPC);
  cache.unpin("other");
  cache.transfer_done("f");
}

// A copy of src/<name> in the cache as an earlier mount left it: data, with `crc` recorded.
void put_from_earlier_mount(NodeCache& c, const std::string& name, const std::string& data, uint64_t crc,
                            const struct stat& src) {
  const std::string dest = c.store_root() + "/" + name;
  auto txn = c.store().begin(dest);
  ASSERT_TRUE(txn);
  ASSERT_TRUE((*txn)->write(0, std::as_bytes(std::span(data.data(), data.size()))));
  ASSERT_TRUE((*txn)->finish(stage::meta_from_stat(src), crc, nullptr));
  ASSERT_TRUE((*txn)->commit());
}

// The question an open asks the cache room: a copy from an earlier mount is read back once
// (verify, then serve), a corrupted one is removed (verify, then miss), a copy this mount
// published is served at once; nothing is trusted before it was checked.
TEST_F(NodeCacheTest, CopyCheckerReadsACopyFromAnEarlierMountBackOnceBeforeServingIt) {
  auto c = NodeCache::open(path("c"));
  ASSERT_TRUE(c);
  NodeCache& cache = **c;
  const std::string good = random_bytes(100000, 1), bad = random_bytes(100000, 2);
  const auto crc = [](const std::string& d) {
    return stage::crc64(std::as_bytes(std::span(d.data(), d.size())));
  };
  struct stat sg {
  }, sb{}, sn{};
  for (const auto& [name, data, st] :
       {std::tuple{"good", &good, &sg}, std::tuple{"bad", &bad, &sb}, std::tuple{"new", &good, &sn}}) {
    write_file(path(std::string("src/") + name), *data);
    ASSERT_EQ(::stat(path(std::string("src/") + name).c_str(), st), 0);
  }
  put_from_earlier_mount(cache, "good", good, crc(good), sg);
  put_from_earlier_mount(cache, "bad", bad, crc(bad) ^ 1, sb);  // recorded CRC does not match
  put_from_earlier_mount(cache, "new", good, crc(good), sn);
  CheckCounters counters;
  CopyChecker checker(cache, CopyChecker::Config{Verify::crc, 1}, counters);
  struct stat copy {};
  EXPECT_FALSE(checker.open_trusted("good", sg, copy));  // not checked in this mount yet
  const auto ask_and_wait = [&](const std::string& rel, const struct stat& src) {
    std::promise<stage::Status> p;
    auto f = p.get_future();
    auto a = checker.ask(rel, src, false, [&p](stage::Status st) { p.set_value(std::move(st)); });
    EXPECT_EQ(a.kind, CopyChecker::Answer::verify);
    EXPECT_EQ(f.wait_for(std::chrono::seconds(60)), std::future_status::ready);
    return f.get();
  };
  EXPECT_TRUE(ask_and_wait("good", sg));
  auto served = checker.ask("good", sg, true, [](stage::Status) { ADD_FAILURE() << "read back again"; });
  EXPECT_EQ(served.kind, CopyChecker::Answer::serve);
  EXPECT_TRUE(served.fd.valid());
  EXPECT_TRUE(checker.open_trusted("good", sg, copy));
  const stage::Status corrupt = ask_and_wait("bad", sb);
  ASSERT_FALSE(corrupt);
  EXPECT_EQ(corrupt.error().code, stage::make_error_code(stage::Errc::checksum_mismatch));
  EXPECT_EQ(checker.ask("bad", sb, true, [](stage::Status) {}).kind, CopyChecker::Answer::miss);
  EXPECT_FALSE(fs::exists(path("c/data/bad")));
  EXPECT_EQ(counters.verified.load(), 1U);
  EXPECT_EQ(counters.corrupt.load(), 1U);
  // Published by this mount (a batch): trusted without a read-back.
  ASSERT_EQ(::stat(path("c/data/new").c_str(), &copy), 0);
  checker.copies_made({copy});
  EXPECT_TRUE(checker.open_trusted("new", sn, copy));
  EXPECT_EQ(counters.verified.load(), 1U);
  checker.stop();
  EXPECT_EQ(checker.ask("new", sn, false, [](stage::Status) {}).kind, CopyChecker::Answer::serve);
}

TEST_F(NodeCacheTest, EvictsLeastRecentlyUsedUnpinnedCopiesUnderTheLimit) {
  auto c = NodeCache::open(path("c"));
  ASSERT_TRUE(c);
  NodeCache& cache = **c;
  cache.set_limit(3 * 65536);
  put(cache, "a", 65536);
  put(cache, "b", 65536);
  put(cache, "d/c", 65536);
  EXPECT_EQ(cache.usage().files, 3U);
  EXPECT_EQ(cache.usage().bytes, 3U * 65536);
  // The limit is what the engine's free-space check sees.
  EXPECT_EQ(cache.store().free_bytes(cache.store_root() + "/x").value(), 0U);
  stage::Fd b(::open(path("c/data/b").c_str(), O_RDONLY));
  cache.touch("b", b.get());  // b most recently used
  cache.pin("a");             // a open on the node
  ASSERT_TRUE(cache.make_room("new", 65536));
  EXPECT_TRUE(fs::exists(path("c/data/a")));     // pinned
  EXPECT_TRUE(fs::exists(path("c/data/b")));     // recently used
  EXPECT_FALSE(fs::exists(path("c/data/d/c")));  // the least recently used, unpinned
  EXPECT_EQ(cache.usage().evictions, 1U);
  EXPECT_EQ(cache.store().free_bytes(cache.store_root() + "/x").value(), 65536U);
  // Nothing unpinned left but b; a second new file evicts b; then nothing can go.
  ASSERT_TRUE(cache.make_room("new2", 2 * 65536));
  EXPECT_FALSE(fs::exists(path("c/data/b")));
  auto full = cache.make_room("new3", 3 * 65536);
  ASSERT_FALSE(full);
  EXPECT_EQ(full.error().to_errno(), ENOSPC);
  auto huge = cache.make_room("huge", 4 * 65536);
  ASSERT_FALSE(huge);
  EXPECT_NE(huge.error().message.find("more than the whole --cache-size"), std::string::npos);
  struct stat source {};  // the source file put() records as the copies' origin
  source.st_ino = 1;
  source.st_dev = 1;
  EXPECT_EQ(cache.evict("a", source).error().to_errno(), EBUSY);
  cache.unpin("a");
  // An owner check made on another file (the source path swapped since) evicts nothing.
  struct stat other = source;
  other.st_ino = 2;
  EXPECT_EQ(cache.evict("a", other).error().to_errno(), EBUSY);
  EXPECT_TRUE(fs::exists(path("c/data/a")));
  EXPECT_TRUE(cache.evict("a", source));
  EXPECT_EQ(cache.evict("a", source).error().to_errno(), ENOENT);
  EXPECT_EQ(cache.usage().files, 0U);
}

// What a copy takes beyond its data (ext4 with small inodes keeps the origin xattr in a block
// of its own) is measured at open, and the room the engine's free-space check sees leaves out
// the pending copies' share of it: a limit is not overrun by a block per small file.
TEST_F(NodeCacheTest, ACopysOverheadIsMeasuredAndLeftOutOfTheRoom) {
  auto c = NodeCache::open(path("c"));
  ASSERT_TRUE(c);
  NodeCache& cache = **c;
  const std::string data = random_bytes(5000, 3);
  write_file(path("plain"), data);
  write_file(path("with"), data);
  stage::FileMeta m;
  m.size = data.size();
  m.mtime_ns = 1'700'000'000'123'456'789;
  m.ctime_ns = m.mtime_ns + 1;
  m.ino = 123456789;
  m.dev = 2049;
  const std::string origin = stage::encode_origin(m, 0x0123456789abcdefULL);
  ASSERT_EQ(
      ::setxattr(path("with").c_str(), stagefs::kCopyXattrs.origin.c_str(), origin.data(), origin.size(), 0),
      0);
  struct stat plain {
  }, with{};
  ASSERT_EQ(::stat(path("plain").c_str(), &plain), 0);
  ASSERT_EQ(::stat(path("with").c_str(), &with), 0);
  EXPECT_EQ(cache.copy_overhead(), static_cast<uint64_t>(with.st_blocks - plain.st_blocks) * 512U);
  cache.set_limit(10 * 65536);
  const std::string x = cache.store_root() + "/x";
  EXPECT_EQ(cache.store().free_bytes(x).value(), 10U * 65536);
  cache.set_pending_overhead(3 * 4096);
  EXPECT_EQ(cache.store().free_bytes(x).value(), 10U * 65536 - 3 * 4096);
  cache.set_pending_overhead(11 * 65536);
  EXPECT_EQ(cache.store().free_bytes(x).value(), 0U);
  cache.set_pending_overhead(0);
  EXPECT_EQ(cache.store().free_bytes(x).value(), 10U * 65536);
}

TEST_F(NodeCacheTest, IndexSurvivesARestartInAtimeOrder) {
  {
    auto c = NodeCache::open(path("c"));
    ASSERT_TRUE(c);
    put(**c, "old", 4096);
    put(**c, "new", 4096);
    const struct timespec t[2] = {{1000, 0}, {0, UTIME_OMIT}};
    ASSERT_EQ(::utimensat(AT_FDCWD, path("c/data/old").c_str(), t, 0), 0);
  }
  auto c = NodeCache::open(path("c"));  // a crash or a new job: the index is rebuilt
  ASSERT_TRUE(c);
  EXPECT_EQ((*c)->usage().files, 2U);
  (*c)->set_limit(2 * 4096);
  ASSERT_TRUE((*c)->make_room("third", 4096));
  EXPECT_FALSE(fs::exists(path("c/data/old")));
  EXPECT_TRUE(fs::exists(path("c/data/new")));
}

// A warm open reads the copy's origin xattr once: the index remembers it while the copy's
// inode and ctime hold; a new copy (a new inode) is read again. Nothing stale is served.
TEST_F(NodeCacheTest, AWarmOpenReadsTheOriginOnceUntilTheCopyIsReplaced) {
  auto c = NodeCache::open(path("c"));
  ASSERT_TRUE(c);
  NodeCache& cache = **c;
  auto copy = [&](const std::string& data) {
    write_file(path("src"), data);
    struct stat src {};
    EXPECT_EQ(::stat(path("src").c_str(), &src), 0);
    const std::string dest = cache.store_root() + "/d/f";
    EXPECT_TRUE(cache.store().make_parents(dest));
    auto txn = cache.store().begin(dest);
    EXPECT_TRUE(txn);
    EXPECT_TRUE((*txn)->write(0, std::as_bytes(std::span(data.data(), data.size()))));
    EXPECT_TRUE((*txn)->finish(stage::meta_from_stat(src), 0, nullptr));
    EXPECT_TRUE((*txn)->commit());
    cache.added("d/f");
    return src;
  };
  const struct stat v1 = copy("version one");
  EXPECT_TRUE(cache.open_current("d/f", v1));
  EXPECT_TRUE(cache.open_current("d/f", v1));
  EXPECT_TRUE(cache.open_current("d/f", v1));
  EXPECT_EQ(cache.origin_reads(), 1U);
  // The source changes: the remembered origin says the copy is not current.
  write_file(path("src"), "version two!");
  struct stat v2 {};
  ASSERT_EQ(::stat(path("src").c_str(), &v2), 0);
  EXPECT_FALSE(cache.open_current("d/f", v2));
  // A new copy replaces it: read again, and current.
  const struct stat v2b = copy("version two!");
  EXPECT_TRUE(cache.open_current("d/f", v2b));
  EXPECT_EQ(cache.origin_reads(), 2U);
  EXPECT_FALSE(cache.open_current("d/f", v1));
}

// A hit moves the copy's atime (the LRU order across restarts) at most once a minute.
TEST_F(NodeCacheTest, AHitMovesTheAtimeOnlyWhenItIsAMinuteOld) {
  auto c = NodeCache::open(path("c"));
  ASSERT_TRUE(c);
  put(**c, "a", 4096);
  stage::Fd fd(::open(path("c/data/a").c_str(), O_RDONLY));
  ASSERT_TRUE(fd.valid());
  struct timespec now {};
  ::clock_gettime(CLOCK_REALTIME, &now);
  auto atime_after_touch = [&](time_t age) {
    const struct timespec t[2] = {{now.tv_sec - age, 0}, {0, UTIME_OMIT}};
    EXPECT_EQ(::futimens(fd.get(), t), 0);
    struct stat st {};
    EXPECT_EQ(::fstat(fd.get(), &st), 0);
    (*c)->touch("a", fd.get(), &st);
    EXPECT_EQ(::fstat(fd.get(), &st), 0);
    return st.st_atim.tv_sec;
  };
  EXPECT_EQ(atime_after_touch(30), now.tv_sec - 30);  // recent: left alone
  EXPECT_GE(atime_after_touch(120), now.tv_sec);      // a minute old: now
}

// The store as a seed: a copy it opens to feed a transfer is pinned (make_room never evicts
// it) until the engine closes it; only regular files the daemon wrote, inside the cache,
// are opened; a copy reported bad leaves the cache unless it was replaced meanwhile.
TEST_F(NodeCacheTest, ASeedCopyIsPinnedWhileReadAndABadOneIsRemoved) {
  auto c = NodeCache::open(path("c"));
  ASSERT_TRUE(c);
  NodeCache& cache = **c;
  cache.set_limit(2 * 65536);
  put(cache, "seed", 65536);
  put(cache, "other", 65536);
  const std::string seed = cache.store_root() + "/seed";
  {
    auto f = cache.store().open_copy(seed);
    ASSERT_TRUE(f) << f.error().message;
    EXPECT_EQ(cache.usage().pinned_files, 1U);
    ASSERT_TRUE(cache.make_room("new", 65536));  // evicts "other", never the copy being read
    EXPECT_TRUE(fs::exists(path("c/data/seed")));
    EXPECT_FALSE(fs::exists(path("c/data/other")));
    std::string got(65536, '\0');
    ASSERT_TRUE((*f)->read_at(0, std::as_writable_bytes(std::span(got.data(), got.size()))));
    EXPECT_EQ(got, std::string(65536, 'x'));
  }
  EXPECT_EQ(cache.usage().pinned_files, 0U) << "the pin outlived the reader";

  EXPECT_FALSE(cache.store().open_copy(path("elsewhere")));  // not a path in this cache
  EXPECT_FALSE(cache.store().open_copy(cache.store_root() + "/missing"));
  ASSERT_EQ(::link(path("c/data/seed").c_str(), path("c/data/seed2").c_str()), 0);
  auto linked = cache.store().open_copy(seed);  // two links: not a copy the daemon left as it wrote it
  ASSERT_FALSE(linked);
  EXPECT_EQ(cache.usage().pinned_files, 0U);
  ASSERT_EQ(::unlink(path("c/data/seed2").c_str()), 0);

  auto f = cache.store().open_copy(seed);
  ASSERT_TRUE(f);
  const auto seen = (*f)->stat_now();
  ASSERT_TRUE(seen);
  stage::FileMeta other_file = *seen;
  other_file.ino += 1;
  cache.store().bad_copy(seed, other_file);  // names another file: left alone
  EXPECT_TRUE(fs::exists(path("c/data/seed")));
  cache.store().bad_copy(seed, *seen);
  EXPECT_FALSE(fs::exists(path("c/data/seed")));
  EXPECT_EQ(cache.usage().files, 0U);
}

}  // namespace
}  // namespace stagefs
