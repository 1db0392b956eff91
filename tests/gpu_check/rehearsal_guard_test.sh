#!/usr/bin/env bash
# One guard of tools/gpu_check.sh (tests/gpu_check/CMakeLists.txt): puts back
# one bug that would have failed the first GPU run, and expects the rehearsal
# to fail, saying why, within its first steps; where cheap, a control run
# without the bug passes the same steps, so the failure is the bug's.
#
#   rehearsal_guard_test.sh GUARD REPO WORK FETCHED_DEPS
#
#   budget              a 450 s step budget, under the steps' estimates
#   no_torch            an interpreter without torch: a failure, not a warning
#                       (the torch stages and the Python package cannot build)
#   missing_dependency  a build dependency left out of the fetched ones: CMake
#                       would find this machine's own copy, which the GPU
#                       image lacks
#   torch_in_core       the torch bridge in the first build stage, which
#                       would delay every first result behind torch's TUs
#   static_libstdcxx    CXX a g++ that finds only libstdc++.a, as the H200
#                       image's: not a failure, the check builds with the g++
#                       on PATH and says so (Note [A compiler without a shared
#                       libstdc++])
set -euo pipefail
guard=$1 repo=$2 work=$3 fetched=$4
rm -rf "$work"
mkdir -p "$work"

# gpu_check NAME [ENV=VALUE...] -- ARGS...: a rehearsal in its own build
# folder, of the sources in $source (the repository unless a case copies it).
source=$repo
gpu_check() {
  local name=$1
  shift
  local env=()
  while [[ $1 != -- ]]; do env+=("$1"); shift; done
  shift
  env OUT="$work/$name/out" SPILLWAY_GPU_BUILD_DIR="$work/$name/build" SPILLWAY_GPU_DEPS="$fetched" \
    "${env[@]}" bash "$source/tools/gpu_check.sh" --rehearse "$@" >"$work/$name.log" 2>&1
}

expect_pass() {  # expect_pass NAME: the control
  echo "ok control $1: passed"
}

# expect_failure NAME PATTERN...: the run failed, and its output has each pattern.
expect_failure() {
  local name=$1 rc=$2 pattern
  shift 2
  if ((rc == 0)); then
    echo "FAIL $guard: the rehearsal passed with the bug put back"
    cat "$work/$name.log"
    exit 1
  fi
  for pattern in "$@"; do
    if ! grep -q -E -- "$pattern" "$work/$name.log"; then
      echo "FAIL $guard: the rehearsal failed (exit $rc), but its output lacks /$pattern/"
      cat "$work/$name.log"
      exit 1
    fi
  done
  echo "ok $guard: exit $rc, $(grep -m 1 -E -- "$1" "$work/$name.log")"
}

run_control() {  # run_control NAME ARGS...: must pass
  local name=$1
  shift
  gpu_check "$name" -- "$@" || { echo "FAIL $guard: the control failed"; cat "$work/$name.log"; exit 1; }
  expect_pass "$name"
}

case $guard in
  budget)
    run_control control --steps plan
    rc=0
    gpu_check bug SPILLWAY_GPU_CHECK_BUDGET_S=450 -- --steps plan || rc=$?
    expect_failure bug "$rc" 'over the 450s budget' 'plan: failed'
    ;;
  no_torch)
    # A virtual environment of the same base interpreter, without torch.
    python3 -m venv "$work/no-torch-venv"
    rc=0
    gpu_check bug SPILLWAY_PYTHON="$work/no-torch-venv/bin/python" -- \
      --steps versions,deps,configure,python_install || rc=$?
    expect_failure bug "$rc" 'torch is not importable' 'versions: failed' 'configure: failed' \
      'python_install: failed'
    ;;
  missing_dependency)
    run_control control --steps deps,configure
    mkdir -p "$work/deps"
    find "$fetched" -name '*.deb' ! -name 'libcli11-dev_*' -exec cp {} "$work/deps/" \;
    [[ $(find "$fetched" -name 'libcli11-dev_*.deb' | wc -l) == 1 ]] ||
      { echo "FAIL $guard: no libcli11-dev in $fetched"; exit 1; }
    rc=0
    gpu_check bug SPILLWAY_GPU_DEPS="$work/deps" -- --steps deps,configure || rc=$?
    expect_failure bug "$rc" 'CLI11_DIR=.* is not from the fetched dependencies' 'configure: failed'
    ;;
  torch_in_core)
    # No control here: it would compile the whole first stage. The full
    # rehearsal (.ci/run) passes build_core on the unchanged sources.
    # A copy of the sources whose first stage also builds the torch bridge.
    source="$work/source"
    mkdir -p "$source"
    git -C "$repo" ls-files -z --cached --others --exclude-standard |
      (cd "$repo" && xargs -0 cp --parents -t "$source")
    targets="$source/cmake/GpuCheckTargets.cmake"
    grep -q 'gpu_check_core spillway ' "$targets" || { echo "FAIL $guard: $targets changed"; exit 1; }
    sed -i 's/gpu_check_core spillway /gpu_check_core spillway_torch spillway /' "$targets"
    rc=0
    # A short budget: if the guard misses, build_core times out instead of
    # compiling the whole stage.
    gpu_check bug SPILLWAY_GPU_CHECK_BUDGET_S=12 -- --steps deps,configure,build_core || rc=$?
    expect_failure bug "$rc" "gpu_check_core compiles against torch's headers" 'build_core: failed'
    ;;
  static_libstdcxx)
    without_shared="$repo/tests/support/gxx_without_shared_libstdcxx"
    gpu_check image CXX="$without_shared" -- --steps deps,configure ||
      { echo "FAIL $guard: the rehearsal failed"; cat "$work/image.log"; exit 1; }
    grep -q -F "CXX=$without_shared has no libstdc++.so: built with $(command -v g++)" "$work/image/out/gpu_check_summary.md" ||
      { echo "FAIL $guard: the summary does not say which g++ built"; cat "$work/image.log"; exit 1; }
    grep -q "^CMAKE_CXX_COMPILER:[A-Z]*=$(command -v g++)$" "$work/image/build/CMakeCache.txt" ||
      { echo "FAIL $guard: CMake did not configure with $(command -v g++)"; exit 1; }
    echo "ok $guard: configured with $(command -v g++) in place of the g++ without libstdc++.so"
    ;;
  *)
    echo "rehearsal_guard_test.sh: unknown guard '$guard'" >&2
    exit 2
    ;;
esac
