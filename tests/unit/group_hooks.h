// GroupHooks: the group's Admission and ReadOrders as functions a test sets one by one, where
// the daemon hands the group its cache room (NodeCopies) and its profile. group_hooks(cfg) makes
// them on first use; copies of cfg share them. An unset function does nothing.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "fusefs/group/group.h"

namespace stagefs {

struct GroupHooks final : Admission, ReadOrders {
  std::function<stage::Status(const std::string& rel, bool may_evict)> on_before_transfer;
  std::function<void(const std::string& rel, bool ok)> on_after_transfer;
  std::function<void(const std::string& dir, const stage::SelectionSlice& slice, bool may_evict)>
      on_before_batch;
  std::function<void(const std::string& dir, const std::vector<std::string>& published, bool ok)>
      on_after_batch;
  std::function<std::vector<uint64_t>(const std::string& rel, uint64_t chunk_size)> on_first_chunks;
  std::function<void(const std::string& rel, const LiveCopy::ReadOrder& order)> on_live_reads;

  stage::Status before_transfer(const std::string& rel, bool may_evict) override {
    return on_before_transfer ? on_before_transfer(rel, may_evict) : stage::Status{};
  }
  void after_transfer(const std::string& rel, bool ok) override {
    if (on_after_transfer) on_after_transfer(rel, ok);
  }
  void before_batch(const std::string& dir, const stage::SelectionSlice& slice, bool may_evict) override {
    if (on_before_batch) on_before_batch(dir, slice, may_evict);
  }
  void after_batch(const std::string& dir, const std::vector<std::string>& published, bool ok) override {
    if (on_after_batch) on_after_batch(dir, published, ok);
  }
  std::vector<uint64_t> first_chunks(const std::string& rel, uint64_t chunk_size) override {
    return on_first_chunks ? on_first_chunks(rel, chunk_size) : std::vector<uint64_t>{};
  }
  void live_reads(const std::string& rel, const LiveCopy::ReadOrder& order) override {
    if (on_live_reads) on_live_reads(rel, order);
  }
};

// cfg's hooks, made (and set as its admission and read orders) on first use.
inline GroupHooks& group_hooks(GroupConfig& cfg) {
  auto h = std::dynamic_pointer_cast<GroupHooks>(cfg.admission);
  if (!h) {
    h = std::make_shared<GroupHooks>();
    cfg.admission = h;
    cfg.read_orders = h;
  }
  return *h;
}

}  // namespace stagefs
