"""The int8 export on a read-only root, as the chart's pods run (``readOnlyRootFilesystem``): a
worker that would have to export its model where it cannot write says at start-up where to write
it (the chart's ``cache.enabled`` mounts a volume at ``XDG_CACHE_HOME``), instead of failing later or
silently. The read-only filesystem is a real one: a tmpfs mounted read-only in a mount namespace of
the test's own (``unshare``), so the test needs no privileges the suite does not have."""

from __future__ import annotations

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
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-rm", "true"]).returncode != 0:
        missing_tool("this host lets no unprivileged process mount a filesystem (`unshare -rm` fails), and a "
                     "real read-only filesystem is what this test writes to; it runs wherever that is allowed, "
                     "as on the project's CI host (util-linux's unshare)")
    cache = tmp_path / "cache"
    cache.mkdir()
    env = {**os.environ, "XDG_CACHE_HOME": str(cache), "HF_HUB_OFFLINE": "1"}
    command = f"mount -t tmpfs -o ro,size=1m tmpfs {cache} && exec {sys.executable} -c \"$0\" {precision}"
    return subprocess.run(["unshare", "-rm", "sh", "-c", command, _LOAD], env=env, capture_output=True, text=True,
                          timeout=300)


def test_int8_on_a_read_only_root_stops_at_start_saying_where_to_write(tmp_path):
    done = _in_read_only_cache(tmp_path, "int8")
    assert "REFUSED:" in done.stdout, done.stdout + done.stderr[-2000:]
    assert "cannot write the exported model" in done.stdout and "set XDG_CACHE_HOME to a writable folder" in done.stdout
    assert "Read-only file system" in done.stdout


def test_auto_on_a_read_only_root_runs_another_precision_and_says_why(tmp_path):
    done = _in_read_only_cache(tmp_path, "auto")
    assert "LOADED:" in done.stdout and "LOADED: int8" not in done.stdout, done.stdout + done.stderr[-2000:]
    assert "cannot write the exported model" in done.stderr  # the warning at start-up
