#!/usr/bin/env bash
# Installs the Python package into PYTHON's environment (default: the one
# tools/install-deps.sh makes) as PyTorch extensions install: pip install .
# against the torch already there. Extra arguments go to pip.
#
# Refuses --user where the interpreter does not read its user site
# (site.ENABLE_USER_SITE false, as in a virtual environment without system
# site packages): pip would put the package where that interpreter never
# looks. After pip, a fresh interpreter run outside the repository must import
# spillway from the environment's own prefix, or with --user from the user
# site it reads (tools/gpu/installed_spillway.py);
# the script prints where, or fails.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=${PYTHON:-$("$repo/tools/install-deps.sh" --venv-path)/bin/python}

where=()
for arg in "$@"; do
  [[ $arg == --user ]] && where=(--user-site)
  if [[ $arg == --user ]] && ! "$python" -c 'import site, sys; sys.exit(0 if site.ENABLE_USER_SITE else 1)'; then
    echo "install-python.sh: refusing --user: $python does not read its user site" \
         "(site.ENABLE_USER_SITE is false: a virtual environment without system site packages," \
         "or PYTHONNOUSERSITE), so the package would be installed where it is never imported;" \
         "leave out --user to install into $("$python" -c 'import sys; print(sys.prefix)')" >&2
    exit 2
  fi
done

"$python" -m pip install --no-build-isolation "$repo" "$@"
"$python" "$repo/tools/gpu/installed_spillway.py" --python "$python" "${where[@]}"
