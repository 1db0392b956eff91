#!/usr/bin/env bash
# Installs spillway's build and test dependencies: Debian's packages from its
# archive, and the pinned torch (tools/requirements.txt) from PyPI into a
# virtual environment outside the repository.
#
#   tools/install-deps.sh             # both; prints nothing when all is there
#   tools/install-deps.sh --venv-path # prints the environment's folder only
#
# The environment is $SPILLWAY_VENV, by default
# ${XDG_DATA_HOME:-~/.local/share}/spillway/venv. It is reused when present;
# pip then installs only what tools/requirements.txt asks that it lacks (no
# network when nothing is missing). Its interpreter is the one every build
# finds torch through (CMake: SPILLWAY_PYTHON).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${SPILLWAY_VENV:-${XDG_DATA_HOME:-$HOME/.local/share}/spillway/venv}
if [[ ${1:-} == --venv-path ]]; then
  echo "$venv"
  exit 0
fi

packages=(
  build-essential cmake ninja-build pkg-config
  libfmt-dev nlohmann-json3-dev libcli11-dev
  googletest libgtest-dev libgmock-dev libbenchmark-dev
  libgloo-dev  # headers only: torch's Gloo backend for the data parallel tests (its library is inside torch)
  python3-dev python3-venv  # the interpreter the environment is made from, and its headers
  chromium  # tests/report: the HTML report rendered headless (ctest -L browser)
)

missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done

if ((${#missing[@]})); then
  echo "spillway: installing ${missing[*]}"
  sudo_cmd=()
  [[ $(id -u) -ne 0 ]] && sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -q
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# Debian's interpreter, whose headers python3-dev installs (a pyenv or other
# python3 earlier on PATH may lack them).
if [[ ! -x $venv/bin/python ]]; then
  echo "spillway: creating the Python environment $venv"
  mkdir -p "$(dirname "$venv")"
  /usr/bin/python3 -m venv "$venv"
fi
requirements=$root/tools/requirements.txt
stamp=$venv/.spillway-requirements
if ! cmp -s "$requirements" "$stamp" 2>/dev/null; then
  echo "spillway: installing tools/requirements.txt into $venv (torch is a download of several GB)"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$requirements"
  cp "$requirements" "$stamp"
fi
