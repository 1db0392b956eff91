# A precompiled <torch/torch.h> for the targets that include torch headers.
#
# Parsing <torch/torch.h> costs every translation unit
# that includes it ~20 s, and ~30 s with -g; those TUs are most of the build
# time. With a precompiled header the parse is done once per build and each
# TU loads the result instead (measured: a torch test TU went from ~70 s to ~40 s).
#
#   spillway_torch_pch(<target>...)
#
# compiles the C++ sources of each <target> with the PCH. A source that does
# not include torch headers can opt out with the source property
# SKIP_PRECOMPILE_HEADERS. Everything is built as before with
# -DCMAKE_DISABLE_PRECOMPILE_HEADERS=ON (CMake's own switch; e.g. for
# clang-tidy or include-what-you-use, which want each file to stand alone).
#
# The PCH is built once per build directory and flavour, by a small OBJECT
# library (REUSE_FROM), not once per target: a torch PCH takes about as long
# as a torch TU, and most torch targets have a single TU. GCC uses a PCH only
# when it was built with the TU's flags (-fPIC vs -fPIE, -g level, -fsanitize,
# the macros the header reads: NDEBUG, torch's USE_* definitions) and otherwise
# silently compiles without it; CMake passes -Winvalid-pch, so a mismatch
# shows up as a warning in the build log. Executables would take -fPIE and
# libraries -fPIC, which would need two PCHs; a torch executable is compiled
# with -fPIC instead (after CMake's -fPIE, so it wins; the code is the same up
# to a few relocations), so one PCH serves every torch target of the build.
# The host is compiled with the compile definitions every torch target has: torch's
# usage requirements and NDEBUG (torch is built with it, and
# RecordFunction's layout differs without it; see hooks/torch/CMakeLists.txt).
# The hosts are EXCLUDE_FROM_ALL: a flavour no target uses is never built.
#
# Even with the PCH, each torch TU pays ~5 s to load it (about 700 MB) and
# instantiates the same torch templates again, so a target's torch sources are
# also compiled as one unit (CMake's UNITY_BUILD): the bridge's 26 sources took
# 432 s of CPU one by one and take 38 s together (RelWithDebInfo, this
# project's CI machine). A source with its own compile definitions or include
# folders (dist_env.cc) is compiled alone, as CMake does for every unity build.
# In one unit, the anonymous namespaces of the sources are one namespace: two
# sources must not give a helper the same name (the build fails where they
# do). Sources keep including what they use: the unity build is off with
# -DCMAKE_DISABLE_PRECOMPILE_HEADERS=ON too, where each file stands alone.
#
# Included from the top-level CMakeLists.txt (after find_package(Torch)), so
# the hosts see the same directory-wide options (sanitizers) as every target.

if(NOT SPILLWAY_HAVE_TORCH)
  function(spillway_torch_pch)
  endfunction()
  return()
endif()

set(_spillway_torch_pch_source "${PROJECT_BINARY_DIR}/cmake/spillway_torch_pch.cc")
file(CONFIGURE OUTPUT "${_spillway_torch_pch_source}"
     CONTENT "// Compiles the precompiled <torch/torch.h> (cmake/TorchPrecompiledHeader.cmake).\n")

# spillway_torch_pch_pic: for every target with position-independent code;
# spillway_torch_pch_nopic: where POSITION_INDEPENDENT_CODE is off.
foreach(_flavour pic nopic)
  set(_host spillway_torch_pch_${_flavour})
  add_library(${_host} OBJECT EXCLUDE_FROM_ALL "${_spillway_torch_pch_source}")
  target_link_libraries(${_host} PRIVATE ${TORCH_LIBRARIES})
  target_compile_definitions(${_host} PRIVATE NDEBUG)
  target_precompile_headers(${_host} PRIVATE <torch/torch.h>)
  if(_flavour STREQUAL "pic")
    set_target_properties(${_host} PROPERTIES POSITION_INDEPENDENT_CODE ON)
  else()
    set_target_properties(${_host} PROPERTIES POSITION_INDEPENDENT_CODE OFF)
  endif()
endforeach()
unset(_host)
unset(_flavour)

function(spillway_torch_pch)
  foreach(target IN LISTS ARGN)
    get_target_property(type ${target} TYPE)
    get_target_property(pic ${target} POSITION_INDEPENDENT_CODE)
    if(type MATCHES "^(SHARED|MODULE)_LIBRARY$")
      set(flavour pic)  # always -fPIC
    elseif(NOT pic)
      set(flavour nopic)
    else()
      set(flavour pic)
      if(type STREQUAL "EXECUTABLE")
        target_compile_options(${target} PRIVATE ${CMAKE_CXX_COMPILE_OPTIONS_PIC})
      endif()
    endif()
    target_precompile_headers(${target} REUSE_FROM spillway_torch_pch_${flavour})
    if(NOT CMAKE_DISABLE_PRECOMPILE_HEADERS)
      set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 0)
      # A class of a source's own whose member's type is in its anonymous
      # namespace (a pimpl's records): GCC warns of that in an included file,
      # and in one unit every source is an included file.
      target_compile_options(${target} PRIVATE $<$<CXX_COMPILER_ID:GNU>:-Wno-subobject-linkage>)
    endif()
  endforeach()
endfunction()
