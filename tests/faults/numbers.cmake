# Every numeric option of stagefs, stage-bcast and stagectl refuses NaN and infinities with
# exit status 2 (tests/faults/test_numeric_options.py; the options come from --help).
add_test(NAME faults.numbers
         COMMAND /usr/bin/python3 ${CMAKE_CURRENT_LIST_DIR}/test_numeric_options.py
                 $<TARGET_FILE:stagefs> $<TARGET_FILE:stage-bcast> $<TARGET_FILE:stagectl>)
stage_fault_properties(faults.numbers 120)
