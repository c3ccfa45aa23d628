// A fresh directory per test, removed afterwards; and an open-descriptor count for leak checks.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

namespace stage::testing {

inline int open_fd_count() {
  int n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

class TmpDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (std::filesystem::temp_directory_path() / "stagefs-unit-XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    fds_before_ = open_fd_count();
  }
  void TearDown() override {
    EXPECT_EQ(open_fd_count(), fds_before_) << "file descriptors leaked";
    std::filesystem::remove_all(dir_);
  }
  [[nodiscard]] std::string path(const std::string& rel) const { return (dir_ / rel).string(); }

  // Four bytes per draw, and whole-buffer reads: tests make and compare files of 16-64 MiB,
  // which byte-at-a-time loops made take half a minute under the sanitizers.
  static std::string random_bytes(size_t n, uint32_t seed) {
    std::mt19937 g(seed);
    std::string s(n, '\0');
    for (size_t i = 0; i < n; i += 4) {
      const auto v = static_cast<uint32_t>(g());
      std::memcpy(s.data() + i, &v, std::min<size_t>(4, n - i));
    }
    return s;
  }
  static void write_file(const std::string& p, const std::string& data) {
    std::filesystem::create_directories(std::filesystem::path(p).parent_path());
    std::ofstream(p, std::ios::binary) << data;
  }
  static std::string read_file(const std::string& p) {
    std::ifstream f(p, std::ios::binary | std::ios::ate);
    if (!f) return {};
    std::string s(static_cast<size_t>(f.tellg()), '\0');
    f.seekg(0);
    f.read(s.data(), static_cast<std::streamsize>(s.size()));
    s.resize(static_cast<size_t>(f.gcount()));
    return s;
  }

  std::filesystem::path dir_;
  int fds_before_ = 0;
};

}  // namespace stage::testing
