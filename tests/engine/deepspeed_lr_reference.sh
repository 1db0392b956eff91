#!/usr/bin/env bash
# The ctest fixture of the learning-rate parity test: runs DeepSpeed's own
# schedulers on the cases (deepspeed_lr_reference.py) in DeepSpeed's
# environment (bench/optim/deepspeed_env.sh, made on first use).
#
#   deepspeed_lr_reference.sh REPO_ROOT CASES_JSON OUTPUT_JSON
#
# Fails, saying why, when that environment cannot be made: the parity test
# then fails for want of its reference rather than passing untested.
set -euo pipefail
if [[ $# -ne 3 ]]; then
  echo "usage: $0 REPO_ROOT CASES_JSON OUTPUT_JSON" >&2
  exit 2
fi
root=$1 cases=$2 output=$3
if ! python=$(bash "$root/bench/optim/deepspeed_env.sh"); then
  echo "deepspeed_lr_reference: could not make DeepSpeed's environment with" \
    "bench/optim/deepspeed_env.sh (pip's complaint above; it needs PyPI and the" \
    "interpreter SPILLWAY_PYTHON names, default ~/.local/share/spillway/venv/bin/python)," \
    "so there is no DeepSpeed to compare the learning-rate schedules with" >&2
  exit 1
fi
rm -f "$output"
"$python" "$root/tests/engine/deepspeed_lr_reference.py" "$cases" "$output"
