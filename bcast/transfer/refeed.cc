// Fallback: a feed that failed on the seed's side (its copy changed, a short or failed read, a
// chunk or file that does not read back to its recorded CRC, a checksum other than the
// source's) fails nothing. Every rank learned it from the trailer (refeed_); together they
// run the copy phase again, fed by the next lowest seed that proves its copy (the failed one
// excluded), else by the source rank, into the same temporary files: the same version, so
// the same bytes. Chunks a seed proved against its ChunkRecord stay written, so a live
// copy's readers keep their handles and what they read; a feed that proved only its whole
// file may have written wrong bytes, so its temporary files start over (Txn::rewind). The
// failed seed's node then writes a copy of its own. At most kMaxSeedAttempts seeds, then the
// source: only a failure of the source fails the transfer.
#include <spdlog/spdlog.h>

#include "bcast/transfer/transfer.h"

namespace stage::engine {

// The failed seed's node: its copy is no longer trusted (its store may have removed it), so
// it writes the transfer's files like any node that needs them.
void Transfer::rejoin_as_writer() {
  if (!ep_.writer || local_err_) return;
  for (size_t i = 0; i < m_.entries.size(); ++i) {
    if (need_any_[i] == 0 || need_local_[i] != 0 || m_.entries[i].type != EntryType::file) continue;
    auto t = store_.begin(dest_of(i));
    if (!t) return fail_local(t.error());
    txn_[i] = std::move(t.value());
    need_local_[i] = 1;
    proof_[i] = Proof::none;
    r_.this_node_wrote = true;
  }
}

// What one feed of the copy phase leaves behind, cleared for the next; rewind: the temporary
// files start over.
void Transfer::reset_copy_state(bool rewind) {
  if (writer_err_) fail_local(*writer_err_);  // this node's own failure stays
  source_err_.reset();
  root_errno_ = 0;
  refeed_ = false;
  file_crc_.assign(m_.entries.size(), 0);
  finished_.assign(m_.entries.size(), 0);
  source_file_crc_.clear();
  reader_file_crc_.clear();
  reader_chunk_crc_.clear();
  writer_chunk_crc_.clear();
  writer_chunks_ = 0;
  chunk_proof_ = ChunkProof{};
  {
    const std::lock_guard lk(want_m_);
    want_q_.clear();
  }
  if (!rewind || local_err_) return;
  for (auto& t : txn_)
    if (t)
      if (auto st = t->rewind(); !st) return fail_local(st.error());
}

Status Transfer::feed_again() {
  const int failed = data_root_;
  const std::string why = source_err_ ? source_err_->message : std::string("the feed failed");
  excluded_[static_cast<size_t>(failed)] = 1;
  if (comm_.rank() == failed) rejoin_as_writer();
  reset_copy_state(!seed_proves_chunks_);
  // Every rank relays the next feed: one short of buffers ends the transfer here (the failed
  // feed's error stands).
  auto short_of_memory = allreduce_max(comm_, allocate_buffers() ? 0 : 1);
  if (!short_of_memory) return short_of_memory.error();
  if (*short_of_memory != 0) {
    source_err_ = Error{make_error_code(Errc::peer_failed), why};
    return {};
  }
  if (auto st = choose_seed(); !st) return st;
  ++r_.feed_retries;
  r_.fed_by = data_root_;
  r_.fed_from_copy = seeded_;
  if (is_root()) {  // once for the whole group, not once per rank
    r_.feed_failures.push_back(why);
    spdlog::warn("{}: rank {}{} could not feed {} ({}): feeding it again from {}", host_name(), failed,
                 host_of(comm_, failed), ep_.source, why,
                 seeded_ ? "rank " + std::to_string(data_root_) + host_of(comm_, data_root_) + "'s copy"
                         : std::string("the source"));
  }
  return {};
}

}  // namespace stage::engine
