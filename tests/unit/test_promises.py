"""docs/promises.md stays true: every test it names exists (a file, and the function where it names
one), and each promise it lists as not yet tested has no test yet (once its test exists, the promise
moves up into its table)."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAGE = (REPO / "docs" / "promises.md").read_text()
TESTED, _, UNTESTED = PAGE.partition("\n## Not yet tested\n")

#: A test path in backticks, with an optional ``::name`` (and ``[param]``), or ``::name`` alone (of the
#: file named last in the same cell).
_REF = re.compile(r"`(?:(tests/[\w/]+\.py)|(test_\w+\.py))?((?:::\w+)?)(?:\[[^\]`]*\])?(?: -k [^`]*)?`")


@cache
def _defined(path: Path) -> frozenset[str]:
    tree = ast.parse(path.read_text())
    return frozenset(n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef)))


def _resolve(short: str) -> list[Path]:
    return sorted((REPO / "tests").rglob(short))


def _references(text: str) -> list[tuple[str, Path | None, str]]:
    """``(cell text, file, name)`` for each test the cells of ``text`` name (``name`` may be "")."""
    out = []
    for line in text.splitlines():
        for cell in line.split(" | "):
            current: Path | None = None
            for full, short, name in _REF.findall(cell):
                if full or short:
                    found = [REPO / full] if full else _resolve(short)
                    current = found[0] if len(found) == 1 else None
                    out.append((f"{full or short}{name}", current if found else None, name[2:]))
                elif name:
                    out.append((name, current, name[2:]))
    return out


def test_every_test_the_page_names_exists():
    refs = _references(TESTED)
    assert len(refs) > 100, "the pattern no longer reads the page's references"
    missing = [text for text, path, name in refs
               if path is None or not path.is_file() or (name and name not in _defined(path))]
    assert not missing, f"docs/promises.md names tests that do not exist: {missing}"


def test_each_promise_not_yet_tested_has_no_test_yet():
    items = UNTESTED.split("\n- ")[1:]
    assert items, "the list of promises not yet tested is gone (or no longer reads as a list)"
    for item in items:
        to_be = re.search(r"To be: `(tests/[\w/]+\.py)::(\w+)`", item.replace("\n", " "))
        assert to_be, f"an untested promise names no test to be: {item[:80]}"
        path, name = REPO / to_be.group(1), to_be.group(2)
        assert path.parent.is_dir(), f"{to_be.group(1)}: no such folder"
        assert not (path.is_file() and name in _defined(path)), (
            f"{to_be.group(1)}::{name} exists now: move its promise into its table in docs/promises.md")
