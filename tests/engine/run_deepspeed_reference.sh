#!/usr/bin/env bash
# tests/engine/run_deepspeed_reference.sh REFERENCE.py CASES.json OUT.json:
# the ctest fixture of the DeepSpeed parity tests. Finds (or creates) the
# DeepSpeed virtual environment of bench/optim/deepspeed_env.sh and runs the
# reference script in it; fails, saying why, when the environment cannot be
# made, so the parity tests that need OUT.json are reported as not run.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
reference="$1" cases="$2" out="$3"

if ! python="$(bash "$here/../../bench/optim/deepspeed_env.sh")"; then
  echo "cannot create the DeepSpeed environment (bench/optim/deepspeed_env.sh failed; pip's" \
    "reason is above); the DeepSpeed parity tests cannot run" >&2
  exit 1
fi
rm -f "$out"
# The reference runs on the CPU whatever the machine has.
CUDA_VISIBLE_DEVICES="" "$python" "$reference" "$cases" "$out"
