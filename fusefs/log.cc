#include "fusefs/log.h"

#include <spdlog/details/log_msg.h>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/base_sink.h>

namespace stagefs {

namespace {

class EscapingSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit EscapingSink(std::FILE* out) : out_(out) {}

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    const std::string payload = escape_controls(std::string_view(msg.payload.data(), msg.payload.size()));
    spdlog::details::log_msg escaped = msg;
    escaped.payload = spdlog::string_view_t(payload.data(), payload.size());
    spdlog::memory_buf_t line;
    formatter_->format(escaped, line);
    std::fwrite(line.data(), 1, line.size(), out_);
    std::fflush(out_);  // as spdlog's stderr sink: a line is out before a crash
  }
  void flush_() override { std::fflush(out_); }

 private:
  std::FILE* out_;
};

}  // namespace

std::shared_ptr<spdlog::sinks::sink> escaping_sink(std::FILE* out) {
  return std::make_shared<EscapingSink>(out);
}

bool WarnBudget::allow(Clock::time_point now, uint64_t& held_back) {
  std::lock_guard lk(m_);
  held_back = 0;
  if (used_ == 0 || now - start_ >= window_) {
    held_back = dropped_;
    start_ = now;
    used_ = 0;
    dropped_ = 0;
  }
  if (used_ >= burst_) {
    ++dropped_;
    return false;
  }
  ++used_;
  return true;
}

}  // namespace stagefs
