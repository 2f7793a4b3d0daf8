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


def main() -> None:  # pragma: no cover - console entry for `python -m worker`
    # Models load from local paths only (no hub at run time), and the tokenizer must not start
    # threads of its own (the embed thread is its only user; see worker/embedding/base.py).
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        app()
    except ConfigError as exc:
        err.print(f"[red]configuration error:[/] {shown(exc)}")
        sys.exit(2)
