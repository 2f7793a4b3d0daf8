"""The worker imports sentence-transformers without scikit-learn, and loses nothing by it."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration

_CHECK = """
import sys
import numpy as np
from worker.embedding.imports import sentence_transformers
st = sentence_transformers()
assert hasattr(st, "SentenceTransformer")
assert "sklearn" not in sys.modules, "sklearn was imported with sentence-transformers"
assert "sklearn.metrics" not in sys.modules, "the stand-in outlived the import"
from sentence_transformers.util.similarity import pairwise_distances  # the stand-in's function
d = pairwise_distances(np.eye(2), np.eye(2), metric="manhattan")  # imports the real sklearn.metrics
assert np.allclose(d, [[0, 2], [2, 0]]), d
import sklearn.metrics
assert sklearn.metrics.pairwise_distances.__module__.startswith("sklearn"), "a stand-in left behind"
print("ok")
"""


def test_sentence_transformers_imports_without_sklearn_until_a_function_of_it_is_called():
    res = subprocess.run([sys.executable, "-c", _CHECK], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr[-3000:]
