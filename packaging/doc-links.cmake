# cmake -DSRC=FILE -DOUT=FILE -DFROM=DIR -DTO=DIR -P doc-links.cmake
#
# Writes the Markdown page SRC (which lies in the repository's directory FROM: ".", "docs",
# "packaging/examples") to OUT, as it is installed in share/doc/stagefs/TO, with its relative
# links rewritten for the installed tree, whose layout is not the repository's:
#   README.md             -> README.md
#   docs/PAGE             -> docs/PAGE
#   packaging/examples/F  -> examples/F
# A link to a file that is not installed (bench/...) becomes plain text that names the file in
# the source repository. Web links and in-page anchors are left alone.
# tests/packaging/doc_links_test.sh checks that every link of the installed tree resolves.
cmake_minimum_required(VERSION 3.25)

# The installed path (relative to the doc root) of repository path `repo`, or "" if none.
function(installed_path repo out)
  if(repo STREQUAL "README.md")
    set(${out} "README.md" PARENT_SCOPE)
  elseif(repo MATCHES "^docs/[^/]+\\.md$")
    set(${out} "${repo}" PARENT_SCOPE)
  elseif(repo MATCHES "^packaging/examples/([^/]+)$")
    set(${out} "examples/${CMAKE_MATCH_1}" PARENT_SCOPE)
  else()
    set(${out} "" PARENT_SCOPE)
  endif()
endfunction()

file(READ "${SRC}" rest)
set(out "")
while(TRUE)
  string(FIND "${rest}" "](" at)
  if(at EQUAL -1)
    string(APPEND out "${rest}")
    break()
  endif()
  string(SUBSTRING "${rest}" 0 ${at} head)  # ... [text
  math(EXPR after "${at} + 2")
  string(SUBSTRING "${rest}" ${after} -1 tail)  # target) ...
  string(FIND "${tail}" ")" close)
  if(close EQUAL -1)
    string(APPEND out "${rest}")
    break()
  endif()
  string(SUBSTRING "${tail}" 0 ${close} target)
  math(EXPR past "${close} + 1")
  string(SUBSTRING "${tail}" ${past} -1 rest)
  if(target MATCHES "^(https?:|mailto:|#)" OR target STREQUAL "")
    string(APPEND out "${head}](${target})")
    continue()
  endif()
  set(anchor "")
  set(file "${target}")
  if(target MATCHES "^([^#]*)(#.*)$")
    set(file "${CMAKE_MATCH_1}")
    set(anchor "${CMAKE_MATCH_2}")
  endif()
  cmake_path(SET repo NORMALIZE "${FROM}/${file}")
  installed_path("${repo}" dest)
  if(dest STREQUAL "")
    # Not installed: the link text, and where the file is in the source repository.
    string(FIND "${head}" "[" open REVERSE)
    string(SUBSTRING "${head}" 0 ${open} before)
    math(EXPR text_at "${open} + 1")
    string(SUBSTRING "${head}" ${text_at} -1 text)
    if(text STREQUAL repo)
      string(APPEND out "${before}`${repo}` (in the source repository)")
    else()
      string(APPEND out "${before}${text} (`${repo}` in the source repository)")
    endif()
  else()
    cmake_path(RELATIVE_PATH dest BASE_DIRECTORY "${TO}" OUTPUT_VARIABLE rel)
    string(APPEND out "${head}](${rel}${anchor})")
  endif()
endwhile()
file(WRITE "${OUT}" "${out}")
