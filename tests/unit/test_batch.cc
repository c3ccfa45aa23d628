// Small files are materialized by directory. StageFsCore over a GroupService of one
// rank (SelfComm + LocalControlPlane) and a real cache: the first open of a small file stages
// every small file of its directory in one transfer; later opens are cache hits; a large file
// keeps its own transfer; a file that changes during the batch's copy is not served stale.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <sys/xattr.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <future>
#include <iostream>
#include <mutex>
#include <set>
#include <thread>

#include "bcast/comm/comm.h"
#include "bcast/io/store.h"
#include "fakes.h"
#include "fusefs/batch_rules.h"
#include "fusefs/beneath.h"
#include "fusefs/cache/cache.h"
#include "fusefs/core.h"
#include "fusefs/group.h"
#include "group_hooks.h"
#include "source_cache.h"
#include "tmpdir.h"

namespace stagefs {
namespace {

using stage::testing::TmpDirTest;
namespace fs = std::filesystem;

constexpr uint64_t kSmall = 64 * 1024;

// Rewrites a file in place (same inode; new bytes, mtime and ctime).
void rewrite(const std::string& p, const std::string& data) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << data;
}

// The mount's source reader, except that the first open of one file rewrites that file on
// the source right after the engine opened it: a change during the copy, seen by the engine's
// end-of-file check (size, mtime, ctime, inode).
class ChangingSource final : public stage::SourceReader {
 public:
  ChangingSource(BeneathSource& real, std::string victim, std::string path, std::string data)
      : real_(real), victim_(std::move(victim)), path_(std::move(path)), data_(std::move(data)) {}
  stage::Result<stage::Manifest> scan(const std::string& p, bool rec, const SkipFn& skip) override {
    return real_.scan(p, rec, skip);
  }
  stage::Result<stage::Selection> scan_selection(const std::string& dir, uint64_t max,
                                                 const stage::SelectionSlice& slice) override {
    ++scans;
    return real_.scan_selection(dir, max, slice);
  }
  stage::Result<std::unique_ptr<stage::SourceFile>> open(const std::string& root,
                                                         const stage::Entry& e) override {
    auto f = real_.open(root, e);
    if (f && (always || !changed) && stage::join_path(root, e.path) == victim_) {
      changed = true;
      if (always) data_ += 'x';  // a new size each time
      rewrite(path_, data_);     // same inode, new bytes, new mtime and ctime
    }
    return f;
  }
  bool changed = false;
  bool always = false;  // change at every open: every copy of the file fails
  int scans = 0;

 private:
  BeneathSource& real_;
  std::string victim_, path_, data_;
};

// Counts the batches that ended (a walk's run in the background) and waits for them.
struct BatchEnds {
  std::mutex m;
  std::condition_variable cv;
  int ended = 0;
  void count_in(GroupConfig& cfg) {
    group_hooks(cfg).on_after_batch = [this, inner = group_hooks(cfg).on_after_batch](
                                          const std::string& dir, const std::vector<std::string>& published,
                                          bool ok) {
      if (inner) inner(dir, published, ok);
      std::lock_guard lk(m);
      ++ended;
      cv.notify_all();
    };
  }
  bool wait_for(int n) {  // 60 s is only a bound
    std::unique_lock lk(m);
    return cv.wait_for(lk, std::chrono::seconds(60), [&] { return ended >= n; });
  }
};

class BatchTest : public testing::SourceCacheTest {
 protected:
  void SetUp() override {
    TmpDirTest::SetUp();
    spdlog::default_logger_raw();
    fs::create_directories(path("src/many"));
    for (int i = 0; i < 50; ++i) {
      small_.push_back(random_bytes(4096 + static_cast<size_t>(i) * 1200, static_cast<uint32_t>(i + 1)));
      write_file(path("src/many") + "/" + name(i), small_.back());
    }
    large_ = random_bytes(kSmall + 1, 99);  // one byte over the threshold
    write_file(path("src/many/large.bin"), large_);
    open_source_and_cache();
  }
  void TearDown() override {
    if (core_) {  // a test that failed before its own end of the mount
      core_->stop();
      core_.reset();
    }
    SourceCacheTest::TearDown();
  }
  // The end of a test's mount: the core first (it calls into the group), then the group's
  // service thread, after a shutdown.
  void stop(GroupService& group, std::thread& service) {
    if (core_) core_->stop();
    {
      const std::lock_guard lk(core_m_);  // the group's hooks may still be running
      core_.reset();
    }
    group.request_shutdown();
    service.join();
  }
  // A mount of one rank (SelfComm): its group's service thread runs while it lives; end() (or
  // the end of its scope, also when a test fails) stops the core first, then the group.
  struct Mount {
    Mount(BatchTest& t, stage::SourceReader& src, GroupConfig cfg)
        : Mount(t, src, t.store_, std::move(cfg)) {}
    Mount(BatchTest& t, stage::SourceReader& src, stage::LocalStore& store, GroupConfig cfg)
        : test(t),
          group(comm, ctl, src, store, std::move(cfg)),
          service([this] { EXPECT_TRUE(group.run().ok()); }) {}
    ~Mount() { end(); }
    Mount(const Mount&) = delete;
    Mount& operator=(const Mount&) = delete;
    void end() {
      if (service.joinable()) test.stop(group, service);
    }
    BatchTest& test;
    stage::SelfComm comm;
    LocalControlPlane ctl;
    GroupService group;
    std::thread service;
  };
  // A mount before the test's copies src/DIR/NAMES into the cache (with their CRC recorded).
  void copy_in_an_earlier_mount(const std::string& dir, const std::vector<std::string>& names) {
    Mount mount(*this, *source_, config());
    make_core(mount.group);
    const uint64_t d = lookup(StageFsCore::kRootId, dir);
    for (const auto& n : names) EXPECT_FALSE(open_and_read(lookup(d, n)).empty()) << n;
  }
  // Opens id through the core and returns its bytes (the test fails on an error).
  std::string open_and_read(uint64_t id) {
    auto r = core_->open(id, O_RDONLY);
    EXPECT_TRUE(r) << (r ? std::string() : r.error().message);
    if (!r) return {};
    std::string out = read_fd(r->fd.get());
    core_->release(r->pinned);
    return out;
  }
  static std::string name(int i) { return std::string(i < 10 ? "s0" : "s").append(std::to_string(i)); }
  // src/DIR (created) holding small files named NAMES, with the bytes of small_[0], [1]...
  void small_dir(const std::string& dir, const std::vector<std::string>& names) {
    fs::create_directories(path("src/" + dir));
    for (size_t i = 0; i < names.size(); ++i) write_file(path("src/" + dir + "/" + names[i]), small_[i]);
  }
  GroupConfig config() {
    GroupConfig g;
    g.source_dir = path("src");
    g.cache_dir = cache_->store_root();
    g.bcast.chunk_size = 65536;
    g.idle_poll = std::chrono::milliseconds(5);
    g.small_file_size = kSmall;
    // As the daemon: published copies join the index and count as verified in this mount.
    group_hooks(g).on_after_batch = [this](const std::string& dir, const std::vector<std::string>& published,
                                           bool) {
      const auto copies = cache_->added_in(dir, published);
      const std::lock_guard lk(core_m_);  // stop() may be ending the core on the test's thread
      if (core_) core_->copies_made(copies);
    };
    return g;
  }
  void make_core(Materializer& mat) {
    CoreConfig cc{path("src"), StallPolicy::eio};
    cc.small_file_size = kSmall;
    auto c = StageFsCore::create(cc, *cache_, mat);
    ASSERT_TRUE(c) << c.error().message;
    core_ = std::move(c.value());
  }
  uint64_t lookup(uint64_t parent, const std::string& n) {
    auto r = core_->lookup(parent, n);
    EXPECT_TRUE(r) << n << ": " << r.error().message;
    return r ? r->first : 0;
  }
  static std::string read_fd(int fd) {
    std::string out;
    char buf[65536];
    for (off_t off = 0;;) {
      const ssize_t n = ::pread(fd, buf, sizeof buf, off);
      if (n <= 0) break;
      out.append(buf, static_cast<size_t>(n));
      off += n;
    }
    return out;
  }

  std::vector<std::string> small_;
  std::string large_;
  std::unique_ptr<StageFsCore> core_;  // destroyed before the group (declared in each test)
  std::mutex core_m_;                  // core_ as config()'s after_batch hook reads it
  stage::PosixStore store_{stage::StoreOptions{.xattrs = stagefs::kCopyXattrs}};
};

// The daemon's own access check, behind the kernel's default_permissions (which a user who
// may rename a parent directory can fool with attributes of another file). It is made on the
// inode the open stat'ed (faccessat2 on that fd), never on the path resolved a second time.
TEST_F(BatchTest, TheCoreChecksTheCallersAccessOnTheFileItOpens) {
  fs::create_directories(path("src/priv"));
  fs::create_directories(path("src/closed"));
  write_file(path("src/priv/secret"), "root only");
  write_file(path("src/priv/shared"), "anyone");
  ASSERT_EQ(::chmod(path("src").c_str(), 0755), 0);
  ASSERT_EQ(::chmod(path("src/priv").c_str(), 0755), 0);
  ASSERT_EQ(::chmod(path("src/priv/secret").c_str(), 0600), 0);
  ASSERT_EQ(::chmod(path("src/priv/shared").c_str(), 0644), 0);
  ASSERT_EQ(::chmod(path("src/closed").c_str(), 0700), 0);
  Mount mount(*this, *source_, config());
  GroupService& group = mount.group;
  make_core(group);
  const Caller nobody{65534, 65534, {}};
  const uint64_t dir = lookup(StageFsCore::kRootId, "priv");
  auto denied = core_->open(lookup(dir, "secret"), O_RDONLY, nobody);
  ASSERT_FALSE(denied);
  EXPECT_EQ(denied.error().code, std::error_code(EACCES, std::generic_category())) << denied.error().message;
  auto allowed = core_->open(lookup(dir, "shared"), O_RDONLY, nobody);
  ASSERT_TRUE(allowed) << allowed.error().message;
  EXPECT_EQ(read_fd(allowed->fd.get()), "anyone");
  core_->release(allowed->pinned);
  auto root_may = core_->open(lookup(dir, "secret"), O_RDONLY, Caller{});
  ASSERT_TRUE(root_may) << root_may.error().message;
  core_->release(root_may->pinned);
  auto listing = core_->readdir(lookup(StageFsCore::kRootId, "closed"), nobody);
  ASSERT_FALSE(listing);
  EXPECT_EQ(listing.error().code, std::error_code(EACCES, std::generic_category()));
  EXPECT_TRUE(core_->readdir(lookup(StageFsCore::kRootId, "closed"), Caller{}));
  mount.end();
}

// Access is the source's at every open, on the whole path: a directory above the file that
// its owner closes (chmod, or an ACL entry for the user) denies the next open of the file,
// whether its copy is in the cache (a hit) or not, while root still opens it.
TEST_F(BatchTest, AnOpenIsDeniedWhenADirectoryAboveTheFileIsClosedOnTheSource) {
  fs::create_directories(path("src/proj/deep"));
  write_file(path("src/proj/deep/plan.txt"), "the plan");
  write_file(path("src/proj/deep/other.txt"), "not cached");
  for (const char* d : {"src", "src/proj", "src/proj/deep"}) ASSERT_EQ(::chmod(path(d).c_str(), 0755), 0);
  for (const char* f : {"src/proj/deep/plan.txt", "src/proj/deep/other.txt"})
    ASSERT_EQ(::chmod(path(f).c_str(), 0644), 0);
  Mount mount(*this, *source_, config());
  make_core(mount.group);
  const Caller nobody{65534, 65534, {}};
  const uint64_t deep = lookup(lookup(StageFsCore::kRootId, "proj"), "deep");
  const uint64_t plan = lookup(deep, "plan.txt"), other = lookup(deep, "other.txt");
  auto first = core_->open(plan, O_RDONLY, nobody);  // copied into the cache
  ASSERT_TRUE(first) << first.error().message;
  core_->release(first->pinned);
  auto denied = [&](uint64_t id, const char* why) {
    auto r = core_->open(id, O_RDONLY, nobody);
    ASSERT_FALSE(r) << why;
    EXPECT_EQ(r.error().code, std::error_code(EACCES, std::generic_category()))
        << why << ": " << r.error().message;
  };
  ASSERT_EQ(::chmod(path("src/proj").c_str(), 0700), 0);
  denied(plan, "cached copy, a grandparent chmod 700");
  denied(other, "no copy, a grandparent chmod 700");
  EXPECT_FALSE(core_->readdir(deep, nobody));
  auto root_may = core_->open(plan, O_RDONLY, Caller{});
  ASSERT_TRUE(root_may) << root_may.error().message;
  core_->release(root_may->pinned);
  ASSERT_EQ(::chmod(path("src/proj").c_str(), 0755), 0);
  auto again = core_->open(plan, O_RDONLY, nobody);  // nothing remembered the denial
  ASSERT_TRUE(again) << again.error().message;
  core_->release(again->pinned);
  // An ACL entry that takes the user's search permission on the file's parent.
  const std::string acl = "setfacl -m u:65534:--- " + path("src/proj/deep") + " 2>/dev/null";
  if (std::system(acl.c_str()) != 0) {  // NOLINT(cert-env33-c): a fixed command line
    mount.end();
    GTEST_SKIP() << "setfacl missing or ACLs not supported here";
  }
  denied(plan, "cached copy, an ACL on the parent");
  denied(other, "no copy, an ACL on the parent");
  mount.end();
}

// A user who may create files beside another user's file B can name one like B's temporary
// file in the cache (".B.stage-tmp.HOST.PID", predictable from the status). Copied into the
// cache, it would land on (or, as a directory, block) that temporary file. Such paths are
// never cached: read from the source, left out of batches and walks, never evicted.
TEST_F(BatchTest, AFileNamedLikeATemporaryFileIsReadFromTheSourceNeverCached) {
  EXPECT_TRUE(has_temp_component(".b.stage-tmp.h.1"));
  EXPECT_TRUE(has_temp_component("d/.b.stage-tmp.h.1/f"));
  EXPECT_FALSE(has_temp_component("d/b.stage-tmp.h.1"));  // not hidden: not the store's shape
  EXPECT_FALSE(has_temp_component("many/s01"));
  const std::string planted = "." + name(5) + ".stage-tmp.node7.4242";
  write_file(path("src/many/" + planted), "planted bytes");
  fs::create_directories(path("src/" + planted));
  write_file(path("src/" + planted + "/f"), "in a planted directory");
  Mount mount(*this, *source_, config());
  GroupService& group = mount.group;
  make_core(group);
  const uint64_t dir = lookup(StageFsCore::kRootId, "many");
  EXPECT_EQ(open_and_read(lookup(dir, name(0))), small_[0]);  // the directory's batch
  EXPECT_EQ(group.stats().batch_files, 50U) << "the planted name went into the batch";
  const uint64_t id = lookup(dir, planted);
  auto f = core_->open(id, O_RDONLY);
  ASSERT_TRUE(f) << f.error().message;
  EXPECT_TRUE(f->from_source);
  EXPECT_EQ(read_fd(f->fd.get()), "planted bytes");
  core_->release(f->pinned);
  auto in_dir = core_->open(lookup(lookup(StageFsCore::kRootId, planted), "f"), O_RDONLY);
  ASSERT_TRUE(in_dir) << in_dir.error().message;
  EXPECT_TRUE(in_dir->from_source);
  core_->release(in_dir->pinned);
  EXPECT_FALSE(core_->evict(id, Caller{}));
  EXPECT_FALSE(fs::exists(path("cache/data/many/" + planted)));
  EXPECT_FALSE(fs::exists(path("cache/data/" + planted)));
  EXPECT_EQ(group.stats().transfers, 1U);
  mount.end();
}

// Handles on one version of a directory share its listing, but a user who changes a large
// directory between opendirs builds a new listing each time, and could hold hundreds of them
// open (a million 255-byte names is about 300 MB each). Each user's listings have a budget.
TEST_F(BatchTest, AUsersOpenListingsHaveAMemoryBudget) {
  fs::create_directories(path("src/big"));
  ASSERT_EQ(::chmod(path("src").c_str(), 0755), 0);
  ASSERT_EQ(::chmod(path("src/big").c_str(), 0777), 0);
  for (int i = 0; i < 200; ++i) write_file(path("src/big/" + std::string(200, 'n') + std::to_string(i)), "");
  stage::SelfComm comm;
  LocalControlPlane ctl;
  GroupService group(comm, ctl, *source_, store_, config());  // not run: listings only
  CoreConfig cc{path("src"), StallPolicy::eio};
  cc.listing_bytes_per_user = 64 << 10;  // one listing of the 200 long names (~50 KiB), not two
  auto c = StageFsCore::create(cc, *cache_, group);
  ASSERT_TRUE(c) << c.error().message;
  core_ = std::move(c.value());
  const Caller nobody{65534, 65534, {}}, other{65533, 65533, {}};
  const uint64_t big = lookup(StageFsCore::kRootId, "big");
  auto v1 = core_->readdir(big, nobody);
  ASSERT_TRUE(v1) << v1.error().message;
  auto shared = core_->readdir(big, nobody);  // the same version: the same listing, no charge
  ASSERT_TRUE(shared);
  EXPECT_EQ(v1->get(), shared->get());
  write_file(path("src/big/one-more"), "");  // a new version of the directory
  auto v2 = core_->readdir(big, nobody);
  ASSERT_FALSE(v2) << "a second listing went past the budget";
  EXPECT_EQ(v2.error().code, std::error_code(ENOMEM, std::generic_category())) << v2.error().message;
  EXPECT_TRUE(core_->readdir(big, other)) << "one user's listings used another's budget";
  EXPECT_TRUE(core_->readdir(big, Caller{}));  // root: no budget
  v1->reset();
  shared->reset();  // the last handle on v1: its bytes return to the budget
  auto again = core_->readdir(big, nobody);
  EXPECT_TRUE(again) << again.error().message;
  core_.reset();
}

TEST_F(BatchTest, OneSmallFileOpenStagesItsDirectoryInOneTransferButNotTheLargeFile) {
  Mount mount(*this, *source_, config());
  GroupService& group = mount.group;
  make_core(group);
  const uint64_t dir = lookup(StageFsCore::kRootId, "many");
  auto first = core_->open(lookup(dir, name(17)), O_RDONLY);
  ASSERT_TRUE(first) << first.error().message;
  EXPECT_FALSE(first->cache_hit);
  EXPECT_EQ(read_fd(first->fd.get()), small_[17]);
  auto s = group.stats();
  EXPECT_EQ(s.transfers, 1U);
  EXPECT_EQ(s.batches, 1U);
  EXPECT_EQ(s.batch_files, 50U);
  EXPECT_EQ(s.requests_sent, 1U);
  EXPECT_FALSE(fs::exists(path("cache/data/many/large.bin"))) << "a large file went into the batch";
  EXPECT_EQ(cache_->usage().files, 50U);
  // Every other small file: a cache hit, no new transfer, the source's bytes, no CRC re-read.
  for (int i = 0; i < 50; ++i) {
    auto f = core_->open(lookup(dir, name(i)), O_RDONLY);
    ASSERT_TRUE(f) << name(i) << ": " << f.error().message;
    EXPECT_TRUE(f->cache_hit) << name(i);
    EXPECT_EQ(read_fd(f->fd.get()), small_[static_cast<size_t>(i)]) << name(i);
    core_->release(f->pinned);
  }
  core_->release(first->pinned);
  EXPECT_EQ(group.stats().transfers, 1U);
  EXPECT_EQ(core_->copy_counters().verified, 0U) << "batch copies were CRC-read again on their first open";
  // The large file: its own transfer.
  auto large = core_->open(lookup(dir, "large.bin"), O_RDONLY);
  ASSERT_TRUE(large) << large.error().message;
  EXPECT_EQ(read_fd(large->fd.get()), large_);
  s = group.stats();
  EXPECT_EQ(s.transfers, 2U);
  EXPECT_EQ(s.batches, 1U);
  EXPECT_EQ(s.failures, 0U);
  mount.end();
}

TEST_F(BatchTest, ConcurrentOpensOfManySmallFilesShareOneBatchAndANewFileGetsItsOwn) {
  stage::SelfComm comm;
  LocalControlPlane ctl;
  GroupService group(comm, ctl, *source_, store_, config());
  make_core(group);
  const uint64_t dir = lookup(StageFsCore::kRootId, "many");
  std::vector<uint64_t> ids;
  for (int i = 0; i < 50; ++i) ids.push_back(lookup(dir, name(i)));
  // All 50 opens wait before the service runs: one request, one batch, 50 answers.
  std::mutex m;
  std::condition_variable cv;
  int answered = 0;
  std::vector<std::string> errors;
  for (uint64_t id : ids)
    core_->open_async(id, O_RDONLY, {}, [&](stage::Result<OpenFile> r) {
      std::lock_guard lk(m);
      if (!r)
        errors.push_back(r.error().message);
      else
        core_->release(r->pinned);
      ++answered;
      cv.notify_all();
    });
  std::thread service([&] { EXPECT_TRUE(group.run().ok()); });
  {
    std::unique_lock lk(m);
    ASSERT_TRUE(cv.wait_for(lk, std::chrono::seconds(60), [&] { return answered == 50; }));
  }
  EXPECT_TRUE(errors.empty()) << errors.front();
  EXPECT_EQ(group.stats().transfers, 1U);
  EXPECT_EQ(group.stats().requests_sent, 1U);
  // A small file created after the batch: a new batch, which copies only that file.
  write_file(path("src/many/zz-new"), "new");
  auto f = core_->open(lookup(dir, "zz-new"), O_RDONLY);
  ASSERT_TRUE(f) << f.error().message;
  EXPECT_EQ(read_fd(f->fd.get()), "new");
  core_->release(f->pinned);
  const auto s = group.stats();
  EXPECT_EQ(s.transfers, 2U);
  EXPECT_EQ(s.batch_files, 51U) << "the second batch copied current files again";
  stop(group, service);
}

// One file changes on the source while the batch is copied: the engine's end-of-file check
// fails the stream, the group runs the batch once more, which publishes every file, the
// changed one at its new version. An open that looked the file up before the change gets
// ESTALE (the kernel then looks it up again); the new id opens the new bytes. Nothing stale
// is ever served.
TEST_F(BatchTest, AFileChangedDuringTheCopyIsStagedAgainAndNeverServedStale) {
  const std::string fresh = random_bytes(small_[5].size() + 100, 555);
  ChangingSource changing(*source_, "many/" + name(5), path("src/many/" + name(5)), fresh);
  Mount mount(*this, changing, config());
  GroupService& group = mount.group;
  make_core(group);
  const uint64_t dir = lookup(StageFsCore::kRootId, "many");
  const uint64_t old_id = lookup(dir, name(5));
  const uint64_t other = lookup(dir, name(30));
  auto r = core_->open(other, O_RDONLY);  // the batch: name(5) changes during its copy
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(read_fd(r->fd.get()), small_[30]);
  core_->release(r->pinned);
  EXPECT_TRUE(changing.changed);
  EXPECT_EQ(changing.scans, 2) << "the failed batch was not run again";
  auto s = group.stats();
  EXPECT_EQ(s.transfers, 1U);
  EXPECT_EQ(s.failures, 0U);
  EXPECT_EQ(s.batch_files, 50U);
  // The unchanged files are published and served.
  for (int i = 0; i < 50; ++i) {
    if (i == 5) continue;
    EXPECT_EQ(read_file(path("cache/data/many/" + name(i))), small_[static_cast<size_t>(i)]) << name(i);
  }
  // The changed file: its copy is the new version; the old id is refused, the new one served.
  EXPECT_EQ(read_file(path("cache/data/many/" + name(5))), fresh);
  auto old_open = core_->open(old_id, O_RDONLY);
  ASSERT_FALSE(old_open);
  EXPECT_EQ(old_open.error().to_errno(), ESTALE);
  auto now = core_->open(lookup(dir, name(5)), O_RDONLY);
  ASSERT_TRUE(now) << now.error().message;
  EXPECT_TRUE(now->cache_hit);
  EXPECT_EQ(read_fd(now->fd.get()), fresh);
  core_->release(now->pinned);
  EXPECT_EQ(group.stats().transfers, 1U);
  mount.end();
}

// A file that fails every copy (here: it changes at every read; in life a pseudo file) fails
// both runs of its directory's batch. The other files' opens then stage their file alone and
// succeed; the bad file's open fails as it would alone; later small files of that directory
// are staged alone (no batch that is known to fail).
TEST_F(BatchTest, AFileThatFailsEveryCopyDoesNotFailItsNeighbours) {
  ChangingSource changing(*source_, "many/" + name(9), path("src/many/" + name(9)), "v");
  changing.always = true;
  Mount mount(*this, changing, config());
  GroupService& group = mount.group;
  make_core(group);
  const uint64_t dir = lookup(StageFsCore::kRootId, "many");
  auto r = core_->open(lookup(dir, name(20)), O_RDONLY);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(read_fd(r->fd.get()), small_[20]);
  core_->release(r->pinned);
  auto s = group.stats();
  EXPECT_EQ(s.batches, 1U);
  EXPECT_EQ(s.failures, 1U);
  EXPECT_EQ(changing.scans, 2);  // the batch and its one retry
  EXPECT_EQ(s.transfers, 2U);    // the batch, then name(20) alone
  auto r2 = core_->open(lookup(dir, name(21)), O_RDONLY);
  ASSERT_TRUE(r2) << r2.error().message;
  core_->release(r2->pinned);
  EXPECT_EQ(changing.scans, 2) << "a batch known to fail was tried again";
  EXPECT_EQ(group.stats().transfers, 3U);
  auto bad = core_->open(lookup(dir, name(9)), O_RDONLY);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().to_errno(), EIO) << bad.error().message;
  mount.end();
}

// The source file changes after the open checked its version but before the batch lists the
// directory: the batch succeeds with the new version, which is not what the open looked up.
// The open gets ESTALE (the kernel looks the name up again), not the new bytes under the old
// attributes, not EIO.
class ChangeFirst final : public Materializer {
 public:
  ChangeFirst(Materializer& inner, std::string path) : inner_(inner), path_(std::move(path)) {}
  void materialize_async(const std::string& rel, const Want& want, Done done) override {
    inner_.materialize_async(rel, want, std::move(done));
  }
  void materialize_small_async(const std::string& rel, uint64_t since, const Want& want, Done done) override {
    rewrite(path_, "changed");
    inner_.materialize_small_async(rel, since, want, std::move(done));
  }

 private:
  Materializer& inner_;
  std::string path_;
};

TEST_F(BatchTest, AFileChangedBeforeTheBatchListedItGetsEstale) {
  Mount mount(*this, *source_, config());
  GroupService& group = mount.group;
  ChangeFirst mat(group, path("src/many/" + name(3)));
  make_core(mat);
  const uint64_t dir = lookup(StageFsCore::kRootId, "many");
  auto r = core_->open(lookup(dir, name(3)), O_RDONLY);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().to_errno(), ESTALE) << r.error().message;
  EXPECT_EQ(group.stats().transfers, 1U);
  auto again = core_->open(lookup(dir, name(3)), O_RDONLY);  // what the kernel does next
  ASSERT_TRUE(again) << again.error().message;
  EXPECT_TRUE(again->cache_hit);
  EXPECT_EQ(read_fd(again->fd.get()), "changed");
  core_->release(again->pinned);
  EXPECT_EQ(group.stats().transfers, 1U);
  mount.end();
}

// A small file that grew past the threshold between its open and the batch's listing is not in
// the batch: the core stages it alone (a second transfer) rather than failing the open.
TEST_F(BatchTest, ASmallFileLeftOutOfTheBatchIsStagedAlone) {
  // The materializer asks for the batch, but the group's threshold is smaller than the core's
  // (as after a file grew): the batch leaves the file out.
  GroupConfig g = config();
  g.small_file_size = 4096;  // only s00 (4096 bytes) is in the batch
  Mount mount(*this, *source_, g);
  GroupService& group = mount.group;
  make_core(group);
  const uint64_t dir = lookup(StageFsCore::kRootId, "many");
  auto r = core_->open(lookup(dir, name(10)), O_RDONLY);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(read_fd(r->fd.get()), small_[10]);
  core_->release(r->pinned);
  const auto s = group.stats();
  EXPECT_EQ(s.transfers, 2U);
  EXPECT_EQ(s.batches, 1U);
  EXPECT_EQ(s.batch_files, 1U);
  mount.end();
}

// A POSIX access ACL that denies one user (nobody) what the mode grants everyone, as
// `setfacl -m u:nobody:---` writes it. False where the filesystem has no ACLs.
bool deny_nobody(const std::string& p) {
  struct AclEntry {
    uint16_t tag, perm;
    uint32_t id;
  };
  constexpr uint32_t kNobody = 65534, kUndefined = UINT32_MAX;
  const uint32_t version = 2;
  const AclEntry aces[] = {{0x01, 6, kUndefined},
                           {0x02, 0, kNobody},
                           {0x04, 4, kUndefined},
                           {0x10, 4, kUndefined},
                           {0x20, 4, kUndefined}};  // user_obj, user, group_obj, mask, other
  std::string v(reinterpret_cast<const char*>(&version), 4);
  v.append(reinterpret_cast<const char*>(aces), sizeof aces);
  return ::setxattr(p.c_str(), "system.posix_acl_access", v.data(), v.size(), 0) == 0;
}

// A small file that not every user may read is never in a batch: one user's open of another
// file must not copy it. Not readable by others (0640), nor by its owner's group (0604), or
// with an ACL whatever its mode says (the batch runs for every user alike: an ACL may deny
// the very user whose open asked for it). Its own open (after its caller's access check)
// stages it alone, without waiting for a batch first (the core asks the same rule).
TEST_F(BatchTest, AFileNotEveryoneMayReadIsLeftOutAndStagedAlone) {
  ASSERT_EQ(::chmod(path("src/many/" + name(7)).c_str(), 0640), 0);
  ASSERT_EQ(::chmod(path("src/many/" + name(8)).c_str(), 0604), 0);
  const bool acl = deny_nobody(path("src/many/" + name(9)));
  if (!acl) std::cerr << "no POSIX ACLs here: the ACL case is left out\n";
  Mount mount(*this, *source_, config());
  GroupService& group = mount.group;
  make_core(group);
  const uint64_t dir = lookup(StageFsCore::kRootId, "many");
  auto r = core_->open(lookup(dir, name(10)), O_RDONLY);
  ASSERT_TRUE(r) << r.error().message;
  core_->release(r->pinned);
  EXPECT_EQ(group.stats().batch_files, acl ? 47U : 48U);
  std::vector<int> left_out{7, 8};
  if (acl) left_out.push_back(9);
  for (int i : left_out) EXPECT_FALSE(fs::exists(path("cache/data/many/" + name(i)))) << name(i);
  for (int i : left_out) {  // root: neither the modes nor the ACL deny it
    auto p = core_->open(lookup(dir, name(i)), O_RDONLY);
    ASSERT_TRUE(p) << p.error().message;
    EXPECT_EQ(read_fd(p->fd.get()), small_[static_cast<size_t>(i)]);
    core_->release(p->pinned);
  }
  const auto s = group.stats();
  EXPECT_EQ(s.transfers, acl ? 4U : 3U);
  EXPECT_EQ(s.batches, 1U);  // their own transfers, not batches
  mount.end();
}

// An open that looked into the cache just before its directory's batch published the copy, and
// asks after the batch completed, is answered at once (it looks again and finds the copy)
// instead of costing the group another batch; one that looked after the batch asks anew.
TEST_F(BatchTest, ABatchThatCompletedAfterTheCacheLookAnswersWithoutANewTransfer) {
  Mount mount(*this, *source_, config());
  GroupService& group = mount.group;
  const uint64_t before = group.epoch();
  auto ask = [&](const std::string& rel, uint64_t since) {
    std::promise<stage::Status> p;
    auto f = p.get_future();
    group.materialize_small_async(rel, since, {}, [&p](stage::Status st) { p.set_value(std::move(st)); });
    return f.get();
  };
  ASSERT_TRUE(ask("many/" + name(1), before).ok());
  EXPECT_EQ(group.stats().transfers, 1U);
  EXPECT_TRUE(ask("many/" + name(2), before).ok());  // looked before the batch completed
  EXPECT_EQ(group.stats().transfers, 1U);
  EXPECT_TRUE(ask("many/" + name(2), group.epoch()).ok());  // looked after: a new batch
  EXPECT_EQ(group.stats().transfers, 2U);
  mount.end();
}

// The engine's side: a batch lists only the small regular files directly in the directory
// (no symlink, subdirectory, FIFO or large file), makes the cache directory 0700 (not the
// source directory's mode), and publishes N files with one sync for the whole batch (the data,
// before any rename; a store may record the names instead: the cache's UnsyncedLog) instead of
// an fsync per file and per rename.
class CountingStore final : public stage::LocalStore {
 public:
  stage::Result<stage::LocalState> inspect(const std::string& p) override { return real_.inspect(p); }
  stage::Result<uint64_t> checksum(const std::string& p) override { return real_.checksum(p); }
  stage::Result<uint64_t> free_bytes(const std::string& p) override { return real_.free_bytes(p); }
  stage::Status sync_filesystem(const std::string& p) override {
    ++syncfs;
    return real_.sync_filesystem(p);
  }
  stage::Status make_dir(const std::string& p, uint32_t m) override { return real_.make_dir(p, m); }
  stage::Status make_parents(const std::string& p) override { return real_.make_parents(p); }
  stage::Status make_symlink(const std::string& p, const std::string& t) override {
    return real_.make_symlink(p, t);
  }
  int remove_stale_temps(const std::string& p) override { return real_.remove_stale_temps(p); }
  stage::Result<std::unique_ptr<stage::Txn>> begin(const std::string& p) override {
    auto t = real_.begin(p);
    if (!t) return t.error();
    return std::unique_ptr<stage::Txn>(new CountingTxn(std::move(t.value()), *this));
  }
  // The group's publication: the default one (a sync of the filesystem, counted), with the
  // renames seen at each of its steps.
  std::unique_ptr<stage::Publication> publication(const std::string& d,
                                                  std::vector<std::string> names) override {
    return std::make_unique<CountingPublication>(LocalStore::publication(d, names), *this, names.size());
  }
  int syncfs = 0, fsyncs = 0, synced_commits = 0, renames = 0;
  int unsynced_publishes = 0, unsynced_names = 0, renames_before_publish = -1;
  int published_names = 0, renames_after_publish = -1;

 private:
  class CountingPublication final : public stage::Publication {
   public:
    CountingPublication(std::unique_ptr<stage::Publication> in, CountingStore& s, size_t n)
        : in_(std::move(in)), s_(s), n_(static_cast<int>(n)) {}
    stage::Status data_durable() override {
      ++s_.unsynced_publishes;
      s_.unsynced_names += n_;
      s_.renames_before_publish = s_.renames;
      return in_->data_durable();
    }
    void done() override {
      s_.published_names += n_;
      s_.renames_after_publish = s_.renames;
      in_->done();
    }

   private:
    std::unique_ptr<stage::Publication> in_;
    CountingStore& s_;
    int n_;
  };
  class CountingTxn final : public stage::Txn {
   public:
    CountingTxn(std::unique_ptr<stage::Txn> in, CountingStore& s) : in_(std::move(in)), s_(s) {}
    stage::Status write(uint64_t off, std::span<const std::byte> d) override { return in_->write(off, d); }
    stage::Status finish(const stage::FileMeta& m, uint64_t crc, const stage::ChunkRecord* chunks) override {
      return in_->finish(m, crc, chunks);
    }
    stage::Status rewind() override { return in_->rewind(); }
    stage::Status sync() override {
      ++s_.fsyncs;
      return in_->sync();
    }
    stage::Result<uint64_t> crc_on_disk() override { return in_->crc_on_disk(); }
    stage::Result<uint64_t> size_on_disk() override { return in_->size_on_disk(); }
    stage::Status commit() override {
      ++s_.synced_commits;
      return in_->commit();
    }
    stage::Status commit_unsynced() override {
      ++s_.renames;
      return in_->commit_unsynced();
    }
    void abort() noexcept override { in_->abort(); }
    [[nodiscard]] const std::string& temp_path() const override { return in_->temp_path(); }

   private:
    std::unique_ptr<stage::Txn> in_;
    CountingStore& s_;
  };
  stage::PosixStore real_{stage::StoreOptions{
      .direct_io = false, .parent_mode = 0700, .xattrs = stagefs::kCopyXattrs}};  // as the cache's
};

TEST_F(BatchTest, TheEngineStagesOnlyTheSmallRegularFilesWithOneSyncPerBatch) {
  fs::create_directories(path("src/many/sub"));
  write_file(path("src/many/sub/deep"), "not recursive");
  write_file(path("secret"), "outside the directory");
  fs::create_symlink("../../secret", path("src/many/link"));
  ASSERT_EQ(::mkfifo(path("src/many/fifo").c_str(), 0600), 0);
  ASSERT_EQ(::chmod(path("src/many").c_str(), 0751), 0);
  CountingStore store;
  stage::SelfComm comm;
  stage::StageOptions opt;
  opt.pre = stage::Validate::recorded;
  opt.selection.max_file_size = kSmall;
  opt.chunk_size = 65536;
  const stage::StageEndpoint ep{"many", path("dest/many"), true};
  auto rep = stage::stage_transfer(comm, source_.get(), store, opt, ep);
  ASSERT_TRUE(rep.ok) << (rep.errors.empty() ? "" : rep.errors.front());
  EXPECT_EQ(rep.files, 50U);
  EXPECT_EQ(rep.published.size(), 50U);
  for (int i = 0; i < 50; ++i)
    EXPECT_EQ(read_file(path("dest/many/" + name(i))), small_[static_cast<size_t>(i)]) << name(i);
  for (const char* absent : {"large.bin", "sub", "link", "fifo"})
    EXPECT_FALSE(fs::exists(fs::symlink_status(path(std::string("dest/many/") + absent)))) << absent;
  struct stat st {};
  ASSERT_EQ(::stat(path("dest/many").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700U) << "the batch's directory took the source directory's mode";
  EXPECT_EQ(store.fsyncs, 0);
  EXPECT_EQ(store.synced_commits, 0);
  EXPECT_EQ(store.renames, 50);
  EXPECT_EQ(store.syncfs, 1);  // the data, before the renames
  // The store is told of every name before the first rename (the cache records them there).
  EXPECT_EQ(store.unsynced_publishes, 1);
  EXPECT_EQ(store.unsynced_names, 50);
  EXPECT_EQ(store.renames_before_publish, 0);
  EXPECT_EQ(store.published_names, 50);  // ... and of them again after the last rename
  EXPECT_EQ(store.renames_after_publish, 50);
  // Again: every copy current, nothing copied, nothing synced.
  auto again = stage::stage_transfer(comm, source_.get(), store, opt, ep);
  ASSERT_TRUE(again.ok);
  EXPECT_TRUE(again.published.empty());
  EXPECT_EQ(again.bytes_streamed, 0U);
  EXPECT_EQ(store.syncfs, 1);
}

// Walks: opens in two sibling directories stage the parent's other subdirectories
// that every user may list and enter, without an open; never a private one, nor a symlink.
TEST_F(BatchTest, AWalkOfTwoSiblingsStagesTheOtherSubdirectories) {
  for (const char* d : {"w/a", "w/b", "w/c", "w/d", "w/private", "w/nogroup", "w/acl"})
    small_dir(d, {"f0", "f1", "f2"});
  ASSERT_EQ(::chmod(path("src/w/private").c_str(), 0750), 0);
  ASSERT_EQ(::chmod(path("src/w/nogroup").c_str(), 0705), 0);              // its owner's group may not enter
  if (!deny_nobody(path("src/w/acl"))) fs::remove_all(path("src/w/acl"));  // no ACLs here
  fs::create_directory_symlink("../many", path("src/w/link"));
  write_file(path("src/w/plain"), small_[4]);
  // The listing itself: directories every user may list and enter (ugo+rx, no ACL) only, at
  // most max of them.
  auto all = source_->list_dirs("w", 100);
  ASSERT_TRUE(all) << all.error().message;
  std::vector<std::string> names = *all;
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"a", "b", "c", "d"}));
  auto two = source_->list_dirs("w", 2);
  ASSERT_TRUE(two);
  EXPECT_EQ(two->size(), 2U);
  EXPECT_FALSE(source_->list_dirs("w/plain", 100));
  EXPECT_FALSE(source_->list_dirs("w/link", 100));

  BatchEnds ends;
  auto cfg = config();
  ends.count_in(cfg);
  Mount mount(*this, *source_, cfg);
  GroupService& group = mount.group;
  make_core(group);
  const uint64_t w = lookup(StageFsCore::kRootId, "w");
  for (const char* d : {"a", "b"}) EXPECT_EQ(open_and_read(lookup(lookup(w, d), "f1")), small_[1]) << d;
  EXPECT_TRUE(ends.wait_for(4));  // c and d follow in the background
  EXPECT_TRUE(fs::exists(path("cache/data/w/c/f2")));
  EXPECT_TRUE(fs::exists(path("cache/data/w/d/f0")));
  EXPECT_FALSE(fs::exists(path("cache/data/w/private")));
  EXPECT_FALSE(fs::exists(path("cache/data/w/nogroup")));
  EXPECT_FALSE(fs::exists(path("cache/data/w/acl")));
  EXPECT_FALSE(fs::exists(path("cache/data/many")));
  // An open in c is a cache hit: no transfer.
  auto c = core_->open(lookup(lookup(w, "c"), "f2"), O_RDONLY);
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_TRUE(c->cache_hit);
  EXPECT_EQ(read_fd(c->fd.get()), small_[2]);
  core_->release(c->pinned);
  mount.end();  // the group's counters are final now (a batch counts itself after its hook)
  const auto s = group.stats();
  EXPECT_EQ(s.batches, 4U);
  EXPECT_EQ(s.batch_files, 12U);
  EXPECT_EQ(s.transfers, 4U);
  EXPECT_EQ(s.walks, 1U);
}

// A prefetched batch never evicts: its hook is told so (the daemon's then makes no room), and
// when it does not fit (here the store has no room for it) it fails quietly: the rest of the
// walk is dropped, nothing is marked failed, and opens in the skipped and the dropped
// directories get their batches as usual.
TEST_F(BatchTest, APrefetchThatDoesNotFitDropsTheWalkAndMarksNothingFailed) {
  const std::vector<std::string> dirs{"a", "b", "c", "d", "e"};
  for (const auto& d : dirs) small_dir("w/" + d, {"f0", "f1", "f2"});
  stage::testing::StoreFaults faults;
  stage::testing::FaultStore store(faults);
  std::mutex m;
  std::vector<std::pair<std::string, bool>> hooks;  // (dir, may_evict), in order
  auto cfg = config();
  group_hooks(cfg).on_before_batch = [&](const std::string& dir, const stage::SelectionSlice&,
                                         bool may_evict) {
    faults.free_bytes = may_evict ? -1 : 0;  // the service thread, as the store's free_bytes()
    std::lock_guard lk(m);
    hooks.emplace_back(dir, may_evict);
  };
  BatchEnds ends;
  ends.count_in(cfg);
  Mount mount(*this, *source_, store, cfg);
  GroupService& group = mount.group;
  make_core(group);
  const uint64_t w = lookup(StageFsCore::kRootId, "w");
  for (const char* d : {"a", "b"}) EXPECT_EQ(open_and_read(lookup(lookup(w, d), "f1")), small_[1]) << d;
  EXPECT_TRUE(ends.wait_for(3));  // the walk's first prefetch ended (it failed)
  std::string skipped;
  {
    std::lock_guard lk(m);
    ASSERT_EQ(hooks.size(), 3U);
    EXPECT_EQ(hooks[0], (std::pair<std::string, bool>{"w/a", true}));
    EXPECT_EQ(hooks[1], (std::pair<std::string, bool>{"w/b", true}));
    EXPECT_FALSE(hooks[2].second) << "a prefetched batch must not evict";
    skipped = hooks[2].first;
  }
  for (const char* d : {"c", "d", "e"}) {
    EXPECT_FALSE(fs::exists(path("cache/data/w/" + std::string(d) + "/f0"))) << d;
    EXPECT_EQ(open_and_read(lookup(lookup(w, d), "f2")), small_[2]) << d;
  }
  mount.end();
  const auto s = group.stats();
  EXPECT_EQ(s.prefetch_skipped, 1U);
  EXPECT_EQ(s.failures, 0U);
  EXPECT_EQ(s.batches, 6U);  // a, b, the skipped prefetch, then c, d, e asked for
  EXPECT_EQ(s.batch_files, 15U);
  std::lock_guard lk(m);
  ASSERT_EQ(hooks.size(), 6U);
  for (size_t i = 3; i < 6; ++i) EXPECT_TRUE(hooks[i].second) << hooks[i].first;
  EXPECT_TRUE(
      std::ranges::any_of(hooks.begin() + 3, hooks.end(), [&](const auto& h) { return h.first == skipped; }))
      << skipped << ": asked for after its prefetch failed, it is a batch again (not file by file)";
}

// An open that attached to a prefetch while it ran (its directory's batch was running here)
// is not failed when the prefetch is skipped: it asks again and gets an ordinary batch. The
// open attaches from inside the prefetch's hook, so the order is certain.
TEST_F(BatchTest, AnOpenThatAttachedToASkippedPrefetchGetsAnOrdinaryBatch) {
  for (const char* d : {"w/a", "w/b", "w/c"}) small_dir(d, {"f"});
  stage::SelfComm comm;
  LocalControlPlane ctl;
  stage::testing::StoreFaults faults;
  stage::testing::FaultStore store(faults);
  std::vector<std::pair<std::string, bool>> hooks;  // the service thread's, read after stop()
  std::promise<stage::Status> attached;
  GroupService* g = nullptr;
  auto cfg = config();
  group_hooks(cfg).on_before_batch = [&](const std::string& dir, const stage::SelectionSlice&,
                                         bool may_evict) {
    hooks.emplace_back(dir, may_evict);
    faults.free_bytes = may_evict ? -1 : 0;
    if (!may_evict)
      g->materialize_small_async(dir + "/f", 0, {}, [&](stage::Status st) { attached.set_value(st); });
  };
  GroupService group(comm, ctl, *source_, store, cfg);
  g = &group;
  std::thread service([&] { EXPECT_TRUE(group.run().ok()); });
  make_core(group);
  const uint64_t w = lookup(StageFsCore::kRootId, "w");
  for (const char* d : {"a", "b"}) EXPECT_EQ(open_and_read(lookup(lookup(w, d), "f")), small_[0]) << d;
  auto done = attached.get_future();
  ASSERT_EQ(done.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  const stage::Status st = done.get();
  EXPECT_TRUE(st.ok()) << st.error().message;
  EXPECT_EQ(read_file(path("cache/data/w/c/f")), small_[0]);
  stop(group, service);
  ASSERT_EQ(hooks.size(), 4U);
  EXPECT_EQ(hooks[2], (std::pair<std::string, bool>{"w/c", false}));
  EXPECT_EQ(hooks[3], (std::pair<std::string, bool>{"w/c", true}));  // asked again: may evict
  const auto s = group.stats();
  EXPECT_EQ(s.prefetch_skipped, 1U);
  EXPECT_EQ(s.failures, 0U);
}

// With prefetch_siblings off, only what opens ask for.
TEST_F(BatchTest, WithoutWalksOnlyOpenedDirectoriesAreStaged) {
  for (const char* d : {"w/a", "w/b", "w/c"}) small_dir(d, {"f"});
  auto cfg = config();
  cfg.prefetch_siblings = false;
  Mount mount(*this, *source_, cfg);
  GroupService& group = mount.group;
  make_core(group);
  const uint64_t w = lookup(StageFsCore::kRootId, "w");
  for (const char* d : {"a", "b", "c"}) EXPECT_EQ(open_and_read(lookup(lookup(w, d), "f")), small_[0]) << d;
  // No walk was found (it is counted before b's batch is announced, so before b's open
  // returns), and each open asked for its own directory.
  const auto s = group.stats();
  EXPECT_EQ(s.walks, 0U);
  EXPECT_EQ(s.batches, 3U);
  EXPECT_EQ(s.requests_sent, 3U);
  mount.end();
}

// A copy its directory's batch is publishing on this node right now is not yet known to the
// core as made in this mount (the batch tells it when it ends). An open that finds it then
// waits for the batch, instead of reading it back for its CRC as a copy from an earlier mount.
class Publishing final : public Materializer {
 public:
  void materialize_async(const std::string& rel, const Want&, Done done) override {
    ADD_FAILURE() << "a transfer of " << rel << " alone";
    done(stage::sys_error(EIO, "unexpected"));
  }
  void materialize_small_async(const std::string& rel, uint64_t, const Want&, Done done) override {
    asked = rel;
    pending = std::move(done);
    called.set_value();  // publishes asked and pending to the test's thread
  }
  [[nodiscard]] bool batch_running(const std::string& rel) const override {
    return batch_dir_of(rel) == "many";
  }
  std::string asked;
  Done pending;
  std::promise<void> called;
};

TEST_F(BatchTest, AnOpenDuringItsBatchsPublicationWaitsForItInsteadOfReadingTheCrc) {
  copy_in_an_earlier_mount("many", {name(5)});  // its batch stages the whole directory
  // A new core over the same cache, whose materializer says the batch of "many" runs now.
  Publishing mat;
  make_core(mat);
  const uint64_t id = lookup(lookup(StageFsCore::kRootId, "many"), name(5));
  std::promise<stage::Result<OpenFile>> answer;
  core_->open_async(id, O_RDONLY, Caller{},
                    [&](stage::Result<OpenFile> r) { answer.set_value(std::move(r)); });
  auto f = answer.get_future();
  // The core asks for the batch (on its completion pool); 60 s is only a bound.
  ASSERT_EQ(mat.called.get_future().wait_for(std::chrono::seconds(60)), std::future_status::ready);
  EXPECT_EQ(mat.asked, "many/" + name(5));
  EXPECT_EQ(f.wait_for(std::chrono::seconds(0)), std::future_status::timeout);  // waiting, not read back
  EXPECT_EQ(core_->copy_counters().verified.load(), 0U);
  // The batch ends: it tells the core what it published, then answers.
  core_->copies_made(cache_->added_in("many", {name(5)}));
  mat.pending({});
  auto r = f.get();
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(read_fd(r->fd.get()), small_[5]);
  core_->release(r->pinned);
  EXPECT_EQ(core_->copy_counters().verified.load(), 0U);
  core_->stop();
  core_.reset();
}

// A node id stands for one version of a file. After the source changed, getattr of the old id
// (an fstat on a handle of it, once the kernel's attributes expired) gives that version's size
// and times, not the new file's: the kernel sizes the handle's reads by them.
TEST_F(BatchTest, AnOldIdKeepsTheSizeAndTimesOfItsVersion) {
  Mount mount(*this, *source_, config());
  make_core(mount.group);
  const uint64_t dir = lookup(StageFsCore::kRootId, "many");
  const uint64_t old_id = lookup(dir, "large.bin");
  auto before = core_->getattr(old_id);
  ASSERT_TRUE(before) << before.error().message;
  auto r = core_->open(old_id, O_RDONLY);
  ASSERT_TRUE(r) << r.error().message;
  rewrite(path("src/many/large.bin"), "short");  // same inode: new size, mtime and ctime
  auto now = core_->getattr(old_id);
  ASSERT_TRUE(now) << now.error().message;
  EXPECT_EQ(now->st_size, static_cast<off_t>(large_.size())) << "the old id reports the new file's size";
  EXPECT_EQ(stage::to_ns(now->st_mtim), stage::to_ns(before->st_mtim));
  EXPECT_EQ(stage::to_ns(now->st_ctim), stage::to_ns(before->st_ctim));
  EXPECT_EQ(read_fd(r->fd.get()), large_);  // its handle reads the old version, whole
  core_->release(r->pinned);
  const uint64_t new_id = lookup(dir, "large.bin");
  EXPECT_NE(new_id, old_id);
  auto fresh = core_->getattr(new_id);
  ASSERT_TRUE(fresh) << fresh.error().message;
  EXPECT_EQ(fresh->st_size, 5);
  // The name now a directory, then gone: the old id is still the file its holders read (a
  // directory's attributes would make the kernel mark their inode bad: EIO on every read).
  for (bool dir_there : {true, false}) {
    fs::remove(path("src/many/large.bin"));
    if (dir_there) fs::create_directory(path("src/many/large.bin"));
    auto old = core_->getattr(old_id);
    ASSERT_TRUE(old) << old.error().message;
    EXPECT_TRUE(S_ISREG(old->st_mode));
    EXPECT_EQ(old->st_size, static_cast<off_t>(large_.size()));
    EXPECT_EQ(stage::to_ns(old->st_mtim), stage::to_ns(before->st_mtim));
    EXPECT_EQ(old->st_mode & 07777, before->st_mode & 07777);
    EXPECT_EQ(old->st_uid, before->st_uid);
  }
  mount.end();
}

// A copy from an earlier mount is read back for its CRC on the core's verifier threads, once
// however many opens ask: the opens of that copy wait for the one read, and the completion
// pool (here one thread) keeps answering other files meanwhile. The read-backs are held by the
// core's CopyReader (a fake), so nothing depends on timing.
class NoCopies final : public Materializer {
 public:
  void materialize_async(const std::string& rel, const Want&, Done done) override {
    asked.push_back(rel);  // the completion pool's one thread
    done(stage::sys_error(EIO, "no copies in this test", rel));
  }
  std::vector<std::string> asked;
};

// A core over the cache (into `core`) whose CRC read-backs (it is their CopyReader) wait until
// let_go(), with one completion thread and NoCopies as its materializer. Its end lets them go
// and stops the core before the answers and the materializer go, however the test ends.
class HeldReadBacks final : public CopyReader {
 public:
  HeldReadBacks(std::unique_ptr<StageFsCore>& core, const std::string& src, NodeCache& cache,
                int verify_threads = 2)
      : core_(core) {
    CoreConfig cc{src, StallPolicy::eio};
    cc.completion_threads = 1;
    cc.verify_threads = verify_threads;
    auto c = StageFsCore::create(cc, cache, mat, *this);
    if (c)
      core_ = std::move(c.value());
    else
      ADD_FAILURE() << c.error().message;
  }
  ~HeldReadBacks() override {
    let_go();
    core_.reset();  // stopped and gone with the reader it uses
  }
  stage::Result<uint64_t> crc(int fd, const std::string& rel) override {
    {
      std::unique_lock lk(m_);
      started_.push_back(rel);
      cv_.notify_all();
      cv_.wait(lk, [&] { return go_; });
      if (unreadable_.contains(rel)) return stage::sys_error(EIO, "read back (injected)", rel);
    }
    return disk_copy_reader().crc(fd, rel);
  }
  void stopping() override { let_go(); }  // a stop lets the held read-backs go
  HeldReadBacks(const HeldReadBacks&) = delete;
  HeldReadBacks& operator=(const HeldReadBacks&) = delete;
  // Whether n read-backs have started (60 s is only a bound).
  bool started(size_t n) {
    std::unique_lock lk(m_);
    return cv_.wait_for(lk, std::chrono::seconds(60), [&] { return started_.size() >= n; });
  }
  std::vector<std::string> names() {
    std::lock_guard lk(m_);
    return started_;
  }
  void let_go() {
    std::lock_guard lk(m_);
    go_ = true;
    cv_.notify_all();
  }
  // The read-back of rel's copy fails as an I/O error would (before the core starts).
  void unreadable(const std::string& rel) {
    std::lock_guard lk(m_);
    unreadable_.insert(rel);
  }
  std::future<stage::Result<OpenFile>> open(uint64_t id) {
    auto& p = answers_.emplace_back();  // a deque: the promises already handed out stay put
    core_->open_async(id, O_RDONLY, Caller{}, [&p](stage::Result<OpenFile> r) { p.set_value(std::move(r)); });
    return p.get_future();
  }
  NoCopies mat;

 private:
  std::unique_ptr<StageFsCore>& core_;
  std::mutex m_;
  std::condition_variable cv_;
  std::vector<std::string> started_;
  bool go_ = false;
  std::set<std::string> unreadable_;
  std::deque<std::promise<stage::Result<OpenFile>>> answers_;
};

TEST_F(BatchTest, CrcReadBacksRunApartFromOtherOpensAndOncePerCopy) {
  fs::create_directories(path("src/big"));
  const std::string a = random_bytes(3 * kSmall, 7), b = random_bytes(2 * kSmall, 8);
  write_file(path("src/big/a"), a);
  write_file(path("src/big/b"), b);
  write_file(path("src/big/c"), random_bytes(2 * kSmall, 9));
  copy_in_an_earlier_mount("big", {"a", "b"});
  HeldReadBacks held(core_, path("src"), *cache_);
  ASSERT_TRUE(core_);
  const uint64_t dir = lookup(StageFsCore::kRootId, "big");
  const uint64_t ida = lookup(dir, "a"), idb = lookup(dir, "b"), idc = lookup(dir, "c");
  auto a1 = held.open(ida);
  auto b1 = held.open(idb);
  ASSERT_TRUE(held.started(2)) << "the read-backs did not both start: they hold the completion pool";
  auto a2 = held.open(ida);
  auto a3 = held.open(ida);
  auto c1 = held.open(idc);
  // The pool's one thread took a2 and a3 before c1: c1's answer means they have been seen.
  ASSERT_EQ(c1.wait_for(std::chrono::seconds(60)), std::future_status::ready)
      << "an open of another file waited for the CRC read-backs";
  auto rc = c1.get();
  ASSERT_FALSE(rc);
  EXPECT_EQ(rc.error().to_errno(), EIO);
  EXPECT_EQ(held.mat.asked, std::vector<std::string>{"big/c"});
  EXPECT_EQ(core_->copy_counters().verify_waits.load(), 2U);
  EXPECT_EQ(a2.wait_for(std::chrono::seconds(0)), std::future_status::timeout) << "served before its CRC was read";
  held.let_go();
  for (auto* f : {&a1, &a2, &a3, &b1}) {
    ASSERT_EQ(f->wait_for(std::chrono::seconds(60)), std::future_status::ready)
        << "an open was never answered";
    auto r = f->get();
    ASSERT_TRUE(r) << r.error().message;
    EXPECT_EQ(read_fd(r->fd.get()), f == &b1 ? b : a);
    EXPECT_TRUE(r->cache_hit);
    core_->release(r->pinned);
  }
  auto checked = held.names();
  std::sort(checked.begin(), checked.end());
  EXPECT_EQ(checked, (std::vector<std::string>{"big/a", "big/b"})) << "a copy was read back more than once";
  EXPECT_EQ(core_->copy_counters().verified.load(), 2U);
  EXPECT_EQ(core_->counters().materializations.load(), 1U);  // c only
}

// Three opens of a copy (ida) while its read-back is held (the first starts it; the two others are
// known to wait for it once an open of another file (idc), answered by the pool's one thread
// after them, is answered), then the read-back is let go. Each must be answered with NoCopies' EIO: sent
// on to a new copy, not served.
void three_opens_go_to_new_copies(HeldReadBacks& held, uint64_t ida, uint64_t idc, const char* served) {
  std::vector<std::future<stage::Result<OpenFile>>> f;
  f.push_back(held.open(ida));
  ASSERT_TRUE(held.started(1));  // the read-back runs before the others ask
  f.push_back(held.open(ida));
  f.push_back(held.open(ida));
  auto c = held.open(idc);
  ASSERT_EQ(c.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  held.let_go();
  for (auto& x : f) {
    ASSERT_EQ(x.wait_for(std::chrono::seconds(60)), std::future_status::ready)
        << "an open was never answered";
    auto r = x.get();
    ASSERT_FALSE(r) << served;
    EXPECT_EQ(r.error().to_errno(), EIO);
  }
}

// A corrupted copy from an earlier mount, asked for by three opens while its one read-back
// runs: it is removed once, and every one of them goes on to a new copy; none reads it back.
TEST_F(BatchTest, ACorruptedCopyFoundByOneReadBackSendsItsWaitersToANewCopy) {
  fs::create_directories(path("src/big"));
  write_file(path("src/big/a"), random_bytes(3 * kSmall, 7));
  write_file(path("src/big/c"), random_bytes(2 * kSmall, 9));
  copy_in_an_earlier_mount("big", {"a"});
  {  // one byte of the copy changed, its times kept: to the cache's validity rule it is current
    stage::Fd f(::open((cache_->store_root() + "/big/a").c_str(), O_RDWR | O_CLOEXEC));
    ASSERT_TRUE(f.valid());
    struct stat st {};
    ASSERT_EQ(::fstat(f.get(), &st), 0);
    char byte = 0;
    ASSERT_EQ(::pread(f.get(), &byte, 1, 1000), 1);
    byte = static_cast<char>(~byte);
    ASSERT_EQ(::pwrite(f.get(), &byte, 1, 1000), 1);
    const struct timespec times[2] = {st.st_atim, st.st_mtim};
    ASSERT_EQ(::futimens(f.get(), times), 0);
  }
  HeldReadBacks held(core_, path("src"), *cache_);
  ASSERT_TRUE(core_);
  const uint64_t dir = lookup(StageFsCore::kRootId, "big");
  ASSERT_NO_FATAL_FAILURE(
      three_opens_go_to_new_copies(held, lookup(dir, "a"), lookup(dir, "c"), "a corrupted copy was served"));
  EXPECT_EQ(held.names().size(), 1U);
  EXPECT_EQ(core_->copy_counters().corrupt.load(), 1U);
  EXPECT_EQ(core_->copy_counters().verify_waits.load(), 2U);
  EXPECT_EQ(held.mat.asked, (std::vector<std::string>{"big/c", "big/a", "big/a", "big/a"}));
  EXPECT_FALSE(fs::exists(cache_->store_root() + "/big/a")) << "the corrupted copy was left in the cache";
}

// A mount that stops while a read-back runs and another waits for a verifier: the running one
// ends (a read in progress is not cut), the waiting one is never started, and its open is
// answered ESHUTDOWN instead of holding the unmount for the read of a whole copy.
TEST_F(BatchTest, AStopAnswersTheReadBacksNotStartedWithoutReadingThem) {
  fs::create_directories(path("src/big"));
  const std::string a = random_bytes(3 * kSmall, 7);
  write_file(path("src/big/a"), a);
  write_file(path("src/big/b"), random_bytes(2 * kSmall, 8));
  copy_in_an_earlier_mount("big", {"a", "b"});
  HeldReadBacks held(core_, path("src"), *cache_, /*verify_threads=*/1);
  ASSERT_TRUE(core_);
  const uint64_t dir = lookup(StageFsCore::kRootId, "big");
  auto fa = held.open(lookup(dir, "a"));
  ASSERT_TRUE(held.started(1));  // the one verifier holds a's read-back: b's waits behind it
  auto fb = held.open(lookup(dir, "b"));
  std::thread stopper([&] { core_->stop(); });  // lets a's read-back go once none may start
  stopper.join();
  ASSERT_EQ(fa.wait_for(std::chrono::seconds(0)), std::future_status::ready);
  ASSERT_EQ(fb.wait_for(std::chrono::seconds(0)), std::future_status::ready)
      << "the stop left an open unanswered";
  auto ra = fa.get();
  ASSERT_TRUE(ra) << ra.error().message;
  EXPECT_EQ(read_fd(ra->fd.get()), a);
  core_->release(ra->pinned);
  auto rb = fb.get();
  ASSERT_FALSE(rb) << "a read-back started after the stop";
  EXPECT_EQ(rb.error().to_errno(), ESHUTDOWN);
  EXPECT_EQ(held.names(), std::vector<std::string>{"big/a"});
  EXPECT_TRUE(held.mat.asked.empty());
  EXPECT_TRUE(fs::exists(cache_->store_root() + "/big/b")) << "a copy that was not read was removed";
}

// A copy whose read-back fails (an I/O error on the cache's disk), asked for by three opens:
// it is removed (nothing is served from a disk that cannot read it), and every one of them
// goes on to a new copy; none reads it back again.
TEST_F(BatchTest, AnUnreadableCopySendsItsWaitersToANewCopy) {
  fs::create_directories(path("src/big"));
  write_file(path("src/big/a"), random_bytes(3 * kSmall, 7));
  write_file(path("src/big/c"), random_bytes(2 * kSmall, 9));
  copy_in_an_earlier_mount("big", {"a"});
  HeldReadBacks held(core_, path("src"), *cache_);
  ASSERT_TRUE(core_);
  held.unreadable("big/a");
  const uint64_t dir = lookup(StageFsCore::kRootId, "big");
  ASSERT_NO_FATAL_FAILURE(three_opens_go_to_new_copies(held, lookup(dir, "a"), lookup(dir, "c"),
                                                       "a copy that could not be read back was served"));
  EXPECT_EQ(held.names().size(), 1U);
  EXPECT_EQ(core_->copy_counters().corrupt.load(), 0U);  // not counted as corrupted: it was not read
  EXPECT_EQ(core_->copy_counters().verified.load(), 0U);
  EXPECT_EQ(held.mat.asked, (std::vector<std::string>{"big/c", "big/a", "big/a", "big/a"}));
  EXPECT_FALSE(fs::exists(cache_->store_root() + "/big/a")) << "the unreadable copy was left in the cache";
}

// Bounded batches and fairness between users. Names that sort as numbers.
std::string huge_name(int i) {
  std::string n = std::to_string(i);
  return "h" + std::string(4 - n.size(), '0') + n;
}

// The mount's source reader, counting the small files its batch scans listed (checked with
// a stat): what each batch costs on the source and in every node's decision.
class CountingScans final : public stage::SourceReader {
 public:
  explicit CountingScans(BeneathSource& real) : real_(real) {}
  stage::Result<stage::Manifest> scan(const std::string& p, bool rec, const SkipFn& skip) override {
    return real_.scan(p, rec, skip);
  }
  stage::Result<stage::Selection> scan_selection(const std::string& dir, uint64_t max,
                                                 const stage::SelectionSlice& slice) override {
    auto r = real_.scan_selection(dir, max, slice);
    if (r) listed += r->manifest.entries.size() - 1;  // the directory's own entry left out
    return r;
  }
  stage::Result<std::vector<std::string>> list_dirs(const std::string& dir, size_t max) override {
    return real_.list_dirs(dir, max);
  }
  stage::Result<std::unique_ptr<stage::SourceFile>> open(const std::string& root,
                                                         const stage::Entry& e) override {
    return real_.open(root, e);
  }
  std::atomic<uint64_t> listed{0};

 private:
  BeneathSource& real_;
};

// One user's open of a file in a directory of 1,000 small files, with batches of at most 100
// files: ten slices, the opened file in the first; another user's open that asked during the
// first slice is served right after it, before the other nine.
TEST_F(BatchTest, AHugeDirectoryGoesInBoundedSlicesWithAnotherUsersOpenServedBetween) {
  constexpr int kFiles = 1000;
  fs::create_directories(path("src/huge"));
  for (int i = 0; i < kFiles; ++i) write_file(path("src/huge/" + huge_name(i)), std::string(100, 'a'));
  std::vector<std::string> order;  // the service thread's, read after the mount's end
  std::promise<stage::Status> other;
  GroupService* g = nullptr;
  auto cfg = config();
  cfg.batch_max_files = 100;
  group_hooks(cfg).on_before_batch = [&](const std::string& dir, const stage::SelectionSlice&, bool) {
    order.push_back("batch " + dir);
    if (order.size() == 1)  // another user's open while the first slice runs
      g->materialize_async("many/large.bin", Want{2000, false},
                           [&](stage::Status st) { other.set_value(st); });
  };
  group_hooks(cfg).on_before_transfer = [&](const std::string& rel, bool) {
    order.push_back("file " + rel);
    return stage::Status{};
  };
  BatchEnds ends;
  ends.count_in(cfg);
  Mount mount(*this, *source_, cfg);
  g = &mount.group;
  make_core(mount.group);
  const uint64_t dir = lookup(StageFsCore::kRootId, "huge");
  auto r = core_->open(lookup(dir, huge_name(567)), O_RDONLY, Caller{1000, 1000, {}});
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(read_fd(r->fd.get()), std::string(100, 'a'));
  core_->release(r->pinned);
  auto done = other.get_future();
  ASSERT_EQ(done.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  EXPECT_TRUE(done.get().ok());
  ASSERT_TRUE(ends.wait_for(10));
  mount.end();
  ASSERT_EQ(order.size(), 11U);
  EXPECT_EQ(order[0], "batch huge");
  EXPECT_EQ(order[1], "file many/large.bin");
  EXPECT_EQ(std::count(order.begin(), order.end(), "batch huge"), 10);
  const auto s = mount.group.stats();
  EXPECT_EQ(s.batches, 10U);
  EXPECT_EQ(s.batch_files, static_cast<uint64_t>(kFiles));
  for (int i = 0; i < kFiles; i += 97) EXPECT_TRUE(fs::exists(path("cache/data/huge/" + huge_name(i)))) << i;
  EXPECT_TRUE(fs::exists(path("cache/data/huge/" + huge_name(kFiles - 1))));
}

// A new file in a big directory already staged costs a slice around it, and one more that
// finds nothing to copy: not a check of every name of the directory.
TEST_F(BatchTest, ANewFileInAStagedHugeDirectoryChecksASliceNotEveryName) {
  constexpr int kFiles = 1000;
  fs::create_directories(path("src/huge"));
  for (int i = 0; i < kFiles; ++i) write_file(path("src/huge/" + huge_name(i)), std::string(100, 'b'));
  CountingScans counting(*source_);
  auto cfg = config();
  cfg.batch_max_files = 100;
  BatchEnds ends;
  ends.count_in(cfg);
  Mount mount(*this, counting, cfg);
  make_core(mount.group);
  const uint64_t dir = lookup(StageFsCore::kRootId, "huge");
  EXPECT_EQ(open_and_read(lookup(dir, huge_name(0))), std::string(100, 'b'));
  ASSERT_TRUE(ends.wait_for(10));  // the whole directory, in ten slices
  // ... and completed (the group counts a batch done after its after_batch hook): an open
  // that looked into the cache before that would be answered by it and go alone.
  ASSERT_TRUE(mount.group.wait_for_epoch(10, std::chrono::seconds(60)));
  ASSERT_EQ(mount.group.epoch(), 10U);
  EXPECT_EQ(counting.listed.load(), static_cast<uint64_t>(kFiles));
  write_file(path("src/huge/h9999"), "new");
  EXPECT_EQ(open_and_read(lookup(dir, "h9999")), "new");
  ASSERT_TRUE(ends.wait_for(12));
  mount.end();
  EXPECT_EQ(mount.group.stats().batches, 12U);  // the new file's slice, then one with nothing new
  EXPECT_EQ(counting.listed.load(), static_cast<uint64_t>(kFiles) + 200U);
}

// Waits (60 s is only a bound) until the group counts n budget stops.
bool wait_budget_stops(GroupService& g, uint64_t n) {
  return g.wait_for_budget_stops(n, std::chrono::seconds(60));
}

size_t cached_in(const std::string& dir) {
  if (!fs::exists(dir)) return 0;
  return static_cast<size_t>(std::distance(fs::directory_iterator(dir), fs::directory_iterator()));
}

// One open in a directory of 1,000 empty files, with batches of at most 100 files and a
// budget of 250 files: its batch and the slices that follow list 250 files (the last slice
// only what is left), then stop; an empty file counts (it is not free in the cache).
TEST_F(BatchTest, OneOpenInAHugeDirectoryOfEmptyFilesStagesItsBudgetNotTheDirectory) {
  fs::create_directories(path("src/empty"));
  for (int i = 0; i < 1000; ++i) write_file(path("src/empty/" + huge_name(i)), "");
  auto cfg = config();
  cfg.batch_max_files = 100;
  cfg.prefetch_max_files = 250;
  cfg.file_charge = kCopyCharge;
  Mount mount(*this, *source_, cfg);
  make_core(mount.group);
  EXPECT_EQ(open_and_read(lookup(lookup(StageFsCore::kRootId, "empty"), huge_name(567))), "");
  ASSERT_TRUE(wait_budget_stops(mount.group, 1));
  mount.end();
  EXPECT_EQ(cached_in(path("cache/data/empty")), 250U);
  EXPECT_EQ(mount.group.stats().batches, 3U);  // 100, 100, then the 50 left
}

// A walk counts its files too: with a budget of 250 files (or of 4 KiB: one empty file's copy
// is charged 8 KiB), the walk over three directories of 300 empty files stops after 250 files
// (the last slice listing only what is left), or one; the rest waits for its own opens.
TEST_F(BatchTest, AWalkOfEmptyFilesStopsAtItsFileOrByteBudget) {
  for (const char* d : {"w/a", "w/b", "w/c", "w/d", "w/e"}) {  // the reader's two, then three to prefetch
    fs::create_directories(path("src/") + d);
    for (int i = 0; i < (d[2] < 'c' ? 1 : 300); ++i) write_file(path("src/") + d + "/" + huge_name(i), "");
  }
  for (bool by_bytes : {false, true}) {
    SCOPED_TRACE(by_bytes ? "byte budget" : "file budget");
    fs::remove_all(path("cache/data/w"));
    auto cfg = config();
    cfg.batch_max_files = 100;
    cfg.prefetch_max_files = by_bytes ? 0 : 250;
    cfg.prefetch_max_bytes = by_bytes ? 4096 : 0;
    cfg.file_charge = kCopyCharge;
    Mount mount(*this, *source_, cfg);
    make_core(mount.group);
    const uint64_t w = lookup(StageFsCore::kRootId, "w");
    for (const char* d : {"a", "b"}) EXPECT_EQ(open_and_read(lookup(lookup(w, d), huge_name(0))), "") << d;
    ASSERT_TRUE(wait_budget_stops(mount.group, 1));
    mount.end();
    size_t prefetched = 0;
    for (const char* d : {"c", "d", "e"}) prefetched += cached_in(path("cache/data/w/") + d);
    EXPECT_EQ(prefetched, by_bytes ? 1U : 250U);
  }
}

// A walk prefetches at most prefetch_max_dirs subdirectories of its parent.
TEST_F(BatchTest, AWalkPrefetchesAtMostItsBudgetOfDirectories) {
  for (const char* d : {"w/a", "w/b", "w/c", "w/d", "w/e", "w/f"}) small_dir(d, {"f0", "f1"});
  auto cfg = config();
  cfg.prefetch_max_dirs = 2;
  Mount mount(*this, *source_, cfg);
  make_core(mount.group);
  const uint64_t w = lookup(StageFsCore::kRootId, "w");
  for (const char* d : {"a", "b"}) EXPECT_EQ(open_and_read(lookup(lookup(w, d), "f1")), small_[1]) << d;
  mount.end();
  const auto s = mount.group.stats();
  EXPECT_EQ(s.walks, 1U);
  EXPECT_EQ(s.prefetch_queued, 2U);
}

// Forty names of one file (hard links) prefetched at once, as `stagectl prefetch` of their
// directory asks: one transfer; each name's open then reads that one copy.
TEST_F(BatchTest, FortyNamesOfOneFileCostOneTransfer) {
  fs::create_directories(path("src/links"));
  write_file(path("src/links/" + name(0)), large_);  // not small: a transfer of its own
  for (int i = 1; i < 40; ++i)
    fs::create_hard_link(path("src/links/" + name(0)), path("src/links/" + name(i)));
  Mount mount(*this, *source_, config());
  make_core(mount.group);
  const uint64_t d = lookup(StageFsCore::kRootId, "links");
  std::vector<uint64_t> ids;
  for (int i = 0; i < 40; ++i) ids.push_back(lookup(d, name(i)));
  std::vector<std::promise<stage::Status>> done(40);
  for (size_t i = 0; i < ids.size(); ++i)
    core_->prefetch_async(ids[i], Caller{1000, 1000, {}},
                          [&done, i](stage::Status st) { done[i].set_value(st); });
  for (auto& p : done) {
    auto f = p.get_future();
    ASSERT_EQ(f.wait_for(std::chrono::seconds(60)), std::future_status::ready);
    const stage::Status st = f.get();
    EXPECT_TRUE(st.ok()) << st.error().message;
  }
  for (uint64_t id : ids) EXPECT_EQ(open_and_read(id), large_);
  mount.end();
  EXPECT_EQ(mount.group.stats().transfers, 1U);
}

}  // namespace
}  // namespace stagefs
