#include "bcast/test_hold.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace stage {

void test_hold(const char* point, int rank) {
  static const char* const wanted = std::getenv("STAGE_TEST_HOLD");
  if (wanted == nullptr || std::strcmp(wanted, point) != 0) return;
  if (const char* r = std::getenv("STAGE_TEST_HOLD_RANK"); r != nullptr && std::atoi(r) != rank) return;
  const char* f = std::getenv("STAGE_TEST_HOLD_FILE");
  if (f != nullptr) {
    const int fd = ::open(f, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0) ::close(fd);
  }
  if (std::getenv("STAGE_TEST_HOLD_BLOCK") != nullptr && f != nullptr) {
    // Only this thread waits, until the test removes the file (the rest of the process runs).
    while (::access(f, F_OK) == 0) ::usleep(5000);
    return;
  }
  ::raise(SIGSTOP);
}

}  // namespace stage
