"""The tests' ports: each xdist worker's slice is its own, below the kernel's ephemeral range."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from tests.support import ports
from tests.support.ports import SLICES, bindable, draw_range, free_port

ROOT = Path(__file__).resolve().parents[2]


def test_slices_and_their_parts_are_disjoint_and_below_the_ephemeral_range() -> None:
    drawn = [draw_range(32_768, i, owner) for i in range(SLICES) for owner in (True, False)]
    every = [port for part in drawn for port in part]
    assert len(every) == len(set(every))
    assert min(every) == ports.LOWEST and max(every) < 32_768
    assert all(len(part) >= 300 for part in drawn)
    assert draw_range(10_500, 0, True) == range(0)  # too few ports: the kernel picks


def test_a_port_handed_out_is_bindable_and_not_handed_out_again_soon() -> None:
    handed = [free_port() for _ in range(50)]
    assert len(set(handed)) == 50
    assert all(bindable(port) for port in handed)


def test_a_taken_port_is_skipped() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", free_port()))
        taken.listen()
        port = taken.getsockname()[1]
        assert not bindable(port)
        assert port not in [free_port() for _ in range(20)]


def test_a_process_started_by_a_test_draws_from_its_parents_slice_but_not_its_part() -> None:
    """A benchmark's ``--tiny`` run picks its own ports: never one its parent may hand out."""
    code = f"import sys; sys.path.insert(0, {str(ROOT)!r}); from tests.support.ports import *"
    child = subprocess.run(
        [sys.executable, "-c", code + "; print(free_port())"],
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert child.returncode == 0, child.stderr
    port = int(child.stdout)
    mine = free_port()
    index = next(i for i in range(SLICES) if mine in draw_range(ports.ephemeral_low(), i, True))
    assert port in draw_range(ports.ephemeral_low(), index, False)
