# Crash points, disk full, a source that changes (tests/faults/test_crash.py): real stage-bcast
# jobs under mpirun (ranks as nodes) and standalone stagefs mounts, in a private mount
# namespace of their own; skipped (77) without /dev/fuse, root, fusermount3, unshare, nsenter,
# mount or mpirun. Uses the holding store and source (bcast/holds/holds.h).
function(stage_fault_crash_test name timeout filter)
  add_test(NAME faults.${name}
           COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/test_crash.py
                   $<TARGET_FILE:stage-bcast> $<TARGET_FILE:stagefs> ${STAGE_MPIRUN} -- ${filter})
  stage_fault_properties(faults.${name} ${timeout})
endfunction()

# kill -9 of rank 1 at before-first-chunk, mid-file, before-rename (with/without old copies)
stage_fault_crash_test(crash.bcast 150 CrashBcast.test_kill9_rank1_at_each_hold_point)
# the next run sweeps a dead writer's temporary file even when its own copy is current
stage_fault_crash_test(crash.bcast_current_copy_temp 60 CrashBcast.test_temp_beside_current_copy_is_swept)
# the temporary file of a killed writer that is still a zombie (unreaped) is swept too
stage_fault_crash_test(crash.bcast_zombie_temp 60 CrashBcast.test_temp_of_zombie_writer_is_swept)
# kill -9 of a standalone stagefs at mid-file / before-rename during an open; restart
stage_fault_crash_test(crash.stagefs 120 CrashStagefs)
# up-front free-space check (stage-bcast np 2, stagefs cache), ENOSPC in the middle of a copy
stage_fault_crash_test(diskfull 120 DiskFull)
# source appended / rewritten / replaced during a transfer; changed between two stagefs jobs
stage_fault_crash_test(source_change 150 SourceChange)
