# Wrong bytes and access (tests/faults/test_wrong_bytes_and_access.py): real standalone mounts
# attacked by a second user and by a careless admin; skipped (77) without /dev/fuse, root,
# fusermount3, unshare, nsenter, useradd, setpriv.
function(stage_fault_wrong_bytes_test name timeout)
  add_test(NAME faults.wrong_bytes_and_access.${name}
           COMMAND /usr/bin/python3 ${CMAKE_CURRENT_LIST_DIR}/test_wrong_bytes_and_access.py
                   $<TARGET_FILE:stagefs> -- ${name})
  stage_fault_properties(faults.wrong_bytes_and_access.${name} ${timeout})
endfunction()

# an attacker's --cache (owner, symlinks, forged copies), rm -rf under a live mount, a copy
# corrupted on disk, a stale copy on a full cache
stage_fault_wrong_bytes_test(Cache 120)
# a rewritten, grown or shrunk source while an old holder keeps it open
stage_fault_wrong_bytes_test(Fresh 90)
# ACLs, chmod after caching, trusted.* xattrs, 300 directory handles, 100 waiting opens,
# SIGTERM during a copy
stage_fault_wrong_bytes_test(Access 150)
