"""HL7 v2.5 messages made up for the demo: a day on two wards of an imaginary hospital.

Every patient is admitted (ADT^A01), gets one to three lab results (ORU^R01) and is discharged
(ADT^A03). Stays overlap, so the feed interleaves patients the way a real one does, and a
receiver that got the feed out of order could see a discharge before its admission. Names,
identifiers and values are invented (the LOINC codes are real ones). The same seed gives the
same messages.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta

GIVEN = ["Ada", "Bram", "Cleo", "Dario", "Edda", "Finn", "Greta", "Hugo", "Ines", "Jonas"]
FAMILY = ["Abbott", "Brennan", "Castellan", "Dunmore", "Everly", "Fairweather", "Gallo", "Hale"]
#: (LOINC code, name, unit, low, high) of the tests the lab reports.
TESTS = [
    ("2345-7", "Glucose", "mmol/L", 3.9, 6.1),
    ("2823-3", "Potassium", "mmol/L", 3.5, 5.1),
    ("2951-2", "Sodium", "mmol/L", 135.0, 145.0),
    ("718-7", "Hemoglobin", "g/dL", 12.0, 17.5),
    ("2160-0", "Creatinine", "umol/L", 60.0, 110.0),
]
START = datetime(2026, 3, 2, 7, 0)
DOCTOR = "4711^Quill^Morgan^^^Dr"


@dataclass(frozen=True)
class Message:
    """One generated message, with what the demo checks at the receivers."""

    control_id: str  # MSH-10, unique
    kind: str  # "A01", "ORU" or "A03"
    patient: str  # the MRN in PID-3
    payload: bytes  # segments separated by CR


@dataclass
class Patient:
    mrn: str
    name: str
    birth: str
    sex: str
    bed: str
    admitted: datetime
    results_left: int


def ts(when: datetime) -> str:
    return when.strftime("%Y%m%d%H%M%S")


def msh(app: str, when: datetime, message_type: str, control_id: str) -> str:
    return (
        f"MSH|^~\\&|{app}|NORTHFIELD|INTURN-DEMO|DEMO|{ts(when)}||{message_type}|{control_id}|P|2.5"
    )


def pid(p: Patient) -> str:
    return f"PID|1||{p.mrn}^^^NORTHFIELD^MR||{p.name}||{p.birth}|{p.sex}"


def pv1(p: Patient, discharged: datetime | None = None) -> str:
    fields = [""] * 46  # index n is PV1-n
    fields[:4] = ["PV1", "1", "I", p.bed]
    fields[7] = DOCTOR
    fields[44] = ts(p.admitted)
    fields[45] = ts(discharged) if discharged else ""
    return "|".join(fields).rstrip("|")


def adt(event: str, p: Patient, when: datetime, control_id: str) -> str:
    return "\r".join(
        [
            msh("ADMISSIONS", when, f"ADT^{event}^ADT_{event}", control_id),
            f"EVN|{event}|{ts(when)}",
            pid(p),
            pv1(p, when if event == "A03" else None),
        ]
    )


def oru(p: Patient, when: datetime, control_id: str, rng: random.Random) -> str:
    code, name, unit, low, high = rng.choice(TESTS)
    value = round(rng.uniform(low * 0.8, high * 1.2), 1)
    flag = "L" if value < low else "H" if value > high else "N"
    order = f"LAB{control_id[-5:]}"
    return "\r".join(
        [
            msh("LAB", when, "ORU^R01^ORU_R01", control_id),
            pid(p),
            pv1(p),
            f"OBR|1|{order}|{order}|{code}^{name}^LN|||{ts(when - timedelta(minutes=20))}",
            f"OBX|1|NM|{code}^{name}^LN||{value}|{unit}|{low}-{high}|{flag}|||F|||{ts(when)}",
        ]
    )


def generate(patients: int = 80, seed: int = 7) -> list[Message]:
    """The feed: ``patients`` stays (about 4 messages each), interleaved, in sending order."""
    rng = random.Random(seed)
    out: list[Message] = []
    waiting = list(range(patients))
    inside: list[Patient] = []
    when = START

    while waiting or inside:
        when += timedelta(minutes=rng.randint(1, 4))
        control_id = f"DEMO{len(out) + 1:05d}"
        # Admit while the wards have room (at most 6 in at once), otherwise move someone along.
        if waiting and (len(inside) < 2 or (len(inside) < 6 and rng.random() < 0.35)):
            n = waiting.pop(0)
            p = Patient(
                mrn=f"NF{100000 + n * 37}",
                name=f"{FAMILY[n % len(FAMILY)]}^{GIVEN[(n * 3) % len(GIVEN)]}",
                birth=f"{1940 + (n * 7) % 60}{1 + n % 12:02d}{1 + n % 28:02d}",
                sex="FM"[n % 2],
                bed=f"WARD-{'AB'[n % 2]}^{100 + n % 20}^1",
                admitted=when,
                results_left=rng.randint(1, 3),
            )
            inside.append(p)
            kind, text = "A01", adt("A01", p, when, control_id)
        else:
            p = rng.choice(inside)
            if p.results_left:
                p.results_left -= 1
                kind, text = "ORU", oru(p, when, control_id, rng)
            else:
                inside.remove(p)
                kind, text = "A03", adt("A03", p, when, control_id)
        out.append(Message(control_id, kind, p.mrn, text.encode()))
    return out


if __name__ == "__main__":  # print the feed, one message per paragraph
    for m in generate():
        print(m.payload.decode().replace("\r", "\n"), end="\n\n")
