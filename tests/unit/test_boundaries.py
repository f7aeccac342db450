"""What a worker process loads: the operator's libraries never (the import contracts in
pyproject.toml say the same statically; this runs the real command)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

PROBE = """
import json, sys
from inturn.worker.cli import main
try:
    main(["worker", "--help"])
except SystemExit:
    pass
roots = {m.split(".")[0] for m in sys.modules} | {m for m in sys.modules if m.startswith("inturn.")}
print(json.dumps(sorted(roots)))
"""


def test_inturn_worker_help_loads_no_kopf_kubernetes_or_operator(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    loaded = set(json.loads(out.stdout.strip().splitlines()[-1]))
    assert "inturn.worker.cli.worker" in loaded  # the probe did load the command
    assert not loaded & {"kopf", "kubernetes", "inturn.operator", "aiohttp", "asyncssh"}
