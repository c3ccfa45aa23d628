// libFuzzer target: every message a rank decodes from another (the manifest broadcast by
// the source rank, control-plane requests and announcements), and a profile (written by
// another node's daemon, or another user, or edited by hand), must be rejected or accepted
// without crashing, over-reading or yielding an unsafe path. Built by tests/run-all.sh with
// clang (-fsanitize=fuzzer,address,undefined) and run for a bounded time.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "bcast/io/manifest.h"
#include "fusefs/group/control.h"
#include "fusefs/profile/format.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto bytes = std::as_bytes(std::span(data, size));
  if (auto m = stage::decode(bytes); m) {
    for (const auto& e : m->entries) {
      if (!stage::is_safe_relative(e.path)) std::abort();  // decode must never accept these
      // Holes inside the file: the stream never runs past it nor wraps.
      if (stage::streamed_bytes(e) > e.meta.size) std::abort();
    }
    const std::string again = stage::encode(*m);  // round trip must be stable
    if (!stage::decode(std::as_bytes(std::span(again.data(), again.size())))) std::abort();
  }
  if (auto c = stagefs::decode_message(bytes); c) {
    if ((c->type == stagefs::MsgType::materialize || stagefs::is_batch(c->type)) && !stage::is_safe_relative(c->path))
      std::abort();
    const std::string again = stagefs::encode_message(*c);
    auto back = stagefs::decode_message(std::as_bytes(std::span(again.data(), again.size())));
    if (!back || !(*back == *c)) std::abort();
  }
  if (auto p = stagefs::decode_profile(bytes); p) {
    for (const auto& f : p->files)
      if (!stage::is_safe_relative(f.path)) std::abort();  // only paths beneath the source
    const std::string again = stagefs::encode_profile(*p);
    auto back = stagefs::decode_profile(std::as_bytes(std::span(again.data(), again.size())));
    if (!back || !(*back == *p)) std::abort();
  }
  return 0;
}
