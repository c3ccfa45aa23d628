// Fault-injecting sides of the source and store seams: they wrap the real POSIX ones and fail
// on demand, so the engine's error paths run against real files.
#pragma once

#include <atomic>
#include <memory>

#include "bcast/io/source.h"
#include "bcast/io/store.h"
#include "fusefs/cache/copy_xattrs.h"

namespace stage::testing {

struct SourceFaults {
  int64_t short_read_at = -1;        // a read covering this file offset returns short_read
  int64_t eio_at = -1;               // ... returns EIO
  int64_t corrupt_at = -1;           // a read covering this offset flips a bit there (no error)
  bool changes_during_copy = false;  // stat_now() reports a new mtime
  std::atomic<uint64_t> bytes_read{0};
};

// A SourceFile that fails, corrupts or changes on demand (SourceFaults).
class FaultFile final : public SourceFile {
 public:
  FaultFile(std::unique_ptr<SourceFile> in, SourceFaults& f) : in_(std::move(in)), f_(f) {}
  Status read_at(uint64_t off, std::span<std::byte> buf) override {
    auto covers = [&](int64_t at) {
      return at >= 0 && static_cast<uint64_t>(at) >= off && static_cast<uint64_t>(at) < off + buf.size();
    };
    if (covers(f_.short_read_at)) return stage_error(Errc::short_read, "read source (injected)");
    if (covers(f_.eio_at)) return sys_error(EIO, "read source (injected)");
    f_.bytes_read += buf.size();
    auto st = in_->read_at(off, buf);
    if (st && covers(f_.corrupt_at)) buf[static_cast<size_t>(f_.corrupt_at) - off] ^= std::byte{1};
    return st;
  }
  bool has_data(uint64_t off, uint64_t len) override { return in_->has_data(off, len); }
  Result<FileMeta> stat_now() override {
    auto m = in_->stat_now();
    if (m && f_.changes_during_copy) m->mtime_ns += 1;
    return m;
  }

 private:
  std::unique_ptr<SourceFile> in_;
  SourceFaults& f_;
};

class FaultSource final : public SourceReader {
 public:
  explicit FaultSource(SourceFaults& f) : f_(f) {}
  Result<Manifest> scan(const std::string& p, bool rec, const SkipFn& skip) override {
    return real_.scan(p, rec, skip);
  }
  Result<std::unique_ptr<SourceFile>> open(const std::string& root, const Entry& e) override {
    auto inner = real_.open(root, e);
    if (!inner) return inner.error();
    return std::unique_ptr<SourceFile>(new FaultFile(std::move(inner.value()), f_));
  }

 private:
  PosixSource real_;
  SourceFaults& f_;
};

struct StoreFaults {
  bool fail_begin = false;          // cannot create the temporary file (EACCES)
  int64_t enospc_after_bytes = -1;  // writes fail with ENOSPC once this many bytes were written
  bool fail_commit = false;         // rename fails (EIO)
  int64_t free_bytes = -1;          // statvfs says this much is free (-1: the real figure)
  uint64_t written = 0;
  SourceFaults* copy = nullptr;  // reads of this node's existing copies (seeding) go through these
  int bad_copies = 0;            // seed copies the engine reported as unreadable or wrong (bad_copy)
};

class FaultStore final : public LocalStore {
 public:
  explicit FaultStore(StoreFaults& f) : f_(f) {}
  Result<LocalState> inspect(const std::string& p) override { return real_.inspect(p); }
  Result<uint64_t> checksum(const std::string& p) override { return real_.checksum(p); }
  Result<std::optional<CopyRecord>> chunk_record(const std::string& p) override {
    return real_.chunk_record(p);
  }
  Result<std::unique_ptr<SourceFile>> open_copy(const std::string& p) override {
    auto inner = real_.open_copy(p);
    if (!inner || f_.copy == nullptr) return inner;
    return std::unique_ptr<SourceFile>(new FaultFile(std::move(inner.value()), *f_.copy));
  }
  void bad_copy(const std::string& /*p*/, const FileMeta& /*seen*/) override { ++f_.bad_copies; }
  Result<uint64_t> free_bytes(const std::string& p) override {
    if (f_.free_bytes >= 0) return static_cast<uint64_t>(f_.free_bytes);
    return real_.free_bytes(p);
  }
  Status sync_filesystem(const std::string& p) override { return real_.sync_filesystem(p); }
  Status make_dir(const std::string& p, uint32_t m) override { return real_.make_dir(p, m); }
  Status make_parents(const std::string& p) override { return real_.make_parents(p); }
  Status make_symlink(const std::string& p, const std::string& t) override {
    return real_.make_symlink(p, t);
  }
  int remove_stale_temps(const std::string& p) override { return real_.remove_stale_temps(p); }
  Result<std::unique_ptr<Txn>> begin(const std::string& p) override {
    if (f_.fail_begin) return sys_error(EACCES, "create temporary file (injected)", p);
    auto t = real_.begin(p);
    if (!t) return t.error();
    return std::unique_ptr<Txn>(new FaultTxn(std::move(t.value()), f_));
  }

 private:
  class FaultTxn final : public Txn {
   public:
    FaultTxn(std::unique_ptr<Txn> in, StoreFaults& f) : in_(std::move(in)), f_(f) {}
    Status write(uint64_t off, std::span<const std::byte> d) override {
      if (f_.enospc_after_bytes >= 0 && f_.written + d.size() > static_cast<uint64_t>(f_.enospc_after_bytes))
        return sys_error(ENOSPC, "write local copy (injected)", in_->temp_path());
      f_.written += d.size();
      return in_->write(off, d);
    }
    Status finish(const FileMeta& m, uint64_t crc, const ChunkRecord* chunks) override {
      return in_->finish(m, crc, chunks);
    }
    Status rewind() override { return in_->rewind(); }
    Status sync() override { return in_->sync(); }
    Result<uint64_t> crc_on_disk() override { return in_->crc_on_disk(); }
    Result<uint64_t> size_on_disk() override { return in_->size_on_disk(); }
    Status commit() override {
      if (f_.fail_commit) return sys_error(EIO, "publish (injected)", in_->temp_path());
      return in_->commit();
    }
    void abort() noexcept override { in_->abort(); }
    [[nodiscard]] const std::string& temp_path() const override { return in_->temp_path(); }

   private:
    std::unique_ptr<Txn> in_;
    StoreFaults& f_;
  };
  PosixStore real_{StoreOptions{.xattrs = stagefs::kCopyXattrs}};
  StoreFaults& f_;
};

}  // namespace stage::testing
