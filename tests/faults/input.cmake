# Bad input, odd names, special files, a second user, load (tests/faults/test_input_security_load.py):
# real standalone stagefs mounts and an MPI mount group of 4 ranks (ranks as nodes, one mount
# namespace each), run in a private mount namespace of their own; skipped (77) without /dev/fuse,
# root, fusermount3, unshare, nsenter (faults.load: mpirun; faults.security: useradd, setpriv).
function(stage_fault_input_test name timeout)
  add_test(NAME faults.${name}
           COMMAND /usr/bin/python3 ${CMAKE_CURRENT_LIST_DIR}/test_input_security_load.py
                   $<TARGET_FILE:stagefs> ${ARGN})
  stage_fault_properties(faults.${name} ${timeout})
endfunction()

# every option with a missing/empty/malformed/out-of-range value, missing operands, unusable
# SOURCE_DIR/MOUNTPOINT/--cache, an occupied mount point, relative paths, --wait on nothing
stage_fault_input_test(input 120 -- Input)
# spaces, newlines, non-UTF-8 bytes, leading dashes, 255-byte names, 20 levels deep
stage_fault_input_test(names 60 -- Names)
# FIFO, UNIX socket, char device, symlinks out of SOURCE_DIR: listed as such, never materialized
stage_fault_input_test(special 60 -- Special)
# a real second user: 0600 file, 0700 dir, the 0700 cache, root's copies do not leak
stage_fault_input_test(security 60 -- Security)
# 4 ranks: 64 concurrent range readers over 12 files of 8-32 MiB, then 1,000 small files in one
# burst; every daemon's fd count and RSS come back
stage_fault_input_test(load 240 4 ${STAGE_MPIRUN} -- Load)
