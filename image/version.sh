#!/usr/bin/env bash
# The version of this checkout as setuptools-scm reads it from git (the release tag vX.Y.Z, or
# X.Y.devN+g<commit> between releases; PEP 440).
set -euo pipefail
cd "$(dirname "$0")/.."
py=python3
[[ -x .venv/bin/python ]] && py=.venv/bin/python
if ! "$py" -c 'import setuptools_scm' 2>/dev/null; then
    "$py" -m pip install --quiet setuptools-scm >/dev/null 2>&1 || true
fi
"$py" -m setuptools_scm 2>/dev/null || echo "0.0.0+unknown"
