#!/usr/bin/env bash
# tools/gpu_check.sh: spillway's checks on a machine with an NVIDIA GPU.
#
# For a machine with a GPU, CUDA, a pip torch 2.x and no internet (and no tty):
# builds spillway in Release against that machine's torch, runs the GPU tests
# (ctest -L gpu) and the GPU benchmarks, and writes two files
#   gpu_check_summary.md  result, each step's outcome and time, nvidia-smi,
#                         versions, ctest result lines, metric lines
#   gpu_check.log         every step's full output, one section per step
# to $OUT when it is set, else to build-gpu/gpu_check/. The summary is rewritten
# after every step, so a run cut short still leaves one.
#
#   tools/gpu_check.sh [--allow-no-gpu]
#   tools/gpu_check.sh --fetch-deps [DIR]
#
# --allow-no-gpu  run every step even without a GPU (GPU tests then skip, the
#                 benchmarks say "cuda: skipped"): to try the script on a build
#                 machine. Without it, no GPU stops the run at once (exit 2).
# --fetch-deps    on a Debian/Ubuntu machine WITH internet: download the .deb
#                 files of the build dependencies a bare GPU image may lack
#                 (fmt, nlohmann_json, CLI11, GoogleTest, Google Benchmark) into DIR (default
#                 .gpu-deps/ at the repo root). Carried to the GPU machine, the
#                 deps step unpacks them into the build folder (never into /).
#
# Environment:
#   OUT                         where the summary and log go (see above)
#   SPILLWAY_GPU_BUILD_DIR      build folder (default: build-gpu/ at the repo root)
#   SPILLWAY_GPU_DEPS           folder of carried .deb files (default: .gpu-deps/)
#   SPILLWAY_PYTHON             the interpreter whose torch to build against
#                               (default: python3 on PATH, as the GPU image's venv)
#   SPILLWAY_GPU_CHECK_BUDGET_S time for all steps (default 450: with the last
#                               kill grace the run ends inside 8 minutes)
#
# Exit status: 0 every step passed (or warned); 1 a step failed (build, GPU
# tests, benchmarks, ...); 2 no GPU.
#
# Adding a check (later issues): write a step_NAME function below that runs
# its commands through `timed` and returns non-zero on failure (it may set
# step_status=warn|skipped and step_note="..."), then add "NAME LIMIT_S POLICY"
# to STEPS. POLICY is stop (a failure ends the run: later steps need it) or
# continue. Keep outputs to the two files above: the GPU machine returns at
# most 8 files from $OUT.

# shellcheck disable=SC2317  # the step_* functions are called by name
set -uo pipefail

STEPS=(
  "gpu 30 stop"           # nvidia-smi sees a GPU; its compute capability
  "versions 90 continue"  # compilers, CMake, CUDA, torch (and torch's CMake path)
  "deps 60 stop"          # unpack carried .deb build dependencies, if any
  "configure 150 stop"    # Release, against torch when its CMake package works
  "build 300 stop"        # everything, -j$(nproc)
  "gpu_tests 180 continue"  # ctest -L gpu: must pass, and must not skip on a GPU
  "gpu_bench 90 continue"   # bench_device --device=cuda: metric lines
  "pluggable 150 continue"  # libspillway.so as torch's allocator vs torch's own
  "cuda_api 60 continue"   # torch.cuda.memory_stats & co., record_stream, OOM under spillway
  "train_demo_cuda 120 continue"  # the C++ demo on CUDA, spillway as torch's allocator: bit-identical, tokens/s
  "python_train 240 continue"  # a Python script under SPILLWAY_CONF, spilling (planned, LRU), CUPTI, its report
)

# Build dependencies fetched by --fetch-deps (Debian package names): what the
# top CMakeLists.txt and tests/, tools/, bench/ find_package, beyond CUDA and torch.
DEP_PACKAGES=(libfmt-dev libfmt9 nlohmann-json3-dev libcli11-dev libgtest-dev libgmock-dev
  libbenchmark-dev libbenchmark1debian)

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${SPILLWAY_GPU_BUILD_DIR:-$repo/build-gpu}"
deps_dir="${SPILLWAY_GPU_DEPS:-$repo/.gpu-deps}"
budget_s="${SPILLWAY_GPU_CHECK_BUDGET_S:-450}"
out_dir="${OUT:-$build/gpu_check}"
summary="$out_dir/gpu_check_summary.md"
full_log="$out_dir/gpu_check.log"

allow_no_gpu=0
have_gpu=0
no_gpu_reason=""
cuda_arch=""
python="${SPILLWAY_PYTHON:-$(command -v python3)}"
torch_prefix=""
prefix_paths=()
run_start_s=0
step_deadline_s=0
step_status=""
step_note=""
step_results=()  # "name|status|seconds|note"

now_s() { date +%s; }

# Runs a command under the current step's deadline (timeout kills its whole
# process group: compilers, test programs). 124 when time ran out.
timed() {
  local left=$((step_deadline_s - $(now_s)))
  if ((left <= 0)); then
    echo "gpu_check: no time left for: $*"
    return 124
  fi
  timeout -k 10 "$left" "$@"
}

# ---------------------------------------------------------------- the steps

step_gpu() {
  if ! command -v nvidia-smi >/dev/null 2>&1; then
    no_gpu_reason="nvidia-smi not found (no NVIDIA driver)"
  elif ! timed nvidia-smi >"$work/nvidia-smi.txt" 2>&1; then
    no_gpu_reason="nvidia-smi failed: $(tail -n 1 "$work/nvidia-smi.txt")"
  elif ! grep -q '^GPU ' <(timed nvidia-smi -L 2>&1); then
    no_gpu_reason="nvidia-smi lists no GPU"
  fi
  [[ -f "$work/nvidia-smi.txt" ]] && cat "$work/nvidia-smi.txt"
  if [[ -n "$no_gpu_reason" ]]; then
    echo "no GPU: $no_gpu_reason"
    step_note="no GPU: $no_gpu_reason"
    ((allow_no_gpu)) || return 3
    step_status=skipped
    return 0
  fi
  have_gpu=1
  # "9.0" -> "90", for CMAKE_CUDA_ARCHITECTURES once spillway has kernels.
  cuda_arch="$(timed nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d ' .')"
  step_note="$(timed nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -n 1)"
  echo "compute capability: $cuda_arch"
}

step_versions() {
  local versions="$work/versions.txt"
  : >"$versions"
  local tool
  for tool in "uname -srm" "g++ --version" "cmake --version" "ninja --version" "nvcc --version"; do
    local argv
    read -r -a argv <<<"$tool"
    if command -v "${argv[0]}" >/dev/null 2>&1; then
      { echo "\$ $tool"; timed "${argv[@]}" 2>&1 | grep -m 1 -E '[0-9]+\.[0-9]+'; } >>"$versions"
    else
      echo "\$ $tool: not found" >>"$versions"
    fi
  done
  # One python3 start for all torch facts (importing torch takes seconds).
  local torch_out
  torch_out="$(timed "$python" -c '
import torch
print("torch_cmake_prefix_path=" + torch.utils.cmake_prefix_path)
line = "torch " + torch.__version__ + ", built for CUDA " + str(torch.version.cuda)
line += ", cuda available: " + str(torch.cuda.is_available())
if torch.cuda.is_available():
    line += ", " + torch.cuda.get_device_name(0)
print(line)
' 2>&1)"
  torch_prefix="$(sed -n 's/^torch_cmake_prefix_path=//p' <<<"$torch_out")"
  if [[ -n "$torch_prefix" ]]; then
    grep -v '^torch_cmake_prefix_path=' <<<"$torch_out" | tail -n 1 >>"$versions"
    step_note="$(tail -n 1 "$versions")"
  else
    echo "torch: not importable ($(tail -n 1 <<<"$torch_out")); building without it" >>"$versions"
    step_status=warn
    step_note="no torch: building without the LibTorch bridge"
  fi
  echo "torch CMake prefix: ${torch_prefix:-none}" >>"$versions"
  cat "$versions"
}

step_deps() {
  shopt -s nullglob
  local debs=("$deps_dir"/*.deb)
  shopt -u nullglob
  if ((${#debs[@]} == 0)); then
    echo "no .deb files in $deps_dir: using the system's fmt, GoogleTest and Google Benchmark"
    step_status=skipped
    step_note="none carried; system packages"
    return 0
  fi
  local prefix="$build/deps"
  rm -rf "$prefix" && mkdir -p "$prefix" || return 1
  local deb
  for deb in "${debs[@]}"; do
    echo "unpacking $(basename "$deb")"
    if command -v dpkg-deb >/dev/null 2>&1; then
      timed dpkg-deb -x "$deb" "$prefix" || return 1
    else  # a .deb is an ar archive holding data.tar.*
      local unpack="$work/unpack"
      rm -rf "$unpack" && mkdir -p "$unpack" || return 1
      (cd "$unpack" && ar x "$deb" && tar -xf data.tar.* -C "$prefix") || return 1
    fi
  done
  prefix_paths+=("$prefix/usr")
  step_note="${#debs[@]} packages unpacked into $prefix"
}

configure_with() {  # configure_with PREFIX_PATH EXTRA_ARGS...
  local prefix_path="$1"
  shift
  local args=(-S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=Release -DSPILLWAY_BUILD_TESTS=ON
    -DSPILLWAY_BUILD_BENCHMARKS=ON -DCMAKE_PREFIX_PATH="$prefix_path" -DSPILLWAY_PYTHON="$python")
  [[ -n "$cuda_arch" ]] && args+=(-DCMAKE_CUDA_ARCHITECTURES="$cuda_arch")
  [[ ! -f "$build/CMakeCache.txt" ]] && command -v ninja >/dev/null 2>&1 && args+=(-G Ninja)
  timed cmake "${args[@]}" "$@"
}

step_configure() {
  # The CUDA toolkit's usual home, for find_package(CUDAToolkit).
  if ! command -v nvcc >/dev/null 2>&1 && [[ -x /usr/local/cuda/bin/nvcc ]]; then
    export PATH="/usr/local/cuda/bin:$PATH"
  fi
  local base_path
  base_path="$(IFS=';'; echo "${prefix_paths[*]}")"
  # Torch is found through $python (cmake/FindTorchThroughPython.cmake).
  if ! configure_with "$base_path"; then
    [[ -n "$torch_prefix" ]] || return 1
    # A pip torch's CMake package can fail on what this image lacks (a CUDA
    # library, cuDNN); the device and allocator checks still need running.
    echo "gpu_check: configuring against torch failed; retrying without torch"
    rm -rf "$build/CMakeCache.txt" "$build/CMakeFiles"  # start clean (cmake --fresh needs 3.24)
    configure_with "$base_path" -DSPILLWAY_WITH_TORCH=OFF || return 1
    step_status=warn
    step_note="configured WITHOUT torch: torch's CMake package failed (see log)"
  fi
  # The CUDA backend is built exactly when cuda_device.cc is compiled.
  if ! grep -q 'cuda_device\.cc' "$build/compile_commands.json" 2>/dev/null; then
    echo "gpu_check: the CUDA backend is not built (no CUDA toolkit found by CMake)"
    step_note="CUDA backend not built: CMake found no CUDA toolkit"
    return 1
  fi
}

step_build() {
  timed cmake --build "$build" -j "$(nproc)"
}

step_gpu_tests() {
  local rc=0
  (cd "$build" && timed ctest -L gpu --output-on-failure --no-tests=error --timeout 120) 2>&1 |
    tee "$work/ctest.txt" || rc=$?
  step_note="$(grep -E 'tests passed|tests failed' "$work/ctest.txt" | tail -n 1)"
  ((rc == 0)) || return "$rc"
  if grep -q '(Skipped)' "$work/ctest.txt"; then
    if ((have_gpu)); then
      # GPU tests skip only when they find no usable device: here that is a bug.
      echo "gpu_check: GPU tests were skipped on a machine with a GPU"
      step_note="GPU tests SKIPPED on a GPU machine; $step_note"
      return 1
    fi
    step_status=skipped
    step_note="skipped without a GPU; $step_note"
  fi
}

step_gpu_bench() {
  local device=cuda
  ((have_gpu)) || device=auto
  local name program rc=0
  : >"$work/bench.txt"
  # bench_device: raw copies and events; bench_chunk: chunk moves against them.
  for name in bench_device bench_chunk; do
    program="$build/bin/$name"
    [[ -x "$program" ]] || { echo "gpu_check: $name was not built"; rc=1; continue; }
    timed "$program" --device="$device" 2>&1 | tee -a "$work/bench.txt"
    ((PIPESTATUS[0] == 0)) || rc=1
  done
  return "$rc"
}

step_pluggable() {
  local lib="$build/allocator/libspillway.so"
  [[ -f "$lib" ]] || { echo "gpu_check: $lib was not built"; return 1; }
  local rc=0
  timed "$python" "$repo/tools/gpu/pluggable_allocator_check.py" --lib "$lib" 2>&1 |
    tee "$work/pluggable.txt" || rc=$?
  if ((rc == 2)); then  # no torch with CUDA here: the script said why
    step_status=skipped
    step_note="$(tail -n 1 "$work/pluggable.txt")"
    return 0
  fi
  step_note="$(grep -E '^losses identical' "$work/pluggable.txt")"
  return "$rc"
}

# torch's CUDA memory functions (memory_stats, memory_allocated,
# max_memory_allocated, memory_reserved, reset_peak_memory_stats, empty_cache,
# Tensor.record_stream), a 0-byte tensor and torch's OOM error, with spillway
# installed from the build's Python package as torch's CUDA allocator.
step_cuda_api() {
  [[ -d "$build/python/spillway" ]] || {
    step_status=skipped
    step_note="the Python package was not built (see 'spillway: Python package' in configure)"
    return 0
  }
  local rc=0
  timed "$python" "$repo/tools/gpu/torch_cuda_api_check.py" --build "$build" 2>&1 |
    tee "$work/cuda_api.txt" || rc=$?
  if ((rc == 2)); then
    step_status=skipped
    step_note="$(tail -n 1 "$work/cuda_api.txt")"
    return 0
  fi
  step_note="$(grep -E '^torch cuda api:' "$work/cuda_api.txt")"
  return "$rc"
}

# spillway-train-demo on CUDA (C++), spillway installed as torch's CUDA
# allocator through LibTorch's CUDAPluggableAllocator: bit-identical to a run
# on torch's own allocator (--check), then with spillway's Adam; tokens/s of each.
step_train_demo_cuda() {
  local demo="$build/bin/spillway-train-demo"
  [[ -x "$demo" ]] || {
    step_status=skipped
    step_note="spillway-train-demo was not built (no torch)"
    return 0
  }
  local rc=0
  : >"$work/train_demo_cuda.txt"
  timed "$demo" --cuda --check --steps 50 2>&1 | tee -a "$work/train_demo_cuda.txt" || rc=1
  timed "$demo" --cuda --optimizer spillway-adam --steps 50 2>&1 | tee -a "$work/train_demo_cuda.txt" || rc=1
  # "[plain] 50 steps in 1.23 s: 45678 tokens/s (torch-adam)" -> metric lines.
  sed -nE 's/^\[(plain|spillway)\] .* ([0-9]+) tokens\/s \((torch|spillway)-adam\)$/metric train_demo_cuda_\1_\3_adam_tokens_per_s \2 tokens\/s/p' \
    "$work/train_demo_cuda.txt" | tee -a "$work/bench.txt"
  step_note="$(grep -E '^check: ' "$work/train_demo_cuda.txt" | tail -n 1)"
  return "$rc"
}

# The Python package installed as users install it; a plain training script
# run unchanged under SPILLWAY_CONF and with spillway.manage() under a budget
# that spills; identical losses; the spilling run's report into $OUT.
step_python_train() {
  [[ -d "$build/python/spillway" ]] || {
    step_status=skipped
    step_note="the Python package was not built (see 'spillway: Python package' in configure)"
    return 0
  }
  local rc=0
  timed "$python" "$repo/tools/gpu/python_train_check.py" --build "$build" --out "$out_dir" 2>&1 |
    tee "$work/python_train.txt" || rc=$?
  if ((rc == 2)); then
    step_status=skipped
    step_note="$(tail -n 1 "$work/python_train.txt")"
    return 0
  fi
  step_note="$(grep -E '^losses identical' "$work/python_train.txt")"
  return "$rc"
}

# ---------------------------------------------------------------- the runner

# Runs one step; returns non-zero when it failed and its policy is stop.
run_step() {
  local name="$1" limit="$2" policy="$3"
  local started left
  started="$(now_s)"
  left=$((run_start_s + budget_s - started))
  step_status=""
  step_note=""
  local rc=0
  if ((left < 5)); then
    rc=124
    step_note="not started: the ${budget_s}s budget is spent"
  else
    step_deadline_s=$((started + (limit < left ? limit : left)))
    echo "== $name (limit $((step_deadline_s - started))s)"
    "step_$name" >"$work/$name.log" 2>&1 </dev/null || rc=$?
  fi
  local seconds=$(($(now_s) - started))
  if ((rc == 124 || rc == 137)); then
    step_status="timed out"
  elif ((rc != 0)); then
    step_status=failed
  fi
  : "${step_status:=passed}"
  step_results+=("$name|$step_status|$seconds|$step_note")
  {
    echo "==================== step $name: $step_status (${seconds}s) ===================="
    [[ -f "$work/$name.log" ]] && cat "$work/$name.log"
    echo
  } >>"$full_log"
  echo "   $name: $step_status (${seconds}s)${step_note:+ - $step_note}"
  if [[ "$step_status" == failed || "$step_status" == "timed out" ]]; then
    [[ -f "$work/$name.log" ]] && tail -n 40 "$work/$name.log" | sed 's/^/   | /'
    [[ "$policy" == stop ]] && return 1
  fi
  return 0
}

overall_result() {
  local entry
  [[ -n "$no_gpu_reason" ]] && ((!allow_no_gpu)) && { echo "NO GPU ($no_gpu_reason)"; return; }
  for entry in "${step_results[@]}"; do
    case "$(cut -d'|' -f2 <<<"$entry")" in
      failed | "timed out") echo "FAILED"; return ;;
    esac
  done
  ((${#step_results[@]} == ${#STEPS[@]})) && echo "PASSED" || echo "INCOMPLETE"
}

code_block() {  # code_block FILE [GREP_PATTERN]
  echo '```text'
  if [[ ! -s "$1" ]]; then
    echo "(none)"
  elif (($# > 1)); then
    grep -E "$2" "$1" || echo "(none)"
  else
    cat "$1"
  fi
  echo '```'
}

write_summary() {
  local entry name status seconds note
  {
    echo "# spillway GPU check"
    echo
    echo "- result: **$(overall_result)**"
    echo "- finished: $(date -u '+%Y-%m-%d %H:%M:%S UTC') on $(uname -n), $(($(now_s) - run_start_s))s of a ${budget_s}s budget"
    echo "- source: $(git -C "$repo" describe --always --dirty 2>/dev/null || echo 'unknown revision')"
    echo "- full output of every step: gpu_check.log"
    echo
    echo "## Steps"
    echo
    echo "| step | result | seconds | note |"
    echo "| --- | --- | --- | --- |"
    for entry in "${step_results[@]}"; do
      IFS='|' read -r name status seconds note <<<"$entry"
      echo "| $name | $status | $seconds | ${note//|//} |"
    done
    echo
    echo "## GPU (nvidia-smi)"
    echo
    code_block "$work/nvidia-smi.txt"
    echo
    echo "## Versions"
    echo
    code_block "$work/versions.txt"
    echo
    echo "## GPU tests (ctest -L gpu)"
    echo
    # ctest's totals, and its closing lists of tests that failed or did not run.
    code_block "$work/ctest.txt" \
      'tests passed|tests failed|Total Test time|No tests|did not run|FAILED:|^\s+[0-9]+ - .*\([A-Za-z ]+\)$'
    echo
    echo "## Metrics"
    echo
    code_block "$work/bench.txt" '^metric |^# (cuda|sim|error)'
    echo
    echo "## spillway as torch's allocator (CUDAPluggableAllocator)"
    echo
    code_block "$work/pluggable.txt"
    echo
    echo "## torch.cuda's memory functions under spillway (TorchCudaAllocator)"
    echo
    code_block "$work/cuda_api.txt"
    echo
    echo "## The C++ demo on CUDA (spillway as LibTorch's CUDA allocator)"
    echo
    code_block "$work/train_demo_cuda.txt" '^check: |tokens/s|spillway-train-demo: '
    echo
    echo "## A Python training script on CUDA"
    echo
    code_block "$work/python_train.txt" '^metric |^losses identical|identical to torch|python_train_check: '
  } >"$summary.tmp" && mv "$summary.tmp" "$summary"
}

fetch_deps() {
  local dir="${1:-$deps_dir}"
  mkdir -p "$dir" || exit 1
  echo "downloading ${DEP_PACKAGES[*]} into $dir"
  (cd "$dir" && apt-get download "${DEP_PACKAGES[@]}") || exit 1
  ls -l "$dir"
}

main() {
  while (($#)); do
    case "$1" in
      --allow-no-gpu) allow_no_gpu=1 ;;
      --fetch-deps) shift; fetch_deps "${1:-}"; exit 0 ;;
      -h | --help) sed -n '2,41s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; exit 0 ;;
      *) echo "gpu_check: unknown argument '$1' (see --help)" >&2; exit 1 ;;
    esac
    shift
  done
  mkdir -p "$out_dir" "$build" || exit 1
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  : >"$full_log"
  run_start_s="$(now_s)"
  echo "gpu_check: writing $summary and $full_log"

  local entry name limit policy
  for entry in "${STEPS[@]}"; do
    read -r name limit policy _ <<<"$entry"
    run_step "$name" "$limit" "$policy"
    local keep_going=$?
    write_summary
    ((keep_going == 0)) || break
  done

  local result
  result="$(overall_result)"
  echo "gpu_check: $result (summary: $summary)"
  case "$result" in
    PASSED) exit 0 ;;
    NO\ GPU*) exit 2 ;;
    *) exit 1 ;;
  esac
}

main "$@"
