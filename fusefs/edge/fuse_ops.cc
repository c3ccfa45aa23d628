// The FUSE edge (see mount.h): the only file that includes fuse_lowlevel.h. Every callback is
// a few lines: unpack, one StageFsCore call, reply. Errors map to errno through
// stage::Error::to_errno(); expected ones (ENOENT, ENODATA, EROFS) are not logged as failures.
// Below the callbacks, the libfuse session calls of the mount's life cycle (fuse_ops.h).
#define FUSE_USE_VERSION FUSE_MAKE_VERSION(3, 12)
#include "fusefs/edge/fuse_ops.h"

#include <fuse_lowlevel.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <new>
#include <span>

#include "fusefs/core/live.h"
#include "fusefs/base/log.h"
#include "fusefs/edge/read_mode.h"
#include "fusefs/core/stagectl_channel.h"

namespace stagefs {

namespace {

struct FileHandle {
  stage::Fd fd;
  std::shared_ptr<LiveCopy> live;  // read_mode during_copy: reads go through it
  uint64_t node = 0;
  ReadChoice read_mode;  // counted by the mount until release
  std::string pinned;    // the cache copy kept from eviction while this handle is open
  HandleLimits::Slot slot;  // its share of its user's limit
};

using DirHandle = OpenDir;  // the listing is shared by every handle of this directory version

EdgeMount& fm(fuse_req_t req) {
  return *static_cast<EdgeMount*>(fuse_req_userdata(req));
}

// The caller's identity; groups only where the daemon checks access itself (root daemon).
Caller caller(fuse_req_t req, bool with_groups) {
  const fuse_ctx* c = fuse_req_ctx(req);
  Caller who{static_cast<uint32_t>(c->uid), static_cast<uint32_t>(c->gid), {}};
  if (with_groups && who.uid != 0 && ::geteuid() == 0) {
    std::vector<gid_t> g(64);
    int n = fuse_req_getgroups(req, static_cast<int>(g.size()), g.data());
    if (n > static_cast<int>(g.size())) {
      g.resize(static_cast<size_t>(n));
      n = fuse_req_getgroups(req, static_cast<int>(g.size()), g.data());
    }
    for (int i = 0; i < n && i < static_cast<int>(g.size()); ++i)
      who.groups.push_back(g[static_cast<size_t>(i)]);
  }
  return who;
}

// Failed requests, which any user can cause at will (stat a name under a file, open what they
// may not read): rate-limited in the log, each errno its own cause (log.h).
void reply_err(fuse_req_t req, const stage::Error& e) {
  const int err = e.to_errno();
  if (err == ENOENT || err == ENODATA || err == EOPNOTSUPP || err == EROFS || err == ENAMETOOLONG ||
      err == ESTALE) {
    spdlog::debug("{}", e.message);
  } else {
    const std::string cause = "failed request: " + std::string(std::strerror(err != 0 ? err : EIO));
    log_limited(spdlog::level::warn, cause, cause, e.message);
  }
  fuse_reply_err(req, err != 0 ? err : EIO);
}

// No exception may cross into libfuse (C): a callback that throws replies ENOMEM or EIO.
template <class F>
void guarded(fuse_req_t req, F&& body) {
  try {
    body();
  } catch (const std::bad_alloc&) {
    fuse_reply_err(req, ENOMEM);
  } catch (...) {
    fuse_reply_err(req, EIO);
  }
}

void reply_erofs(fuse_req_t req) {
  fuse_reply_err(req, EROFS);
}

void op_init(void* userdata, struct fuse_conn_info* conn) {
  auto* m = static_cast<EdgeMount*>(userdata);
  if ((conn->capable & FUSE_CAP_SPLICE_WRITE) != 0) conn->want |= FUSE_CAP_SPLICE_WRITE;
  if ((conn->capable & FUSE_CAP_CACHE_SYMLINKS) != 0) conn->want |= FUSE_CAP_CACHE_SYMLINKS;
  // The kernel enforces the source's POSIX ACLs (system.posix_acl_* from getxattr) on every
  // path walk, not only the mode bits; open and opendir are also checked against the source.
  if ((conn->capable & FUSE_CAP_POSIX_ACL) != 0) conn->want |= FUSE_CAP_POSIX_ACL;
  // READDIRPLUS for every buffer of a listing, not the kernel's adaptive mode: that one asks
  // for plus on the first buffer and on later ones only if lookups came in between, and the
  // readers that matter here (tar, ls -l, os.walk) read the whole listing before the first
  // stat, so all but the first few hundred entries of a large directory would still cost a
  // LOOKUP each. The price: a names-only listing looks every entry up in the daemon.
  conn->want &= ~FUSE_CAP_READDIRPLUS_AUTO;
  // READs of up to 252 pages: a spliced reply then fits the default 1 MiB pipe limit
  // (a 256-page reply would silently fall back to copying).
  conn->max_write = 252 * 4096;
  spdlog::debug("FUSE init: proto {}.{}, passthrough {}", conn->proto_major, conn->proto_minor,
                m->passthrough().offered() ? "offered" : "not offered");
}

void op_lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  guarded(req, [&] {
    auto& m = fm(req);
    fuse_entry_param e{};
    e.entry_timeout = m.entry_timeout();
    auto r = m.core().lookup(parent, name, caller(req, true));
    if (!r) {
      if (r.error().to_errno() == ENOENT) {  // cache the negative answer too
        fuse_reply_entry(req, &e);
        return;
      }
      return reply_err(req, r.error());
    }
    e.ino = r->first;
    e.attr = r->second;
    e.attr_timeout = m.attr_timeout();
    fuse_reply_entry(req, &e);
  });
}

void op_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup) {
  fm(req).core().forget(ino, nlookup);
  fuse_reply_none(req);
}

void op_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data* forgets) {
  for (size_t i = 0; i < count; ++i) fm(req).core().forget(forgets[i].ino, forgets[i].nlookup);
  fuse_reply_none(req);
}

void op_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info* fi) {
  guarded(req, [&] {
    // Through a handle (the kernel refreshing an open file's size): its holder was checked at
    // its open. Otherwise as the caller.
    auto r = fm(req).core().getattr(ino, fi != nullptr ? Caller{} : caller(req, true));
    if (!r) return reply_err(req, r.error());
    fuse_reply_attr(req, &r.value(), fm(req).attr_timeout());
  });
}

void op_readlink(fuse_req_t req, fuse_ino_t ino) {
  guarded(req, [&] {
    auto r = fm(req).core().readlink(ino, caller(req, true));
    if (!r) return reply_err(req, r.error());
    fuse_reply_readlink(req, r->c_str());
  });
}

void op_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info* fi) {
  guarded(req, [&] {
    auto r = fm(req).core().opendir(ino, caller(req, true));
    if (!r) return reply_err(req, r.error());
    auto h = std::make_unique<DirHandle>(std::move(r.value()));
    fi->fh = reinterpret_cast<uint64_t>(h.get());
    fi->cache_readdir = 1;
    fi->keep_cache = 1;
    if (fuse_reply_open(req, fi) == 0) (void)h.release();
  });
}

void op_readdir(fuse_req_t req, fuse_ino_t /*ino*/, size_t size, off_t off, struct fuse_file_info* fi) {
  guarded(req, [&] {
    const auto* h = reinterpret_cast<DirHandle*>(fi->fh);
    std::vector<char> buf(size);
    size_t used = 0;
    const std::vector<DirEntry>& entries = *h->entries;
    for (auto i = static_cast<size_t>(off); i < entries.size(); ++i) {
      const DirEntry& d = entries[i];
      struct stat st {};
      st.st_ino = d.ino;
      st.st_mode = d.mode;
      const size_t n = fuse_add_direntry(req, buf.data() + used, size - used, d.name.c_str(), &st,
                                         static_cast<off_t>(i + 1));
      if (n > size - used) break;
      used += n;
    }
    fuse_reply_buf(req, buf.data(), used);
  });
}

// READDIRPLUS: each entry with its attributes, looked up as op_lookup does (the kernel links
// them into its dentry cache). A reader that lists a directory and then stats or opens its
// entries (tar, ls -l, a data loader's os.walk and open) then costs no LOOKUP round trip per
// entry. The entries that fit in the reply are looked up together (one fstatat each); one
// that no longer resolves (removed since the listing) goes out without attributes (node id
// 0: the kernel looks it up if it is asked for). Every id handed out is counted as a lookup;
// a reply the kernel did not take forgets them again.
void op_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info* fi) {
  guarded(req, [&] {
    auto& m = fm(req);
    const auto* h = reinterpret_cast<DirHandle*>(fi->fh);
    const std::vector<DirEntry>& entries = *h->entries;
    const auto first = std::min(static_cast<size_t>(off), entries.size());
    size_t last = first;
    for (size_t need = 0; last < entries.size(); ++last) {
      need += fuse_add_direntry_plus(req, nullptr, 0, entries[last].name.c_str(), nullptr, 0);
      if (need > size) break;
    }
    std::vector<char> buf(size);  // allocated before any id is counted
    std::vector<uint64_t> ids;
    ids.reserve(last - first);
    const auto looked =
        m.core().lookup_many(ino, std::span(entries).subspan(first, last - first), caller(req, true));
    size_t used = 0;
    for (size_t i = first; i < last; ++i) {
      const DirEntry& d = entries[i];
      fuse_entry_param e{};
      if (const auto& r = looked[i - first]) {
        e.ino = r->first;
        e.attr = r->second;
        e.attr_timeout = m.attr_timeout();
        e.entry_timeout = m.entry_timeout();
        ids.push_back(e.ino);
      } else {
        e.attr.st_ino = d.ino;
        e.attr.st_mode = d.mode;
      }
      used += fuse_add_direntry_plus(req, buf.data() + used, size - used, d.name.c_str(), &e,
                                     static_cast<off_t>(i + 1));
    }
    if (fuse_reply_buf(req, buf.data(), used) != 0)
      for (const uint64_t id : ids) m.core().forget(id, 1);
  });
}

void op_releasedir(fuse_req_t req, fuse_ino_t /*ino*/, struct fuse_file_info* fi) {
  delete reinterpret_cast<DirHandle*>(fi->fh);
  fuse_reply_err(req, 0);
}

// Replies to an open with the core's answer (on the FUSE worker, or later on the core's
// completion pool: a waiting open holds no worker), read as the mount's policy decides
// (read_mode.h).
void reply_open(fuse_req_t req, fuse_ino_t ino, fuse_file_info fi, stage::Result<OpenFile> r) {
  auto& m = fm(req);
  const auto alive = m.reply_guard();
  if (!alive) {  // the session is gone: nobody waits for this reply
    if (r) m.core().release(r->pinned);
    return;
  }
  if (!r) return reply_err(req, r.error());
  auto h = std::make_unique<FileHandle>();
  h->node = ino;
  h->read_mode = m.open_read_mode(ino, r->fd.get(), {r->live != nullptr, r->from_source, r->cache_hit});
  h->fd = std::move(r->fd);
  h->pinned = std::move(r->pinned);
  h->slot = std::move(r->slot);
  if (h->read_mode.mode == ReadMode::during_copy) h->live = std::move(r->live);
  fi.keep_cache = h->read_mode.keep_cache ? 1 : 0;
  fi.fh = reinterpret_cast<uint64_t>(h.get());
  fi.noflush = 1;  // read-only: a close needs no FLUSH round trip (one per file of a dataset)
  if (h->read_mode.mode == ReadMode::passthrough) Passthrough::arm_open_reply(h->read_mode.backing_id);
  const int rc = fuse_reply_open(req, &fi);
  Passthrough::disarm();
  if (rc == 0) {
    (void)h.release();
    return;
  }
  // interrupted: the kernel will not send RELEASE
  m.close_read_mode(ino, h->read_mode);
  m.core().release(h->pinned);
}

void op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info* fi) {
  guarded(req, [&] {
    const fuse_file_info copy = *fi;
    fm(req).core().open_async(ino, fi->flags, caller(req, true), [req, ino, copy](stage::Result<OpenFile> r) {
      guarded(req, [&] { reply_open(req, ino, copy, std::move(r)); });
    });
  });
}

void op_read(fuse_req_t req, fuse_ino_t /*ino*/, size_t size, off_t off, struct fuse_file_info* fi) {
  const auto* h = reinterpret_cast<FileHandle*>(fi->fh);
  if (h->live) {  // the copy is in progress: at once if the range is here, else when it is
    EdgeMount* m = &fm(req);
    return guarded(req, [&] {
      m->core().read_live(h->live, h->fd.get(), static_cast<uint64_t>(off), size,
                          [m, req](stage::Result<std::string> r) {
                            const auto alive = m->reply_guard();
                            if (!alive) return;  // the session is gone
                            if (!r) return reply_err(req, r.error());
                            fuse_reply_buf(req, r->data(), r->size());
                          });
    });
  }
  fuse_bufvec buf = FUSE_BUFVEC_INIT(size);
  buf.buf[0].flags = static_cast<fuse_buf_flags>(FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK);
  buf.buf[0].fd = h->fd.get();
  buf.buf[0].pos = off;
  fuse_reply_data(req, &buf, FUSE_BUF_SPLICE_MOVE);
}

void op_release(fuse_req_t req, fuse_ino_t /*ino*/, struct fuse_file_info* fi) {
  auto* h = reinterpret_cast<FileHandle*>(fi->fh);
  fm(req).close_read_mode(h->node, h->read_mode);
  fm(req).core().release(h->pinned);
  delete h;
  fuse_reply_err(req, 0);
}

void op_statfs(fuse_req_t req, fuse_ino_t /*ino*/) {
  guarded(req, [&] {
    auto r = fm(req).core().statfs();
    if (!r) return reply_err(req, r.error());
    fuse_reply_statfs(req, &r.value());
  });
}

void reply_xattr_value(fuse_req_t req, const std::string& v, size_t size) {
  if (size == 0)
    fuse_reply_xattr(req, v.size());
  else if (size < v.size())
    fuse_reply_err(req, ERANGE);
  else
    fuse_reply_buf(req, v.data(), v.size());
}

void op_getxattr(fuse_req_t req, fuse_ino_t ino, const char* name, size_t size) {
  guarded(req, [&] {
    if (const auto request = parse_stagectl_request(name)) {  // stagectl_channel.h
      const Caller who = caller(req, needs_caller_groups(*request));
      return run_stagectl_request(fm(req).core(), ino, *request, who,
                                  [req, size](const stage::Result<std::string>& value) {
                                    guarded(req, [&] {
                                      const auto alive = fm(req).reply_guard();
                                      if (!alive) return;
                                      if (!value) return reply_err(req, value.error());
                                      reply_xattr_value(req, *value, size);
                                    });
                                  });
    }
    // As the caller, groups included (the path's directories as the source says now; the
    // status attributes on the root name a transfer only to who may read it).
    auto r = fm(req).core().getxattr(ino, name, caller(req, StageFsCore::xattr_checked_as_caller(name)));
    if (!r) return reply_err(req, r.error());
    reply_xattr_value(req, *r, size);
  });
}

void op_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size) {
  guarded(req, [&] {
    auto r = fm(req).core().listxattr(ino, caller(req, true));
    if (!r) return reply_err(req, r.error());
    reply_xattr_value(req, *r, size);
  });
}

// Every change to the tree: EROFS (the mount is also made with -o ro).
void op_setattr(fuse_req_t req, fuse_ino_t, struct stat*, int, struct fuse_file_info*) {
  reply_erofs(req);
}
void op_mknod(fuse_req_t req, fuse_ino_t, const char*, mode_t, dev_t) {
  reply_erofs(req);
}
void op_mkdir(fuse_req_t req, fuse_ino_t, const char*, mode_t) {
  reply_erofs(req);
}
void op_unlink(fuse_req_t req, fuse_ino_t, const char*) {
  reply_erofs(req);
}
void op_rmdir(fuse_req_t req, fuse_ino_t, const char*) {
  reply_erofs(req);
}
void op_symlink(fuse_req_t req, const char*, fuse_ino_t, const char*) {
  reply_erofs(req);
}
void op_rename(fuse_req_t req, fuse_ino_t, const char*, fuse_ino_t, const char*, unsigned int) {
  reply_erofs(req);
}
void op_link(fuse_req_t req, fuse_ino_t, fuse_ino_t, const char*) {
  reply_erofs(req);
}
void op_write(fuse_req_t req, fuse_ino_t, const char*, size_t, off_t, struct fuse_file_info*) {
  reply_erofs(req);
}
void op_create(fuse_req_t req, fuse_ino_t, const char*, mode_t, struct fuse_file_info*) {
  reply_erofs(req);
}
void op_setxattr(fuse_req_t req, fuse_ino_t, const char*, const char*, size_t, int) {
  reply_erofs(req);
}
void op_removexattr(fuse_req_t req, fuse_ino_t, const char*) {
  reply_erofs(req);
}
void op_fallocate(fuse_req_t req, fuse_ino_t, int, off_t, off_t, struct fuse_file_info*) {
  reply_erofs(req);
}
void op_flush(fuse_req_t req, fuse_ino_t, struct fuse_file_info*) {
  fuse_reply_err(req, 0);
}
void op_fsync(fuse_req_t req, fuse_ino_t, int, struct fuse_file_info*) {
  fuse_reply_err(req, 0);
}

const fuse_lowlevel_ops kOps = [] {
  fuse_lowlevel_ops o{};
  o.init = op_init;
  o.lookup = op_lookup;
  o.forget = op_forget;
  o.forget_multi = op_forget_multi;
  o.getattr = op_getattr;
  o.readlink = op_readlink;
  o.opendir = op_opendir;
  o.readdirplus = op_readdirplus;
  o.readdir = op_readdir;
  o.releasedir = op_releasedir;
  o.open = op_open;
  o.read = op_read;
  o.release = op_release;
  o.statfs = op_statfs;
  o.getxattr = op_getxattr;
  o.listxattr = op_listxattr;
  o.setattr = op_setattr;
  o.mknod = op_mknod;
  o.mkdir = op_mkdir;
  o.unlink = op_unlink;
  o.rmdir = op_rmdir;
  o.symlink = op_symlink;
  o.rename = op_rename;
  o.link = op_link;
  o.write = op_write;
  o.create = op_create;
  o.setxattr = op_setxattr;
  o.removexattr = op_removexattr;
  o.fallocate = op_fallocate;
  o.flush = op_flush;
  o.fsync = op_fsync;
  return o;
}();

// custom io: libfuse hands us the session's userdata (the EdgeMount).
ssize_t io_read(int fd, void* buf, size_t len, void* ud) {
  return Passthrough::read_hook(fd, buf, len, &static_cast<EdgeMount*>(ud)->passthrough());
}
ssize_t io_writev(int fd, struct iovec* iov, int count, void* ud) {
  return Passthrough::writev_hook(fd, iov, count, &static_cast<EdgeMount*>(ud)->passthrough());
}
ssize_t io_splice_send(int fdin, off_t* offin, int fdout, off_t* offout, size_t len, unsigned int flags,
                       void* ud) {
  return Passthrough::splice_send_hook(fdin, offin, fdout, offout, len, flags, ud);
}

}  // namespace

namespace fuse_edge {

fuse_session* new_session(EdgeMount& m, std::span<const char*> argv) {
  fuse_args args = FUSE_ARGS_INIT(static_cast<int>(argv.size()), const_cast<char**>(argv.data()));
  return fuse_session_new(&args, &kOps, sizeof kOps, &m);
}

int mount_session(fuse_session* se, const std::string& mountpoint) {
  return fuse_session_mount(se, mountpoint.c_str());
}

bool use_passthrough_io(fuse_session* se) {
  const fuse_custom_io io{io_writev, io_read, nullptr, io_splice_send};
  return fuse_session_custom_io(se, &io, fuse_session_fd(se)) == 0;
}

int session_fd(fuse_session* se) {
  return fuse_session_fd(se);
}

int run_loop(fuse_session* se, unsigned max_threads) {
  fuse_loop_config* cfg = fuse_loop_cfg_create();
  fuse_loop_cfg_set_max_threads(cfg, max_threads);
  // Workers are kept once started: libfuse ends a worker that finds more than max_idle others
  // idle and starts one whenever none is idle, so bursts of opens of small files would
  // otherwise start and end thousands of threads per pass over a dataset
  // (bench/bench_threads.py). An idle
  // worker costs its stack and a request buffer of which only the pages used are resident
  // (read-only mount: no large WRITE ever fills one).
  fuse_loop_cfg_set_idle_threads(cfg, max_threads);
  const int rc = fuse_session_loop_mt(se, cfg);
  fuse_loop_cfg_destroy(cfg);
  return rc;
}

void leave_loop(fuse_session* se) {
  fuse_session_exit(se);
}

void unmount_session(fuse_session* se) {
  fuse_session_unmount(se);
}

void destroy_session(fuse_session* se) {
  fuse_session_destroy(se);
}

}  // namespace fuse_edge
}  // namespace stagefs
