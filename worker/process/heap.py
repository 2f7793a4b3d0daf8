"""Keep the cyclic garbage collector off the objects a loaded model brings, and the C heap's
pages in use from one group to the next.

A model loads hundreds of thousands of long-lived Python objects (torch, transformers, the
tokenizer), and every full (generation 2) collection walks all of them while holding the GIL: on
this project's 2-core machine one took 265 ms of CPU, and one in every few runs of 4,000 documents
landed in the stream, more than doubling that run's CPU per document (42 → 108 µs, instant model).
Once the worker is assembled, ``settle`` collects what is garbage and freezes the rest
(``gc.freeze``): the collector then walks only what the stream allocates. Reference counting frees
frozen objects as usual; only a reference cycle among them would outlive its use, so a model is
thawed before it is unloaded (``release``).

Each group of batches allocates and frees buffers of megabytes (its Milvus request: the vectors,
protobuf's copy, the serialized message). glibc serves such sizes with a fresh ``mmap`` (or trims
them off the heap's top when freed), so every group faulted its pages in anew, zeroed by the kernel:
``keep_pages`` has them served from the heap and kept there (instant model, S2 without the cache,
three alternating runs: the Milvus writer thread 5.0-5.1 → 3.3-3.7 µs a document, the process
29.0-31.1 → 27.0-28.7).

What a burst of large records leaves on the heap (fetched 1 MB keys, dead letters on their way out)
is then kept too, up to ``TRIM_THRESHOLD``: after a flood of hostile records the idle worker sat
~125 MB above a clean run. So once the input has been quiet a while, ``trim`` hands the free pages
back (``malloc_trim``): the pages are kept while records stream, returned when they stop.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc

#: mallopt's parameters (glibc's malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
#: Allocations below this come from the heap (a group's buffers are a few MB).
MMAP_THRESHOLD = 32 << 20
#: Freed memory at the heap's top is returned to the system only past this much.
TRIM_THRESHOLD = 128 << 20


def settle() -> None:
    """Collect, then freeze every object alive now (after the models are loaded)."""
    gc.collect()
    gc.freeze()


def settled() -> bool:
    """Whether ``settle`` ran in this process (some objects are frozen)."""
    return gc.get_freeze_count() > 0


def release() -> None:
    """After dropping a large object (an unloaded model): collect it, cycles included. A settled heap
    is thawed first, so that the model's frozen objects can go, and settled again."""
    if settled():
        gc.unfreeze()
        settle()
    else:
        gc.collect()


def keep_pages() -> bool:
    """Have glibc serve allocations under ``MMAP_THRESHOLD`` from the heap and keep up to
    ``TRIM_THRESHOLD`` of freed heap (a process setting: it replaces glibc's ``MALLOC_MMAP_THRESHOLD_``
    and ``MALLOC_TRIM_THRESHOLD_``). False where the C library has no ``mallopt`` (musl, macOS):
    nothing changes there."""
    mallopt = getattr(_libc(), "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def _libc():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c"))
    except (OSError, TypeError):
        return None


def trim() -> bool:
    """Return the free pages of every malloc arena to the system (glibc's ``malloc_trim(0)``; a few
    ms). False where the C library has none (musl, macOS) or nothing was returned."""
    libc = _libc()
    trim_ = getattr(libc, "malloc_trim", None)
    if trim_ is None:
        return False
    trim_.argtypes, trim_.restype = [ctypes.c_size_t], ctypes.c_int
    return bool(trim_(0))


class IdleTrim:
    """``tick(quiet)`` from the loop: once the worker has been quiet (nothing batching or in flight)
    for ``after`` seconds after a busy spell, ``trim`` once; again only after the next busy spell.
    Never before the first: a worker waiting for its partitions has nothing to hand back, and pages
    handed back then are faulted in again by the first records (measured: ~10 µs a document over a
    run of 4,000, the trim landing in a 5 s group join)."""

    def __init__(self, after: float = 5.0, trim=trim, clock=None) -> None:
        import time

        self.after = after
        self._trim = trim
        self._clock = clock or time.monotonic
        self._quiet_since: float | None = None
        self._done = True  # armed by the first busy tick

    def tick(self, quiet: bool) -> None:
        if not quiet:
            self._quiet_since, self._done = None, False
            return
        now = self._clock()
        if self._quiet_since is None:
            self._quiet_since = now
        elif not self._done and now - self._quiet_since >= self.after:
            self._done = True
            self._trim()
