"""Keep the cyclic garbage collector off the objects a loaded model brings.

A model loads hundreds of thousands of long-lived Python objects (torch, transformers, the
tokenizer), and every full (generation 2) collection walks all of them while holding the GIL: on
this project's 2-core machine one took 265 ms of CPU, and one in every few runs of 4,000 documents
landed in the stream, more than doubling that run's CPU per document (42 → 108 µs, instant model).
Once the worker is assembled, ``settle`` collects what is garbage and freezes the rest
(``gc.freeze``): the collector then walks only what the stream allocates. Reference counting frees
frozen objects as usual; only a reference cycle among them would outlive its use, so a model is
thawed before it is unloaded (``release``).
"""

from __future__ import annotations

import gc


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
