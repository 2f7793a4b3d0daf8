"""worker.heap: a settled heap is out of the collector's walks, and ``release`` still frees a frozen
reference cycle (an unloaded model's)."""

from __future__ import annotations

import gc
import weakref

from worker import heap


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
