// StageFsCore's life (core.h): its construction, the completion pool the open chain runs on,
// and what every room of the core shares.
#include "fusefs/core/core.h"

#include <fcntl.h>
#include <unistd.h>

#include <future>

#include "fusefs/base/log.h"
#include "fusefs/cache/cache.h"

namespace stagefs {

using stage::Error;
using stage::Result;

stage::Status Materializer::materialize(const std::string& rel, const Want& want) {
  auto p = std::make_shared<std::promise<stage::Status>>();
  auto f = p->get_future();
  materialize_async(rel, want, [p](stage::Status st) { p->set_value(std::move(st)); });
  return f.get();
}

StageFsCore::StageFsCore(CoreConfig cfg, std::unique_ptr<NodeCopies> own, NodeCopies& copies,
                         Materializer& mat, stage::Fd root)
    : own_copies_(std::move(own)),
      cfg_(std::move(cfg)),
      copies_(copies),
      mat_(mat),
      root_(std::move(root)),
      budget_(std::make_shared<UserBytes>(cfg_.listing_bytes_per_user)),
      nodes_(budget_),
      access_(AccessCheck::probe(root_.get())),
      handles_(cfg_.handles) {
  for (int i = 0; i < std::max(1, cfg_.completion_threads); ++i)
    pool_.emplace_back([this] { completion_loop(); });
}
StageFsCore::~StageFsCore() {
  stop();
}

void StageFsCore::stop() {
  // The cache room's read-backs and waits for room end first (their opens get ESHUTDOWN), while
  // the pool they post to still runs.
  copies_.stop();
  {
    std::lock_guard lk(pool_m_);
    if (pool_stop_) return;
    pool_stop_ = true;
  }
  pool_cv_.notify_all();
  for (auto& t : pool_) t.join();
}

void StageFsCore::post(std::function<void()> fn) {
  {
    std::lock_guard lk(pool_m_);
    if (!pool_stop_) {
      pool_q_.push_back(std::move(fn));
      pool_cv_.notify_one();
      return;
    }
  }
  fn();  // stopping: run here (it only replies with an error or a descriptor)
}

void StageFsCore::completion_loop() {
  for (;;) {
    std::function<void()> fn;
    {
      std::unique_lock lk(pool_m_);
      pool_cv_.wait(lk, [&] { return pool_stop_ || !pool_q_.empty(); });
      if (pool_q_.empty()) return;
      fn = std::move(pool_q_.front());
      pool_q_.pop_front();
    }
    fn();
  }
}

Error StageFsCore::read_only(const char* op) {
  return stage::sys_error(EROFS, op, "(read-only mount)");
}

Result<std::unique_ptr<StageFsCore>> StageFsCore::create(CoreConfig cfg, NodeCopies& copies,
                                                         Materializer& mat) {
  stage::Fd root(::open(cfg.source_dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!root.valid()) return stage::sys_error(errno, "open SOURCE_DIR", cfg.source_dir);
  return started(
      std::unique_ptr<StageFsCore>(new StageFsCore(std::move(cfg), nullptr, copies, mat, std::move(root))));
}

Result<std::unique_ptr<StageFsCore>> StageFsCore::create(CoreConfig cfg, NodeCache& cache, Materializer& mat,
                                                         CopyReader& reader) {
  stage::Fd root(::open(cfg.source_dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!root.valid()) return stage::sys_error(errno, "open SOURCE_DIR", cfg.source_dir);
  // Its admission looks at the source through the core's own SOURCE_DIR descriptor.
  auto own = std::make_unique<NodeCopies>(cache,
                                          NodeCopies::Config{root.get(), cfg.verify_cache, cfg.verify_threads,
                                                             cfg.space_wait, cfg.small_file_size},
                                          reader);
  NodeCopies& copies = *own;
  return started(std::unique_ptr<StageFsCore>(
      new StageFsCore(std::move(cfg), std::move(own), copies, mat, std::move(root))));
}

std::unique_ptr<StageFsCore> StageFsCore::started(std::unique_ptr<StageFsCore> core) {
  if (core->access_.method() != AccessCheck::Method::faccessat2 && ::geteuid() == 0)
    log_info(
        "the kernel has no faccessat2 (Linux before 5.8, or a seccomp filter that predates it): each access "
        "is checked by {}",
        to_string(core->access_.method()));
  return core;
}

size_t StageFsCore::node_count() const {
  return nodes_.size();
}

Result<std::string> StageFsCore::path_of(uint64_t id) const {
  return nodes_.path_of(id);
}

Result<struct statvfs> StageFsCore::statfs() {
  struct statvfs sv {};
  if (::fstatvfs(root_.get(), &sv) != 0) return stage::sys_error(errno, "statfs", cfg_.source_dir);
  return sv;
}

// Runs an xattr call on the source node behind id. Its /proc/self/fd/N link (of an O_PATH fd
}  // namespace stagefs
