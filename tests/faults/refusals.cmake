# What stage-bcast and stagefs refuse, and mounts by an unprivileged user
# (tests/faults/test_refusals.py); in a private mount namespace of their own; skipped (77)
# without /dev/fuse, root, fusermount3, unshare, nsenter, mount (faults.refusals.unprivileged:
# useradd, userdel, setpriv).
function(stage_fault_refusals_test name timeout filter)
  add_test(NAME faults.refusals.${name}
           COMMAND /usr/bin/python3 ${CMAKE_CURRENT_LIST_DIR}/test_refusals.py
                   $<TARGET_FILE:stagefs> $<TARGET_FILE:stage-bcast> ${STAGE_MPIRUN} -- ${filter})
  stage_fault_properties(faults.refusals.${name} ${timeout})
endfunction()

# --dest a device (and /dev/null), FIFO, socket, directory; --source on /proc; a /proc file in a
# -r tree (read-time check); -r into itself; one node of two refusing under mpirun
stage_fault_refusals_test(bcast 90 BcastRefusals)
# MOUNTPOINT / --cache / SOURCE_DIR inside one another (also through symlinks), SOURCE_DIR on /proc
stage_fault_refusals_test(paths 60 StagefsPaths)
# a second user mounts with and without user_allow_other; a mount point it cannot write
stage_fault_refusals_test(unprivileged 60 Unprivileged)
