"""The ``embedstream`` command line, one module per command (``worker.commands.cli.app`` holds what
they share). With ``worker.settings``, the only code that reads the environment."""

from __future__ import annotations

import os
import sys

from schemas.errors import ConfigError

# each module registers its command with the app
from worker.commands.cli import bench, config, demo, dev, dlq, erase, lag, migrate, produce, run, search, tail  # noqa: F401,E501
from worker.commands.cli.app import app, err
from worker.commands.shown import shown

__all__ = ["app", "main"]

#: Entries of oneDNN's process-wide primitive cache inside OpenVINO's CPU plugin (int8 on CPUs; its
#: default, 1,024, a JIT-compiled kernel each, ~0.2 MB). It outlives the compiled model and fills
#: with the kernels of every shape OpenVINO's runtime cache (``worker.embedding.int8.SHAPE_CACHE``)
#: evicted: after 1,000 passes of random small shapes (a flood's few documents a batch) resident
#: memory stayed +229 MB over the clean run, of which dropping the compiled model freed nothing; at
#: 128 it stays +56 (measured in one process on this project's 2-core host; 0: +46, 256: +82, 512:
#: +126). The plugin reads it once, at its first kernel: ``process_defaults`` sets it at the start,
#: unless ``ONEDNN_PRIMITIVE_CACHE_CAPACITY`` is set.
PRIMITIVE_CACHE = 128


def process_defaults() -> None:
    """The environment the libraries read once, set at the start unless the user set it: models load
    from local paths only (no hub at run time); the tokenizer starts no threads of its own (the
    embed thread is its only user; see worker/embedding/base.py); OpenVINO's kernel cache is bounded
    (``PRIMITIVE_CACHE``: what a flood of small shapes leaves there)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", str(PRIMITIVE_CACHE))


def main() -> None:  # pragma: no cover - console entry for `python -m worker`
    process_defaults()
    try:
        app()
    except ConfigError as exc:
        err.print(f"[red]configuration error:[/] {shown(exc)}")
        sys.exit(2)
