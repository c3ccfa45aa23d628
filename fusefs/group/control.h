// The control plane of a mount group: how a node asks for a file and how the coordinator
// (rank 0, the node that reads the source) tells every node what to transfer next.
//
//   node -> coordinator   Request       point to point: "materialize PATH", "batch DIR" or
//                                       "shut down"
//   coordinator -> all    Announcement  one broadcast per decision, in the same order on every
//                                       rank: "transfer PATH (id N)", "batch DIR (id N)" or
//                                       "shut down"; while a transfer of one file runs,
//                                       "batch DIR (id N), nested in it"
// A batch stands for every small regular file directly in DIR (not recursive; "" is the root
// of the source): one transfer packs them all (datasets of many small files).
//
// Messages are small fixed-layout byte strings; decode_*() validate type, lengths and the
// path (relative, no "..") before anything uses them (a fuzz target covers them).
// ControlPlane is owned by the group's service thread: not thread-safe; every call is
// non-blocking, so the service thread can poll it and sleep when idle.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <string>

#include "bcast/io/error.h"

namespace stagefs {

inline constexpr size_t kMaxPath = 4096;
inline constexpr size_t kMaxName = 255;  // one component (a batch slice's bounds)
// Every message fits one fixed buffer.
inline constexpr size_t kMaxMessage = kMaxPath + 2 * kMaxName + 64;

// batch_nested: an announcement only, a batch to run nested in the single-file transfer in
// progress (bcast/transfer/terms.h, Nest), where the source rank puts a mark in its stream (or after
// that transfer, if its stream ends first). Its key is the batch's.
// batch_prefetch: an announcement only, a batch that no open had asked for when it was
// announced (a walk's, coordinator.h): it never evicts a copy to make room. Its key is the
// batch's.
// file_prefetch: an announcement only, one file that no open had asked for when it was
// announced (a background request: a replayed profile, stagectl prefetch): it never evicts
// a copy, and a request of an open may run nested in it (file_nested). Its key is the file's.
// file_nested: an announcement only, one file to run nested in the background transfer in
// progress, as batch_nested. Its key is the file's.
enum class MsgType : uint8_t {
  materialize = 1,
  shutdown = 2,
  batch = 3,
  batch_nested = 4,
  batch_prefetch = 5,
  file_prefetch = 6,
  file_nested = 7
};
// A directory batch, whatever the announcement's kind.
inline bool is_batch(MsgType t) {
  return t == MsgType::batch || t == MsgType::batch_nested || t == MsgType::batch_prefetch;
}
// One file, whatever the announcement's kind.
inline bool is_file(MsgType t) {
  return t == MsgType::materialize || t == MsgType::file_prefetch || t == MsgType::file_nested;
}
inline bool is_nested(MsgType t) {
  return t == MsgType::batch_nested || t == MsgType::file_nested;
}
// The key an announcement answers: (materialize, FILE) or (batch, DIR).
inline MsgType key_type(MsgType t) {
  return is_batch(t) ? MsgType::batch : is_file(t) ? MsgType::materialize : t;
}

struct Message {
  MsgType type = MsgType::materialize;
  uint64_t id = 0;   // announcements: transfer id; requests: the last id the node had seen
  std::string path;  // relative to SOURCE_DIR; empty for shutdown (and for a batch of the root)
  // Requests: the uid of the open that asked (the coordinator's queue takes turns by uid);
  // announcements: the uid whose request (or walk) it answers.
  uint32_t uid = 0;
  // Requests: kBackground marks one no open waits for (stagectl prefetch): it is announced
  // only when no other request waits.
  uint8_t flags = 0;
  // Batches: the slice of the directory's small files, by name in byte order, circularly
  // (stage::SelectionSlice): from `from` up to `until` (exclusive), or with `until` empty
  // back to `from`, or with flag kToEnd to the last name. A request names the opened file in
  // `from`, so that file is first in its slice. Plain names only.
  std::string from{};
  std::string until{};
  bool operator==(const Message&) const = default;
};
inline constexpr uint8_t kBackground = 1;
inline constexpr uint8_t kToEnd = 2;

// The directory holding rel ("" at the root of the source): a small file's batch key, and
// the parent of a batch's directory.
std::string batch_dir_of(const std::string& rel);

std::string encode_message(const Message& m);
stage::Result<Message> decode_message(std::span<const std::byte> bytes);

class ControlPlane {
 public:
  virtual ~ControlPlane() = default;
  [[nodiscard]] virtual bool is_coordinator() const = 0;
  // A node's request to the coordinator (the coordinator itself never calls it).
  virtual stage::Status send_request(const Message& m) = 0;
  // Coordinator: the next request from any rank, if one has arrived.
  virtual stage::Result<std::optional<Message>> poll_request() = 0;
  // Coordinator: start broadcasting an announcement (at most one outstanding).
  virtual stage::Status announce(const Message& m) = 0;
  // Everyone: the next announcement, once it has arrived (on the coordinator: once sent).
  virtual stage::Result<std::optional<Message>> poll_announcement() = 0;
  // COLLECTIVE, for a group that stops before any shutdown announcement (a node failed to
  // mount): completes the outstanding announcement on every rank. Blocking.
  virtual stage::Status close() { return {}; }
};

// A group of one rank: requests and announcements are in-process queues.
class LocalControlPlane final : public ControlPlane {
 public:
  [[nodiscard]] bool is_coordinator() const override { return true; }
  stage::Status send_request(const Message& m) override {
    requests_.push_back(m);
    return {};
  }
  stage::Result<std::optional<Message>> poll_request() override { return pop(requests_); }
  stage::Status announce(const Message& m) override {
    announcements_.push_back(m);
    return {};
  }
  stage::Result<std::optional<Message>> poll_announcement() override { return pop(announcements_); }

 private:
  static std::optional<Message> pop(std::deque<Message>& q) {
    if (q.empty()) return std::nullopt;
    Message m = std::move(q.front());
    q.pop_front();
    return m;
  }
  std::deque<Message> requests_;
  std::deque<Message> announcements_;
};

}  // namespace stagefs
