#!/usr/bin/env bash
# bench/optim/deepspeed_env.sh: prints the python of a benchmark-only virtual
# environment holding DeepSpeed from PyPI, creating it on first use.
#
# The environment lies outside the repository (SPILLWAY_BENCH_DEEPSPEED_VENV,
# default ~/.cache/spillway/bench-deepspeed-venv) and sees the packages of the
# project's interpreter (SPILLWAY_PYTHON, default the venv
# tools/install-deps.sh makes) through a .pth file, so it reuses that torch
# (--system-site-packages would not: made from a venv it exposes the base
# interpreter's packages, and pip would download a torch of its own; a
# constraint makes pip fail instead). The project's own environment is never
# changed. DeepSpeed's CPUAdam is built later, at its first use, by
# DeepSpeed's own op builder.
#
# Exits non-zero, with pip's complaint on stderr, when DeepSpeed cannot be
# installed (no registry reachable, say); bench_optim_compare.py then reports
# why and goes on without it.
set -euo pipefail

base="${SPILLWAY_PYTHON:-$HOME/.local/share/spillway/venv/bin/python}"
venv="${SPILLWAY_BENCH_DEEPSPEED_VENV:-$HOME/.cache/spillway/bench-deepspeed-venv}"
version="${SPILLWAY_BENCH_DEEPSPEED_VERSION:-0.18.*}"

mkdir -p "$(dirname "$venv")"
# Tests run in parallel may ask at once: one makes the environment, the
# others wait for it.
exec 9>"$venv.lock"
flock 9
if ! "$venv/bin/python" -c 'import deepspeed' >/dev/null 2>&1; then
  rm -rf "$venv"  # a half-made one from an interrupted run
  "$base" -m venv "$venv" >&2
  site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  "$base" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' >"$site/spillway-project.pth"
  torch_version="$("$base" -c 'import importlib.metadata as m; print(m.version("torch"))')"
  constraints="$(mktemp)"
  trap 'rm -f "$constraints"' EXIT
  echo "torch==$torch_version" >"$constraints"
  # No build isolation: DeepSpeed's setup.py imports torch, which must be the
  # project's, not a fresh download.
  DS_BUILD_OPS=0 "$venv/bin/python" -m pip install --quiet --no-build-isolation \
    --constraint "$constraints" "deepspeed==$version" >&2
fi
echo "$venv/bin/python"
