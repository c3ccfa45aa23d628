# Issue 8, security and wrong bytes (tests/faults/test_security8.py): real standalone mounts
# attacked by a second user and by a careless admin; skipped (77) without /dev/fuse, root,
# fusermount3, unshare, nsenter, useradd, setpriv.
function(stage_fault_security8_test name timeout)
  add_test(NAME faults.security8.${name}
           COMMAND /usr/bin/python3 ${CMAKE_CURRENT_LIST_DIR}/test_security8.py
                   $<TARGET_FILE:stagefs> -- ${name})
  stage_fault_properties(faults.security8.${name} ${timeout})
endfunction()

# an attacker's --cache (owner, symlinks, forged copies), rm -rf under a live mount, a copy
# corrupted on disk, a stale copy on a full cache
stage_fault_security8_test(Cache 120)
# a rewritten, grown or shrunk source while an old holder keeps it open
stage_fault_security8_test(Fresh 90)
# ACLs, chmod after caching, trusted.* xattrs, 300 directory handles, 100 waiting opens,
# SIGTERM during a copy
stage_fault_security8_test(Access 150)
