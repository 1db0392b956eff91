"""Activation of spillway at interpreter start.

spillway-activate.pth imports this module when SPILLWAY_CONF is set, while
site.py is still adding site directories, before any user code runs. It is a
module of its own, outside the package, so that a failure to import the
package is caught here too.

Note [Site directories not yet added]: site.py processes a directory's .pth
files when it adds that directory, and adds the user site before the global
ones (and a virtual environment's before the base's). torch may live in a
directory not added yet, so this module puts the remaining site directories
on sys.path for the imports, and takes them off again; site.py adds them in
their usual order afterwards.

A bad configuration stops the interpreter here, exit status 1: an exception
from a .pth line would only be printed and skipped by site.py.
"""

import os
import site
import sys


def _stop(message):
    sys.stderr.write(f"spillway: {message}\n")
    sys.stderr.flush()
    os._exit(1)


def _activate():
    conf = os.environ["SPILLWAY_CONF"]
    # Note [Site directories not yet added].
    pending = [d for d in site.getsitepackages() if os.path.isdir(d) and d not in sys.path]
    sys.path.extend(pending)
    try:
        try:
            import spillway
        except Exception as error:  # a broken install must not pass silently
            _stop(f"SPILLWAY_CONF is set, but the spillway package cannot be imported: {error}")
        try:
            spillway._activate_at_start(conf)
        except (ValueError, RuntimeError) as error:
            _stop(f"SPILLWAY_CONF={conf!r}: {error}")
    finally:
        for directory in pending:
            sys.path.remove(directory)


_activate()
