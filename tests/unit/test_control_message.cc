// The control channel's messages (fusefs/group/control.h): what goes out comes back equal, and a
// message a node must not act on (an unsafe directory, a bad slice, unknown flags) is refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "fusefs/group/control.h"
#include "fusefs/group/coordinator.h"

namespace stagefs {
namespace {

TEST(ControlMessageTest, BatchesRoundTripAndUnsafeDirectoriesAreRefused) {
  for (const Message& m :
       {Message{MsgType::batch, 7, "d/e"}, Message{MsgType::batch, 8, ""},
        Message{MsgType::batch_nested, 9, "d"}, Message{MsgType::batch_prefetch, 10, "d/f"},
        Message{MsgType::file_prefetch, 11, "d/g"}, Message{MsgType::file_nested, 12, "h"}}) {
    const std::string bytes = encode_message(m);
    auto back = decode_message(std::as_bytes(std::span(bytes.data(), bytes.size())));
    ASSERT_TRUE(back) << back.error().message;
    EXPECT_EQ(*back, m);
  }
  for (const char* bad : {"../x", "/etc", "d/../..", "d//e"}) {
    for (MsgType t : {MsgType::batch, MsgType::batch_nested, MsgType::batch_prefetch}) {
      const std::string bytes = encode_message(Message{t, 1, bad});
      EXPECT_FALSE(decode_message(std::as_bytes(std::span(bytes.data(), bytes.size())))) << bad;
    }
  }
  // A single file still needs a name, and a safe one.
  for (MsgType t : {MsgType::materialize, MsgType::file_prefetch, MsgType::file_nested})
    for (const char* bad : {"", "../x", "/etc", "d//e"}) {
      const std::string bytes = encode_message(Message{t, 1, bad});
      EXPECT_FALSE(decode_message(std::as_bytes(std::span(bytes.data(), bytes.size())))) << bad;
    }
  // No type beyond the last one.
  std::string unknown = encode_message(Message{MsgType::file_nested, 1, "d"});
  unknown[4] = static_cast<char>(static_cast<uint8_t>(MsgType::file_nested) + 1);
  EXPECT_FALSE(decode_message(std::as_bytes(std::span(unknown.data(), unknown.size()))));
  unknown[4] = 0;
  EXPECT_FALSE(decode_message(std::as_bytes(std::span(unknown.data(), unknown.size()))));
}
TEST(ControlMessageTest, UidsFlagsAndSlicesRoundTripAndBadSlicesAreRefused) {
  for (const Message& m : {Message{MsgType::batch, 7, "d/e", 1000, kBackground, "f1", "f9"},
                           Message{MsgType::batch_prefetch, 8, "", 0, kToEnd, "x", ""},
                           Message{MsgType::materialize, 9, "a/b", 4294967295U, kBackground, "", ""}}) {
    const std::string bytes = encode_message(m);
    auto back = decode_message(std::as_bytes(std::span(bytes.data(), bytes.size())));
    ASSERT_TRUE(back) << back.error().message;
    EXPECT_EQ(*back, m);
  }
  for (const Message& bad :
       {Message{MsgType::batch, 1, "d", 0, 0, "a/b", ""}, Message{MsgType::batch, 1, "d", 0, 0, "..", ""},
        Message{MsgType::batch, 1, "d", 0, 0, "", std::string(256, 'x')},
        Message{MsgType::materialize, 1, "f", 0, 0, "x", ""},
        Message{MsgType::batch, 1, "d", 0, 4, "", ""}}) {
    const std::string bytes = encode_message(bad);
    EXPECT_FALSE(decode_message(std::as_bytes(std::span(bytes.data(), bytes.size()))))
        << bad.from << bad.until;
  }
}

}  // namespace
}  // namespace stagefs
