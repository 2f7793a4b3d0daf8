"""The start-up path imports nothing the first batch does not need before the model loads.

A worker process (a scaled-out pod, a restarted worker) pays every import before it takes a record.
The command line, the settings, the assembly and both loops must import without the model's
libraries (torch, transformers, sentence-transformers: loaded with the model, in
``worker.assembly.runner.load_embedder``), the int8 engines, the plotting and data-science libraries
only tools or helpers use, and the checkout's tools. A module that pulls one of them in at import
time fails here; measured with ``python -X importtime``, not timed."""

from __future__ import annotations

import json
import subprocess
import sys

#: What the start path must not import (before the model loads).
NOT_AT_START = ("torch", "transformers", "sentence_transformers", "sklearn", "scipy", "matplotlib", "openvino",
                "onnxruntime", "tools", "datasets")

_START_PATH = """
import json, sys
import worker.commands.cli.app, worker.commands.cli.run
import worker.assembly.runner, worker.assembly.chain, worker.core.loop, worker.core.share_loop
print(json.dumps(sorted({name.split(".")[0] for name in sys.modules})))
"""


def test_the_start_path_imports_no_model_library_and_no_tool():
    res = subprocess.run([sys.executable, "-c", _START_PATH], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    loaded = set(json.loads(res.stdout))
    assert {"worker", "connectors", "schemas", "confluent_kafka"} <= loaded  # the path was imported
    assert loaded.isdisjoint(NOT_AT_START), sorted(loaded & set(NOT_AT_START))
