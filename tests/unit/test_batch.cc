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

#include "acl.h"
#include "batch_fixture.h"
#include "bcast/comm/comm.h"
#include "bcast/io/store.h"
#include "fakes.h"
#include "fusefs/base/batch_rules.h"
#include "fusefs/base/beneath.h"
#include "fusefs/cache/cache.h"
#include "fusefs/core/core.h"
#include "fusefs/group/group.h"
#include "tmpdir.h"

namespace stagefs {
namespace {

using testing::BatchEnds;
using testing::BatchTest;
namespace fs = std::filesystem;
using testing::deny_nobody;
using testing::kSmall;
using testing::rewrite;

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
