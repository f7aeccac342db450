"""The ``inturn`` console script's entry point, kept free of imports.

The command line imports psycopg, click and the rest before it can catch anything; a Ctrl-C in
that first tenth of a second would otherwise print the interpreter's traceback. This module
imports nothing of its own, so the import it makes can be interrupted cleanly: one line, exit
status 130 (128 + SIGINT), as the command line does once it runs.
"""

from __future__ import annotations

import sys
from typing import Any


def main() -> Any:
    """Import the command line and run it; a Ctrl-C during the import exits 130 quietly."""
    try:
        from inturn.worker.cli import main as run
    except KeyboardInterrupt:
        sys.stderr.write("inturn: interrupted\n")
        sys.exit(130)
    return run()
