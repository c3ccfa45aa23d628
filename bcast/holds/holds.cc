#include "bcast/holds/holds.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace stage {
namespace {

class HoldingTxn final : public Txn {
 public:
  HoldingTxn(std::unique_ptr<Txn> inner, StoreHold at, HoldFn hold)
      : inner_(std::move(inner)), at_(at), hold_(std::move(hold)) {}
  Status write(uint64_t off, std::span<const std::byte> data) override {
    const int nth = writes_++;
    if ((at_ == StoreHold::before_first_write && nth == 0) ||
        (at_ == StoreHold::before_third_write && nth == 2))
      hold_();
    return inner_->write(off, data);
  }
  Status finish(const FileMeta& source, uint64_t crc, const ChunkRecord* chunks) override {
    return inner_->finish(source, crc, chunks);
  }
  Status rewind() override { return inner_->rewind(); }
  Status sync() override { return inner_->sync(); }
  Result<uint64_t> crc_on_disk() override { return inner_->crc_on_disk(); }
  Result<uint64_t> size_on_disk() override { return inner_->size_on_disk(); }
  Status commit() override {
    before_commit();
    return inner_->commit();
  }
  Status commit_unsynced() override {
    before_commit();
    return inner_->commit_unsynced();
  }
  void abort() noexcept override { inner_->abort(); }
  [[nodiscard]] const std::string& temp_path() const override { return inner_->temp_path(); }

 private:
  void before_commit() {
    if (at_ == StoreHold::before_commit) hold_();
  }
  std::unique_ptr<Txn> inner_;
  StoreHold at_;
  HoldFn hold_;
  int writes_ = 0;
};

class HoldingFile final : public SourceFile {
 public:
  HoldingFile(std::unique_ptr<SourceFile> inner, HoldFn hold)
      : inner_(std::move(inner)), hold_(std::move(hold)) {}
  Status read_at(uint64_t off, std::span<std::byte> buf) override {
    if (reads_++ == 2) hold_();
    return inner_->read_at(off, buf);
  }
  bool has_data(uint64_t off, uint64_t len) override { return inner_->has_data(off, len); }
  Result<FileMeta> stat_now() override { return inner_->stat_now(); }
  Result<bool> data_past(uint64_t size) override { return inner_->data_past(size); }
  std::optional<Sparseness> sparseness(uint64_t size, uint64_t align, size_t max_extents) override {
    return inner_->sparseness(size, align, max_extents);
  }

 private:
  std::unique_ptr<SourceFile> inner_;
  HoldFn hold_;
  int reads_ = 0;
};

}  // namespace

Result<std::unique_ptr<Txn>> HoldingStore::begin(const std::string& path) {
  auto t = inner_.begin(path);
  if (!t) return t.error();
  return std::unique_ptr<Txn>(new HoldingTxn(std::move(t.value()), at_, hold_));
}

Result<std::unique_ptr<SourceFile>> HoldingSource::open(const std::string& root, const Entry& e) {
  auto f = inner_.open(root, e);
  if (!f) return f.error();
  return std::unique_ptr<SourceFile>(new HoldingFile(std::move(f.value()), hold_));
}

std::optional<HoldRequest> hold_request_from_env(int rank) {
  const char* point = std::getenv("STAGE_TEST_HOLD");
  if (point == nullptr || *point == '\0') return std::nullopt;
  if (const char* r = std::getenv("STAGE_TEST_HOLD_RANK"); r != nullptr && std::atoi(r) != rank)
    return std::nullopt;
  HoldRequest req{point, "", false};
  if (const char* f = std::getenv("STAGE_TEST_HOLD_FILE"); f != nullptr) req.file = f;
  req.block = std::getenv("STAGE_TEST_HOLD_BLOCK") != nullptr && !req.file.empty();
  return req;
}

HoldFn hold_action(const HoldRequest& r) {
  return [file = r.file, block = r.block] {
    if (!file.empty()) {
      const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
      if (fd >= 0) ::close(fd);
    }
    if (block) {
      // Only this thread waits, until the test removes the file (the rest of the process runs).
      while (::access(file.c_str(), F_OK) == 0) ::usleep(5000);
      return;
    }
    ::raise(SIGSTOP);
  };
}

TestHolds::TestHolds(LocalStore& store, SourceReader& source, int rank)
    : plain_store_(store), plain_source_(source) {
  const auto req = hold_request_from_env(rank);
  if (!req) return;
  const std::string& p = req->point;
  if (p == "reader-mid-file") {
    source_ = std::make_unique<HoldingSource>(source, hold_action(*req));
    return;
  }
  std::optional<StoreHold> at;
  if (p == "before-first-chunk") at = StoreHold::before_first_write;
  if (p == "mid-file") at = StoreHold::before_third_write;
  if (p == "before-rename") at = StoreHold::before_commit;
  if (at) store_ = std::make_unique<HoldingStore>(store, *at, hold_action(*req));
}

std::unique_ptr<Seams> test_holds(LocalStore& store, SourceReader& source, int rank) {
  return std::make_unique<TestHolds>(store, source, rank);
}

}  // namespace stage
