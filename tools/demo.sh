#!/usr/bin/env bash
# Installs dependencies, builds spillway, and runs the demo on this machine's
# device (the simulated GPU where no GPU is usable): spillway-train-demo (a
# small GPT trained with LibTorch, docs/train-demo.md) when Torch was found,
# else spillway-demo (the stack below the LibTorch bridge).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/tools/install-deps.sh"
build=${SPILLWAY_BUILD_DIR:-$root/build}
mkdir -p "$build"
# torch: the pinned one in install-deps.sh's environment, found through its interpreter.
python=$("$root/tools/install-deps.sh" --venv-path)/bin/python
cmake -S "$root" -B "$build" -G Ninja -DSPILLWAY_PYTHON="$python" >"$build/configure.log" 2>&1 || { cat "$build/configure.log"; exit 1; }
grep '^-- spillway:' "$build/configure.log" || true
if grep -q '^-- spillway: Torch found' "$build/configure.log"; then
  cmake --build "$build" -j"$(nproc)" --target spillway-train-demo spillway-report
  # Its own default configuration (the simulated GPU, a budget a quarter of
  # the model data) unless the caller exports SPILLWAY_CONF. Without
  # arguments it also writes a trace and the report of it (docs/report.md).
  if (($#)); then
    exec "$build/bin/spillway-train-demo" "$@"
  fi
  "$build/bin/spillway-train-demo" --trace "$build/demo.trace"
  "$build/bin/spillway-report" "$build/demo.trace" -o "$build/demo-report.html" \
    --chrome "$build/demo-chrome-trace.json"
  echo "report: $build/demo-report.html (open in a browser); Perfetto: $build/demo-chrome-trace.json"
  exit 0
fi
cmake --build "$build" -j"$(nproc)" --target spillway-demo
# A modest simulated GPU, its copies modelled at 2 GB/s (below this machine's
# memcpy speed, so the model, not memcpy, sets the pace), unless the caller says otherwise.
export SPILLWAY_CONF=${SPILLWAY_CONF:-device:auto,device_budget:96MiB,chunk_size:16MiB,sim_capacity:2GB,sim_bandwidth:2GB/s,log:info}
exec "$build/bin/spillway-demo" "$@"
