// Plan: what the transfer is (the manifest the source rank scans and shares) and who needs
// what (each writer judges its copies; allreduces make the answer everyone's), then who feeds
// the stream (the source rank, or a seed).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>

#include "bcast/io/crc.h"
#include "bcast/transfer/transfer.h"

namespace stage {

bool needs_copy(const LocalState& local, const FileMeta& src, Validate mode, bool overwrite,
                uint64_t local_crc, uint64_t source_crc, SourceVersion rule) {
  if (overwrite || mode == Validate::none) return true;
  if (!local.exists || !local.regular || local.size != src.size) return true;
  if (mode == Validate::checksum) return local_crc != source_crc;
  if (mode == Validate::recorded) {
    return !local.origin || !origin_matches(*local.origin, local.mtime_ns, src, rule);
  }
  return local.mtime_ns != src.mtime_ns;  // size: same size and same mtime as the source
}

namespace engine {

// `root` broadcasts "did I fail?", the failure's errno if the system gave one (root_errno_:
// what a failed open of the mount reports; a source that changed or ended early has none)
// and its message; every rank returns the same error. how: on root, a non-zero kind of
// failure to send with it (err set); everywhere, the kind sent.
Status Transfer::share_root_status(std::optional<Error>& err, int root, int64_t* how) {
  const bool me = comm_.rank() == root;
  const bool sys = me && err && err->code.category() == std::generic_category();
  std::array<int64_t, 2> failed{me && err ? (how != nullptr ? *how : 1) : 0, sys ? err->code.value() : 0};
  if (auto st = comm_.bcast(std::as_writable_bytes(std::span(failed)), root); !st) return st;
  if (how != nullptr) *how = failed[0];
  if (failed[0] == 0) return {};
  root_errno_ = static_cast<int>(failed[1]);
  std::string msg = me ? err->message : std::string();
  if (auto st = bcast_string(comm_, msg, root); !st) return st;
  if (!me) err = Error{make_error_code(Errc::peer_failed), msg};
  return {};
}

// The source rank: the manifest of the whole source, or of a selection of its files.
Result<Manifest> Transfer::scan_source() {
  if (src_ == nullptr) return stage_error(Errc::unsupported, "no source reader");
  if (opt_.selection.active()) {
    auto picked = src_->scan_selection(ep_.source, opt_.selection.max_file_size, opt_.selection.range);
    if (!picked) return picked.error();
    r_.next_slice = std::move(picked->next_slice);
    return std::move(picked->manifest);
  }
  auto skip = [&](const std::string& path, const std::string& why) {
    r_.skipped.push_back(path + ": " + why);
    spdlog::warn("{}: skipping {}: {}", host_name(), path, why);
  };
  auto m = src_->scan(ep_.source, opt_.recursive, skip);
  if (m && m->tree) order_files_first(*m, opt_.first_files);
  return m;
}

void Transfer::count_entries() {
  for (const Entry& e : m_.entries) {
    if (e.type == EntryType::file) {
      ++r_.files;
      r_.bytes_total += e.meta.size;
    } else if (e.type == EntryType::dir) {
      ++r_.dirs;
    } else {
      ++r_.symlinks;
    }
  }
}

Status Transfer::share_manifest() {
  std::optional<Error> err;
  std::string bytes;
  if (is_root()) {
    Result<Manifest> scanned = scan_source();
    if (scanned) {
      scanned->chunk_size = opt_.chunk_size;           // every rank follows the source rank's
      scan_sparse_files(*src_, ep_.source, *scanned);  // holes the stream skips, what copies take
      bytes = encode(*scanned);
    } else {
      err = scanned.error();
    }
  }
  if (auto st = share_root_status(err, opt_.root); !st) return st;
  if (err) return *err;
  if (auto st = bcast_string(comm_, bytes, opt_.root); !st) return st;
  auto decoded = decode(std::as_bytes(std::span(bytes.data(), bytes.size())));
  if (!decoded) return decoded.error();
  m_ = std::move(decoded.value());
  count_entries();
  return {};
}

// --pre-validate checksum: the root reads every source file once and broadcasts the CRCs.
Status Transfer::share_source_crcs(std::vector<uint64_t>& crcs) {
  crcs.assign(m_.entries.size(), 0);
  std::optional<Error> err;
  if (is_root()) {
    std::vector<std::byte> buf(4 * kMiB);
    for (size_t i = 0; i < m_.entries.size() && !err; ++i) {
      const Entry& e = m_.entries[i];
      if (e.type != EntryType::file) continue;
      auto f = src_->open(ep_.source, e);
      if (!f) {
        err = f.error();
        break;
      }
      uint64_t crc = 0;
      for (uint64_t off = 0; off < e.meta.size;) {
        const size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), e.meta.size - off));
        if (auto st = (*f)->read_at(off, std::span(buf.data(), n)); !st) {
          err = st.error();
          break;
        }
        crc = crc64(std::span(buf.data(), n), crc);
        read_source_ += n;
        off += n;
      }
      crcs[i] = crc;
    }
  }
  if (auto st = share_root_status(err, opt_.root); !st) return st;
  if (err) return *err;
  return comm_.bcast(std::as_writable_bytes(std::span(crcs)), opt_.root);
}

// A writer's judgement of entry i: directories and symlinks are made here; a regular file is
// marked in need_local_ when this node's copy is missing or stale.
void Transfer::judge_entry(size_t i, int& swept) {
  const Entry& e = m_.entries[i];
  const std::string path = dest_of(i);
  if (e.type == EntryType::dir) {
    // A selection's directory is created like the parents of a single file
    // (StoreOptions::parent_mode), not with the source directory's mode.
    const bool selection_dir = opt_.selection.active() && e.path.empty();
    if (auto st =
            selection_dir ? store_.make_parents(join_path(path, "x")) : store_.make_dir(path, e.meta.mode);
        !st)
      fail_local(st.error());
    swept += store_.remove_stale_temps(path);
    return;
  }
  auto ls = store_.inspect(path);
  if (!ls) return fail_local(ls.error());
  if (ls->special != nullptr) {  // a rename would replace /dev/null, a FIFO, a socket
    return fail_local(sys_error(
        EEXIST, std::string("destination is a ") + ls->special + ", not a regular file: refusing to replace",
        path));
  }
  if (e.type == EntryType::symlink) {
    if (ls->link_target != e.link_target || opt_.overwrite) {
      if (auto st = store_.make_symlink(path, e.link_target); !st) fail_local(st.error());
    }
    return;
  }
  if (ls->is_dir) return fail_local(sys_error(EISDIR, "destination (give the full path of the file)", path));
  uint64_t local_crc = 0;
  if (!src_crc_.empty() && ls->regular && ls->size == e.meta.size) {
    auto c = store_.checksum(path);
    if (!c) return fail_local(c.error());
    local_crc = *c;
  }
  copy_seen_[i] = FileMeta{ls->size, ls->mtime_ns, 0, ls->ino, ls->dev, 0};
  need_local_[i] = needs_copy(*ls, e.meta, opt_.pre, opt_.overwrite, local_crc,
                              src_crc_.empty() ? 0 : src_crc_[i], opt_.source_version)
                       ? 1
                       : 0;
  if (need_local_[i] == 0 && ls->regular) proof_[i] = judge_proof(i, *ls, local_crc);
  const SourceVersion rule = opt_.source_version;
  if (ls->origin && rule == SourceVersion::full && !origin_matches(*ls->origin, ls->mtime_ns, e.meta, rule) &&
      origin_matches(*ls->origin, ls->mtime_ns, e.meta, SourceVersion::no_inode))
    ++inode_only_;  // decide() says so once, on the source rank
}

// A single file of more than one chunk: the transfer whose copies record their chunks' CRCs
// (ChunkRecord), and whose readers may read before it ends.
bool Transfer::single_file_of_chunks() const {
  return !m_.tree && !opt_.selection.active() && m_.entries.size() == 1 &&
         m_.entries[0].type == EntryType::file && chunk_count(m_.entries[0].meta.size, m_.chunk_size) > 1 &&
         chunk_count(m_.entries[0].meta.size, m_.chunk_size) <= kMaxLiveCopyChunks;
}

// What proves entry i's copy here (current by the pre-validation rule) to be the source's
// current version, so that it may feed other nodes: its CRC compared with the source's
// (--pre-validate checksum), or a recorded origin that matches the source now, and then
// also its ChunkRecord if that can prove this transfer's chunks. A same-size, same-mtime file
// of unknown origin (--pre-validate size) is proven by nothing.
Proof Transfer::judge_proof(size_t i, const LocalState& ls, uint64_t local_crc) {
  const Entry& e = m_.entries[i];
  const SourceVersion rule = opt_.source_version;
  if (!src_crc_.empty()) return local_crc == src_crc_[i] ? Proof::whole : Proof::none;
  if (!ls.origin || !ls.origin->crc_known || !origin_matches(*ls.origin, ls.mtime_ns, e.meta, rule))
    return Proof::none;
  copy_crc_[i] = ls.origin->crc;
  if (!single_file_of_chunks()) return Proof::whole;
  auto rec = store_.chunk_record(dest_of(i));
  if (!rec || !*rec || (*rec)->dev != ls.dev || (*rec)->ino != ls.ino ||
      !(*rec)->chunks.proves(m_.chunk_size, e.meta.size, ls.origin->crc))
    return Proof::whole;
  record_ = std::move((*rec)->chunks);
  return Proof::chunks;
}

Status Transfer::decide() {
  const size_t n = m_.entries.size();
  if (opt_.pre == Validate::checksum && !opt_.overwrite) {
    if (auto st = share_source_crcs(src_crc_); !st) return st;
  }
  need_local_.assign(n, 0);
  copy_seen_.assign(n, FileMeta{});
  copy_crc_.assign(n, std::nullopt);
  proof_.assign(n, Proof::none);
  excluded_.assign(static_cast<size_t>(comm_.size()), 0);
  if (ep_.writer) {
    if (auto st = store_.make_parents(ep_.dest); !st) fail_local(st.error());
    // Temporary files of killed runs go first, whether or not this node copies anything now.
    int swept = m_.tree ? 0 : store_.remove_stale_temps(parent_dir(ep_.dest));
    for (size_t i = 0; i < n && !local_err_; ++i) judge_entry(i, swept);
    if (swept > 0)
      spdlog::info("{}: removed {} stale temporary file(s) under {}", host_name(), swept, ep_.dest);
  }
  need_any_ = need_local_;
  if (auto st = comm_.allreduce_max(need_any_); !st) return st;
  bool mine = false;
  for (int64_t v : need_local_) mine = mine || v != 0;
  r_.this_node_wrote = mine;
  std::array<int64_t, 3> counts{ep_.writer ? 1 : 0, mine ? 1 : 0, inode_only_ > 0 ? 1 : 0};
  if (auto st = comm_.allreduce_sum(counts); !st) return st;
  r_.writers = counts[0];
  r_.nodes_needing = counts[1];
  if (counts[2] > 0 && is_root())
    spdlog::warn(
        "{}: {} node(s) hold a copy of {} whose recorded origin matches the source on size, mtime and "
        "ctime but not on its inode number: such a copy is not taken for the source's version. If the "
        "source's inode numbers are not stable across mounts or nodes (a FUSE filesystem without "
        "use_ino, an object-store mount), --source-version no-inode takes them (see the admin guide)",
        host_name(), counts[2], ep_.source);
  if (r_.nodes_needing == 0) return {};
  if (opt_.seed_from_copies)
    if (auto st = choose_seed(); !st) return st;
  r_.fed_by = data_root_;
  r_.fed_from_copy = seeded_;
  return {};
}

// Seeding: a writer whose copies of every file any node needs are proven current (Proof) may
// feed the broadcast; the lowest such rank does, unless this transfer has already seen it
// fail (excluded_). When readers may read the copy before it ends (a live copy's hooks on any
// rank), only a copy that proves each chunk before it is sent: a reader never gets a byte
// the source does not hold. Otherwise (and after kMaxSeedAttempts seeds) the source rank
// feeds. Collective: every rank computes the same choice from one allreduce.
Status Transfer::choose_seed() {
  bool whole = ep_.writer && !local_err_ && excluded_[static_cast<size_t>(comm_.rank())] == 0 &&
               seeds_tried_ < kMaxSeedAttempts;
  bool chunks = whole;
  for (size_t i = 0; i < m_.entries.size() && whole; ++i) {
    if (need_any_[i] == 0) continue;
    whole = need_local_[i] == 0 && proof_[i] != Proof::none;
    chunks = chunks && whole && proof_[i] == Proof::chunks;
  }
  const int64_t me = comm_.size() - comm_.rank();  // max: the lowest rank
  std::array<int64_t, 3> best{chunks ? me : 0, whole ? me : 0, opt_.live_copy != nullptr ? 1 : 0};
  if (auto st = comm_.allreduce_max(best); !st) return st;
  const bool readers = best[2] != 0 && single_file_of_chunks();
  const int64_t pick = readers ? best[0] : std::max(best[0], best[1]);
  seeded_ = pick != 0;
  data_root_ = seeded_ ? comm_.size() - static_cast<int>(pick) : opt_.root;
  seed_proves_chunks_ = seeded_ && pick == best[0];
  if (!seeded_) return {};
  ++seeds_tried_;
  seed_before_.assign(m_.entries.size(), FileMeta{});
  if (is_root())
    spdlog::info("{}: rank {} feeds the transfer from its current copy{}{}", host_name(), data_root_,
                 host_of(comm_, data_root_),
                 seed_proves_chunks_ ? ", its chunks proven against their recorded CRCs" : "");
  return {};
}

}  // namespace engine
}  // namespace stage
