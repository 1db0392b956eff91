#!/usr/bin/env python3
"""Whether the spillway package is installed in an interpreter's own
environment, as tools/install-python.sh installs it (pip install .).

The GPU checks in tools/gpu/ do not install the package (tools/gpu_check.sh
does, in its step python_install, before they run); they ask this module
instead, so that a package installed where the interpreter never reads (the
user site of a virtual environment without system site packages) fails the
check at its start instead of letting a SPILLWAY_CONF run pass as plain torch.

The question is asked of a fresh interpreter, run outside the repository with
neither PYTHONPATH nor SPILLWAY_CONF: what a training script would import.

    python3 tools/gpu/installed_spillway.py [--python PYTHON] [--user-site]

prints where the package is and exits 0, or says why not and exits 1.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

PROBE = """
import json, os, site, sys
try:
    import spillway
except Exception as error:
    print(json.dumps({"error": f"{type(error).__name__}: {error}", "prefix": sys.prefix}))
    raise SystemExit(0)
print(json.dumps({"file": os.path.realpath(spillway.__file__), "prefix": os.path.realpath(sys.prefix),
                  "user_site": os.path.realpath(site.getusersitepackages())
                  if site.ENABLE_USER_SITE else None}))
"""


def installed_spillway(python=None, user_site=False):
    """(where, None) when `python` (default: this interpreter) imports spillway
    from its own environment (sys.prefix), or with `user_site` from the user
    site that interpreter reads; else (None, why)."""
    python = python or sys.executable
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTHONPATH", "SPILLWAY_CONF", "PYTHONSTARTUP")}
    with tempfile.TemporaryDirectory(prefix="spillway-import-") as outside:
        probe = subprocess.run([python, "-c", PROBE], cwd=outside, env=env, capture_output=True,
                               text=True, timeout=120)
    if probe.returncode != 0 or not probe.stdout.strip():
        return None, (f"{python} could not be asked where spillway is (exit {probe.returncode}): "
                      f"{probe.stderr.strip()[-400:]}")
    found = json.loads(probe.stdout.strip().splitlines()[-1])
    if "error" in found:
        return None, (f"{python} (environment {found['prefix']}) cannot import spillway: "
                      f"{found['error']}; install it into that environment first: "
                      f"PYTHON={python} tools/install-python.sh")
    homes = [found["prefix"]] + ([found["user_site"]] if user_site and found["user_site"] else [])
    if not any(found["file"].startswith(home.rstrip(os.sep) + os.sep) for home in homes):
        return None, (f"{python} imports spillway from {found['file']}, outside its own environment "
                      f"{found['prefix']} (a user-site or PYTHONPATH install?); install it into "
                      f"that environment: PYTHON={python} tools/install-python.sh")
    return os.path.dirname(found["file"]), None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=sys.executable, help="the interpreter to ask")
    parser.add_argument("--user-site", action="store_true",
                        help="accept the user site the interpreter reads (pip install --user)")
    args = parser.parse_args()
    where, why = installed_spillway(args.python, args.user_site)
    if why:
        print(f"installed_spillway: {why}")
        return 1
    print(f"installed_spillway: spillway is installed in {args.python}'s environment: {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
