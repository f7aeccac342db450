"""``image/check.py`` (the image's own check, a script outside the package) loaded as a module,
for the tests of its parse and of the image built."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def checker() -> ModuleType:
    """``image/check.py``, loaded anew as module ``image_check``."""
    spec = importlib.util.spec_from_file_location("image_check", ROOT / "image" / "check.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
