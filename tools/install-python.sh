#!/usr/bin/env bash
# Installs the Python package into PYTHON's environment (default: the one
# tools/install-deps.sh makes) as PyTorch extensions install: pip install .
# against the torch already there. Extra arguments go to pip.
exec "${PYTHON:-$("$(dirname "${BASH_SOURCE[0]}")/install-deps.sh" --venv-path)/bin/python}" -m pip install --no-build-isolation "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)" "$@"
