"""The command line of a generated docs page (``tools.config_docs``, ``tools.metrics_docs``): write
the page, or with ``--check`` only say whether it is up to date (exit 1 if not)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path


def page_main(path: Path, page: Callable[[], str], description: str, argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--check", action="store_true", help="only say whether the page is up to date (exit 1 if not)")
    args = ap.parse_args(argv)
    name = f"docs/{path.name}"
    if args.check:
        fresh = path.exists() and path.read_text() == page()
        print(f"{name} is up to date" if fresh else f"{name} is stale: run make docs")
        return 0 if fresh else 1
    path.write_text(page())
    print(f"wrote {path}")
    return 0
