"""Milvus filter expressions with a producer's text in them, written so that the text stays data.

Document ids come from the input topic: anyone who can produce a record chooses them. pymilvus'
``get(ids=…)`` and ``delete(ids=…)`` paste them into ``id in ['…']`` as they are, so an id such as
``a'] or id not in ['`` turned a one-row delete into a delete of every row, and an id with a
backslash made every read of its batch fail. Every expression that names an id is built here.

A string literal is double-quoted, with the four characters that a Milvus string literal cannot hold
as they are written as escapes: ``\\`` and ``"`` (which would end or bend the literal), LF and CR (a
literal may not span lines). Milvus' grammar (a C-like string literal) and milvus-lite's parser both
read these four escapes; every other character, NUL and non-ASCII included, stands for itself.
"""

from __future__ import annotations

from collections.abc import Iterable

_ESCAPES = str.maketrans({"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r"})


def string_literal(text: str) -> str:
    """``text`` as a Milvus string literal that reads back as exactly ``text``."""
    return '"' + text.translate(_ESCAPES) + '"'


def field_in(field: str, values: Iterable[str]) -> str:
    """``<field> in ["…", …]``: the rows whose VARCHAR ``field`` is one of ``values``. ``field`` is
    this module's caller's own name, never a record's."""
    if not field.isidentifier():
        raise ValueError(f"not a field name: {field!r}")
    return f"{field} in [{', '.join(string_literal(v) for v in values)}]"
