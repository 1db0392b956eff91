#!/usr/bin/env bash
# Installs the build into a scratch prefix, checks that only the public headers
# were installed, then builds and runs a separate project that finds it with
# find_package(spillway).
#
#   install_test.sh BUILD SCRATCH CONSUMER SANITIZER [TORCH_PREFIX]
#
# CONSUMER is the project's source folder. With TORCH_PREFIX (the folder of
# torch's CMake package, torch.utils.cmake_prefix_path) it is a LibTorch
# project that links spillway::torch, and the installed bridge is checked too.
set -euo pipefail
build=$1 scratch=$2 consumer=$3 sanitizer=${4:-} torch_prefix=${5:-}
if [[ -n $torch_prefix && $sanitizer == thread ]]; then
  # As tools/test.sh: torch's wheels are not built with TSan, whose reports
  # about torch's own thread pools would not be races.
  echo "install_test: skipped: the LibTorch consumer does not run under TSan (torch is not built with it)"
  exit 77
fi
rm -rf "$scratch"
prefix=$scratch/prefix
cmake --install "$build" --prefix "$prefix" >/dev/null

# The public headers, and nothing else: the C ABI, and where the bridge was
# built, its API and what that includes (cmake/PublicHeaders.cmake). Not the
# allocator's rooms (allocator/chunk/, ...), tracer/ or hooks/torch/bridge.h.
public='allocator/spillway\.h'
bridge_headers='hooks/torch/(spillway_torch|engine|optim)\.h|hooks/engine/(engine_config|loss_scaler|lr_schedule|lr_schedule_config|progress_report|zero_config)\.h|hooks/optim/cpu_kernels\.h'
public+="|$bridge_headers"
installed=$(cd "$prefix/include/spillway" && find . -type f | sed 's|^\./||' | sort)
echo "install_test: installed headers: $(tr '\n' ' ' <<<"$installed")"
internal=$(grep -vxE "$public" <<<"$installed" || true)
if [[ -n $internal ]]; then
  echo "install_test: internal headers installed: $(tr '\n' ' ' <<<"$internal")"
  exit 1
fi
grep -qx 'allocator/spillway.h' <<<"$installed" || { echo "install_test: allocator/spillway.h not installed"; exit 1; }

cmake_args=(-DCMAKE_PREFIX_PATH="$prefix")
if [[ -n $torch_prefix ]]; then
  libdir=$(dirname "$(find "$prefix" -name 'libspillway.so' | head -n1)")
  [[ -e $libdir/libspillway_torch.so ]] || { echo "install_test: libspillway_torch.so not installed"; exit 1; }
  api_headers=$(grep -cxE "$bridge_headers" <<<"$installed" || true)
  [[ $api_headers == 10 ]] || { echo "install_test: the bridge's API headers are not all installed"; exit 1; }
  # One runtime per process: the bridge defines none of libspillway.so's own
  # (strong) symbols; it uses them. Inline functions (weak) may be in both.
  strong() { nm -D --defined-only "$1" | awk '$2 ~ /^[TDBR]$/ {print $3}' | sort -u; }
  both=$(comm -12 <(strong "$libdir/libspillway.so") <(strong "$libdir/libspillway_torch.so"))
  if [[ -n $both ]]; then
    echo "install_test: libspillway_torch.so defines libspillway.so's symbols too:"
    head -n 20 <<<"$both"
    exit 1
  fi
  cmake_args=(-DCMAKE_PREFIX_PATH="$prefix;$torch_prefix")
  # As the top-level CMakeLists.txt: torch's package would otherwise run a
  # program on the GPU to choose architectures for CUDA code (this has none).
  cmake_args+=(-DTORCH_CUDA_ARCH_LIST=9.0)
fi
case $sanitizer in
  address) cmake_args+=("-DCMAKE_CXX_FLAGS=-fsanitize=address,undefined") ;;
  thread) cmake_args+=(-DCMAKE_CXX_FLAGS=-fsanitize=thread) ;;
esac
cmake -S "$consumer" -B "$scratch/consumer" -G Ninja "${cmake_args[@]}" >"$scratch/configure.log" 2>&1 ||
  { cat "$scratch/configure.log"; exit 1; }
cmake --build "$scratch/consumer" >"$scratch/build.log" 2>&1 || { cat "$scratch/build.log"; exit 1; }
"$scratch/consumer/consumer"
