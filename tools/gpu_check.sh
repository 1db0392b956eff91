#!/usr/bin/env bash
# tools/gpu_check.sh: spillway's checks on a machine with an NVIDIA GPU, and
# their rehearsal on a machine without one. docs/gpu.md gives the one command
# for whoever is lent a GPU.
#
# On a machine with a GPU, CUDA, a pip torch 2.x in a virtual environment, no
# internet and no tty: configures spillway once (Release, against that torch),
# then builds and checks in stages, each reporting before the next starts:
#   1. torch-free (gpu_check_core): GPU tests, GPU benchmarks, libspillway.so
#      as torch's allocator through CUDAPluggableAllocator;
#   2. torch (gpu_check_torch): the torch GPU tests, the C++ demo on CUDA;
#   3. the Python package, pip-installed into $python's own environment:
#      torch.cuda's memory functions and a training script under SPILLWAY_CONF.
# It writes to $OUT (else $build/gpu_check/), rewriting both after every step
# so that a run cut short still leaves them:
#   gpu_check_summary.md  the result, each step's outcome and time, versions,
#                         ctest totals, every metric line and every loss
#                         comparison: committable under bench/results/
#   gpu_check.log         every step's full output, one section per step
# and python_train_report.html (spillway-report of the spilling run).
#
#   tools/gpu_check.sh                  on the GPU machine
#   tools/gpu_check.sh --rehearse       here, without a GPU (CI runs it)
#   tools/gpu_check.sh --fetch-deps [DIR]
#   tools/gpu_check.sh --steps a,b,... [--rehearse]
#
# --rehearse    everything that does not need a GPU, as on the GPU machine: the
#               staged configure and build with dependencies only from the
#               fetched folder (never the system's), the Python checks on the
#               simulated device in a virtual environment without a user site,
#               the summary and the $OUT layout. GPU tests skip; nothing else
#               may. Step limits are scaled for a 2-core machine.
# --fetch-deps  with internet (Debian's archive): download the .deb files of
#               the build dependencies the GPU image lacks (DEP_PACKAGES) into
#               DIR (default .gpu-deps/ at the repo root, which git ignores:
#               the device tool must carry it). The deps step unpacks them
#               into the build folder, never into /.
# --steps       run only these steps (names as in STEPS), in STEPS' order:
#               e.g. a second call on a warm machine reruns python_train.
#
# Environment:
#   OUT                         where the summary, log and report go
#   SPILLWAY_GPU_BUILD_TYPE     CMAKE_BUILD_TYPE of every build (default
#                               Release; RelWithDebInfo for a debugger)
#   SPILLWAY_GPU_BUILD_DIR      build folder (default build-gpu/, with
#                               --rehearse build-gpu-rehearse/, at the repo root)
#   SPILLWAY_GPU_DEPS           folder of fetched .deb files (default .gpu-deps/)
#   SPILLWAY_PYTHON             the interpreter whose torch to build against
#                               (default: python3 on PATH, the image's venv;
#                               with --rehearse a venv made in the build folder
#                               over tools/install-deps.sh's environment)
#   SPILLWAY_GPU_CHECK_BUDGET_S time for all steps (default 580: the device
#                               tool's 600 s command limit, less the last
#                               step's kill grace and the summary)
#
# Exit status: 0 every step passed (skipped GPU tests allowed with --rehearse
# only); 1 a step failed or did not run; 2 no GPU (without --rehearse).
#
# Adding a check: write a step_NAME function below that runs its commands
# through `timed` and returns non-zero on failure (it may set step_status=
# skipped and step_note="..."; step_status=failed with return 0 records a
# failure that later steps can still work around), then add "NAME LIMIT_S
# ESTIMATE_S POLICY" to STEPS. LIMIT_S is the most the step may take on the GPU
# machine; ESTIMATE_S is its expected time there (16 cores), which the plan
# step checks against the budget. POLICY is stop (a failure ends the run:
# later steps need it) or continue. $OUT returns at most 8 files.

# shellcheck disable=SC2317  # the step_* functions are called by name
# Under pipefail, `producer | grep -q` fails when grep quits early and the
# producer dies of SIGPIPE: pipelines here read all input (grep -c).
set -uo pipefail
export PYTHONUNBUFFERED=1

# Estimates: the H200 machine's 16 cores, from this 2-core machine's
# measured rehearsal (docs/gpu.md): compile time divided by 8 where the
# build parallelises, its critical path where it does not (build_torch:
# torch's precompiled header, then the longest torch TU), process starts
# and GPU work added. The run plus the
# machine's start (1-2 minutes) fits the 15 minutes of device time.
STEPS=(
  #name          limit estimate policy
  "plan             10    1 stop"      # the estimates fit the budget, the budget the device tool's limits
  "gpu              30    2 stop"      # nvidia-smi sees a GPU; its compute capability and driver
  "versions         60    8 continue"  # torch, its CUDA and C++ ABI, Python, nvcc, driver, compilers
  "deps             60    2 stop"      # unpack the fetched .deb build dependencies
  "configure       150   40 stop"      # Release, against torch; dependencies only from the deps
  "build_core      240   45 stop"      # gpu_check_core: libspillway.so, torch-free GPU tests, benchmarks
  "gpu_tests       120   20 continue"  # ctest -L gpu -LE torch: must pass, and must not skip on a GPU
  "gpu_bench        90   30 continue"  # bench_device, bench_chunk --device=cuda: metric lines
  "pluggable       120   25 continue"  # libspillway.so as torch's allocator vs torch's own
  "build_torch     300  150 stop"      # gpu_check_torch: the LibTorch bridge, torch GPU tests, the demo
  "torch_gpu_tests  90   10 continue"  # ctest -L gpu_torch: the GPU tests with torch
  "train_demo_cuda 120   40 continue"  # the C++ demo on CUDA: bit-identical, tokens/s
  "python_install  240   60 stop"      # pip install . into $python's own environment
  "cuda_api         90   15 continue"  # torch.cuda.memory_stats & co., record_stream, OOM under spillway
  "python_train    300   90 continue"  # a script under SPILLWAY_CONF: spilling (planned, LRU), CUPTI, report
  "out              10    1 continue"  # $OUT fits what the device tool returns
)
# The device tool's limits (/work/.library/device/README.md): one command
# runs at most 600 s; the session has 900 s of device time, machine start
# included.
DEVICE_COMMAND_LIMIT_S=600
DEVICE_TIME_S=900
MACHINE_START_S=120
KILL_GRACE_S=10
# With --rehearse, limits are multiplied by this: 2 cores build the torch
# TUs about 8 times slower than 16.
REHEARSAL_LIMIT_FACTOR=10

# Build dependencies fetched by --fetch-deps (Debian package names): what the
# top CMakeLists.txt and tests/, tools/, bench/ find_package, beyond CUDA and
# torch. DEP_CMAKE_DIRS: the cache entries that must then point into them.
DEP_PACKAGES=(libfmt-dev libfmt9 nlohmann-json3-dev libcli11-dev libgtest-dev libgmock-dev
  libbenchmark-dev libbenchmark1debian)
DEP_CMAKE_DIRS=(fmt_DIR nlohmann_json_DIR CLI11_DIR GTest_DIR benchmark_DIR SPILLWAY_FMT_INCLUDE_DIR)

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
rehearse=0
only_steps=""
build=""
deps_dir="${SPILLWAY_GPU_DEPS:-$repo/.gpu-deps}"
budget_s=""
out_dir=""
summary=""
full_log=""

have_gpu=0
no_gpu_reason=""
cuda_arch=""
python="${SPILLWAY_PYTHON:-}"
torch_prefix=""
torch_problem=""           # why the torch stages cannot build, when they cannot
python_package_problem=""  # why the Python package is not configured
compiler_note=""           # the compiler used, where it is not $CXX (choose_compilers)
compiler_problem=""        # why no compiler can build spillway
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
  timeout -k "$KILL_GRACE_S" "$left" "$@"
}

# The Python checks' flag: the simulated device instead of the GPU.
rehearse_flag() { ((rehearse)) && echo --rehearse; }

# A Python check exits 2 when it finds no usable torch GPU: on the GPU
# machine that is a failure (torch or the GPU is broken), and with --rehearse
# the checks never say it.
python_check_status() {  # python_check_status RC LOG
  local rc="$1" log="$2"
  if ((rc == 2)); then
    step_note="no usable torch GPU: $(tail -n 1 "$log")"
    return 1
  fi
  return "$rc"
}

# ---------------------------------------------------------------- the steps

step_plan() {
  local entry name limit estimate policy total=0
  for entry in "${STEPS[@]}"; do
    read -r name limit estimate policy <<<"$entry"
    declare -F "step_$name" >/dev/null || { echo "gpu_check: no function step_$name"; return 1; }
    [[ "$policy" == stop || "$policy" == continue ]] || { echo "gpu_check: $name: policy '$policy'"; return 1; }
    if ((estimate > limit)); then
      echo "gpu_check: $name is estimated at ${estimate}s, over its ${limit}s limit"
      return 1
    fi
    total=$((total + estimate))
  done
  local gpu_budget=$((rehearse ? ${SPILLWAY_GPU_CHECK_BUDGET_S:-580} : budget_s))
  echo "estimated ${total}s on the GPU machine, budget ${gpu_budget}s"
  step_note="estimated ${total}s of a ${gpu_budget}s budget"
  if ((total > gpu_budget)); then
    echo "gpu_check: the steps are estimated at ${total}s, over the ${gpu_budget}s budget: steps would time out"
    return 1
  fi
  if ((gpu_budget + KILL_GRACE_S > DEVICE_COMMAND_LIMIT_S)); then
    echo "gpu_check: a ${gpu_budget}s budget runs past the device tool's ${DEVICE_COMMAND_LIMIT_S}s command limit"
    return 1
  fi
  if ((gpu_budget + MACHINE_START_S > DEVICE_TIME_S)); then
    echo "gpu_check: a ${gpu_budget}s budget and the machine's start exceed ${DEVICE_TIME_S}s of device time"
    return 1
  fi
}

step_gpu() {
  if ((rehearse)); then
    step_status=skipped
    step_note="rehearsal: no GPU expected"
    command -v nvidia-smi >/dev/null 2>&1 && timed nvidia-smi -L
    return 0
  fi
  if ! command -v nvidia-smi >/dev/null 2>&1; then
    no_gpu_reason="nvidia-smi not found (no NVIDIA driver)"
  elif ! timed nvidia-smi >"$work/nvidia-smi.txt" 2>&1; then
    no_gpu_reason="nvidia-smi failed: $(tail -n 1 "$work/nvidia-smi.txt")"
  elif ! grep -q '^GPU ' <(timed nvidia-smi -L 2>&1); then
    no_gpu_reason="nvidia-smi lists no GPU"
  fi
  [[ -f "$work/nvidia-smi.txt" ]] && cat "$work/nvidia-smi.txt"
  if [[ -n "$no_gpu_reason" ]]; then
    echo "no GPU: $no_gpu_reason (tools/gpu_check.sh --rehearse runs without one)"
    step_note="no GPU: $no_gpu_reason"
    return 3
  fi
  have_gpu=1
  # "9.0" -> "90", for CMAKE_CUDA_ARCHITECTURES.
  cuda_arch="$(timed nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d ' .')"
  step_note="$(timed nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -n 1)"
  echo "compute capability: $cuda_arch"
}

step_versions() {
  local versions="$work/versions.txt"
  : >"$versions"
  local tool
  for tool in "uname -srm" "${CXX:-g++} --version" "cmake --version" "ninja --version" "nvcc --version"; do
    local argv
    read -r -a argv <<<"$tool"
    if command -v "${argv[0]}" >/dev/null 2>&1; then
      { echo "\$ $tool"; timed "${argv[@]}" 2>&1 | grep -m 1 -E '[0-9]+\.[0-9]+'; } >>"$versions"
    else
      echo "\$ $tool: not found" >>"$versions"
    fi
  done
  if command -v nvidia-smi >/dev/null 2>&1; then
    { echo "\$ nvidia-smi (driver)"
      timed nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader 2>&1; } >>"$versions"
  fi
  # One interpreter start for every Python and torch fact (importing torch takes seconds).
  local torch_out rc=0
  torch_out="$(timed "$python" -c '
import site, sys
print("python " + sys.version.split()[0] + " at " + sys.executable + ", user site "
      + ("enabled" if site.ENABLE_USER_SITE else "disabled"))
import torch
print("torch_cmake_prefix_path=" + torch.utils.cmake_prefix_path)
print("torch " + torch.__version__ + ", built for CUDA " + str(torch.version.cuda)
      + ", C++11 ABI " + str(int(torch._C._GLIBCXX_USE_CXX11_ABI))
      + ", cuda available: " + str(torch.cuda.is_available())
      + (", " + torch.cuda.get_device_name(0) if torch.cuda.is_available() else ""))
' 2>&1)" || rc=$?
  torch_prefix="$(sed -n 's/^torch_cmake_prefix_path=//p' <<<"$torch_out")"
  grep -E '^python ' <<<"$torch_out" >>"$versions"
  if ((rc != 0)) || [[ -z "$torch_prefix" ]]; then
    torch_problem="torch is not importable by $python: $(tail -n 1 <<<"$torch_out")"
    echo "$torch_problem" >>"$versions"
    cat "$versions"
    step_status=failed  # the torch-free stages still run
    step_note="$torch_problem"
    return 0
  fi
  grep -E '^torch ' <<<"$torch_out" >>"$versions"
  echo "torch CMake prefix: $torch_prefix" >>"$versions"
  cat "$versions"
  step_note="$(grep -m 1 -E '^torch [0-9]' "$versions")"
  if ((rehearse)) && grep -q 'user site enabled' "$versions"; then
    echo "gpu_check: the rehearsal's interpreter has a user site; the GPU image's venv has none"
    return 1
  fi
  if ((have_gpu)) && ! grep -q 'cuda available: True' "$versions"; then
    step_note="torch sees no GPU: $step_note"
    return 1
  fi
}

step_deps() {
  shopt -s nullglob
  local debs=("$deps_dir"/*.deb)
  shopt -u nullglob
  if ((${#debs[@]} == 0)); then
    if ((rehearse)); then
      echo "gpu_check: no .deb files in $deps_dir: run tools/gpu_check.sh --fetch-deps first"
      step_note="no fetched dependencies in $deps_dir"
      return 1
    fi
    echo "no .deb files in $deps_dir: the image's own packages must do (docs/gpu.md: carry .gpu-deps)"
    rm -rf "$build/deps"  # none of an earlier run's either
    step_status=skipped
    step_note="none carried; the image's packages"
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
  step_note="${#debs[@]} packages unpacked into $prefix"
}

configure_with() {  # configure_with PREFIX_PATH EXTRA_ARGS...
  local prefix_path="$1"
  shift
  local args=(-S "$repo" -B "$build" -DCMAKE_BUILD_TYPE="$build_type" -DSPILLWAY_BUILD_TESTS=ON
    -DSPILLWAY_BUILD_BENCHMARKS=ON -DCMAKE_PREFIX_PATH="$prefix_path" -DSPILLWAY_PYTHON="$python")
  [[ -n "$cuda_arch" ]] && args+=(-DCMAKE_CUDA_ARCHITECTURES="$cuda_arch")
  [[ ! -f "$build/CMakeCache.txt" ]] && command -v ninja >/dev/null 2>&1 && args+=(-G Ninja)
  timed cmake "${args[@]}" "$@"
}

cache_value() {  # cache_value NAME: its value in the build's CMakeCache.txt
  sed -n "s/^$1:[A-Z]*=//p" "$build/CMakeCache.txt" | head -n 1
}

# Each dependency must come from the unpacked .deb files when some were
# carried: one found in the system's folders here would be missing on the
# GPU image (a package left out of DEP_PACKAGES).
check_dependency_origins() {
  [[ -d "$build/deps" ]] || return 0
  local name value bad=0
  for name in "${DEP_CMAKE_DIRS[@]}"; do
    value="$(cache_value "$name")"
    [[ -z "$value" ]] && continue  # not searched in this configuration
    if [[ "$value" != "$build/deps/"* ]]; then
      echo "gpu_check: $name=$value is not from the fetched dependencies ($build/deps):" \
        "add its package to DEP_PACKAGES in tools/gpu_check.sh"
      bad=1
    fi
  done
  return "$bad"
}

# Whether g++ $1 finds a shared libstdc++ to link against.
finds_shared_libstdcxx() {
  local found
  found="$("$1" -print-file-name=libstdc++.so 2>/dev/null)" && [[ "$found" == /* && -e "$found" ]]
}

# Note [A compiler without a shared libstdc++] (cmake/SharedLibstdcxx.cmake):
# the H200 image sets CXX=/opt/gcc/bin/g++, which finds only libstdc++.a, and
# CMake then refuses it. The g++ on PATH (the image's Ubuntu g++ of the same
# version) links libstdc++.so: it builds everything, CUDA's host code too.
choose_compilers() {
  # No CXX, one that is not there (CMake says so), or one that works.
  if [[ -z "${CXX:-}" ]] || ! command -v "$CXX" >/dev/null 2>&1 || finds_shared_libstdcxx "$CXX"; then
    return 0
  fi
  local gxx
  gxx="$(command -v g++)"
  if [[ -z "$gxx" ]] || ! finds_shared_libstdcxx "$gxx"; then
    compiler_problem="CXX=$CXX finds no libstdc++.so, and no g++ on PATH does"
    return 0
  fi
  compiler_note="CXX=$CXX has no libstdc++.so: built with $gxx"
  export CXX="$gxx" CUDAHOSTCXX="$gxx"
  local gcc
  gcc="$(command -v gcc)"
  [[ -n "${CC:-}" && -n "$gcc" ]] && export CC="$gcc"
  return 0
}

step_configure() {
  # The CUDA toolkit's usual home, for find_package(CUDAToolkit).
  if ! command -v nvcc >/dev/null 2>&1 && [[ -x /usr/local/cuda/bin/nvcc ]]; then
    export PATH="/usr/local/cuda/bin:$PATH"
  fi
  [[ -n "$compiler_problem" ]] && { step_note="$compiler_problem"; echo "gpu_check: $step_note"; return 1; }
  # The unpacked dependencies, also those of an earlier run when --steps
  # leaves out the deps step.
  local base_path="" log="$work/configure.txt"
  [[ -d "$build/deps/usr" ]] && base_path="$build/deps/usr"
  # Torch is found through $python (cmake/FindTorchThroughPython.cmake).
  if ! configure_with "$base_path" 2>&1 | tee "$log"; then
    [[ -n "$torch_problem" ]] && return 1
    # A pip torch's CMake package can fail on what this image lacks (a CUDA
    # library, cuDNN): the torch-free stages still need running.
    echo "gpu_check: configuring against torch failed; configuring without torch for the torch-free stages"
    torch_problem="torch's CMake package failed at configure (see the log)"
    rm -rf "$build/CMakeCache.txt" "$build/CMakeFiles"  # start clean (cmake --fresh needs 3.24)
    configure_with "$base_path" -DSPILLWAY_WITH_TORCH=OFF 2>&1 | tee "$log" || return 1
  fi
  check_dependency_origins || { step_note="a dependency came from outside the fetched ones"; return 1; }
  # The CUDA backend is built exactly when cuda_device.cc is compiled.
  if ! grep -q 'cuda_device\.cc' "$build/compile_commands.json" 2>/dev/null; then
    echo "gpu_check: the CUDA backend is not built (no CUDA toolkit found by CMake)"
    step_note="CUDA backend not built: CMake found no CUDA toolkit"
    return 1
  fi
  if [[ -z "$torch_problem" ]] && ! grep -q 'spillway: Torch found' "$log"; then
    torch_problem="$(grep -m 1 'spillway: Torch not found' "$log" | sed 's/^-- //')"
    torch_problem="${torch_problem:-configured without torch (see the log)}"
  fi
  python_package_problem="$(grep -m 1 'Python package not built' "$log" | sed 's/^-- //')"
  [[ -n "$torch_problem" ]] && python_package_problem="${python_package_problem:-$torch_problem}"
  if [[ -n "$torch_problem" || -n "$python_package_problem" ]]; then
    step_status=failed  # the torch-free stages still run
    step_note="${torch_problem:-$python_package_problem}"
    return 0
  fi
  step_note="$(grep -m 1 'spillway: CUDA backend' "$log" | sed 's/^-- //')${compiler_note:+; $compiler_note}"
}

step_build_core() {
  # The first stage must not wait for torch's headers: a target that pulls
  # the torch bridge into gpu_check_core would delay every first result.
  if [[ -f "$build/build.ninja" ]] &&
    ninja -C "$build" -t commands gpu_check_core | grep -c 'torch/include' >/dev/null; then
    echo "gpu_check: gpu_check_core compiles against torch's headers (cmake/GpuCheckTargets.cmake)"
    return 1
  fi
  timed cmake --build "$build" --target gpu_check_core -j "$(nproc)"
}

# ctest over the GPU tests that match LABEL_ARGS; on a GPU none may skip.
run_gpu_ctest() {  # run_gpu_ctest RESULT_FILE LABEL_ARGS...
  local result="$1" rc=0
  shift
  (cd "$build" && timed ctest "$@" --output-on-failure --no-tests=error --timeout 120 -j 4) 2>&1 |
    tee "$result" || rc=$?
  step_note="$(grep -E 'tests passed|tests failed' "$result" | tail -n 1)"
  ((rc == 0)) || return "$rc"
  if grep -q '(Skipped)' "$result"; then
    if ((!rehearse)); then
      # GPU tests skip only when they find no usable device: here that is a bug.
      echo "gpu_check: GPU tests were skipped on a machine with a GPU"
      step_note="GPU tests SKIPPED on a GPU machine; $step_note"
      return 1
    fi
    step_status=skipped
    step_note="rehearsal: skipped without a GPU; $step_note"
  fi
}

step_gpu_tests() { run_gpu_ctest "$work/ctest.txt" -L gpu -LE torch; }

step_gpu_bench() {
  local device=cuda
  ((rehearse)) && device=auto
  local name program rc=0
  # bench_device: raw copies and events; bench_chunk: chunk moves against them.
  for name in bench_device bench_chunk; do
    program="$build/bin/$name"
    [[ -x "$program" ]] || { echo "gpu_check: $name was not built"; rc=1; continue; }
    timed "$program" --device="$device" 2>&1 || rc=1
  done
  return "$rc"
}

step_pluggable() {
  local lib="$build/allocator/libspillway.so" rc=0
  [[ -f "$lib" ]] || { echo "gpu_check: $lib was not built"; return 1; }
  [[ -n "$torch_problem" ]] && { step_note="$torch_problem"; return 1; }
  # shellcheck disable=SC2046  # rehearse_flag is empty or one word
  timed "$python" "$repo/tools/gpu/pluggable_allocator_check.py" --lib "$lib" $(rehearse_flag) 2>&1 |
    tee "$work/pluggable.out" || rc=$?
  step_note="$(grep -E '^losses identical' "$work/pluggable.out")"
  python_check_status "$rc" "$work/pluggable.out"
}

step_build_torch() {
  [[ -n "$torch_problem" ]] && { step_note="$torch_problem"; echo "$torch_problem"; return 1; }
  timed cmake --build "$build" --target gpu_check_torch -j "$(nproc)"
}

step_torch_gpu_tests() { run_gpu_ctest "$work/ctest_torch.txt" -L gpu_torch; }

# spillway-train-demo (C++) on CUDA, spillway installed as torch's CUDA
# allocator through LibTorch's CUDAPluggableAllocator: bit-identical to a run
# on torch's own allocator (--check), then with spillway's Adam; tokens/s of
# each. Rehearsed on the simulated device.
step_train_demo_cuda() {
  local demo="$build/bin/spillway-train-demo" rc=0 device=(--cuda) steps=50
  [[ -x "$demo" ]] || { echo "gpu_check: spillway-train-demo was not built"; return 1; }
  ((rehearse)) && device=() steps=3
  : >"$work/train_demo.out"
  timed "$demo" "${device[@]}" --check --steps "$steps" 2>&1 | tee -a "$work/train_demo.out" || rc=1
  timed "$demo" "${device[@]}" --optimizer spillway-adam --steps "$steps" 2>&1 | tee -a "$work/train_demo.out" || rc=1
  # "[plain] 50 steps in 1.23 s: 45678 tokens/s (torch-adam)" -> metric lines.
  local metrics
  metrics="$(sed -nE 's/^\[(plain|spillway)\] .* ([0-9]+) tokens\/s \((torch|spillway)-adam\)$/metric train_demo_cuda_\1_\3_adam_tokens_per_s \2 tokens\/s/p' \
    "$work/train_demo.out")"
  echo "$metrics"
  if (($(grep -c '^metric ' <<<"$metrics") < 3)); then
    echo "gpu_check: the demo's tokens/s lines did not parse (its output format changed?)"
    rc=1
  fi
  step_note="$(grep -E '^check: ' "$work/train_demo.out" | tail -n 1)"
  return "$rc"
}

# The package installed as users install it (pip install . into $python's own
# environment, building only the extension in this build folder), then
# imported from a fresh interpreter outside the repository.
step_python_install() {
  [[ -n "$python_package_problem" ]] && { step_note="$python_package_problem"; echo "$step_note"; return 1; }
  # install-python.sh then imports the package from a fresh interpreter
  # outside the repository (tools/gpu/installed_spillway.py) and says where.
  PYTHON="$python" timed bash "$repo/tools/install-python.sh" --disable-pip-version-check \
    --config-settings=build-dir="$build" --config-settings=cmake.build-type="$build_type" \
    2>&1 | tee "$work/python_install.out" || return 1
  step_note="$(grep -m 1 '^installed_spillway: ' "$work/python_install.out" | sed 's/^installed_spillway: //')"
}

# torch's CUDA memory functions (memory_stats, memory_allocated,
# max_memory_allocated, memory_reserved, reset_peak_memory_stats, empty_cache,
# Tensor.record_stream), a 0-byte tensor and torch's OOM error, with spillway
# installed as torch's CUDA allocator.
step_cuda_api() {
  local rc=0
  # shellcheck disable=SC2046
  timed "$python" "$repo/tools/gpu/torch_cuda_api_check.py" --build "$build" $(rehearse_flag) 2>&1 |
    tee "$work/cuda_api.out" || rc=$?
  step_note="$(grep -E '^torch_cuda_api_check: ' "$work/cuda_api.out" | tail -n 1 | sed 's/^torch_cuda_api_check: //')"
  python_check_status "$rc" "$work/cuda_api.out"
}

# A plain training script run unchanged under SPILLWAY_CONF and with
# spillway.manage() under a budget that spills; identical losses; the
# spilling run's report into $OUT.
step_python_train() {
  local rc=0
  # shellcheck disable=SC2046
  timed "$python" "$repo/tools/gpu/python_train_check.py" --build "$build" --out "$out_dir" $(rehearse_flag) 2>&1 |
    tee "$work/python_train.out" || rc=$?
  step_note="$(grep -E '^losses identical' "$work/python_train.out")"
  python_check_status "$rc" "$work/python_train.out"
}

# What comes back from the device tool: at most 8 files, 16 MiB each, no more
# than 2 folders down, named in letters, digits, '.', '_' and '-'.
step_out() {
  local bad=0 count=0 file relative
  while IFS= read -r -d '' file; do
    count=$((count + 1))
    relative="${file#"$out_dir"/}"
    if [[ ! "$relative" =~ ^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+){0,2}$ ]]; then
      echo "gpu_check: $relative: the device tool returns only names of [A-Za-z0-9._-], 2 folders down"
      bad=1
    fi
    if (($(stat -c %s "$file") > 16 * 1024 * 1024)); then
      echo "gpu_check: $relative is over the 16 MiB the device tool returns"
      bad=1
    fi
  done < <(find "$out_dir" -type f -print0)
  # The summary is rewritten after this step: count it even before it exists.
  [[ -f "$summary" ]] || count=$((count + 1))
  echo "$count files in $out_dir"
  ls -l "$out_dir"
  step_note="$count files"
  if ((count > 8)); then
    echo "gpu_check: $count files in \$OUT; the device tool returns at most 8"
    bad=1
  fi
  return "$bad"
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
    [[ "$policy" == stop ]] && ((rc != 0)) && return 1
  fi
  return 0
}

selected_steps() {  # the STEPS entries this run runs
  local entry name
  for entry in "${STEPS[@]}"; do
    read -r name _ <<<"$entry"
    [[ -z "$only_steps" || ",$only_steps," == *",$name,"* ]] && echo "$entry"
  done
}

overall_result() {
  local entry
  [[ -n "$no_gpu_reason" ]] && { echo "NO GPU ($no_gpu_reason)"; return; }
  for entry in "${step_results[@]}"; do
    case "$(cut -d'|' -f2 <<<"$entry")" in
      failed | "timed out") echo "FAILED"; return ;;
    esac
  done
  (($(selected_steps | wc -l) == ${#step_results[@]})) && echo "PASSED" || echo "INCOMPLETE"
}

code_block() {  # code_block PATTERN FILE...: the lines of the files that match
  local pattern="$1"
  shift
  echo '```text'
  cat "$@" 2>/dev/null | grep -E "$pattern" || echo "(none)"
  echo '```'
}

write_summary() {
  local entry name status seconds note logs=()
  shopt -s nullglob
  for entry in $(selected_steps | awk '{print $1}'); do
    [[ -f "$work/$entry.log" ]] && logs+=("$work/$entry.log")
  done
  shopt -u nullglob
  {
    echo "# spillway GPU check$( ((rehearse)) && echo ' (rehearsal, no GPU)')"
    echo
    echo "- result: **$(overall_result)**"
    echo "- finished: $(date -u '+%Y-%m-%d %H:%M:%S UTC') on $(uname -n), $(($(now_s) - run_start_s))s of a ${budget_s}s budget"
    echo "- source: $(git -C "$repo" describe --always --dirty 2>/dev/null || echo 'unknown revision')"
    echo "- command: tools/gpu_check.sh$( ((rehearse)) && echo ' --rehearse')${only_steps:+ --steps $only_steps}"
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
    code_block '.' "$work/nvidia-smi.txt"
    echo
    echo "## Versions"
    echo
    code_block '.' "$work/versions.txt"
    echo
    echo "## GPU tests (ctest -L gpu)"
    echo
    # ctest's totals, and its closing lists of tests that failed or did not run.
    code_block 'tests passed|tests failed|Total Test time|No tests|did not run|FAILED:|^\s+[0-9]+ - .*\([A-Za-z ]+\)$' \
      "$work/ctest.txt" "$work/ctest_torch.txt"
    echo
    echo "## Metrics (every step)"
    echo
    code_block '^metric |^# (cuda|sim|error)' "${logs[@]}"
    echo
    echo "## Loss and parameter comparisons (every step)"
    echo
    code_block 'identical|^check: ' "${logs[@]}"
    echo
    echo "## spillway as torch's allocator (CUDAPluggableAllocator)"
    echo
    code_block '.' "$work/pluggable.out"
    echo
    echo "## torch.cuda's memory functions under spillway (TorchCudaAllocator)"
    echo
    code_block '.' "$work/cuda_api.out"
    echo
    echo "## A Python training script under SPILLWAY_CONF"
    echo
    code_block '^metric |identical|budget|python_train_check: |CUPTI' "$work/python_train.out"
  } >"$summary.tmp" && mv "$summary.tmp" "$summary"
}

fetch_deps() {
  local dir="${1:-$deps_dir}"
  mkdir -p "$dir" || exit 1
  dir="$(cd "$dir" && pwd)"
  echo "downloading ${DEP_PACKAGES[*]} into $dir"
  (cd "$dir" && apt-get download "${DEP_PACKAGES[@]}") || exit 1
  ls -l "$dir"
}

# The rehearsal's interpreter: a fresh virtual environment without system
# site packages, so without a user site, as the GPU image's, that sees
# tools/install-deps.sh's torch and scikit-build-core through a .pth file.
# Made anew when python_install runs; --steps without it reuses the last one.
make_rehearsal_python() {
  local deps_python venv="$build/rehearse-venv"
  python="$venv/bin/python"
  if [[ -x "$python" ]] && ! selected_steps | grep -c '^python_install ' >/dev/null; then
    return 0
  fi
  deps_python="$("$repo/tools/install-deps.sh" --venv-path)/bin/python"
  [[ -x "$deps_python" ]] || { echo "gpu_check: no $deps_python: run tools/install-deps.sh" >&2; return 1; }
  rm -rf "$venv"
  "$("$deps_python" -c 'import sys; print(sys._base_executable)')" -m venv "$venv" || return 1
  local deps_site venv_site
  deps_site="$("$deps_python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
  venv_site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
  # Sorts before spillway-activate.pth, which imports torch.
  echo "$deps_site" >"$venv_site/00-spillway-rehearsal-dependencies.pth"
}

main() {
  while (($#)); do
    case "$1" in
      --rehearse) rehearse=1 ;;
      --steps) shift; only_steps="${1:-}" ;;
      --fetch-deps) shift; fetch_deps "${1:-}"; exit 0 ;;
      -h | --help) sed -n '2,/^$/s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; exit 0 ;;
      *) echo "gpu_check: unknown argument '$1' (see --help)" >&2; exit 1 ;;
    esac
    shift
  done
  local entry name
  for name in ${only_steps//,/ }; do
    printf '%s\n' "${STEPS[@]}" | grep -c "^$name " >/dev/null ||
      { echo "gpu_check: --steps: no step '$name'" >&2; exit 1; }
  done
  build_type="${SPILLWAY_GPU_BUILD_TYPE:-Release}"
  build="${SPILLWAY_GPU_BUILD_DIR:-$repo/build-gpu$( ((rehearse)) && echo -rehearse)}"
  budget_s="${SPILLWAY_GPU_CHECK_BUDGET_S:-580}"
  ((rehearse)) && budget_s=$((budget_s * REHEARSAL_LIMIT_FACTOR))
  out_dir="${OUT:-$build/gpu_check}"
  summary="$out_dir/gpu_check_summary.md"
  full_log="$out_dir/gpu_check.log"
  mkdir -p "$out_dir" "$build" || exit 1
  build="$(cd "$build" && pwd)"
  if [[ -z "$python" ]]; then
    if ((rehearse)); then
      make_rehearsal_python || exit 1
    else
      python="$(command -v python3)"
    fi
  fi
  choose_compilers
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  : >"$full_log"
  run_start_s="$(now_s)"
  echo "gpu_check: writing $summary and $full_log"

  local limit estimate policy
  while read -r name limit estimate policy; do
    ((rehearse)) && limit=$((limit * REHEARSAL_LIMIT_FACTOR))
    run_step "$name" "$limit" "$policy"
    local keep_going=$?
    write_summary
    ((keep_going == 0)) || break
  done < <(selected_steps)

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
