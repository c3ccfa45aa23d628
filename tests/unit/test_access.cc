// Access checked as the caller (fusefs/base/as_caller.h) on kernels without faccessat2: a table of
// files and directories (owner, group, other, supplementary groups, POSIX ACLs that allow and
// deny, a mask, a closed parent) read by seven callers (root among them). The fallback (a
// reopen as the caller) must give faccessat2's answers, both called directly and through
// StageFsCore on a thread where a seccomp filter makes faccessat2 fail with ENOSYS, as on
// Linux before 5.8. Needs root (files of other owners, other callers' credentials).
#include <gtest/gtest.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>
#include <filesystem>
#include <thread>

#include "acl.h"
#include "core_fixture.h"
#include "fusefs/base/as_caller.h"

namespace stagefs {
namespace {

namespace fs = std::filesystem;
using testing::Ace;
using testing::acl_xattr;
using testing::kGroupAce;
using testing::kGroupObj;
using testing::kMask;
using testing::kOther;
using testing::kUser;
using testing::kUserObj;

constexpr uint32_t kOwner = 61001, kGroup = 61002, kNamedUser = 61096, kNamedGroup = 61090;

// The callers, in the order of the expected answers below.
const std::vector<std::pair<const char*, Caller>> kCallers = {
    {"owner", {kOwner, 61011, {}}},
    {"group", {61012, kGroup, {}}},                      // the file's group as primary group
    {"supplementary", {61013, 61014, {61015, kGroup}}},  // ... as a supplementary group
    {"other", {61016, 61017, {}}},
    {"named user", {kNamedUser, 61018, {}}},         // named by the ACL cases
    {"named group", {61019, 61020, {kNamedGroup}}},  // ... as a supplementary group
    {"root", {0, 0, {}}},
};

struct Case {
  const char* name;
  unsigned mode;
  std::vector<Ace> acl;  // empty: mode bits only
  const char* expect;    // one of 0/1 per caller, kCallers' order
};

const std::vector<Case> kCases = {
    {"owner-only", 0400, {}, "1000001"},
    {"group-only", 0040, {}, "0110001"},  // the owner is refused: its own bits say ---
    {"other-only", 0004, {}, "0001111"},
    {"group-denied", 0604, {}, "1001111"},  // a group member gets the group's ---, not other's r
    {"acl-user-allowed",
     0600,
     {{kUserObj, 6}, {kUser, 4, kNamedUser}, {kGroupObj, 0}, {kMask, 4}, {kOther, 0}},
     "1000101"},
    {"acl-user-denied",
     0644,
     {{kUserObj, 6}, {kUser, 0, kNamedUser}, {kGroupObj, 4}, {kMask, 4}, {kOther, 4}},
     "1111011"},
    {"acl-group-allowed",
     0600,
     {{kUserObj, 6}, {kGroupObj, 0}, {kGroupAce, 4, kNamedGroup}, {kMask, 4}, {kOther, 0}},
     "1000011"},
    {"acl-mask-denies",
     0640,
     {{kUserObj, 6}, {kUser, 4, kNamedUser}, {kGroupObj, 4}, {kMask, 0}, {kOther, 0}},
     "1000001"},
};

// faccessat2 fails with ENOSYS on the calling thread (and the threads it starts) from now on,
// as on a kernel before 5.8. False if this architecture is not covered here.
bool hide_faccessat2_on_this_thread() {
#if defined(__x86_64__)
  constexpr uint32_t arch = AUDIT_ARCH_X86_64;
#elif defined(__aarch64__)
  constexpr uint32_t arch = AUDIT_ARCH_AARCH64;
#else
  return false;
#endif
  sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, arch, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_faccessat2, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (ENOSYS & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  sock_fprog prog{static_cast<unsigned short>(sizeof filter / sizeof filter[0]), filter};
  // Both per thread (no TSYNC): the test's other threads keep faccessat2.
  return ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 &&
         ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0;
}

class AccessTest : public testing::CoreFixture {
 protected:
  void SetUp() override {
    CoreFixture::SetUp();
    if (::geteuid() != 0) GTEST_SKIP() << "needs root (files of other owners, other callers' credentials)";
    fs::create_directories(path("src"));
    for (const Case& c : kCases) {
      for (const std::string& rel : {std::string("f-") + c.name, std::string("d-") + c.name}) {
        const std::string p = path("src/" + rel);
        if (rel[0] == 'f')
          write_file(p, "data");
        else
          fs::create_directory(p);
        ASSERT_EQ(::chown(p.c_str(), kOwner, kGroup), 0);
        ASSERT_EQ(::chmod(p.c_str(), c.mode), 0);
        if (!c.acl.empty()) {
          const std::string v = acl_xattr(c.acl);
          if (::setxattr(p.c_str(), "system.posix_acl_access", v.data(), v.size(), 0) != 0)
            GTEST_SKIP() << "no POSIX ACLs on this filesystem: " << std::strerror(errno);
        }
      }
    }
    // A parent only its owner may search, over a file everyone may read.
    fs::create_directories(path("src/closed"));
    write_file(path("src/closed/inner"), "inner");
    ASSERT_EQ(::chown(path("src/closed").c_str(), kOwner, kGroup), 0);
    ASSERT_EQ(::chmod(path("src/closed").c_str(), 0700), 0);
  }

  // Every case's answer ("0"/"1" per caller, kCallers' order) from a core created on this
  // thread, through may_read (the check opens and listings make).
  std::vector<std::string> answers(StageFsCore& core) {
    std::vector<std::string> out;
    for (const Case& c : kCases)
      for (const char* kind : {"f-", "d-"}) {
        std::string row;
        for (const auto& [who_name, who] : kCallers)
          row += core.may_read(kind + std::string(c.name), who) ? '1' : '0';
        out.push_back(row);
      }
    std::string closed;
    for (const auto& [who_name, who] : kCallers) closed += core.may_read("closed/inner", who) ? '1' : '0';
    out.push_back(closed);
    return out;
  }
  static std::vector<std::string> expected() {
    std::vector<std::string> out;
    for (const Case& c : kCases) {
      out.emplace_back(c.expect);
      out.emplace_back(c.expect);
    }
    out.emplace_back("1000001");  // closed/inner: only the owner (and root) reach it
    return out;
  }
};

// Both methods, asked directly on every case for every caller but root (whom the core never
// checks): the same answers, and the expected ones.
TEST_F(AccessTest, AReopenAsTheCallerGivesFaccessat2sAnswers) {
  const AccessCheck reopen(AccessCheck::Method::reopen);
  const AccessCheck kernel(AccessCheck::Method::faccessat2);
  stage::Fd src(::open(path("src").c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  ASSERT_TRUE(src.valid());
  const bool have_faccessat2 = AccessCheck::probe(src.get()) == AccessCheck::Method::faccessat2;
  for (const Case& c : kCases)
    for (const char* kind : {"f-", "d-"}) {
      const std::string rel = kind + std::string(c.name);
      stage::Fd fd(::openat(src.get(), rel.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
      ASSERT_TRUE(fd.valid()) << rel;
      for (size_t i = 0; i + 1 < kCallers.size(); ++i) {
        const AsCaller as(kCallers[i].second);
        ASSERT_TRUE(as.ok());
        const bool by_reopen = reopen.check(fd.get(), R_OK) == 0;
        EXPECT_EQ(by_reopen, c.expect[i] == '1') << rel << " as " << kCallers[i].first;
        if (have_faccessat2) {
          EXPECT_EQ(kernel.check(fd.get(), R_OK) == 0, by_reopen) << rel << " as " << kCallers[i].first;
        }
      }
    }
  // A FIFO is never opened by the fallback (it could block, a device could act on its open).
  ASSERT_EQ(::mkfifo(path("src/fifo").c_str(), 0644), 0);
  stage::Fd fifo(::openat(src.get(), "fifo", O_PATH | O_CLOEXEC));
  ASSERT_TRUE(fifo.valid());
  const AsCaller as(kCallers[3].second);
  EXPECT_EQ(reopen.check(fifo.get(), R_OK), EACCES);
  EXPECT_EQ(reopen.check(fifo.get(), W_OK), EINVAL);  // only R_OK can be asked by a reopen
}

// The old kernel simulated: on a thread whose faccessat2 fails with ENOSYS, a core created
// there selects the fallback at start and gives, through may_read, the answers a core with
// faccessat2 gives on the test's own thread (and the expected ones).
TEST_F(AccessTest, WithoutFaccessat2TheCoreGivesTheSameAnswers) {
  auto core = StageFsCore::create(CoreConfig{path("src")}, *cache_, mat_);
  ASSERT_TRUE(core) << core.error().message;
  const std::vector<std::string> with_kernel = answers(**core);
  EXPECT_EQ(with_kernel, expected());
  core->reset();

  bool filtered = false;
  int raw_errno = 0;
  AccessCheck::Method method = AccessCheck::Method::faccessat2;
  std::vector<std::string> without;
  std::thread old_kernel([&] {
    if (!(filtered = hide_faccessat2_on_this_thread())) return;
    raw_errno = ::syscall(SYS_faccessat2, AT_FDCWD, "/", R_OK, AT_EACCESS) == 0 ? 0 : errno;
    auto c = StageFsCore::create(CoreConfig{path("src")}, *cache_, mat_);
    if (!c) return;
    method = (*c)->access_method();
    without = answers(**c);
  });
  old_kernel.join();
  if (!filtered) GTEST_SKIP() << "no seccomp filter on this architecture or kernel";
  ASSERT_EQ(raw_errno, ENOSYS) << "the filter did not hide faccessat2";
  EXPECT_EQ(method, AccessCheck::Method::reopen);
  EXPECT_EQ(without, with_kernel);
}

}  // namespace
}  // namespace stagefs
