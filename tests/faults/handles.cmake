# A user holding as many handles as the daemon gives (tests/faults/test_handles.py): the
# per-user limit (EMFILE) with other users' opens and listings going on, the descriptor limit
# raised at start, and a first open on the other node of a 2-rank group; skipped (77) without
# /dev/fuse, root, fusermount3, unshare, nsenter, mpirun, useradd, setpriv, prlimit.
function(stage_fault_handles_test name timeout class)
  add_test(NAME faults.handles.${name}
           COMMAND /usr/bin/python3 ${CMAKE_CURRENT_LIST_DIR}/test_handles.py
                   $<TARGET_FILE:stagefs> 2 ${STAGE_MPIRUN} -- ${class})
  stage_fault_properties(faults.handles.${name} ${timeout})
endfunction()

stage_fault_handles_test(standalone 120 Standalone)
stage_fault_handles_test(group.np2 180 Group)
