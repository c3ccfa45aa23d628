# Profiles against a root daemon (tests/faults/test_profiles.py): another user's profile is
# replayed with that user's access only; a forged one naming a path outside the source, or
# one that other users may write, is refused whole; skipped (77) without /dev/fuse, root,
# fusermount3, unshare, nsenter, useradd, setpriv.
foreach(cls Owner Forged)
  add_test(NAME faults.profiles.${cls}
           COMMAND /usr/bin/python3 ${CMAKE_CURRENT_LIST_DIR}/test_profiles.py $<TARGET_FILE:stagefs> -- ${cls})
  stage_fault_properties(faults.profiles.${cls} 120)
endforeach()
