"""Find the patient identifiers in a message (PID-3), for data-subject erasure.

Source: HL7 v2.x chapter 3, "PID - patient identification segment": PID-3 (patient identifier
list) is a repeating CX field whose first component is the ID itself. The message's own
delimiters (MSH-1/MSH-2) are used to split it.

Only PID-3 is read. Older identifiers that also name a person (PID-2 external ID, PID-4
alternate ID, MRG-1 prior identifiers in merges) are not.
"""

from __future__ import annotations

from .delimiters import delimiters_of, split_segments, strip_preamble


def patient_identifiers(payload: bytes) -> set[str]:
    """Every ID (component 1) of every PID-3 repetition in every PID segment of ``payload``.

    IDs are unescaped, decoded as UTF-8 (invalid bytes replaced) and stripped of surrounding
    whitespace; empty ones are left out. The delimiters come from MSH-1/MSH-2 when readable,
    otherwise the defaults ``|^~\\&`` are used. Never raises.

    Returns:
        A set of IDs, empty when the message has no PID segment or no PID-3.
    """
    delimiters = delimiters_of(payload)
    text = strip_preamble(payload).decode("latin-1")
    found: set[str] = set()
    for segment in split_segments(text):
        if not segment.startswith("PID") or segment[3:4] != delimiters.field:
            continue
        fields = segment.split(delimiters.field)
        if len(fields) < 4:
            continue
        for repetition in fields[3].split(delimiters.repetition):
            raw = repetition.split(delimiters.component, 1)[0]
            ident = delimiters.unescape_text(raw).encode("latin-1").decode("utf-8", "replace")
            if ident.strip():
                found.add(ident.strip())
    return found


def has_patient_id(payload: bytes, ident: str) -> bool:
    """Whether ``ident`` (compared after stripping whitespace) is one of the PID-3 IDs."""
    wanted = ident.strip()
    return bool(wanted) and wanted in patient_identifiers(payload)
