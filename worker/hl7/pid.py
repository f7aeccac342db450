"""Find the patient identifiers a message carries, for data-subject erasure and lookups.

Source: HL7 v2.x chapter 3. A patient is named by four repeating fields of the CX data type
(v2.2's CK for PID-2 has the same first and fourth components):

* PID-2, patient ID (external ID; older feeds put the main identifier here);
* PID-3, patient identifier list (the identifiers of today);
* PID-4, alternate patient ID (older feeds);
* MRG-1, prior patient identifier list, in merges and moves (ADT^A34, A36, A40, A47 and others).

In each repetition, component 1 is the ID and component 4 the assigning authority (HD data type:
subcomponent 1 the namespace ID, subcomponent 2 the universal ID). The message's own delimiters
(MSH-1/MSH-2) are used to split it.

Everything here is pure: bytes in, values out, and nothing raises on any input.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

from inturn.worker.hl7.delimiters import Delimiters, delimiters_of, split_segments, strip_preamble

#: Default most distinct identifiers indexed per message (ingest's
#: ``--max-indexed-identifiers``): far above what a real patient carries, small enough that a
#: message cannot make its row's index entry large.
MAX_INDEXED_IDENTIFIERS = 100

#: Longest CX-1 (ID) or HD subcomponent (authority), as written, read as an identifier; HL7
#: v2.7+ gives CX-1 199 characters, so this leaves room for escapes.
MAX_ID_CHARS = 1024

#: The key :func:`index_keys` adds when a message names more identifiers than it indexes. Not a
#: lookup key (those are 32 hex digits), so no identifier's key equals it; every lookup by
#: patient reads the rows holding it through the same index and matches their payloads
#: (:func:`inturn.worker.store.identifiers.beyond_index`), so identifiers past the cap are found;
#: lanes (:mod:`inturn.worker.drain.lanes`) read it as "some of this message's patients are
#: unknown", which makes the message a barrier: it cannot be ordered by the keys that were kept.
CAPPED_KEY = "capped"

#: The fields read, as (segment, field number).
PATIENT_FIELDS: tuple[tuple[str, int], ...] = (("PID", 2), ("PID", 3), ("PID", 4), ("MRG", 1))


@dataclass(frozen=True)
class PatientId:
    """One patient identifier found in a message.

    Attributes:
        field: where it was found: ``PID-2``, ``PID-3``, ``PID-4`` or ``MRG-1``.
        id: component 1, unescaped, decoded as UTF-8 (invalid bytes replaced), stripped.
        authorities: the non-empty subcomponents 1 and 2 of component 4 (namespace ID and
            universal ID of the assigning authority), unescaped and stripped; may be empty.
    """

    field: str
    id: str
    authorities: tuple[str, ...] = ()

    def matches(self, ident: str, authority: str | None = None) -> bool:
        """Whether this is ``ident`` (and, when ``authority`` is given, assigned by it).

        Both are compared after stripping surrounding whitespace, case-sensitively. An
        identifier that names no authority does not match a request that names one.
        """
        if self.id != ident.strip():
            return False
        return authority is None or authority.strip() in self.authorities


def _text(delimiters: Delimiters, raw: str) -> str:
    unescaped = delimiters.unescape_text(raw).encode("latin-1")
    return unescaped.decode("utf-8", "replace").strip()


def _repetition(delimiters: Delimiters, field: str, value: str) -> PatientId | None:
    components = value.split(delimiters.component, 4)  # components past CX-4 are never read
    raw_id = components[0].split(delimiters.subcomponent, 1)[0]
    if len(raw_id) > MAX_ID_CHARS:
        return None
    ident = _text(delimiters, raw_id)
    if not ident:
        return None
    authorities: list[str] = []
    if len(components) > 3:
        for sub in components[3].split(delimiters.subcomponent, 2)[:2]:
            if len(sub) > MAX_ID_CHARS:
                continue
            name = _text(delimiters, sub)
            if name and name not in authorities:
                authorities.append(name)
    return PatientId(field, ident, tuple(authorities))


def patient_identifiers(payload: bytes, limit: int | None = None) -> list[PatientId]:
    """Every identifier in PID-2, PID-3, PID-4 and MRG-1, every repetition, every segment.

    The delimiters come from MSH-1/MSH-2 when readable, otherwise the defaults ``|^~\\&`` are
    used. Repetitions without an ID are left out; exact repeats are reported once. Never raises.

    The work is linear in the size of ``payload``: a repetition written the same way twice is
    parsed once, repeats are recognised by a hash lookup (12,000 repetitions of PID-3 cost
    milliseconds, not seconds), and an ID or authority longer than :data:`MAX_ID_CHARS` as
    written is no identifier (nothing assigns those; unescaping them would only cost time).

    Args:
        payload: the message bytes.
        limit: stop after this many distinct identifiers (None: no limit). Ingest indexes at
            most :data:`MAX_INDEXED_IDENTIFIERS` per message.

    Returns:
        The identifiers in message order (segment, then field, then repetition).
    """
    delimiters = delimiters_of(payload)
    text = strip_preamble(payload).decode("latin-1")
    seen: dict[PatientId, None] = {}
    read: set[tuple[int, str]] = set()  # (field, repetition as written) already read
    for segment in split_segments(text):
        name = segment[:3]
        if segment[3:4] != delimiters.field or name not in ("PID", "MRG"):
            continue
        fields = segment.split(delimiters.field)
        for seg, number in PATIENT_FIELDS:
            if seg != name or number >= len(fields):
                continue
            for value in fields[number].split(delimiters.repetition):
                if (number, value) in read:  # a repeat as written: nothing new to parse
                    continue
                read.add((number, value))
                patient = _repetition(delimiters, f"{seg}-{number}", value)
                if patient is None or patient in seen:
                    continue
                seen[patient] = None
                if limit is not None and len(seen) >= limit:
                    return list(seen)
    return list(seen)


def has_patient_id(payload: bytes, ident: str, authority: str | None = None) -> bool:
    """Whether ``payload`` names ``ident`` (assigned by ``authority``, when given) in any of
    PID-2, PID-3, PID-4 or MRG-1. An empty ``ident`` matches nothing."""
    if not ident.strip():
        return False
    return any(p.matches(ident, authority) for p in patient_identifiers(payload))


#: A function from key text (bytes) to an index key (32 hex digits): plain SHA-256 here, a keyed
#: HMAC with payload keys (:class:`inturn.worker.crypto.blind.BlindIndex`).
Digest = Callable[[bytes], str]


def plain_digest(text: bytes) -> str:
    """The unkeyed index key of ``text``: the first 32 hex digits (128 bits) of its SHA-256
    (the form of installations without payload keys)."""
    return hashlib.sha256(text).hexdigest()[:32]


def key_text(ident: str, authority: str | None = None) -> bytes:
    """What an index key is the digest of: the stripped ID, or the ID, a NUL and the stripped
    authority, as UTF-8."""
    text = ident.strip() if authority is None else f"{ident.strip()}\x00{authority.strip()}"
    return text.encode("utf-8", "surrogatepass")


def lookup_key(ident: str, authority: str | None = None, digest: Digest = plain_digest) -> str:
    """The index key of an identifier, alone or qualified by one assigning authority.

    A key is ``digest`` (by default the first 32 hex digits, 128 bits, of SHA-256) of
    :func:`key_text`: bounded in size whatever a message holds, free of separators, and not
    the identifier in clear. With payload keys the digest is keyed (a blind index).
    """
    return digest(key_text(ident, authority))


def index_keys(
    payload: bytes, limit: int = MAX_INDEXED_IDENTIFIERS, digest: Digest = plain_digest
) -> list[str]:
    """The keys under which a message is found by :func:`lookup_key`, sorted, no repeats.

    For each identifier: the key of its ID alone and one per assigning authority, so that a
    lookup by ID finds it whatever its authority and a lookup by ID and authority finds it only
    when that authority assigned it (:meth:`PatientId.matches`).

    Only the first ``limit`` distinct identifiers (message order) are indexed, so a message
    yields at most ``3 * limit + 1`` keys however many repetitions it carries; identifiers past
    the cap are not in the index. A message that names more than ``limit`` identifiers also gets
    :data:`CAPPED_KEY`: lookups by patient read those rows' payloads with :func:`has_patient_id`
    (no cap), so they find them by any identifier; lanes read it as a barrier.

    Raises:
        ValueError: ``limit`` is below 1.
    """
    if limit < 1:
        raise ValueError("limit must be at least 1")
    keys: set[str] = set()
    found = patient_identifiers(payload, limit + 1)
    for patient in found[:limit]:
        keys.update(patient_lookups(patient, digest))
    if len(found) > limit:
        keys.add(CAPPED_KEY)
    return sorted(keys)


def patient_lookups(patient: PatientId, digest: Digest = plain_digest) -> list[str]:
    """The index keys of one identifier: of its ID alone, then one per assigning authority."""
    keys = [lookup_key(patient.id, None, digest)]
    keys.extend(lookup_key(patient.id, a, digest) for a in patient.authorities)
    return keys
