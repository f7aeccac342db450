"""The README's Destination, field by field, is a valid manifest."""

from __future__ import annotations

from pathlib import Path

import yaml

from inturn.worker.spec.destination import load_manifest

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_destination_validates() -> None:
    text = README.read_text()
    start = text.index("```yaml", text.index("## A Destination, field by field")) + len("```yaml")
    doc = yaml.safe_load(text[start : text.index("```", start)])
    cfg = load_manifest(doc, secrets_dir="/nonexistent")
    assert cfg.destination == "hospital/lab-results"
    assert (cfg.retry.max_attempts, cfg.ack_policy.AR, cfg.message_types) == (
        20,
        "fail",
        ("ORU^R01", "ORM^*"),
    )
