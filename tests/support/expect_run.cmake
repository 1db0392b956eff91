# Runs PROGRAM with ARGS ('|'-separated) and checks its exit status and output.
#   cmake -DPROGRAM=... -DARGS=a|b -DEXPECT_EXIT=0|nonzero -DEXPECT=regex -P expect_run.cmake
string(REPLACE "|" ";" args "${ARGS}")
execute_process(COMMAND ${PROGRAM} ${args} RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(all "${out}${err}")
message("${all}")
if(EXPECT_EXIT STREQUAL "0" AND NOT status EQUAL 0)
  message(FATAL_ERROR "expected exit status 0, got ${status}")
elseif(EXPECT_EXIT STREQUAL "nonzero" AND status EQUAL 0)
  message(FATAL_ERROR "expected a non-zero exit status, got 0")
endif()
if(NOT all MATCHES "${EXPECT}")
  message(FATAL_ERROR "output does not match: ${EXPECT}")
endif()
