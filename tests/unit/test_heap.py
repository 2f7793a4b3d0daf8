"""worker.process.heap: a settled heap is out of the collector's walks, and ``release`` still frees a frozen
reference cycle (an unloaded model's)."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest

from worker.process import heap


class _Node:
    other: _Node


def test_settle_freezes_and_release_collects_a_frozen_cycle():
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    alive = weakref.ref(a)
    try:
        heap.settle()
        assert heap.settled()
        del a, b
        gc.collect()
        assert alive() is not None  # frozen: a full collection leaves the cycle alone
        heap.release()
        assert alive() is None and heap.settled()  # thawed, collected, the rest frozen again
    finally:
        gc.unfreeze()


def test_release_on_an_unsettled_heap_only_collects():
    gc.unfreeze()
    a = _Node()
    a.other = a
    alive = weakref.ref(a)
    del a
    heap.release()
    assert alive() is None and not heap.settled()


def test_keep_pages_has_megabyte_buffers_reuse_the_heap_instead_of_faulting_pages_in(tmp_path):
    """In a fresh process: allocating and freeing 4 MB buffers faults their pages in every time under
    glibc's defaults, and almost never once ``keep_pages`` ran."""
    import subprocess
    import sys

    script = tmp_path / "faults.py"
    script.write_text(
        "import resource, sys\n"
        "from worker.process import heap\n"
        "def faults():\n"
        "    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
        "    for i in range(40):\n"
        "        buf = bytearray((4 << 20) + i * 4096)\n"
        "        del buf\n"
        "    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before\n"
        "default = faults()\n"
        "if not heap.keep_pages():\n"
        "    print('no mallopt'); sys.exit(0)\n"
        "faults()\n"  # the heap grows to the size once
        "print(default, faults())\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2]).stdout.split()
    if out == ["no", "mallopt"]:
        pytest.skip("this C library has no mallopt")
    default, kept = map(int, out)
    assert default > 40 * 500 and kept < 200, (default, kept)


def test_the_heap_is_trimmed_once_a_quiet_spell_lasts_and_again_only_after_work():
    from worker.process.heap import IdleTrim

    now = [0.0]
    trims: list[float] = []
    idle = IdleTrim(after=5.0, trim=lambda: trims.append(now[0]), clock=lambda: now[0])
    for t, quiet in [(0, True), (6, True), (7, False), (8, True), (12.9, True), (13.0, True), (17, True), (18, False),
                     (19, True), (23.9, True), (24, True), (40, True)]:
        now[0] = t
        idle.tick(quiet)
    assert trims == [13.0, 24]  # not before the first busy tick (7 s); a busy tick (18 s) starts the count again

