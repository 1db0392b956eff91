#!/usr/bin/env bash
# Installs spillway's Python package, with its activation hook
# (spillway-activate.pth), into a Python environment, offline.
#
#   tools/install-python.sh [--build DIR] [--user | --target DIR]
#
# --build DIR   the CMake build folder (default: build/ at the repo root); the
#               package is built there first if needed. The interpreter is
#               the one the build chose (SPILLWAY_PYTHON, see python/CMakeLists.txt).
# --user        into that interpreter's user site (honours PYTHONUSERBASE)
# --target DIR  into DIR (which must be on the interpreter's site path for the
#               .pth hook to run)
# By default: the interpreter's own site-packages, which for a virtual
# environment is the environment's (python3 -m venv --system-site-packages
# keeps Debian's python3-torch importable).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build="$root/build"
mode=site
target=""
while (($#)); do
  case $1 in
    --build) build=$2; shift 2 ;;
    --user) mode=user; shift ;;
    --target) mode=target; target=$2; shift 2 ;;
    -h|--help) sed -n '2,17p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install-python.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

python=$(sed -n 's/^SPILLWAY_PYTHON_EXECUTABLE:[A-Z]*=//p' "$build/CMakeCache.txt" 2>/dev/null || true)
if [[ -z $python ]]; then
  echo "install-python.sh: $build has no Python package configured (see 'spillway: Python package'" \
       "in its CMake output; needs Torch and an interpreter that imports it)" >&2
  exit 1
fi
cmake --build "$build" --target spillway_python_module >/dev/null
case $mode in
  user) target=$("$python" -c 'import site; print(site.getusersitepackages())') ;;
  site) target=$("$python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))') ;;
esac
mkdir -p "$target"
cmake --install "$build" --component python --prefix "$target" >/dev/null
echo "spillway: Python package installed into $target (for $python)"
