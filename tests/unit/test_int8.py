"""The int8 export's cache key and quality gate (no model, no onnxruntime needed)."""

from __future__ import annotations

import numpy as np

from worker.embedding import int8


def test_the_cache_key_follows_the_model_files(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"\0" * (3 << 20))
    first = int8.model_key(tmp_path)
    assert int8.model_key(tmp_path) == first
    (tmp_path / "model.safetensors").write_bytes(b"\0" * (3 << 20) + b"\1")  # a changed tail
    assert int8.model_key(tmp_path) != first
    (tmp_path / "model.safetensors").write_bytes(b"\0" * (3 << 20))
    (tmp_path / "config.json").write_text('{"hidden": 1}')
    assert int8.model_key(tmp_path) != first


def test_the_gate_needs_both_the_mean_and_the_worst_cosine():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((50, 16)).astype(np.float32)
    assert int8.check_quality(ref * 2, ref).passes  # scale does not matter
    one_off = ref.copy()
    one_off[0] = rng.standard_normal(16)  # one vector unrelated: mean still high, min not
    q = int8.check_quality(one_off, ref)
    assert q.mean > 0.95 and q.min < int8.MIN_COSINE and not q.passes


def test_auto_runs_openvino_int8_with_vnni_else_bf16_else_onnxruntime_int8_with_vnni(monkeypatch):
    from worker.embedding import cpu, sentence

    assert sentence.pick_precision("auto", "cuda") == "fp16"
    assert sentence.pick_precision("int8", "cpu") == "int8"
    monkeypatch.setattr(cpu, "flags", lambda: frozenset({"avx2", "avx512_vnni", "avx512_bf16"}))
    monkeypatch.setattr(sentence, "cpu_has_bf16", lambda: True)
    monkeypatch.setattr(int8, "engine", lambda: "openvino")
    assert sentence.pick_precision("auto", "cpu") == "int8"  # static int8: faster than bf16, within the gate
    monkeypatch.setattr(int8, "engine", lambda: "onnxruntime")
    assert sentence.pick_precision("auto", "cpu") == "bf16"  # dynamic int8: no faster than bf16
    assert sentence.fallback_precision() == "bf16"
    monkeypatch.setattr(sentence, "cpu_has_bf16", lambda: False)
    monkeypatch.setattr(cpu, "flags", lambda: frozenset({"avx2", "avx512_vnni"}))
    assert sentence.pick_precision("auto", "cpu") == "int8"
    assert sentence.fallback_precision() == "fp32"
    monkeypatch.setattr(cpu, "flags", lambda: frozenset({"avx2"}))  # 7-bit int8 only: too close to its gate
    assert sentence.pick_precision("auto", "cpu") == "fp32"
    monkeypatch.setattr(int8, "engine", lambda: "openvino")
    assert sentence.pick_precision("auto", "cpu") == "fp32"  # no int8 dot products: not measured, not picked
    monkeypatch.setattr(cpu, "flags", lambda: frozenset({"avx2", "avx512_vnni"}))
    monkeypatch.setattr(int8, "engine", lambda: None)
    assert sentence.pick_precision("auto", "cpu") == "fp32"


def test_calibration_texts_are_stable_docstrings_and_their_first_words_never_the_gate_s_texts():
    texts = int8.calibration_texts()
    assert texts == int8.calibration_texts() and len(texts) == int8.CALIBRATION_TEXTS
    words = texts[-int8.CALIBRATION_TEXTS // 5:]
    assert all(1 <= len(t.split()) <= 3 for t in words) and all(len(t) >= 20 for t in texts[:len(texts) - len(words)])
    assert not set(texts) & set(int8.CHECK_TEXTS)


def test_weights_are_7_bit_on_cpus_without_vnni_and_the_export_is_keyed_by_it(monkeypatch, tmp_path):
    from worker.embedding import cpu

    (tmp_path / "config.json").write_text("{}")
    monkeypatch.setattr(cpu, "flags", lambda: frozenset({"avx2", "fma"}))
    assert int8.reduce_range() and not cpu.has_bf16()
    seven = int8.model_key(tmp_path)
    monkeypatch.setattr(cpu, "flags", lambda: frozenset({"avx2", "avx512_vnni", "avx512_bf16"}))
    assert not int8.reduce_range() and cpu.has_bf16()
    assert int8.model_key(tmp_path) != seven  # a disk shared by two kinds of CPU keeps both exports
    assert int8.model_key(tmp_path, "openvino") not in (seven, int8.model_key(tmp_path))  # nor two engines


def test_cpu_flags_are_read_from_the_flags_line():
    from worker.embedding import cpu

    text = ("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse4_2 avx2 avx512_vnni\n"
            "bugs\t\t: sysret_ss_attrs\n\nprocessor\t: 1\nflags\t\t: fpu\n")
    assert cpu.parse_flags(text) == {"fpu", "sse4_2", "avx2", "avx512_vnni"}
    assert cpu.parse_flags("processor: 0\n") == frozenset()


def test_the_cache_key_is_the_transformers_alone(tmp_path):
    """Later modules, prompts and the model card do not change the export: a model derived by adding
    a projection shares its base's. The transformer's own files do, wherever its folder is."""
    import json

    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "vocab.txt").write_text("a\nb\n")
    (tmp_path / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text('{"pooling_mode_mean_tokens": true}')
    first = int8.model_key(tmp_path)
    (tmp_path / "README.md").write_text("# a card")
    (tmp_path / "config_sentence_transformers.json").write_text('{"prompts": {"query": "q: "}}')
    (tmp_path / "1_Pooling" / "config.json").write_text('{"pooling_mode_cls_token": true}')
    (tmp_path / "2_Dense").mkdir()
    (tmp_path / "2_Dense" / "model.safetensors").write_bytes(b"\1" * 64)
    modules = json.loads((tmp_path / "modules.json").read_text())
    modules.append({"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"})
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    assert int8.model_key(tmp_path) == first
    (tmp_path / "vocab.txt").write_text("a\nc\n")  # the tokenizer is the transformer's
    assert int8.model_key(tmp_path) != first

    sub = tmp_path / "nested"
    (sub / "0_Transformer").mkdir(parents=True)
    (sub / "0_Transformer" / "config.json").write_text("{}")
    (sub / "modules.json").write_text(json.dumps([{"idx": 0, "name": "0", "path": "0_Transformer",
                                                   "type": "sentence_transformers.models.Transformer"}]))
    nested = int8.model_key(sub)
    (sub / "0_Transformer" / "config.json").write_text('{"hidden": 1}')
    assert int8.model_key(sub) != nested


def test_the_command_line_bounds_onednns_kernel_cache_unless_the_environment_says(monkeypatch):
    import os

    from worker.commands.cli import PRIMITIVE_CACHE, process_defaults

    for name in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "HF_HUB_OFFLINE", "TOKENIZERS_PARALLELISM"):
        monkeypatch.delenv(name, raising=False)
    process_defaults()
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == str(PRIMITIVE_CACHE) == "128"
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "512")
    process_defaults()
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "512"


def test_the_check_is_recorded_whole_and_a_read_only_cache_keeps_none(tmp_path, monkeypatch):
    """``record_check`` adds the check to the export's ``export.json`` by a rename (no half-written file for
    a start reading beside it), and leaves nothing behind where the folder cannot be written."""
    import json as _json

    from worker.embedding import int8 as _int8

    folder = tmp_path / "key"
    folder.mkdir()
    (folder / "export.json").write_text(_json.dumps({"inputs": ["input_ids"]}))
    monkeypatch.setattr(_int8, "cache_root", lambda: tmp_path)
    monkeypatch.setattr(_int8, "model_key", lambda path, engine: "key")
    _int8.record_check("m", _int8.Quality(0.995, 0.98, 40))
    found = _json.loads((folder / "export.json").read_text())
    assert found["inputs"] == ["input_ids"] and found["check"]["mean"] == 0.995 and found["check"]["passes"]
    assert sorted(p.name for p in folder.iterdir()) == ["export.json"]
    monkeypatch.setattr(_int8.os, "replace", lambda *a: (_ for _ in ()).throw(OSError(30, "Read-only file system")))
    _int8.record_check("m", _int8.Quality(0.5, 0.4, 40))  # refused: logged, never raised
    assert _json.loads((folder / "export.json").read_text())["check"]["mean"] == 0.995
    assert sorted(p.name for p in folder.iterdir()) == ["export.json"]


def test_a_compiled_copy_that_cannot_be_loaded_is_compiled_at_this_start(tmp_path, monkeypatch, caplog):
    """The CPU image's case run as another user: OpenVINO finds the copy but cannot read it, and on a
    read-only root cannot remove it either, so its compile raises. The start compiles without the copy
    and says so, instead of failing."""
    import logging
    import sys
    import types

    from worker.embedding import int8 as _int8

    calls: list[dict] = []

    class Compiled:
        def get_property(self, name):
            return False

        def create_infer_request(self):
            return None

    class Core:
        def compile_model(self, path, device, config):
            calls.append(dict(config))
            if "CACHE_DIR" in config:
                raise RuntimeError("Exception from src/inference/src/cpp/core.cpp:132:\n"
                                   "filesystem error: cannot remove: Read-only file system [x.blob]")
            return Compiled()

    monkeypatch.setitem(sys.modules, "openvino", types.SimpleNamespace(Core=Core))
    (tmp_path / "compiled").mkdir()
    with caplog.at_level(logging.WARNING):
        t = _int8.OpenVinoTransformer(tmp_path / "model-int8.xml", ["input_ids"])
    assert [("CACHE_DIR" in c) for c in calls] == [True, False] and not t.from_cache
    assert "compiled copy" in caplog.text and "Read-only file system" in caplog.text
