"""Which files ``inturn local -f FOLDER`` (and ``inturn validate FOLDER``) read as manifests:
``*.yaml``, ``*.yml`` and ``*.json`` under the folder, but never a hidden file or folder, nor
the data directory (its embedded Postgres writes JSON files of its own, such as
``pg/.handle_pids.json``), wherever ``--data-dir`` points."""

from __future__ import annotations

from pathlib import Path

import pytest

from inturn.worker.local.manifests import load_all, manifest_files

MANIFEST = (
    "apiVersion: inturn.dev/v1alpha1\nkind: Destination\n"
    "metadata: {{name: {name}}}\n"
    "spec:\n  channel: adt\n"
    "  sender:\n    mllp:\n      host: 127.0.0.1\n      port: 9\n"
    "  retry: {{maxAttempts: 0}}\n"
)


def site(root: Path) -> None:
    """A folder as a first run leaves it: two manifests, a data directory, an editor's litter."""
    (root / "a.yaml").write_text(MANIFEST.format(name="a"))
    (root / "more").mkdir()
    (root / "more" / "b.yml").write_text(MANIFEST.format(name="b"))
    for data in (root / ".inturn" / "pg", root / "state" / "pg"):  # default and --data-dir
        data.mkdir(parents=True)
        (data / ".handle_pids.json").write_text('[{"pid": 1}]')
        (data / "settings.json").write_text("[1, 2]")
        (data / "postgresql.conf").write_text("port = 5432\n")
    (root / ".git").mkdir()
    (root / ".git" / "ci.yaml").write_text("not: a destination\n")
    (root / ".a.yaml.swp").write_text("\0\0")
    (root / "notes.txt").write_text("a: b\n")


def test_a_folder_yields_its_manifests_and_never_the_data_dir_or_hidden_files(
    tmp_path: Path,
) -> None:
    site(tmp_path)
    found = manifest_files([tmp_path], skip=[tmp_path / "state"])
    assert [p.relative_to(tmp_path).as_posix() for p in found] == ["a.yaml", "more/b.yml"]


def test_the_data_dir_is_left_out_when_given_relative_to_the_working_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site(tmp_path)
    monkeypatch.chdir(tmp_path)  # `cd folder && inturn local -f . --data-dir state`
    found = manifest_files([Path(".")], skip=[Path("state")])
    configs = load_all([Path(".")], None, skip=[Path("state")])
    assert [p.as_posix() for p in found] == ["a.yaml", "more/b.yml"]
    assert sorted(configs) == ["default/a", "default/b"]


def test_a_file_named_on_the_command_line_is_read_even_when_hidden(tmp_path: Path) -> None:
    hidden = tmp_path / ".c.yaml"
    hidden.write_text(MANIFEST.format(name="c"))
    assert manifest_files([hidden]) == [hidden]
    assert sorted(load_all([hidden], None)) == ["default/c"]
