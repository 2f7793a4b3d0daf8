"""The int8 export on a read-only root, as the chart's pods run (``readOnlyRootFilesystem``): a
worker that would have to export its model where it cannot write says at start-up where to write
it (the chart's ``cache.enabled`` mounts a volume at ``XDG_CACHE_HOME``), instead of failing later or
silently. The read-only filesystem is a real one: a tmpfs mounted read-only in a mount namespace of
the test's own (``unshare``), so the test needs no privileges the suite does not have."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from tests.helpers import missing_tool

pytestmark = pytest.mark.integration

_LOAD = textwrap.dedent("""
    import sys
    from schemas.errors import ConfigError
    from worker.embedding.sentence import SentenceTransformerEmbedder
    try:
        model = SentenceTransformerEmbedder(None, sys.argv[1], "cpu")
    except ConfigError as exc:
        print("REFUSED:", exc)
    else:
        print("LOADED:", model.precision)
""")


def _in_read_only_cache(tmp_path, precision: str) -> subprocess.CompletedProcess:
    cache = tmp_path / "cache"
    cache.mkdir()
    return _unshared(cache, f"mount -t tmpfs -o ro,size=1m tmpfs {cache}", _LOAD, precision)


def _unshared(cache, mount: str, script: str, arg: str) -> subprocess.CompletedProcess:
    """``script`` run by Python with ``arg``, ``XDG_CACHE_HOME`` at ``cache``, after ``mount`` in a
    mount namespace of its own."""
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-rm", "true"]).returncode != 0:
        missing_tool("this host lets no unprivileged process mount a filesystem (`unshare -rm` fails), and a "
                     "real read-only filesystem is what this test writes to; it runs wherever that is allowed, "
                     "as on the project's CI host (util-linux's unshare)")
    env = {**os.environ, "XDG_CACHE_HOME": str(cache), "HF_HUB_OFFLINE": "1"}
    command = f"{mount} && exec {sys.executable} -c \"$0\" \"$1\""
    return subprocess.run(["unshare", "-rm", "sh", "-c", command, script, arg], env=env, capture_output=True,
                          text=True, timeout=300)


def test_int8_on_a_read_only_root_stops_at_start_saying_where_to_write(tmp_path):
    done = _in_read_only_cache(tmp_path, "int8")
    assert "REFUSED:" in done.stdout, done.stdout + done.stderr[-2000:]
    assert "cannot write the exported model" in done.stdout and "set XDG_CACHE_HOME to a writable folder" in done.stdout
    assert "Read-only file system" in done.stdout


def test_auto_on_a_read_only_root_runs_another_precision_and_says_why(tmp_path):
    done = _in_read_only_cache(tmp_path, "auto")
    assert "LOADED:" in done.stdout and "LOADED: int8" not in done.stdout, done.stdout + done.stderr[-2000:]
    assert "cannot write the exported model" in done.stderr  # the warning at start-up


_LITE = textwrap.dedent("""
    import json, sys
    from worker.embedding.lite import lite_model
    model = lite_model(None, "int8", "cpu")
    print("FROM_CACHE:", model.int8_transformer.from_cache)
    print("VECTOR:", json.dumps(model.embed([sys.argv[1]])[0].tolist()))
""")


@pytest.mark.parametrize("compiled", [False, True], ids=["export only", "export and its compiled copy"])
def test_a_read_only_cache_holding_the_export_loads_it_and_embeds_the_same(tmp_path, model, compiled):
    """The export made before (the CPU image's, baked at build time; a volume an earlier pod filled),
    then mounted read-only: with its compiled copy beside it the start loads that copy; without one it
    compiles in memory and keeps nothing. Either way its vectors are those of a start here."""
    from worker.embedding import int8
    from worker.embedding.lite import lite_model

    here = lite_model(None, "int8", "cpu")
    if here is None:
        pytest.skip(f"this CPU runs the model at {model.precision}, not int8 (int8 is taken on CPUs with VNNI or AMX "
                    "instructions and OpenVINO installed): no start here loads an int8 export, read-only or not")
    export = int8.cache_root() / int8.model_key(here.model_path, "openvino")
    cache = tmp_path / "cache"
    shutil.copytree(export, cache / "embedstream" / "int8" / export.name, ignore=shutil.ignore_patterns(int8.COMPILED))
    text = "A read-only volume still serves the export."
    if compiled:  # a start where the cache could be written keeps the copy, as the image's build does
        # (OpenVINO keys a copy by where its export is: one made in another folder would not be found)
        filled = _unshared(cache, "true", _LITE, text)
        assert "FROM_CACHE: False" in filled.stdout, filled.stdout + filled.stderr[-2000:]
    done = _unshared(cache, f"mount --bind {cache} {cache} && mount -o remount,ro,bind {cache}", _LITE, text)
    assert "VECTOR:" in done.stdout, done.stdout + done.stderr[-2000:]
    vector = json.loads(done.stdout.split("VECTOR:", 1)[1])
    assert max(abs(a - b) for a, b in zip(vector, here.embed([text])[0].tolist())) < 1e-6
    assert f"FROM_CACHE: {compiled}" in done.stdout, done.stdout
    assert (cache / "embedstream" / "int8" / export.name / int8.COMPILED).exists() == compiled  # nothing made
