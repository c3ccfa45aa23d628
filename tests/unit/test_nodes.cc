// The node table (fusefs/core/nodes.h): paths built from parents (each node holds one name), a
// parent kept while children need it whatever order forgets come in, new versions, and every
// node a user's lookup creates counted against that user's budget (UserBytes), shared with
// the listings, given back when forgotten; through StageFsCore, a user past the budget gets
// ENOMEM while other users and root go on.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "core_fixture.h"
#include "fusefs/core/nodes.h"

namespace stagefs {
namespace {

namespace fs = std::filesystem;

struct stat dir_stat() {
  struct stat st {};
  st.st_mode = S_IFDIR | 0755;
  return st;
}

struct stat file_stat(off_t size, long mtime) {
  struct stat st {};
  st.st_mode = S_IFREG | 0644;
  st.st_size = size;
  st.st_mtim.tv_sec = mtime;
  st.st_ino = 42;
  return st;
}

int err(const stage::Result<uint64_t>& r) {
  return r ? 0 : r.error().to_errno();
}

TEST(NodeTableTest, PathsComeFromParentsWhateverOrderForgetsCome) {
  NodeTable t(nullptr);
  const uint64_t a = t.note_lookup(NodeTable::kRootId, "a", dir_stat(), 0).value();
  const uint64_t b = t.note_lookup(a, "b", dir_stat(), 0).value();
  const uint64_t f = t.note_lookup(b, "f", file_stat(10, 1), 0).value();
  EXPECT_EQ(t.path_of(f).value(), "a/b/f");
  EXPECT_EQ(t.path_of(NodeTable::kRootId).value(), "");
  EXPECT_EQ(t.note_lookup(b, "f", file_stat(10, 1), 0).value(), f);  // the same version: the same id
  // The kernel forgets the directories first (forgets of one batch run on several threads):
  // the file keeps its path, and the directories go with it.
  EXPECT_TRUE(t.forget(a, 1).empty());
  EXPECT_TRUE(t.forget(b, 1).empty());
  EXPECT_EQ(t.path_of(f).value(), "a/b/f");
  EXPECT_TRUE(t.forget(f, 1).empty());  // looked up twice
  EXPECT_EQ(t.forget(f, 1), (std::vector<uint64_t>{f, b, a}));
  EXPECT_EQ(t.size(), 1U);  // the root
  EXPECT_EQ(err(t.note_lookup(b, "g", file_stat(1, 1), 0)), ESTALE);
}

TEST(NodeTableTest, ANewVersionGetsANewIdAndTheOldOneKeepsItsPath) {
  NodeTable t(nullptr);
  const uint64_t d = t.note_lookup(NodeTable::kRootId, "d", dir_stat(), 0).value();
  const uint64_t v1 = t.note_lookup(d, "f", file_stat(10, 1), 0).value();
  const uint64_t v2 = t.note_lookup(d, "f", file_stat(20, 2), 0).value();
  EXPECT_NE(v1, v2);
  EXPECT_EQ(t.info(v1).value().version.size, 10U);
  EXPECT_EQ(t.info(v2).value().version.size, 20U);
  EXPECT_EQ(t.forget(v1, 1), (std::vector<uint64_t>{v1}));            // the old one goes alone ...
  EXPECT_EQ(t.note_lookup(d, "f", file_stat(20, 2), 0).value(), v2);  // ... the name still finds the new
  EXPECT_EQ(t.path_of(v2).value(), "d/f");
}

TEST(NodeTableTest, EachUsersNodesCountAgainstItsBudgetUntilForgotten) {
  const std::string name(250, 'n');
  const uint64_t per = NodeTable::node_bytes(name);
  EXPECT_GT(per, 500U);
  EXPECT_LT(per, 1000U);  // near the kernel's own dentry and inode
  auto budget = std::make_shared<UserBytes>(10 * per);
  NodeTable t(budget);
  std::vector<uint64_t> ids;
  for (int i = 0; i < 10; ++i)
    ids.push_back(t.note_lookup(NodeTable::kRootId, name + std::to_string(i), file_stat(1, 1), 1000).value());
  const auto over = t.note_lookup(NodeTable::kRootId, name + "x", file_stat(1, 1), 1000);
  ASSERT_FALSE(over);
  EXPECT_EQ(over.error().to_errno(), ENOMEM);
  EXPECT_NE(over.error().message.find("uid 1000"), std::string::npos) << over.error().message;
  EXPECT_EQ(t.note_lookup(NodeTable::kRootId, name + "0", file_stat(1, 1), 1000).value(), ids[0]);  // held
  EXPECT_TRUE(t.note_lookup(NodeTable::kRootId, name + "x", file_stat(1, 1), 1001));  // another user
  EXPECT_TRUE(t.note_lookup(NodeTable::kRootId, name + "y", file_stat(1, 1), 0));     // root: not counted
  EXPECT_EQ(budget->used(1000), 10 * per);
  EXPECT_EQ(budget->used(0), 0U);
  t.forget(ids[3], 1);  // looked up once ...
  t.forget(ids[0], 2);  // ... and twice
  EXPECT_EQ(budget->used(1000), 8 * per);
  EXPECT_TRUE(t.note_lookup(NodeTable::kRootId, name + "z", file_stat(1, 1), 1000));
}

// Through the core: a user whose listings and lookups reach the budget gets ENOMEM for new
// names (READDIRPLUS: entries without attributes), others do not; forgetting gives it back.
class CoreBudgetTest : public testing::CoreFixture {
 protected:
  void SetUp() override {
    CoreFixture::SetUp();
    fs::create_directories(path("src/d"));
    for (int i = 0; i < 40; ++i)
      write_file(path("src/d/" + std::string(200, static_cast<char>('a' + i % 26)) + std::to_string(i)), "");
    CoreConfig cfg;
    cfg.listing_bytes_per_user = 20 * NodeTable::node_bytes(std::string(203, 'a')) + 16 * 1024;
    make_core(cfg);
  }
};

TEST_F(CoreBudgetTest, AUserPastItsBudgetGetsEnomemAndOthersGoOn) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root (two users)";
  const Caller user{1000, 1000, {}};
  const Caller other{1001, 1001, {}};
  auto d = core_->lookup(StageFsCore::kRootId, "d", user);
  ASSERT_TRUE(d);
  auto listing = core_->readdir(d->first, user);  // its listing counts too
  ASSERT_TRUE(listing);
  const auto looked = core_->lookup_many(d->first, *listing.value(), user);
  size_t with_attrs = 0;
  for (const auto& l : looked) with_attrs += l ? 1 : 0;
  EXPECT_GT(with_attrs, 5U);
  EXPECT_LT(with_attrs, 40U) << "the budget stopped nothing";  // 40 files, "." and ".."
  std::string refused;
  for (size_t i = 0; i < looked.size(); ++i)
    if (!looked[i] && (*listing.value())[i].name.size() > 2) refused = (*listing.value())[i].name;
  ASSERT_FALSE(refused.empty());
  auto again = core_->lookup(d->first, refused, user);
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error().to_errno(), ENOMEM);
  EXPECT_TRUE(core_->lookup(d->first, refused, other)) << "another user's lookups are not affected";
  EXPECT_TRUE(core_->lookup(d->first, refused, Caller{}));  // root
  // The kernel forgets what the user's listing looked up: room again.
  for (const auto& l : looked)
    if (l) core_->forget(l->first, 1);
  EXPECT_TRUE(core_->lookup(d->first, refused, user));
}

}  // namespace
}  // namespace stagefs
