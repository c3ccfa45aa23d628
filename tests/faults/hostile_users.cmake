# A root daemon among hostile users (tests/faults/test_hostile_users.py): what the status
# attribute and stagectl show of other users' transfers and names, the metrics file in a
# sticky world-writable directory, SIGPIPE and stray signals, a user's sparse terabyte, a file
# an ACL denies in a batch, stagectl prefetch of what the user cannot list, the budgets of
# walks and batches, the metadata of a directory closed to the user, the memory of a huge
# listing, a user flooding the log; skipped (77) without /dev/fuse, root, fusermount3, unshare,
# nsenter, useradd, setpriv, setfacl.
function(stage_fault_hostile_users_test name timeout)
  add_test(NAME faults.hostile_users.${name}
           COMMAND /usr/bin/python3 ${CMAKE_CURRENT_LIST_DIR}/test_hostile_users.py
                   $<TARGET_FILE:stagefs> -- ${name})
  stage_fault_properties(faults.hostile_users.${name} ${timeout})
endfunction()

stage_fault_hostile_users_test(Status 90)
stage_fault_hostile_users_test(Names 90)
stage_fault_hostile_users_test(Metrics 120)
stage_fault_hostile_users_test(Signals 90)
stage_fault_hostile_users_test(Sparse 120)
stage_fault_hostile_users_test(BatchAcl 90)
stage_fault_hostile_users_test(Prefetch 90)
stage_fault_hostile_users_test(Budgets 300)
stage_fault_hostile_users_test(ClosedDirectory 90)
stage_fault_hostile_users_test(Listing 120)
stage_fault_hostile_users_test(LogFlood 120)
