"""Sphinx configuration of inturn's documentation (MyST Markdown; built by `make docs`).

`make lint` builds it with warnings as errors (`sphinx-build -W`), so a broken link, a missing
page in a toctree or a reference page that cannot be generated fails the build.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "_ext"))

project = "inturn"
author = "the inturn authors"
copyright = "2026, the inturn authors"

extensions = [
    "myst_parser",
    "sphinx_click",
    "sphinxcontrib.openapi",
    "inturn_reference",
]
myst_enable_extensions = ["colon_fence", "deflist"]
# headings up to ### get anchors, so pages link to a section: [text](page.md#a-heading)
myst_heading_anchors = 3
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]
html_theme = "furo"
html_title = "inturn"
nitpicky = False
