// Finish: each writer completes, syncs and (optionally) re-checks its copies, then publishes
// them (rename) only if the source held still and its own copies verified. A selection's
// copies are published as one group (LocalStore::publication): the store makes their data
// durable its own way instead of a sync here. The errors of every rank are gathered at the
// source rank for its report.
#include "bcast/io/crc.h"
#include "bcast/transfer/transfer.h"

namespace stage::engine {

std::vector<size_t> Transfer::my_files() const {
  std::vector<size_t> mine;
  for (size_t i = 0; i < m_.entries.size(); ++i)
    if (need_local_[i] != 0 && txn_[i]) mine.push_back(i);
  return mine;
}

void Transfer::finish_empty_files(const std::vector<size_t>& mine) {
  for (size_t i : mine) {  // files with nothing in the stream (empty, or all hole) never saw a chunk
    if (finished_[i] == 0) {
      const FileMeta& meta = m_.entries[i].meta;
      if (auto st = txn_[i]->finish(meta, crc64_zeros(meta.size), nullptr); !st) fail_local(st.error());
      finished_[i] = 1;
    }
  }
}

// Makes the copies' data durable before any rename. A selection: through the store's
// publication of the group, which is returned (null if there is none or it failed).
std::unique_ptr<Publication> Transfer::sync_copies(const std::vector<size_t>& mine) {
  const Accumulate syncing(r_.pipe.sync);
  if (opt_.selection.active() && !mine.empty() && !local_err_) {
    std::vector<std::string> names;
    names.reserve(mine.size());
    for (size_t i : mine) names.push_back(dest_of(i));
    auto group = store_.publication(ep_.dest, std::move(names));
    if (auto st = group->data_durable(); !st) {
      fail_local(st.error());
      return nullptr;
    }
    return group;
  }
  if (mine.size() > 8 && !local_err_) {
    if (auto st = store_.sync_filesystem(ep_.dest); !st) fail_local(st.error());
    return nullptr;
  }
  for (size_t i : mine) {
    if (auto st = txn_[i]->sync(); !st) {
      fail_local(st.error());
      break;
    }
  }
  return nullptr;
}

void Transfer::post_validate(const std::vector<size_t>& mine) {
  for (size_t i : mine) {
    const Entry& e = m_.entries[i];
    if (opt_.post == Validate::size) {
      auto sz = txn_[i]->size_on_disk();
      if (!sz)
        fail_local(sz.error());
      else if (*sz != e.meta.size)
        fail_local(stage_error(Errc::checksum_mismatch, "size check of", dest_of(i)));
    } else {
      auto c = txn_[i]->crc_on_disk();
      if (!c)
        fail_local(c.error());
      else if (*c != file_crc_[i])
        fail_local(stage_error(Errc::checksum_mismatch, "post-validation of", dest_of(i)));
    }
    if (local_err_) break;
  }
}

// Many files: rename each, then one sync for every name (the data was synced before); a
// single file: rename and fsync its directory. A selection never syncs its names.
void Transfer::publish(const std::vector<size_t>& mine) {
  const bool group = opt_.selection.active();
  const bool batch = mine.size() > 8 || group;
  for (size_t i : mine) {
    if (auto st = batch ? txn_[i]->commit_unsynced() : txn_[i]->commit(); !st) {
      fail_local(st.error());
      break;
    }
    r_.published.push_back(m_.entries[i].path);
  }
  // A selection skips that second sync: before any name appears its data is durable (the
  // publication's first step), so a crash can only lose names, and a lost name is a copy
  // made again when it is next needed.
  if (batch && !local_err_ && !group) {
    const Accumulate syncing(r_.pipe.sync);
    if (auto st = store_.sync_filesystem(ep_.dest); !st) fail_local(st.error());
  }
  published_ = !mine.empty() && !local_err_;
}

void Transfer::finish() {
  const std::vector<size_t> mine = my_files();
  std::unique_ptr<Publication> group;  // a selection's, once its data is durable
  if (!source_err_ && !local_err_) {
    finish_empty_files(mine);
    group = sync_copies(mine);
  }
  const auto t_post = Clock::now();
  if (!source_err_ && !local_err_ && opt_.post != Validate::none) post_validate(mine);
  r_.t.postvalidate = since(t_post);
  // A node publishes iff the source held still and its own copy verified.
  if (!source_err_ && !local_err_) publish(mine);
  // Renamed or not (a check failed in between): the store may now sync what is at those names.
  if (group) group->done();
  for (auto& t : txn_)
    if (t) t->abort();  // no-op after commit
}

void Transfer::collect_errors() {
  std::string mine;
  if (local_err_)
    mine = local_err_->message;
  else if (source_err_ && source_err_->code != make_error_code(Errc::peer_failed))
    mine = source_err_->message;  // the rank that read (or re-checked) the source or seed copy
  auto all = comm_.gather(mine, opt_.root);
  if (is_root() && all) {
    for (auto& s : *all)
      if (!s.empty()) r_.errors.push_back(s);
  } else if (!mine.empty()) {
    r_.errors.push_back(mine);
  }
}

}  // namespace stage::engine
