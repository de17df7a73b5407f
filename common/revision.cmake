# revision.cmake - writes the build's revision into a header, at every build
# (common/CMakeLists.txt runs it as a target), so that a binary never names a
# revision other than the one its sources came from:
#   cmake -DSRC=<source tree> -DOUT=<header> [-DFIXED=<revision>] -P revision.cmake
# FIXED (the TANDEM_GIT_REVISION cache variable: an image build, whose tree
# has no .git) is taken as given. Otherwise the short hash of the tree's
# HEAD, with "-dirty" where a tracked file differs from it; "unknown" where
# git cannot tell (no git, not a checkout). The header is rewritten only
# when its text changes, so an unchanged revision rebuilds nothing.
if(FIXED)
  set(rev "${FIXED}")
else()
  execute_process(COMMAND git rev-parse --short=12 HEAD
    WORKING_DIRECTORY "${SRC}" RESULT_VARIABLE rc
    OUTPUT_VARIABLE rev OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(rc EQUAL 0 AND rev)
    execute_process(COMMAND git status --porcelain --untracked-files=no
      WORKING_DIRECTORY "${SRC}" RESULT_VARIABLE rc
      OUTPUT_VARIABLE changed OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(NOT rc EQUAL 0)
      set(rev "unknown")
    elseif(changed)
      string(APPEND rev "-dirty")
    endif()
  else()
    set(rev "unknown")
  endif()
endif()
file(WRITE "${OUT}.tmp" "/* written by common/revision.cmake at build time */\n"
  "#define TANDEM_GIT_REVISION \"${rev}\"\n")
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUT}.tmp")
