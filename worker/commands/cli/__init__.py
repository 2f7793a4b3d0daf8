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


def process_defaults() -> None:
    """The environment the libraries read once, set at the start unless the user set it: models load
    from local paths only (no hub at run time); the tokenizer starts no threads of its own (the
    embed thread is its only user; see worker/embedding/base.py); OpenVINO's kernel cache is bounded
    (``worker.embedding.int8.PRIMITIVE_CACHE``: what a flood of small shapes leaves there)."""
    from worker.embedding.int8 import PRIMITIVE_CACHE

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
