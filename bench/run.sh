#!/usr/bin/env bash
# bench/run.sh [NAME...] [-- PROGRAM_ARGS...]
#
# Builds spillway's benchmark programs in Release and runs them. Each program
# prints Google Benchmark's table and one line per figure,
#   metric NAME VALUE UNIT
# (docs/benchmarks.md says what each means). Benchmarks measure and print;
# nothing here passes or fails on a time.
#
#   NAME           a program without its bench_ prefix (device -> bench_device);
#                  none: every program. Programs are found by their
#                  add_executable(bench_NAME ...) line in bench/*/CMakeLists.txt.
#   PROGRAM_ARGS   passed to every program, e.g. -- --benchmark_min_time=0.1
#
# A program with a Python side, bench/*/bench_NAME_compare.py (comparisons
# with Python libraries, as optim's with DeepSpeed and torch), has it run
# next, with the build folder and the project's interpreter (SPILLWAY_PYTHON
# from the CMake cache); its metric lines join the program's.
#
# Environment:
#   SPILLWAY_BENCH_BUILD_DIR  build folder (default: build-release/ at the repo root)
#   SPILLWAY_BENCH_JOBS       parallel build jobs (default: nproc)
#
# Works from any directory. Exits non-zero when a name is unknown, the build
# fails, or a program fails (a benchmark error, not a slow figure).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${SPILLWAY_BENCH_BUILD_DIR:-$repo/build-release}"
jobs="${SPILLWAY_BENCH_JOBS:-$(nproc)}"

usage() { sed -n '2,20s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; }

# The known programs, from the CMake files (so a new bench/ folder needs no edit here).
mapfile -t known < <(sed -n 's/^[[:space:]]*add_executable([[:space:]]*bench_\([A-Za-z0-9_]*\).*/\1/p' \
  "$repo"/bench/*/CMakeLists.txt | sort -u)

names=()
program_args=()
while (($#)); do
  case "$1" in
    -h | --help) usage; exit 0 ;;
    --) shift; program_args=("$@"); break ;;
    *) names+=("${1#bench_}"); shift ;;
  esac
done
((${#names[@]})) || names=("${known[@]}")
for name in "${names[@]}"; do
  if [[ " ${known[*]} " != *" $name "* ]]; then
    echo "bench/run.sh: unknown benchmark '$name'; known: ${known[*]}" >&2
    exit 2
  fi
done

# Configure. The first time, a Release build with only what benchmarks need;
# afterwards re-run it anyway (cheap) so new bench/ folders are picked up.
mkdir -p "$build"
configure_log="$build/bench-configure.log"
configure_args=()
if [[ ! -f "$build/CMakeCache.txt" ]]; then
  configure_args=(-DCMAKE_BUILD_TYPE=Release -DSPILLWAY_BUILD_BENCHMARKS=ON -DSPILLWAY_BUILD_TESTS=OFF)
  command -v ninja >/dev/null && configure_args+=(-G Ninja)
fi
if ! cmake -S "$repo" -B "$build" "${configure_args[@]}" >"$configure_log" 2>&1; then
  cat "$configure_log" >&2
  echo "bench/run.sh: configuring $build failed (log: $configure_log)" >&2
  exit 1
fi
build_type="$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$build/CMakeCache.txt")"
[[ "$build_type" == Release ]] ||
  echo "# warning: $build is a '$build_type' build, not Release: figures may be slower" >&2

targets=("${names[@]/#/bench_}")
echo "# building ${targets[*]} in $build ($build_type, -j$jobs)"
cmake --build "$build" --target "${targets[@]}" -j "$jobs"

# Run each program; keep going past a failing one, and say so at the end.
output="$(mktemp)"
trap 'rm -f "$output"' EXIT
failed=()
for name in "${names[@]}"; do
  program="$build/bin/bench_$name"
  [[ -x "$program" ]] || program="$(find "$build" -type f -name "bench_$name" -perm -u+x | head -n 1)"
  echo "# running bench_$name${program_args[*]:+ ${program_args[*]}}"
  if ! "$program" "${program_args[@]}" | tee -a "$output"; then
    failed+=("bench_$name")
  fi
  compare="$(find "$repo/bench" -name "bench_${name}_compare.py" | head -n 1)"
  if [[ -n "$compare" ]]; then
    python="$(sed -n 's/^SPILLWAY_PYTHON:[A-Z]*=//p' "$build/CMakeCache.txt")"
    echo "# running ${compare#"$repo"/}"
    if ! "${python:-python3}" "$compare" --build "$build" | tee -a "$output"; then
      failed+=("${compare#"$repo"/}")
    fi
  fi
done

if ((${#names[@]} > 1)); then
  echo "# all metrics"
  grep '^metric ' "$output" || true
fi
if ((${#failed[@]})); then
  echo "bench/run.sh: failed: ${failed[*]}" >&2
  exit 1
fi
