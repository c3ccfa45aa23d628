# STAGEFS_GIT_REVISION: the git revision the binaries are built from, for `--version`.
#
# `git describe --tags --always --dirty --abbrev=12` of the source tree, taken at configure
# time; "unknown" outside a git checkout (a release tarball, also one unpacked inside some
# other repository: the work tree's top must be this project's source dir). Packagers building
# from a tarball can pass -DSTAGEFS_GIT_REVISION=<rev>.
#
# Configure time is enough because CMake re-runs itself when HEAD moves: the reflog of HEAD
# (logs/HEAD in the worktree's git dir) grows on every commit, checkout, reset or rebase, so it
# is a configure dependency. "-dirty" reflects the tree at the last configure.
if(DEFINED STAGEFS_GIT_REVISION)
  message(STATUS "stagefs ${PROJECT_VERSION}, git revision ${STAGEFS_GIT_REVISION} (given)")
  return()
endif()
set(STAGEFS_GIT_REVISION unknown)
find_package(Git QUIET)
if(GIT_FOUND)
  execute_process(COMMAND ${GIT_EXECUTABLE} rev-parse --show-toplevel --absolute-git-dir
                  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}
                  OUTPUT_VARIABLE _git_dirs RESULT_VARIABLE _git_rc ERROR_QUIET
                  OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(_git_rc EQUAL 0)
    string(REPLACE "\n" ";" _git_dirs "${_git_dirs}")
    list(GET _git_dirs 0 _git_top)
    list(GET _git_dirs 1 _git_dir)
    file(REAL_PATH "${_git_top}" _git_top)
    file(REAL_PATH "${PROJECT_SOURCE_DIR}" _src_top)
    if(_git_top STREQUAL _src_top)
      execute_process(COMMAND ${GIT_EXECUTABLE} describe --tags --always --dirty --abbrev=12
                      WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}
                      OUTPUT_VARIABLE _git_rev RESULT_VARIABLE _git_rc ERROR_QUIET
                      OUTPUT_STRIP_TRAILING_WHITESPACE)
      if(_git_rc EQUAL 0 AND NOT _git_rev STREQUAL "")
        set(STAGEFS_GIT_REVISION ${_git_rev})
      endif()
      foreach(_f HEAD logs/HEAD)
        if(EXISTS ${_git_dir}/${_f})
          set_property(DIRECTORY ${PROJECT_SOURCE_DIR} APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${_git_dir}/${_f})
        endif()
      endforeach()
    endif()
  endif()
endif()
message(STATUS "stagefs ${PROJECT_VERSION}, git revision ${STAGEFS_GIT_REVISION}")
