// Admission: what the mount group asks of this node's cache around each transfer and batch.
//
// The group (group.h) declares it and calls it; the cache room implements it (NodeCopies,
// cache/copies.h), and the daemon hands that object to the group (GroupConfig::admission).
// So the group decides when a copy is made, the cache decides whether it may be written here
// and what it became, and neither reads the other's code to know it.
//
// Every method is called on every rank, from the group's service thread, one transfer or
// batch at a time (never two at once: a nested batch runs between its transfer's calls). A
// method must not call back into the group.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bcast/io/error.h"
#include "bcast/io/source.h"

namespace stagefs {

class Admission {
 public:
  virtual ~Admission() = default;
  // Before a transfer of rel: an outdated copy goes (its space counts as free) and room is
  // made, evicting only if may_evict (not for a background transfer). An error (no room in
  // this node's cache) makes this node relay the transfer without writing a copy: the other
  // nodes get theirs, and this node's opens of rel get the error (they then wait for room).
  virtual stage::Status before_transfer(const std::string& rel, bool may_evict) = 0;
  // After a transfer of rel, whatever its outcome: a published copy joins the cache.
  virtual void after_transfer(const std::string& rel, bool ok) = 0;
  // Before a batch of directory dir: slice is the part of dir's small files the batch takes
  // (the engine's scan, with the limits). may_evict false (a prefetched batch: no open asked
  // for it): no room is made by evicting; a batch that does not fit is then refused by the
  // engine's free-space check, on every rank.
  virtual void before_batch(const std::string& dir, const stage::SelectionSlice& slice, bool may_evict) = 0;
  // After a batch of dir: the files this node published (plain names in dir). They were
  // checked chunk by chunk while written: the cache trusts them for the rest of the mount.
  virtual void after_batch(const std::string& dir, const std::vector<std::string>& published, bool ok) = 0;
};

}  // namespace stagefs
