"""A sender's settings as one digest, to tell when they changed (no setting is revealed).

The digest covers what decides where and how a message goes: the sender configuration as
rendered for the worker (address, port or URL, TLS settings, headers, the paths of mounted
files) and the content of every file its kind reads (CA bundle, client certificate and key,
headers file, SSH keys), so that a rotated certificate or credential counts as a change too.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from inturn.worker.senders.kind import SenderConfig
from inturn.worker.senders.registry import of_config, to_dict


def fingerprint(sender: SenderConfig) -> str:
    """Hex SHA-256 of ``sender``'s settings and of the content of the files its kind reads.

    A file that cannot be read counts by its path and the error's class, so a fingerprint can
    always be taken (the sender itself reports the unreadable file when it sends).

    Raises:
        TypeError: ``sender`` is not the configuration of a registered kind.
    """
    rendered = to_dict(sender)
    digest = hashlib.sha256(json.dumps(rendered, sort_keys=True).encode())
    for path in sorted(set(of_config(sender).files(sender)) | set(_named_files(rendered))):
        digest.update(b"\0" + path.encode())
        try:
            digest.update(hashlib.sha256(Path(path).read_bytes()).digest())
        except OSError as exc:
            digest.update(type(exc).__name__.encode())
    return digest.hexdigest()


def _named_files(node: Any) -> list[str]:
    """Every ``...File`` value of a rendered sender node (a headers file is read per send and
    is not among the kind's start-up files, but it carries credentials all the same)."""
    found: list[str] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key.endswith("File") and isinstance(value, str):
                found.append(value)
            else:
                found.extend(_named_files(value))
    return found
