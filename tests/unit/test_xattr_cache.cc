// XattrCache alone (loads counted by fake loaders), then through StageFsCore over a real
// source directory: absent names cost no load once a node is listed, and a changed source is
// seen again at the next lookup or getattr. The status attributes on the root, and the
// access check that decides what they name for a caller.
#include <gtest/gtest.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <map>

#include "core_fixture.h"
#include "fusefs/cache/cache.h"
#include "fusefs/core/core.h"
#include "fusefs/edge/status.h"
#include "fusefs/core/xattr_cache.h"
#include "tmpdir.h"

namespace stagefs {
namespace {

using stage::testing::TmpDirTest;
namespace fs = std::filesystem;

std::string names(std::initializer_list<const char*> l) {
  std::string s;
  for (const char* n : l) (s += n) += '\0';
  return s;
}

int err(const stage::Result<std::string>& r) {
  return r ? 0 : r.error().to_errno();
}

// A source getxattr: counts calls, answers `values`, else `absent_err`.
struct FakeSource {
  std::map<std::string, std::string> values;
  int absent_err = ENODATA;
  int reads = 0;
  XattrCache::Load value(const std::string& name) {
    return [this, name]() -> stage::Result<std::string> {
      ++reads;
      if (auto it = values.find(name); it != values.end()) return it->second;
      return stage::sys_error(absent_err, "getxattr", name);
    };
  }
};

TEST(XattrCacheTest, ListsOnceAndAnswersAbsentNamesWithoutLoading) {
  XattrCache c;
  FakeSource src{{{"user.a", "v"}}};
  int lists = 0;
  auto list = [&]() -> stage::Result<std::string> {
    ++lists;
    return names({"user.a"});
  };
  c.observe(7, 100, 1);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(err(c.get(7, "security.selinux", list, src.value("security.selinux"))), ENODATA);
    EXPECT_EQ(c.get(7, "user.a", list, src.value("user.a")).value(), "v");
    EXPECT_EQ(c.list(7, list).value(), names({"user.a"}));
  }
  EXPECT_EQ(lists, 1);
  EXPECT_EQ(src.reads, 2);  // what an absent name gets on device 1, and user.a's value
  c.observe(7, 100, 1);     // same ctime: kept
  EXPECT_EQ(c.get(7, "user.a", list, src.value("user.a")).value(), "v");
  EXPECT_EQ(src.reads, 2);
  c.observe(7, 101, 1);  // changed: listed and read again
  EXPECT_EQ(c.get(7, "user.a", list, src.value("user.a")).value(), "v");
  EXPECT_EQ(err(c.get(7, "security.selinux", list, src.value("security.selinux"))), ENODATA);
  EXPECT_EQ(lists, 2);
  EXPECT_EQ(src.reads, 3);
  c.forget(7);
  EXPECT_EQ(c.size(), 0U);
}

TEST(XattrCacheTest, AnAbsentNameGetsWhatItsDeviceAnswers) {
  XattrCache c;
  FakeSource nfs{{}, EOPNOTSUPP};
  auto none = []() -> stage::Result<std::string> { return std::string(); };
  for (uint64_t id = 1; id <= 3; ++id) {
    c.observe(id, 1, 10);
    EXPECT_EQ(err(c.get(id, "security.selinux", none, nfs.value("security.selinux"))), EOPNOTSUPP);
  }
  EXPECT_EQ(nfs.reads, 1);  // learnt once for device 10
  FakeSource ext4;
  c.observe(4, 1, 11);
  EXPECT_EQ(err(c.get(4, "security.selinux", none, ext4.value("security.selinux"))), ENODATA);
  EXPECT_EQ(ext4.reads, 1);
  // A filesystem that hides a name from listxattr but answers it: the value, never kept.
  FakeSource hiding{{{"lustre.lov", "x"}}};
  c.observe(5, 1, 12);
  EXPECT_EQ(c.get(5, "lustre.lov", none, hiding.value("lustre.lov")).value(), "x");
  EXPECT_EQ(c.get(5, "lustre.lov", none, hiding.value("lustre.lov")).value(), "x");
  EXPECT_EQ(hiding.reads, 2);
}

TEST(XattrCacheTest, ALoadThatRacedWithAChangeIsNotKept) {
  XattrCache c;
  int lists = 0;
  auto list = [&]() -> stage::Result<std::string> {
    if (++lists == 1) c.observe(1, 2, 1);  // the source changed while it was being listed
    return names({"user.a"});
  };
  FakeSource src{{{"user.a", "v"}}};
  auto value = src.value("user.a");
  c.observe(1, 1, 1);
  EXPECT_EQ(c.get(1, "user.a", list, value).value(), "v");
  EXPECT_EQ(c.get(1, "user.a", list, value).value(), "v");
  EXPECT_EQ(lists, 2);
}

TEST(XattrCacheTest, ErrorsAndLargeValuesAreNotKept) {
  XattrCache c;
  int lists = 0;
  int reads = 0;
  auto failing = [&]() -> stage::Result<std::string> {
    ++lists;
    return stage::sys_error(EIO, "listxattr");
  };
  auto big = [&]() -> stage::Result<std::string> {
    ++reads;
    return std::string(XattrCache::kMaxValue + 1, 'x');
  };
  EXPECT_EQ(err(c.list(1, failing)), EIO);
  EXPECT_EQ(err(c.list(1, failing)), EIO);
  EXPECT_EQ(lists, 2);
  auto list = []() -> stage::Result<std::string> { return names({"user.big"}); };
  EXPECT_EQ(c.get(2, "user.big", list, big).value().size(), XattrCache::kMaxValue + 1);
  EXPECT_EQ(c.get(2, "user.big", list, big).value().size(), XattrCache::kMaxValue + 1);
  EXPECT_EQ(reads, 2);
}

class CoreXattrTest : public testing::CoreFixture {
 protected:
  void SetUp() override {
    CoreFixture::SetUp();
    fs::create_directories(path("src/d"));
    write_file(path("src/d/f"), "data");
    ASSERT_EQ(::setxattr(path("src/d/f").c_str(), "user.k", "v1", 2, 0), 0) << "user xattrs unsupported here";
    ASSERT_EQ(::setxattr(path("src/d").c_str(), "user.k", "d1", 2, 0), 0);
    make_core();
  }
};

TEST_F(CoreXattrTest, RepeatedCallsCostNoLoadsAndChangesAreSeen) {
  auto d = core_->lookup(StageFsCore::kRootId, "d");
  ASSERT_TRUE(d);
  auto f = core_->lookup(d->first, "f");
  ASSERT_TRUE(f);
  uint64_t loads = 0;
  for (int i = 0; i < 5; ++i) {  // what `ls -l` asks of every entry
    // No label: "not supported" (ls then stops asking for this device), not ENODATA.
    EXPECT_EQ(err(core_->getxattr(f->first, "security.selinux")), EOPNOTSUPP);
    EXPECT_EQ(err(core_->getxattr(f->first, "system.posix_acl_access")), ENODATA);
    EXPECT_EQ(core_->getxattr(f->first, "user.k").value(), "v1");
    if (i == 0) loads = core_->xattr_stats().loads;
  }
  EXPECT_EQ(core_->xattr_stats().loads, loads);  // nothing after the first round
  write_file(path("src/d/g"), "");
  auto g = core_->lookup(d->first, "g");
  ASSERT_TRUE(g);
  EXPECT_EQ(err(core_->getxattr(g->first, "security.selinux")), EOPNOTSUPP);
  EXPECT_EQ(core_->xattr_stats().loads, loads + 1);  // g's list; the absent answer is the device's
  EXPECT_NE(core_->listxattr(f->first).value().find("user.k"), std::string::npos);

  // A changed file gets a new id at lookup: its answers are fresh.
  ASSERT_EQ(::setxattr(path("src/d/f").c_str(), "user.k", "v2", 2, 0), 0);
  auto f2 = core_->lookup(d->first, "f");
  ASSERT_TRUE(f2);
  EXPECT_EQ(core_->getxattr(f2->first, "user.k").value(), "v2");
  ASSERT_EQ(::setxattr(path("src/d/f").c_str(), "user.new", "n", 1, 0), 0);
  auto f3 = core_->lookup(d->first, "f");
  ASSERT_TRUE(f3);
  EXPECT_EQ(core_->getxattr(f3->first, "user.new").value(), "n");

  // A directory keeps its id; the changed ctime that getattr sees drops its answers.
  EXPECT_EQ(core_->getxattr(d->first, "user.k").value(), "d1");
  ASSERT_EQ(::setxattr(path("src/d").c_str(), "user.k", "d2", 2, 0), 0);
  ASSERT_TRUE(core_->getattr(d->first));
  EXPECT_EQ(core_->getxattr(d->first, "user.k").value(), "d2");
  ASSERT_EQ(::removexattr(path("src/d").c_str(), "user.k"), 0);
  ASSERT_TRUE(core_->getattr(d->first));
  EXPECT_EQ(err(core_->getxattr(d->first, "user.k")), ENODATA);
}

// A file that has an SELinux label shows it; the others answer "not supported".
TEST_F(CoreXattrTest, ALabelShowsTheOthersAreNotSupported) {
  write_file(path("src/d/labelled"), "");
  if (::setxattr(path("src/d/labelled").c_str(), "security.selinux", "u:r:t:s0", 8, 0) != 0)
    GTEST_SKIP() << "cannot set security.selinux here: " << std::strerror(errno);
  auto d = core_->lookup(StageFsCore::kRootId, "d");
  ASSERT_TRUE(d);
  auto l = core_->lookup(d->first, "labelled");
  auto f = core_->lookup(d->first, "f");
  ASSERT_TRUE(l && f);
  EXPECT_EQ(core_->getxattr(l->first, "security.selinux").value(), "u:r:t:s0");
  EXPECT_EQ(err(core_->getxattr(f->first, "security.selinux")), EOPNOTSUPP);
  EXPECT_EQ(err(core_->getxattr(f->first, "system.posix_acl_access")), ENODATA);  // the ACL check needs ENODATA
}

TEST_F(CoreXattrTest, TrustedNamesStayHiddenFromUsers) {
  ASSERT_EQ(::setxattr(path("src/d/f").c_str(), "trusted.t", "x", 1, 0), 0);
  auto d = core_->lookup(StageFsCore::kRootId, "d");
  ASSERT_TRUE(d);
  auto f = core_->lookup(d->first, "f");
  ASSERT_TRUE(f);
  const Caller user{1000, 1000, {}};
  EXPECT_EQ(core_->getxattr(f->first, "trusted.t").value(), "x");  // root, cached now
  EXPECT_EQ(err(core_->getxattr(f->first, "trusted.t", user)), ENODATA);
  EXPECT_EQ(core_->listxattr(f->first, user).value().find("trusted.t"), std::string::npos);
  EXPECT_NE(core_->listxattr(f->first).value().find("trusted.t"), std::string::npos);
}

// user.stagefs.status names the transfer in flight only to a caller who could read it through
// the mount: the directories on the way count, not only the file's own mode.
TEST_F(CoreXattrTest, StatusNamesATransferOnlyToCallersWhoMayReadIt) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root (checks as other users)";
  fs::create_directories(path("src/private"));
  fs::permissions(path("src/private"), fs::perms::owner_all);  // 0700, root's
  write_file(path("src/private/plan.bin"), "p");
  fs::permissions(path("src/private/plan.bin"), fs::perms(0644));  // readable, but out of reach
  write_file(path("src/team.bin"), "t");
  fs::permissions(path("src/team.bin"), fs::perms(0640));
  ASSERT_EQ(::chown(path("src/team.bin").c_str(), 0, 4242), 0);
  const Caller nobody{65534, 65534, {}};
  const Caller team{65534, 65534, {4242}};
  const Caller root{};
  EXPECT_TRUE(core_->may_read("d/f", nobody));
  EXPECT_TRUE(core_->may_read("", nobody));  // SOURCE_DIR itself (a batch of its small files)
  EXPECT_FALSE(core_->may_read("private/plan.bin", nobody));
  EXPECT_FALSE(core_->may_read("private", nobody));
  EXPECT_TRUE(core_->may_read("private/plan.bin", root));
  EXPECT_FALSE(core_->may_read("team.bin", nobody));
  EXPECT_TRUE(core_->may_read("team.bin", team));
  EXPECT_FALSE(core_->may_read("gone", nobody));
  EXPECT_EQ(core_->counters().denied, 0U);  // not an open: no denial counted

  // The status as the daemon answers it (show_to): a caller who cannot reach the file sees
  // that a transfer runs, neither its name nor its size.
  core_->set_control_xattr([this](const std::string& name, const Caller& who) -> std::optional<std::string> {
    if (name != "user.stagefs.status") return std::nullopt;
    MountStatus s;
    s.current = "private/plan.bin";
    s.current_done = 1;
    s.current_total = 4096;
    s.current_seconds = 0.5;
    show_to(s, *core_, who);
    return to_json(s);
  });
  const std::string hidden = core_->getxattr(StageFsCore::kRootId, "user.stagefs.status", nobody).value();
  EXPECT_EQ(hidden.find("plan"), std::string::npos) << hidden;
  EXPECT_EQ(hidden.find("4096"), std::string::npos) << hidden;
  EXPECT_NE(hidden.find(R"("transfer":{"hidden":true,"path":null})"), std::string::npos) << hidden;
  const std::string shown = core_->getxattr(StageFsCore::kRootId, "user.stagefs.status", root).value();
  EXPECT_NE(shown.find(R"("path":"private/plan.bin")"), std::string::npos) << shown;
  EXPECT_NE(shown.find(R"("bytes_total":4096)"), std::string::npos) << shown;
  EXPECT_EQ(current_source("private/"), "private");  // a batch: its directory
  EXPECT_EQ(current_source("/"), "");
}

// READDIRPLUS looks entries up in a batch: the same ids, attributes and reference counts as
// one lookup() per name; names that are not plain names, or no longer there, get nothing;
// a symlink is described, never followed.
TEST_F(CoreXattrTest, LookupManyIsLookupForEachName) {
  write_file(path("src/d/g"), "more data");
  ASSERT_EQ(::symlink("/etc/passwd", path("src/d/l").c_str()), 0);
  auto d = core_->lookup(StageFsCore::kRootId, "d");
  ASSERT_TRUE(d);
  auto f = core_->lookup(d->first, "f");
  ASSERT_TRUE(f);
  const size_t nodes = core_->node_count();
  const std::vector<std::string> names = {"f", "g", "l", "gone", "..", ".", "a/b", ""};
  std::vector<DirEntry> listing;
  for (const auto& n : names) listing.push_back(DirEntry{n, 1, 0});
  const auto got = core_->lookup_many(d->first, listing);
  ASSERT_EQ(got.size(), names.size());
  ASSERT_TRUE(got[0] && got[1] && got[2]);
  for (size_t i = 3; i < names.size(); ++i) EXPECT_FALSE(got[i]) << names[i];
  EXPECT_EQ(got[0]->first, f->first);  // the id lookup() gave
  EXPECT_EQ(got[1]->second.st_size, 9);
  EXPECT_TRUE(S_ISLNK(got[2]->second.st_mode));
  EXPECT_EQ(core_->node_count(), nodes + 2);  // g and l are new
  auto g = core_->lookup(d->first, "g");
  ASSERT_TRUE(g);
  EXPECT_EQ(g->first, got[1]->first);
  // g was counted twice (lookup_many, lookup): it goes with the second forget only.
  core_->forget(g->first, 1);
  EXPECT_EQ(core_->node_count(), nodes + 2);
  core_->forget(g->first, 1);
  EXPECT_EQ(core_->node_count(), nodes + 1);
  EXPECT_TRUE(core_->lookup_many(12345678, listing)[0] == std::nullopt);  // an unknown directory id
}

}  // namespace
}  // namespace stagefs
