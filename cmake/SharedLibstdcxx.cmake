# Refuses a GNU compiler that would link libstdc++ statically into spillway's
# shared libraries.
#
# Note [A compiler without a shared libstdc++]
# When g++ finds libstdc++.a but no libstdc++.so beside it (a relocated GCC
# whose libstdc++.so link points nowhere: the H200 image's CXX=/opt/gcc/bin/g++
# is one), it links without a word a private copy of the parts of libstdc++
# that a library uses into that library. libspillway.so, libspillway_torch.so
# and the Python module then run in a process where torch has loaded
# libstdc++.so.6, with a second std::locale whose facet ids the first never
# registered: the first integer written to a std::ostream from spillway's code
# crashes (on the H200, c10::str of a tensor's sizes in rank_layouts, found
# with cuda-gdb). So configuring stops here, naming a compiler that works.
if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "GNU" OR APPLE OR WIN32)
  return()
endif()
execute_process(COMMAND "${CMAKE_CXX_COMPILER}" -print-file-name=libstdc++.so
                OUTPUT_VARIABLE spillway_libstdcxx_so OUTPUT_STRIP_TRAILING_WHITESPACE
                RESULT_VARIABLE spillway_print_file_result)
if(spillway_print_file_result EQUAL 0 AND NOT EXISTS "${spillway_libstdcxx_so}")
  execute_process(COMMAND "${CMAKE_CXX_COMPILER}" -print-file-name=libstdc++.a
                  OUTPUT_VARIABLE spillway_libstdcxx_a OUTPUT_STRIP_TRAILING_WHITESPACE)
  find_program(spillway_system_gxx NAMES g++ PATHS /usr/bin NO_DEFAULT_PATH)
  if(NOT spillway_system_gxx)
    set(spillway_system_gxx "/path/to/g++")  # the message still shows the form
  endif()
  message(FATAL_ERROR
    "spillway: the C++ compiler ${CMAKE_CXX_COMPILER} finds no shared libstdc++ "
    "(-print-file-name=libstdc++.so answers '${spillway_libstdcxx_so}'; the static one is "
    "${spillway_libstdcxx_a}), so it would link a private copy of libstdc++ into spillway's "
    "shared libraries and Python module, beside the libstdc++.so.6 torch loads, and streams "
    "would crash (Note [A compiler without a shared libstdc++] in cmake/SharedLibstdcxx.cmake). "
    "Configure with a compiler whose libstdc++.so is installed, from a fresh build folder: "
    "CXX=${spillway_system_gxx} CC=gcc CUDAHOSTCXX=${spillway_system_gxx}, or "
    "-DCMAKE_CXX_COMPILER=... with pip's --config-settings=cmake.define.CMAKE_CXX_COMPILER=...")
endif()
