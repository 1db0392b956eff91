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

# Sanitizer builds in RelWithDebInfo (tools/test.sh) keep only line tables
# (-g1, after CMake's -g): enough for the file:line and inlined frames of a
# sanitizer report, and it takes ~30% off the compile time of a torch TU,
# whose full debug info (every type of the torch headers) is most of the work.
# Debug builds keep full debug info for the debugger.
if(SPILLWAY_SANITIZER MATCHES "^(address|thread)$")
  add_compile_options("$<$<AND:$<COMPILE_LANGUAGE:C,CXX>,$<CONFIG:RelWithDebInfo>>:-g1>")
endif()
