"""Importing sentence-transformers without the parts a worker never calls.

``import sentence_transformers`` imports scikit-learn (``sentence_transformers.util.similarity``
takes ``pairwise_distances`` from ``sklearn.metrics``, which pulls in scipy.stats and pandas): ~3 s
of a ~12 s import on a 2-core CPU, paid by every worker start and every pod scaled from zero, for a
function used only by similarity helpers the worker never calls. While sentence-transformers is
first imported, ``sklearn.metrics`` is a stand-in whose functions import the real module when first
*called*; once the import is done the stand-in is gone, so any later ``import sklearn.metrics``
gets the real module. Nothing changes once sentence-transformers (or sklearn.metrics) is imported.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

#: Modules sentence-transformers imports at start-up for functions the worker never calls.
_DEFERRED = ("sklearn.metrics",)


class _Deferred(types.ModuleType):
    """A module stand-in: each attribute is a function that imports the real module and calls its
    namesake (what a ``from module import function`` at import time needs)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        real = self.__name__

        def deferred(*args: Any, **kwargs: Any) -> Any:
            return getattr(importlib.import_module(real), name)(*args, **kwargs)

        deferred.__name__ = deferred.__qualname__ = name
        return deferred


def sentence_transformers() -> types.ModuleType:
    """``import sentence_transformers``, deferring the modules of ``_DEFERRED`` (see the module doc)."""
    if "sentence_transformers" in sys.modules:
        return sys.modules["sentence_transformers"]
    placed = [name for name in _DEFERRED if name not in sys.modules]
    for name in placed:
        sys.modules[name] = _Deferred(name)
    try:
        return importlib.import_module("sentence_transformers")
    finally:
        for name in placed:
            if isinstance(sys.modules.get(name), _Deferred):
                del sys.modules[name]
