"""The pure crypto core: envelope, blind index, master key files, key cache (issue 31)."""

from __future__ import annotations

import asyncio
import base64
import os
from pathlib import Path

import pytest

from inturn.worker.crypto import envelope
from inturn.worker.crypto.blind import BlindIndex
from inturn.worker.crypto.cache import KeyCache
from inturn.worker.crypto.codec import PayloadCodec, PayloadKeysMissing
from inturn.worker.crypto.masterkeys import (
    FileKeyProvider,
    MasterKeyError,
    UnwrapFailed,
    natural_order,
    new_key_file,
)
from inturn.worker.hl7.pid import index_keys, lookup_key

MSG = b"MSH|^~\\&|A|B|C|D|2024||ADT^A01|1|P|2.5\rPID|1||MRN7^^^HOSP||ZYZZYVA^QUENTIN\r"
R1, R2, R3 = b"\x01" * 16, b"\x02" * 16, b"\x03" * 16
K1, K2, K3 = os.urandom(32), os.urandom(32), os.urandom(32)


def sealed(**kw: object) -> bytes:
    args: dict[str, object] = {
        "message_id": 41,
        "destination": "lab",
        "kind": envelope.PATIENTS,
        "keys": {R2: K2, R1: K1},
    }
    args.update(kw)
    return envelope.seal(MSG, **args)  # type: ignore[arg-type]


def test_an_envelope_opens_with_every_key_it_names_and_hides_the_payload() -> None:
    stored = sealed()
    assert envelope.is_envelope(stored) and not envelope.is_envelope(MSG)
    assert b"ZYZZYVA" not in stored and b"MRN7" not in stored
    head = envelope.header(stored)
    assert head.kind == envelope.PATIENTS and head.refs == (R1, R2)
    assert len(stored) == head.size + 60 + len(MSG) + 28
    opened = envelope.open_envelope(stored, message_id=41, destination="lab", keys={R1: K1, R2: K2})
    assert opened == MSG


def test_a_fresh_data_key_and_nonce_per_message() -> None:
    assert sealed() != sealed()


@pytest.mark.parametrize(("message_id", "destination"), [(42, "lab"), (41, "pharmacy")])
def test_an_envelope_moved_to_another_row_or_destination_does_not_open(
    message_id: int, destination: str
) -> None:
    with pytest.raises(envelope.Undecryptable):
        envelope.open_envelope(
            sealed(), message_id=message_id, destination=destination, keys={R1: K1, R2: K2}
        )


def test_without_any_one_of_its_keys_it_does_not_open() -> None:
    stored = sealed(keys={R1: K1, R2: K2, R3: K3})
    with pytest.raises(KeyError):
        envelope.open_envelope(stored, message_id=41, destination="lab", keys={R1: K1, R3: K3})
    # a key re-made under the same reference (an erased patient seen again) is another key
    with pytest.raises(envelope.Undecryptable):
        envelope.open_envelope(
            stored, message_id=41, destination="lab", keys={R1: K1, R2: os.urandom(32), R3: K3}
        )


def test_a_changed_byte_anywhere_is_refused() -> None:
    stored = bytearray(sealed())
    for at in (5, 8, len(stored) // 2, len(stored) - 1):
        changed = bytes(stored[:at]) + bytes([stored[at] ^ 1]) + bytes(stored[at + 1 :])
        with pytest.raises((envelope.Undecryptable, envelope.EnvelopeError, KeyError)):
            envelope.open_envelope(changed, message_id=41, destination="lab", keys={R1: K1, R2: K2})


@pytest.mark.parametrize(
    "stored", [envelope.PREFIX, envelope.PREFIX + b"P\x00\x00", envelope.PREFIX + b"X\x00\x01" + R1]
)
def test_a_malformed_envelope_is_a_clear_error(stored: bytes) -> None:
    with pytest.raises(envelope.EnvelopeError, match="envelope"):
        envelope.header(stored)


def test_seal_refuses_no_keys_and_short_keys() -> None:
    with pytest.raises(ValueError):
        sealed(keys={})
    with pytest.raises(ValueError):
        sealed(keys={R1: b"short"})


def test_the_blind_index_is_keyed_labelled_and_as_wide_as_the_plain_one() -> None:
    a, b = BlindIndex(b"a" * 32), BlindIndex(b"b" * 32)
    plain = lookup_key("MRN7", "HOSP")
    blind = lookup_key("MRN7", "HOSP", a.identifier)
    assert len(blind) == len(plain) == 32 and blind != plain
    assert blind == lookup_key(" MRN7 ", "HOSP", a.identifier)
    assert blind != lookup_key("MRN7", "HOSP", b.identifier)
    assert a.check() == BlindIndex(b"a" * 32).check() != b.check()
    assert a.ref(b"patient", b"x") != a.ref(b"destination", b"x")
    assert len(a.payload(MSG)) == 32
    assert lookup_key("MRN7", None, a.identifier) in index_keys(MSG, digest=a.identifier)
    assert plain not in index_keys(MSG, digest=a.identifier)


def test_master_keys_from_a_folder_raw_base64_or_hex_newest_by_natural_order(
    tmp_path: Path,
) -> None:
    (tmp_path / "k2").write_bytes(os.urandom(32))
    (tmp_path / "k10").write_text(base64.b64encode(os.urandom(32)).decode() + "\n")
    (tmp_path / "k9").write_text(os.urandom(32).hex())
    (tmp_path / "..data").mkdir()
    (tmp_path / ".hidden").write_text("not a key")
    for name in ("k2", "k10", "k9"):
        (tmp_path / name).chmod(0o600)
    provider = FileKeyProvider(tmp_path)
    assert provider.ids() == ("k2", "k9", "k10")
    assert provider.newest() == "k10"
    master, wrapped = asyncio.run(provider.wrap(K1, b"aad"))
    assert master == "k10" and K1 not in wrapped
    assert asyncio.run(provider.unwrap("k10", wrapped, b"aad")) == K1
    with pytest.raises(UnwrapFailed):
        asyncio.run(provider.unwrap("k10", wrapped, b"other"))
    with pytest.raises(MasterKeyError, match="--payload-keys: master key 'k1' is not in"):
        asyncio.run(provider.unwrap("k1", wrapped, b"aad"))
    assert provider.derive("k2", b"x") == FileKeyProvider(tmp_path).derive("k2", b"x")
    assert provider.derive("k2", b"x") != provider.derive("k9", b"x")


@pytest.mark.parametrize(
    ("name", "content", "says"),
    [
        ("k1", b"too short", "k1 is not a key"),
        ("bad name", os.urandom(32), "is not a key ID"),
    ],
    ids=["too short", "bad name"],  # not the random bytes: xdist's workers collect the same IDs
)
def test_a_file_that_is_no_key_is_refused_in_one_line(
    tmp_path: Path, name: str, content: bytes, says: str
) -> None:
    (tmp_path / name).write_bytes(content)
    (tmp_path / name).chmod(0o600)
    with pytest.raises(MasterKeyError, match=says) as caught:
        FileKeyProvider(tmp_path)
    assert "\n" not in str(caught.value) and "--payload-keys" in str(caught.value)


def test_a_missing_or_empty_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(MasterKeyError, match="is not a folder"):
        FileKeyProvider(tmp_path / "absent")
    with pytest.raises(MasterKeyError, match="holds no key file"):
        FileKeyProvider(tmp_path)


def test_new_key_file_is_private_and_never_overwrites(tmp_path: Path) -> None:
    path = new_key_file(tmp_path / "keys", "k1")
    assert path.stat().st_mode & 0o777 == 0o600
    assert FileKeyProvider(tmp_path / "keys").ids() == ("k1",)
    with pytest.raises(MasterKeyError, match="exists already"):
        new_key_file(tmp_path / "keys", "k1")


def test_natural_order() -> None:
    ids = ["k10", "k2", "2026-12-01", "2026-02-01", "k1"]
    assert sorted(ids, key=natural_order) == ["2026-02-01", "2026-12-01", "k1", "k2", "k10"]


def test_the_key_cache_is_bounded_least_recently_used_out() -> None:
    cache = KeyCache(2)
    cache.put(R1, K1)
    cache.put(R2, K2)
    assert cache.get(R1) == K1
    cache.put(R3, K3)
    assert len(cache) == 2 and cache.get(R2) is None and cache.get(R1) == K1
    cache.drop([R1])
    assert cache.get(R1) is None
    with pytest.raises(ValueError):
        KeyCache(0)


def test_a_cached_key_asked_for_with_other_wrapped_bytes_is_a_miss() -> None:
    cache = KeyCache(2)
    cache.put(R1, K1, b"wrapped-a")
    assert cache.get(R1, b"wrapped-a") == K1 and cache.get(R1) == K1
    assert cache.get(R1, b"wrapped-b") is None  # made again after an erasure: not this key
    assert (cache.hits, cache.misses) == (2, 1)


def test_without_keys_plaintext_passes_and_an_envelope_is_refused_naming_the_option() -> None:
    codec = PayloadCodec()
    assert asyncio.run(codec.open(1, "lab", MSG)) == MSG
    assert asyncio.run(codec.seal(1, "lab", MSG)) == MSG
    assert codec.index_keys(MSG) == index_keys(MSG)
    with pytest.raises(PayloadKeysMissing) as caught:
        asyncio.run(codec.open(41, "lab", sealed()))
    line = str(caught.value)
    assert "--payload-keys" in line and "\n" not in line and "item 41" in line


def test_a_process_without_keys_never_loads_the_cryptography_library() -> None:
    """About 9 MiB a worker without keys does not carry (a thousand pods)."""
    import subprocess
    import sys

    code = (
        "import sys; import inturn.worker.drain.runner, inturn.worker.drain.main;"
        " print('cryptography' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "False"


def test_a_body_spliced_under_another_rows_wrap_does_not_open() -> None:
    keys = {R1: K1}
    a = envelope.seal(MSG, message_id=1, destination="lab", kind=envelope.PATIENTS, keys=keys)
    b = envelope.seal(MSG, message_id=2, destination="lab", kind=envelope.PATIENTS, keys=keys)
    size = envelope.header(a).size + 60  # header and wrap, then the body
    spliced = b[:size] + a[size:]
    with pytest.raises(envelope.Undecryptable):
        envelope.open_envelope(spliced, message_id=2, destination="lab", keys=keys)
    body = envelope.seal_body(MSG, destination="lab", kind=envelope.PATIENTS, keys=keys)
    bound = envelope.bind(body, 7)
    assert envelope.open_envelope(bound, message_id=7, destination="lab", keys=keys) == MSG
    with pytest.raises(envelope.Undecryptable):
        envelope.open_envelope(bound, message_id=8, destination="lab", keys=keys)
