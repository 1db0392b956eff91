#!/usr/bin/env bash
# The Python package installed as users install it, `pip install .`, into a
# fresh virtual environment, where the pytest suites then run (the ctest
# fixture python_install, tests/python/CMakeLists.txt).
#
#   install_into_fresh_venv.sh REPO BUILD_DIR TORCH_PYTHON VENV
#
# The environment is made anew each time. It sees the pinned torch, pytest
# and scikit-build-core of TORCH_PYTHON's environment (tools/install-deps.sh)
# through a .pth line instead of a second copy of torch's several GB, and gets
# spillway itself only from pip. pip builds in BUILD_DIR, the build folder the
# C++ tests ran from, so it configures again but compiles nothing new.
set -euo pipefail
repo=$1 build=$2 torch_python=$3 venv=$4

rm -rf "$venv"
"$torch_python" -c 'import sys; print(sys._base_executable)' | {
  read -r base
  "$base" -m venv "$venv"
}
deps_site=$("$torch_python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
venv_site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
# Named to sort before spillway-activate.pth: site.py runs a folder's .pth files in
# name order, and the activation hook imports torch.
echo "$deps_site" >"$venv_site/00-spillway-test-dependencies.pth"

build_type=$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$build/CMakeCache.txt")
"$venv/bin/python" -m pip install --disable-pip-version-check --no-build-isolation \
  --config-settings=build-dir="$build" --config-settings=cmake.build-type="$build_type" "$repo"
# What users get: the package and its activation hook in site-packages.
for installed in spillway/__init__.py spillway-activate.pth _spillway_activate.py; do
  [[ -e $venv_site/$installed ]] || { echo "pip install . did not install $installed" >&2; exit 1; }
done
ls "$venv_site"/spillway/_C*.so >/dev/null
echo "spillway installed into $venv"
