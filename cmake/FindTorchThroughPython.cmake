# Finds Torch through the interpreter that imports it (top-level CMakeLists.txt).
#
# Sets SPILLWAY_HAVE_TORCH, SPILLWAY_TORCH_PYTHON (the interpreter, for the
# Python package and its tests), SPILLWAY_TORCH_VERSION, SPILLWAY_TORCH_CUDA
# (the CUDA version torch was built for, empty for a CPU torch),
# SPILLWAY_TORCH_LIB_DIR (torch's own lib/ folder) and
# SPILLWAY_TORCH_CMAKE_PREFIX (where its CMake package is, for the install test).
set(_python "${SPILLWAY_PYTHON}")
if(NOT _python AND SKBUILD AND Python_EXECUTABLE)
  set(_python "${Python_EXECUTABLE}")  # pip install . (pyproject.toml)
endif()
if(NOT _python)
  find_program(_python_on_path NAMES python3 NO_CACHE)
  set(_python "${_python_on_path}")
endif()
if(NOT _python)
  message(STATUS "spillway: Torch not found (no python3; set SPILLWAY_PYTHON); the LibTorch bridge is not built")
  return()
endif()

# One interpreter start for every fact (importing torch takes seconds).
execute_process(
  COMMAND "${_python}" -c [=[
import os, torch, torch.utils
print(torch.__version__.split("+")[0])
print(torch.version.cuda or "")
print(torch.utils.cmake_prefix_path)
print(os.path.join(os.path.dirname(torch.__file__), "lib"))
print(int(torch.compiled_with_cxx11_abi()))
]=]
  OUTPUT_VARIABLE _facts ERROR_VARIABLE _error RESULT_VARIABLE _status OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _status EQUAL 0)
  string(REGEX REPLACE ".*\n([^\n]+)$" "\\1" _error "${_error}")
  message(STATUS "spillway: Torch not found: ${_python} cannot import torch (${_error}); "
                 "the LibTorch bridge is not built (tools/install-deps.sh installs it; set SPILLWAY_PYTHON)")
  return()
endif()
string(REPLACE "\n" ";" _facts "${_facts}")
list(GET _facts 0 SPILLWAY_TORCH_VERSION)
list(GET _facts 1 SPILLWAY_TORCH_CUDA)
list(GET _facts 2 _prefix)
list(GET _facts 3 SPILLWAY_TORCH_LIB_DIR)
list(GET _facts 4 _cxx11_abi)
if(SPILLWAY_TORCH_VERSION VERSION_LESS SPILLWAY_TORCH_MIN_VERSION)
  message(FATAL_ERROR "spillway: ${_python} imports torch ${SPILLWAY_TORCH_VERSION}; spillway supports torch "
                      "${SPILLWAY_TORCH_MIN_VERSION} and newer. Point SPILLWAY_PYTHON at an interpreter with a "
                      "newer torch (tools/install-deps.sh makes one), or configure with -DSPILLWAY_WITH_TORCH=OFF.")
endif()
if(NOT _cxx11_abi)
  message(FATAL_ERROR "spillway: torch ${SPILLWAY_TORCH_VERSION} (${_python}) is built with the pre-C++11 "
                      "std::string ABI, unlike this system's fmt and the rest of spillway; use a torch of 2.7 "
                      "or newer from PyPI, whose wheels use the C++11 ABI.")
endif()

# A CUDA torch's CMake package looks for a CUDA toolkit. Its CUDA major must
# be the toolkit's, or torch's CUDA headers and spillway's CUDA code would
# disagree about the runtime; on a mismatch the build goes on without the
# CUDA-using parts of the bridge (SPILLWAY_TORCH_CUDA_USABLE off) and says so.
set(SPILLWAY_TORCH_CUDA_USABLE OFF)
if(SPILLWAY_TORCH_CUDA)
  string(REGEX MATCH "^[0-9]+" _torch_cuda_major "${SPILLWAY_TORCH_CUDA}")
  if(NOT SPILLWAY_HAVE_CUDA)
    message(STATUS "spillway: torch is built for CUDA ${SPILLWAY_TORCH_CUDA}, but no CUDA toolkit was found: "
                   "the bridge's CUDA paths are not built")
  elseif(NOT _torch_cuda_major STREQUAL CUDAToolkit_VERSION_MAJOR)
    message(WARNING "spillway: torch is built for CUDA ${SPILLWAY_TORCH_CUDA}, the toolkit here is "
                    "${CUDAToolkit_VERSION}: the bridge's CUDA paths are not built. Install a toolkit of "
                    "CUDA ${_torch_cuda_major}, or the torch wheel for CUDA ${CUDAToolkit_VERSION_MAJOR}.")
  else()
    set(SPILLWAY_TORCH_CUDA_USABLE ON)
  endif()
endif()

list(APPEND CMAKE_PREFIX_PATH "${_prefix}")
# torch's package warns about CMAKE_CUDA_ARCHITECTURES (it reads
# TORCH_CUDA_ARCH_LIST instead), and finds a Python of its own: give it ours.
set(_cuda_architectures "${CMAKE_CUDA_ARCHITECTURES}")
unset(CMAKE_CUDA_ARCHITECTURES)
if(NOT DEFINED Python_EXECUTABLE)
  set(Python_EXECUTABLE "${_python}")
endif()
find_package(Torch QUIET)
set(CMAKE_CUDA_ARCHITECTURES "${_cuda_architectures}")
if(NOT Torch_FOUND)
  message(FATAL_ERROR "spillway: ${_python} imports torch ${SPILLWAY_TORCH_VERSION}, but its CMake package in "
                      "${_prefix} did not load (rerun with --debug-find-pkg=Torch)")
endif()
set(SPILLWAY_HAVE_TORCH ON)
set(SPILLWAY_TORCH_PYTHON "${_python}")
set(SPILLWAY_TORCH_CMAKE_PREFIX "${_prefix}")
message(STATUS "spillway: Torch found: ${SPILLWAY_TORCH_VERSION} (CUDA: ${SPILLWAY_TORCH_CUDA}) through ${_python}")
