// POSIX access ACLs as setfacl writes them (the system.posix_acl_access xattr's bytes), for the
// tests of who may read what: a table of entries, or one user denied what the mode grants.
#pragma once

#include <sys/xattr.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace stagefs::testing {

// An ACL entry (tag, permission bits, id) as setfacl would write it.
struct Ace {
  uint16_t tag;
  uint16_t perm;
  uint32_t id = 0xffffffff;
};
constexpr uint16_t kUserObj = 0x01, kUser = 0x02, kGroupObj = 0x04, kGroupAce = 0x08, kMask = 0x10,
                   kOther = 0x20;

// The xattr's value: a version (2), then each entry's 8 bytes.
inline std::string acl_xattr(const std::vector<Ace>& aces) {
  std::string v(4, '\0');
  const uint32_t version = 2;
  std::memcpy(v.data(), &version, 4);
  for (const Ace& a : aces) {
    char e[8];
    std::memcpy(e, &a.tag, 2);
    std::memcpy(e + 2, &a.perm, 2);
    std::memcpy(e + 4, &a.id, 4);
    v.append(e, 8);
  }
  return v;
}

// A POSIX access ACL that denies one user (nobody) what the mode grants everyone, as
// `setfacl -m u:nobody:---` writes it. False where the filesystem has no ACLs.
inline bool deny_nobody(const std::string& p) {
  constexpr uint32_t kNobody = 65534;
  const std::string v =
      acl_xattr({{kUserObj, 6}, {kUser, 0, kNobody}, {kGroupObj, 4}, {kMask, 4}, {kOther, 4}});
  return ::setxattr(p.c_str(), "system.posix_acl_access", v.data(), v.size(), 0) == 0;
}

}  // namespace stagefs::testing
