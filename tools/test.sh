#!/usr/bin/env bash
# Runs every test on a fresh machine: installs dependencies, builds, runs ctest.
#
#   bash tools/test.sh                          # build/, RelWithDebInfo
#   SPILLWAY_SANITIZER=address bash tools/test.sh   # build-asan/, ASan+UBSan
#   SPILLWAY_SANITIZER=thread bash tools/test.sh    # build-tsan/, TSan
#
# GPU tests (ctest label `gpu`) run everywhere and report as skipped where no
# GPU is usable; the list of skipped tests is printed at the end.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
phase_start=$SECONDS
timings=()
timed_phase() {  # records the seconds since the last phase under a name
  timings+=("$1 $((SECONDS - phase_start)) s")
  phase_start=$SECONDS
}
"$root/tools/install-deps.sh"
timed_phase "dependencies"

sanitizer=${SPILLWAY_SANITIZER:-}
build=${SPILLWAY_BUILD_DIR:-$root/build${sanitizer:+-${sanitizer/address/asan}}}
build=${build/-thread/-tsan}
jobs=$(nproc)

# torch: the pinned one in install-deps.sh's environment, found through its interpreter.
python=$("$root/tools/install-deps.sh" --venv-path)/bin/python
cmake_args=(-S "$root" -B "$build" -G Ninja -DSPILLWAY_SANITIZER="$sanitizer" -DSPILLWAY_PYTHON="$python")
if [[ -n $sanitizer ]]; then
  cmake_args+=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DSPILLWAY_BUILD_BENCHMARKS=OFF)
fi
if [[ $sanitizer == thread ]]; then
  # torch's wheels are not built with TSan: the synchronisation inside its
  # thread pools is invisible to TSan, which would report races that are not
  # there. The torch bridge runs in the plain and ASan+UBSan builds instead.
  cmake_args+=(-DSPILLWAY_WITH_TORCH=OFF)
fi
mkdir -p "$build"
cmake "${cmake_args[@]}" >"$build/configure.log" 2>&1 || { cat "$build/configure.log"; exit 1; }
grep '^-- spillway:' "$build/configure.log" || true
timed_phase "configure"
cmake --build "$build" -j"$jobs"
timed_phase "build"

if [[ $sanitizer == address ]]; then
  export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
  export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
elif [[ $sanitizer == thread ]]; then
  export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}
fi

ctest_args=(--test-dir "$build" --output-on-failure -j"$jobs")
if [[ $sanitizer == thread ]]; then
  # Long single-threaded tests, where TSan has nothing to check.
  ctest_args+=(-LE no_tsan)
elif [[ $sanitizer == address ]]; then
  # Long runs whose code paths shorter tests take under ASan (the label's
  # comment says which).
  ctest_args+=(-LE no_asan)
fi

log="$build/ctest.log"
set +e
ctest "${ctest_args[@]}" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
timed_phase "tests"

echo
echo "spillway: sanitizer: ${sanitizer:-none}"
echo "spillway: wall time: $(IFS=,; echo "${timings[*]}" | sed 's/,/, /g')"
grep '^-- spillway: CUDA backend' "$build/configure.log" | sed 's/^-- //' || true
skipped=$(grep -E '^[[:space:]]+[0-9]+ - .*\(Skipped\)$' "$log" | sed -E 's/^[[:space:]]*[0-9]+ - //; s/[[:space:]]+#.*//; s/ \(Skipped\)//' | sort -u || true)
if [[ -n $skipped ]]; then
  echo "spillway: skipped tests (no usable GPU here):"
  sed 's/^/  /' <<<"$skipped"
fi
exit "$status"
