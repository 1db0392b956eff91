# Compiler flags every target shares: the sanitizer builds and the debug-info
# level of RelWithDebInfo (the default build type and CI's).

# SPILLWAY_SANITIZER=address builds everything with ASan+UBSan; =thread with TSan.
# C and C++ only: nvcc does not take -fsanitize (CUDA device code is checked
# with compute-sanitizer on a GPU instead).
if(SPILLWAY_SANITIZER STREQUAL "address")
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=address,undefined;-fno-sanitize-recover=undefined;-fno-omit-frame-pointer>")
  add_link_options(-fsanitize=address,undefined)
elseif(SPILLWAY_SANITIZER STREQUAL "thread")
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=thread;-fno-omit-frame-pointer>")
  add_link_options(-fsanitize=thread)
elseif(NOT SPILLWAY_SANITIZER STREQUAL "")
  message(FATAL_ERROR "SPILLWAY_SANITIZER must be empty, 'address' or 'thread', not '${SPILLWAY_SANITIZER}'")
endif()

# RelWithDebInfo keeps line tables only (-g1, after CMake's -g): enough for
# the file:line and inlined frames of a backtrace, a sanitizer report or perf,
# and it takes a quarter to a third off the compile time of a TU that includes
# torch or CLI11, whose full debug info (every type of those headers) is most
# of the work. Debug builds keep full debug info for the debugger.
add_compile_options("$<$<AND:$<COMPILE_LANGUAGE:C,CXX>,$<CONFIG:RelWithDebInfo>>:-g1>")

# Sanitizer builds optimize at -O1 (after CMake's -O2), as the sanitizers'
# documentation suggests: reports keep their frames, and the instrumented
# build compiles about a third faster (measured on tools/sim/main.cc with
# ASan+UBSan: 54 s at -O2, 35 s at -O1).
if(SPILLWAY_SANITIZER MATCHES "^(address|thread)$")
  add_compile_options("$<$<AND:$<COMPILE_LANGUAGE:C,CXX>,$<CONFIG:RelWithDebInfo>>:-O1>")
endif()
