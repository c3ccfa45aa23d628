// Crash-test hook. With STAGE_TEST_HOLD=<point> in the environment (and, optionally,
// STAGE_TEST_HOLD_RANK=<rank>), a process reaching <point> creates the file named by
// STAGE_TEST_HOLD_FILE and stops itself (SIGSTOP), so a test can kill -9 it exactly there and
// check what a later run accepts. Points: "before-first-chunk" (temporary files exist, no
// data yet), "mid-file" (after the second chunk), "before-rename" (data fsynced, not yet
// published). With STAGE_TEST_HOLD_BLOCK=1 only the calling thread waits instead, until the
// test removes the hold file (the daemon's other threads keep serving). Without the variable
// it costs one cached getenv.
#pragma once

namespace stage {

void test_hold(const char* point, int rank);

}  // namespace stage
