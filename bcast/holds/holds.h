// Holding decorators for the source and store seams: a copy stopped at a known point, so a
// test can kill -9 a real process exactly there, or act while a transfer is known to be under
// way, without timing. The engine knows nothing of them, nor does any library of the product:
// a tool hands test_holds (below) to its job or daemon as the SeamWrapper (bcast/io/seams.h),
// which wraps the store and source at start when the environment asks:
//   STAGE_TEST_HOLD=<point>        where to stop (below)
//   STAGE_TEST_HOLD_RANK=<rank>    only this rank (default: every rank)
//   STAGE_TEST_HOLD_FILE=<path>    created when the point is reached
//   STAGE_TEST_HOLD_BLOCK=1        only the thread that reached the point waits, until the test
//                                  removes the file (the rest of the process runs); otherwise
//                                  the process stops itself (SIGSTOP)
// Points, each reached once per copy of one file (so every later transfer of a daemon holds
// again):
//   "before-first-chunk"  the writer, before its first write: the temporary file exists, empty
//   "mid-file"            the writer, before its third write: two chunks are in the temporary
//                         file, the rest is not
//   "before-rename"       before the commit: the temporary file is complete and synced, the
//                         destination still the old one
//   "reader-mid-file"     the source's reader, before its third read of the file: two chunks
//                         were read, the rest of the process (the broadcast, the control plane)
//                         goes on
// A write or read is one per chunk for a file larger than a chunk (a sparse file's holes are
// neither read nor written). Thread safety: as the wrapped store and reader (the decorators
// keep no shared state; each Txn and SourceFile counts its own calls).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "bcast/io/seams.h"

namespace stage {

// Called at the hold point, on the thread that reached it; returns when the copy may go on.
using HoldFn = std::function<void()>;

enum class StoreHold { before_first_write, before_third_write, before_commit };

// A LocalStore whose transactions call `hold` at one point; everything else goes to `inner`.
class HoldingStore final : public LocalStore {
 public:
  HoldingStore(LocalStore& inner, StoreHold at, HoldFn hold)
      : inner_(inner), at_(at), hold_(std::move(hold)) {}
  Result<LocalState> inspect(const std::string& path) override { return inner_.inspect(path); }
  Result<uint64_t> checksum(const std::string& path) override { return inner_.checksum(path); }
  Result<std::optional<CopyRecord>> chunk_record(const std::string& path) override {
    return inner_.chunk_record(path);
  }
  Result<std::unique_ptr<SourceFile>> open_copy(const std::string& path) override {
    return inner_.open_copy(path);
  }
  void bad_copy(const std::string& path, const FileMeta& seen) override { inner_.bad_copy(path, seen); }
  Result<uint64_t> free_bytes(const std::string& path) override { return inner_.free_bytes(path); }
  Status sync_filesystem(const std::string& path) override { return inner_.sync_filesystem(path); }
  std::unique_ptr<Publication> publication(const std::string& dir, std::vector<std::string> paths) override {
    return inner_.publication(dir, std::move(paths));
  }
  Result<std::unique_ptr<Txn>> begin(const std::string& path) override;
  Status make_dir(const std::string& path, uint32_t mode) override { return inner_.make_dir(path, mode); }
  Status make_parents(const std::string& path) override { return inner_.make_parents(path); }
  Status make_symlink(const std::string& path, const std::string& target) override {
    return inner_.make_symlink(path, target);
  }
  int remove_stale_temps(const std::string& dir) override { return inner_.remove_stale_temps(dir); }

 private:
  LocalStore& inner_;
  StoreHold at_;
  HoldFn hold_;
};

// A SourceReader whose files call `hold` before their third read; everything else goes to `inner`.
class HoldingSource final : public SourceReader {
 public:
  HoldingSource(SourceReader& inner, HoldFn hold) : inner_(inner), hold_(std::move(hold)) {}
  Result<Manifest> scan(const std::string& path, bool recursive, const SkipFn& skipped) override {
    return inner_.scan(path, recursive, skipped);
  }
  Result<Selection> scan_selection(const std::string& dir, uint64_t max_size,
                                   const SelectionSlice& slice) override {
    return inner_.scan_selection(dir, max_size, slice);
  }
  Result<std::vector<std::string>> list_dirs(const std::string& dir, size_t max) override {
    return inner_.list_dirs(dir, max);
  }
  Result<std::unique_ptr<SourceFile>> open(const std::string& root, const Entry& e) override;

 private:
  SourceReader& inner_;
  HoldFn hold_;
};

// What the environment asks (STAGE_TEST_HOLD*, above) for this rank; nullopt: nothing.
struct HoldRequest {
  std::string point;
  std::string file;  // may be empty (no file: SIGSTOP only)
  bool block = false;
};
std::optional<HoldRequest> hold_request_from_env(int rank);
// The hold a request describes: create the file, then SIGSTOP, or (block) wait until the file
// is gone.
HoldFn hold_action(const HoldRequest& r);

// The store and source to hand the engine, held as hold_request_from_env(rank) asks, or the
// given ones untouched.
class TestHolds final : public Seams {
 public:
  TestHolds(LocalStore& store, SourceReader& source, int rank);
  LocalStore& store() override { return store_ != nullptr ? *store_ : plain_store_; }
  SourceReader& source() override { return source_ != nullptr ? *source_ : plain_source_; }

 private:
  LocalStore& plain_store_;
  SourceReader& plain_source_;
  std::unique_ptr<HoldingStore> store_;
  std::unique_ptr<HoldingSource> source_;
};

// The tools' SeamWrapper: a TestHolds over store and source.
std::unique_ptr<Seams> test_holds(LocalStore& store, SourceReader& source, int rank);

}  // namespace stage
