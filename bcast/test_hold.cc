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
  if (const char* f = std::getenv("STAGE_TEST_HOLD_FILE")) {
    const int fd = ::open(f, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0) ::close(fd);
  }
  ::raise(SIGSTOP);
}

}  // namespace stage
