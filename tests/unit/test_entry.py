"""The console script's entry point: a Ctrl-C while the command line is still being imported
ends with one line and exit status 130, not a traceback."""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import pytest

from inturn.worker import entry


class Interrupting(importlib.abc.MetaPathFinder):
    """Raises KeyboardInterrupt when the command line is imported, as a Ctrl-C then would."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> None:
        if fullname == "inturn.worker.cli":
            raise KeyboardInterrupt
        return None


def test_ctrl_c_during_the_import_exits_130_with_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delitem(sys.modules, "inturn.worker.cli", raising=False)
    monkeypatch.setattr(sys, "meta_path", [Interrupting(), *sys.meta_path])
    with pytest.raises(SystemExit) as exited:
        entry.main()
    assert exited.value.code == 130
    assert capsys.readouterr().err == "inturn: interrupted\n"


def test_the_entry_point_imports_nothing_of_inturn_at_module_level() -> None:
    source = Path(entry.__file__).read_text()
    top_level = [line for line in source.splitlines() if line.startswith(("import ", "from "))]
    assert top_level == [
        "from __future__ import annotations",
        "import sys",
        "from typing import Any",
    ]
