"""Key files are kept like keys: a file of secret material (a master key, a TLS private key, a
CSRF secret, an HTTP sender's credentials, a file of bearer tokens) that other users may read is
refused, as libpq refuses such an ``sslkey`` and OpenSSH such an identity file.

The rule is libpq's (PostgreSQL manual, "SSL Support", the client key file), narrowed on the
group: a file owned by the user running inturn may carry no permission for its group or for
others (0600, 0400); a file owned by root may also be read by its group (0640, 0440) when that
group is one of the groups inturn runs with, because that is how Kubernetes mounts a Secret into
a pod that does not run as root: the kubelet's files are root's, their group is the pod's
``fsGroup`` (which the pod's processes hold as a supplementary group; the chart and the operator
set it to the container's own group), and the chart sets ``defaultMode: 0440``. A root-owned
file its group may read where that group is not inturn's (``root:users 0640``) is refused: the
members of that group could read the key, and libpq's rule would let it through. Writable by the
group, anything for others, or owned by another user: refused, with the file, its mode and its
owner named. ``INTURN_ALLOW_OPEN_KEY_FILES=1`` turns the check off (for a file system that has
no permissions, say), and says so on every check.

No I/O beyond ``stat``; nothing is read here.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from inturn.worker.errors import Invalid

__all__ = ["ALLOW_ENV", "KeyFileExposed", "check_key_file"]

log = logging.getLogger("inturn.crypto")

#: Set to 1 to use key files whatever their permissions.
ALLOW_ENV = "INTURN_ALLOW_OPEN_KEY_FILES"
#: Permission bits a key file owned by the user running inturn may not have.
_OWN_FORBIDDEN = stat.S_IRWXG | stat.S_IRWXO
#: Permission bits a key file owned by root, of a group of ours, may not have (group read
#: allowed).
_ROOT_FORBIDDEN = stat.S_IWGRP | stat.S_IXGRP | stat.S_IRWXO


class KeyFileExposed(Invalid):
    """A key file others may read or change (the message names the file, its mode, its owner
    and the cure)."""

    kind = "key_file_exposed"


def check_key_file(path: str | os.PathLike[str], what: str) -> None:
    """Refuse ``path`` when its permissions let another user read or change it (the rule in
    the module docstring). Symbolic links are followed (a Secret volume's files are links).

    Args:
        path: the key file.
        what: the option or setting that names it (``--payload-keys``, ``--tls-key``...), for
            the message.

    Raises:
        KeyFileExposed: the file is readable or writable by others than allowed.
        OSError: the file cannot be examined (missing, no access).
    """
    info = os.stat(path)
    mode = stat.S_IMODE(info.st_mode)
    uid = os.geteuid()
    ours = info.st_gid == os.getegid() or info.st_gid in os.getgroups()
    if info.st_uid == uid and uid != 0:
        forbidden, allowed = _OWN_FORBIDDEN, "0600"
    elif info.st_uid == 0:
        # group read only for a group of our own (a Secret volume's fsGroup)
        forbidden = _ROOT_FORBIDDEN if ours else _OWN_FORBIDDEN
        allowed = "0640" if ours else "0600"
    else:
        forbidden, allowed = ~0, ""
    if not mode & forbidden:
        return
    name = Path(path)
    if os.environ.get(ALLOW_ENV) == "1":
        log.warning(
            "%s: %s has mode %04o: other users may read it (%s=1 allows it)",
            what,
            name,
            mode,
            ALLOW_ENV,
        )
        return
    if allowed:
        cure = f"chmod {allowed[1:]} it (at most {allowed}), or set {ALLOW_ENV}=1"
        owner = "you" if info.st_uid == uid else "root"
        if info.st_uid == 0 and not ours and mode & stat.S_IRGRP:
            owner += f", group {info.st_gid}, which is not one of this process's"
    else:
        cure = f"chown it to the user running inturn (uid {uid}) or root, or set {ALLOW_ENV}=1"
        owner = f"uid {info.st_uid}"
    raise KeyFileExposed(
        f"{what}: {name} has mode {mode:04o} (owner {owner}): other users may read or change"
        f" this key; {cure}"
    )
