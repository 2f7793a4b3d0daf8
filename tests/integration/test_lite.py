"""The worker's int8 model built without torch (``worker.embedding.lite``) is the full load's: the same
token ids, offsets and chunk room, the same cache and Milvus spaces, the same vectors; it imports
none of torch, transformers or sentence-transformers; and every model it cannot run takes the full
load, with the reason."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from schemas.sparse import SparseMode
from tools.bench import workloads
from tools.derived_models import projected_model, prompted_model
from worker.embedding import int8
from worker.embedding.lite import lite_model, why_not

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def full(model):
    """The suite's model, loaded whole at int8 by OpenVINO (its load recorded the export's check)."""
    if model.precision != "int8" or int8.engine() != "openvino":
        pytest.skip(f"this host runs the model at {model.precision} (int8 engine: {int8.engine()}), and the path "
                    "without torch is for OpenVINO's int8 only: there is nothing here to compare it with")
    return model


def test_the_model_without_torch_tokenizes_and_embeds_as_the_full_load(full):
    lite = lite_model(None, "int8", "cpu")
    assert lite is not None and lite.sentence_transformer is None
    # built without the constructor: every attribute the full load sets is set (a new one fails here)
    assert set(vars(full)) <= set(vars(lite)), set(vars(full)) - set(vars(lite))
    texts = (workloads.mixed_texts(200) + workloads.short_texts(60)
             + ["", "a", "Ünïcödé façade 東京 " * 50, "word " * 600])  # empty, one letter, unicode, truncated
    assert lite.tokenize(texts) == full.tokenize(texts)
    assert lite.token_offsets(texts) == full.token_offsets(texts)
    assert lite.offsets_over(texts, 100) == full.offsets_over(texts, 100)
    assert (lite.dim, lite.max_seq_length, lite.chunk_room, lite.special_tokens) == (
        full.dim, full.max_seq_length, full.chunk_room, full.special_tokens)
    assert (lite.cache_id, lite.space_id, lite.model_id) == (full.cache_id, full.space_id, full.model_id)
    ours, theirs = lite.embed(texts), full.embed(texts)
    assert ours.dtype == np.float32 and np.abs(ours - theirs).max() < 1e-5
    ours, theirs = lite.embed_prepared(lite.prepare(texts[:40]))[0], full.embed_prepared(full.prepare(texts[:40]))[0]
    assert np.abs(ours - theirs).max() < 1e-5
    assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
    # the check on record (each full load writes what it measured: int8.record_check)
    recorded = json.loads((int8.cache_root() / int8.model_key(full.model_path, "openvino")
                           / "export.json").read_text())["check"]
    assert (lite.int8_quality.mean, lite.int8_quality.min, lite.int8_quality.texts) == (
        recorded["mean"], recorded["min"], recorded["texts"])
    # and near what this process's full load measured again: OpenVINO's kernels for a shape depend on
    # what the process compiled before (seen in a whole run: min 0.9780 on record, 0.9799 measured here)
    assert lite.int8_quality.min == pytest.approx(full.int8_quality.min, abs=0.01) and full.int8_quality.passes
    short = lite_model(None, "int8", "cpu", truncate_dim=128)  # the first 128 dimensions, normalised again
    kept = theirs[:5, :128] / np.linalg.norm(theirs[:5, :128], axis=1, keepdims=True)
    assert short.dim == 128 and short.space_id != full.space_id
    assert np.abs(short.embed_prepared(short.prepare(texts[:5]))[0] - kept).max() < 1e-5


def test_a_worker_start_on_it_imports_no_model_library(full, tmp_path):
    code = ("import sys\nfrom worker.embedding.lite import lite_model\nm = lite_model(None, 'int8', 'cpu')\n"
            "m.warmup()\nprint(m is not None, sorted(x for x in ('torch', 'transformers', 'sentence_transformers') "
            "if x in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["True", "[]"], out.stderr[-2000:]


def test_what_it_cannot_run_takes_the_full_load(full, tmp_path):
    path = full.model_path
    from pathlib import Path

    plain = Path(path)
    assert why_not(plain, "int8", "cpu", (None, None), SparseMode.of("off")) is None
    assert why_not(plain, "int8", "cpu", (None, None), SparseMode.of("bm25")) is None  # BM25 is Milvus'
    assert why_not(plain, "int8", "cuda", (None, None), SparseMode.of("off")) == "a GPU may be used"
    assert "precision fp32" in why_not(plain, "fp32", "cpu", (None, None), SparseMode.of("off"))
    from worker.embedding.sentence import pick_precision  # auto: exactly where the full load picks int8

    auto = why_not(plain, "auto", "cpu", (None, None), SparseMode.of("off"))
    assert (auto is None) == (pick_precision("auto", "cpu") == "int8"), auto
    assert why_not(plain, "int8", "cpu", ("passage: ", None), SparseMode.of("off")) == "prompts"
    prompted = prompted_model(tmp_path / "prompted", {"query": "query: ", "document": "passage: "})
    assert why_not(prompted, "int8", "cpu", (None, None), SparseMode.of("off")) == "prompts"
    projected = projected_model(tmp_path / "projected")  # a Dense layer after the pooling
    assert why_not(projected, "int8", "cpu", (None, None), SparseMode.of("off")).startswith("modules")
    assert lite_model(str(projected), "int8", "cpu") is None
    # an export whose check was not recorded (a read-only cache at its first start): the full load checks it
    meta = int8.cache_root() / int8.model_key(path, "openvino") / "export.json"
    recorded = json.loads(meta.read_text())
    try:
        meta.write_text(json.dumps({k: v for k, v in recorded.items() if k != "check"}))
        assert lite_model(None, "int8", "cpu") is None
        failed = {**recorded, "check": {**recorded["check"], "passes": False}}
        meta.write_text(json.dumps(failed))
        assert lite_model(None, "int8", "cpu") is None
    finally:
        meta.write_text(json.dumps(recorded))
    assert lite_model(None, "int8", "cpu") is not None



def test_the_export_is_kept_compiled_and_loads_the_same_compiled_or_not(full, tmp_path):
    """A start loads OpenVINO's copy compiled for this CPU, kept beside the export by the load
    before, and embeds as a compile from the export does (tests/integration/test_int8_read_only.py:
    a read-only cache compiles at each start)."""
    lite = lite_model(None, "int8", "cpu")
    export = int8.cache_root() / int8.model_key(lite.model_path, "openvino")
    xml, names = export / int8.FILES["openvino"], json.loads((export / "export.json").read_text())["inputs"]
    assert list((export / int8.COMPILED).glob("*.blob")), "no compiled copy kept beside the export"
    assert lite.int8_transformer.from_cache  # the export loaded before this (the suite's export step)
    plain = tmp_path / "export"  # the same export in a folder of its own: compiled now, kept there
    plain.mkdir()
    for f in (xml, xml.with_suffix(".bin")):
        (plain / f.name).write_bytes(f.read_bytes())
    fresh = int8.OpenVinoTransformer(plain / xml.name, names)
    assert list((plain / int8.COMPILED).glob("*.blob")) and not fresh.from_cache
    texts = workloads.mixed_texts(20) + workloads.short_texts(20)
    ours = lite.embed(texts)
    lite.int8_transformer = fresh
    assert np.abs(lite.embed(texts) - ours).max() < 1e-6
