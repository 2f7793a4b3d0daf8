"""Sample corpora built at run time from what the machine has (nothing third-party is committed).

``stdlib_docstrings()`` walks the installed Python standard library and returns the docstrings of
its modules, classes and functions: ~7,500 real English texts, median ~100 characters, long tail.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import random
import sys
import sysconfig
from functools import lru_cache
from pathlib import Path

from schemas.codec import Document


@lru_cache(maxsize=1)
def stdlib_docstrings(min_chars: int = 20) -> tuple[tuple[str, str], ...]:
    """``(qualified name, docstring)`` pairs, unique texts, in a stable order."""
    return tuple((name, doc) for name, _kind, doc in stdlib_definitions(min_chars))


@lru_cache(maxsize=1)
def stdlib_definitions(min_chars: int = 20) -> tuple[tuple[str, str, str], ...]:
    """``(qualified name, kind, docstring)`` of the standard library's modules, classes and functions
    (kind ``module``, ``class`` or ``function``; a method is ``<module>.<name>``), unique texts, in a
    stable order.

    The walk parses every module (4-6 s of CPU), so its result is kept in the checkout's
    ``.cache/corpus`` keyed by the interpreter and every file's size and mtime: each later process
    (every test session, bench run and suite worker) reads it back in well under a second, and a
    changed standard library is walked again. A cache that cannot be read or written is walked past."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [p for p in sorted(root.rglob("*.py"))
             if not any(part in _SKIPPED for part in p.relative_to(root).parts)]
    key = hashlib.sha256(repr((sys.version, str(root), min_chars, _CACHE_FORMAT,
                               [(str(p), *_size_and_mtime(p)) for p in files])).encode()).hexdigest()[:16]
    cached = CACHE / f"stdlib-{key}.json"
    try:
        return tuple(tuple(row) for row in json.loads(cached.read_text(encoding="utf-8")))  # type: ignore[misc]
    except (OSError, ValueError):
        pass
    out = _walk(root, files, min_chars)
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(out), encoding="utf-8")
        tmp.replace(cached)  # whole or absent for a process reading beside
    except OSError:
        pass
    return out


#: Folders of the standard library that hold tests and tools, not the library's own texts.
_SKIPPED = ("test", "tests", "idlelib", "site-packages", "lib2to3")
#: Where the walks are kept: in the checkout (tools/ runs only from one), outside the model cache
#: that the tests point at a scratch folder, so that every session of a run, and the next run, share it.
CACHE = Path(__file__).resolve().parents[1] / ".cache" / "corpus"
#: Raised when what a cached walk holds changes, so an older cache file is never read as the new.
_CACHE_FORMAT = 1


def _size_and_mtime(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_size, st.st_mtime_ns


def _walk(root: Path, files: list[Path], min_chars: int) -> tuple[tuple[str, str, str], ...]:
    seen: set[str] = set()
    out: list[tuple[str, str, str]] = []
    for path in files:
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
            continue
        module = ".".join(path.relative_to(root).with_suffix("").parts)
        for node in [tree, *ast.walk(tree)]:
            if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            doc = ast.get_docstring(node)
            if not doc or len(doc) < min_chars or doc in seen:
                continue
            seen.add(doc)
            name = module if isinstance(node, ast.Module) else f"{module}.{node.name}"
            kind = {ast.Module: "module", ast.ClassDef: "class"}.get(type(node), "function")
            out.append((name, kind, doc))
    return tuple(out)


def sample_documents(n: int, repeat_fraction: float = 0.0, seed: int = 7, prefix: str = "doc") -> list[Document]:
    """``n`` documents from the stdlib docstrings; a ``repeat_fraction`` of them repeat earlier texts
    under new ids (Zipf-like: a few texts repeat often), so a cache has something to hit."""
    rng = random.Random(seed)
    corpus = stdlib_docstrings()
    unique = int(round(n * (1 - repeat_fraction)))
    if unique > len(corpus):
        raise ValueError(f"asked for {unique} unique texts; the local standard library has {len(corpus)}")
    picked = rng.sample(range(len(corpus)), unique)
    docs = [Document(f"{prefix}-{i}", corpus[j][1], None, {"source": corpus[j][0]}) for i, j in enumerate(picked)]
    weights = [1.0 / (rank + 1) for rank in range(max(unique, 1))]
    for i in range(unique, n):
        j = picked[rng.choices(range(unique), weights)[0]]
        docs.append(Document(f"{prefix}-{i}", corpus[j][1], None, {"source": corpus[j][0], "repeat": "true"}))
    rng.shuffle(docs)
    return docs


def long_documents(n: int | None = None, min_words: int = 2000, max_words: int = 10_000) -> list[Document]:
    """Long documents of real prose from this machine, longest first: the docstrings of a whole
    standard-library module joined into one text, and the long descriptions of installed packages
    (their READMEs). Each between ``min_words`` and ``max_words`` words (longer ones are cut at a
    paragraph); ids ``long-<module or package>``, metadata ``source``."""
    import importlib.metadata

    groups: dict[str, list[str]] = {}
    for name, doc in stdlib_docstrings():
        module = name.rsplit(".", 1)[0] if "." in name else name  # a module's docstring joins its parent
        groups.setdefault(module, []).append(doc)
    texts = {f"long-{m}": ("stdlib " + m, "\n\n".join(docs)) for m, docs in groups.items()}
    for dist in importlib.metadata.distributions():
        body = dist.metadata.get_payload() or dist.metadata.get("Description") or ""  # type: ignore[attr-defined]
        name = dist.metadata["Name"]
        if name and body and f"long-{name}" not in texts:
            texts[f"long-{name}"] = (f"package {name}", body)
    out = []
    for doc_id, (source, text) in texts.items():
        paragraphs, kept, words = text.split("\n\n"), [], 0
        for p in paragraphs:
            if words + len(p.split()) > max_words:
                break
            kept.append(p)
            words += len(p.split())
        if words >= min_words:
            out.append(Document(doc_id, "\n\n".join(kept), None, {"source": source}))
    out.sort(key=lambda d: (-len(d.text.split()), d.id))
    return out[:n] if n is not None else out
