# The targets tools/gpu_check.sh builds, one stage at a time, so that a GPU
# machine reports its first results before the slow torch TUs compile:
#
#   gpu_check_core   torch-free: libspillway.so, the GPU tests without torch,
#                    bench_device and bench_chunk, spillway-report
#   gpu_check_torch  the GPU tests with torch, spillway-train-demo
#
# (The third stage, the Python package, is built by pip install .) A GPU test
# joins its stage by its label (spillway_add_gtest in tests/CMakeLists.txt
# records it): `gpu` is the first stage, `gpu_torch` the second, so a new GPU
# test needs no change here. Included last from the top-level CMakeLists.txt,
# when every target exists.

function(spillway_gpu_check_target name)
  add_custom_target(${name})
  foreach(target IN LISTS ARGN)
    if(TARGET ${target})
      add_dependencies(${name} ${target})
    endif()
  endforeach()
endfunction()

get_property(gpu_tests GLOBAL PROPERTY SPILLWAY_GPU_TEST_TARGETS)
get_property(gpu_torch_tests GLOBAL PROPERTY SPILLWAY_GPU_TORCH_TEST_TARGETS)
spillway_gpu_check_target(gpu_check_core spillway spillway-report bench_device bench_chunk ${gpu_tests})
spillway_gpu_check_target(gpu_check_torch spillway-train-demo ${gpu_torch_tests})
