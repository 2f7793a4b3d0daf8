"""The runtime stays in small pieces: no class of ``worker``, ``connectors`` or ``schemas`` over
180 lines of code and no function over 50 (comments, docstrings and blank lines not counted: a piece
at its bound is split by what it owns, never squeezed by deleting the words that explain it, the way
the loop's rebalance call-backs, the sink's planning and the model's forward passes were split)."""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_CLASS_LINES = 180
MAX_FUNCTION_LINES = 50

_NOT_CODE = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
             tokenize.ENCODING, tokenize.ENDMARKER}
_DEFS = (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def code_lines(source: str) -> set[int]:
    """The lines of ``source`` that hold code: a token other than a comment, docstrings left out."""
    lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in _NOT_CODE:
            lines.update(range(tok.start[0], tok.end[0] + 1))
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, *_DEFS)) and node.body and isinstance(node.body[0], ast.Expr) \
                and isinstance(node.body[0].value, ast.Constant) and isinstance(node.body[0].value.value, str):
            doc = node.body[0]
            lines.difference_update(range(doc.lineno, doc.end_lineno + 1))  # type: ignore[operator]
    return lines


def _pieces() -> list[tuple[int, str, str]]:
    out = []
    for folder in ("worker", "connectors", "schemas"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            source = path.read_text()
            code = code_lines(source)
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, _DEFS):
                    kind = "class" if isinstance(node, ast.ClassDef) else "function"
                    lines = sum(1 for n in range(node.lineno, node.end_lineno + 1) if n in code)  # type: ignore[operator]
                    out.append((lines, kind, f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"))
    return out


def test_code_lines_leave_out_comments_docstrings_and_blank_lines():
    source = "\n".join([
        "def f(x):",
        '    """Its docstring,',
        '    on two lines."""',
        "",
        "    # a comment",
        "    y = x  # a remark",
        '    return """a string',
        '    of two lines"""',
        "",
    ])
    assert code_lines(source) == {1, 6, 7, 8}


def test_no_runtime_class_or_function_outgrows_its_bound():
    pieces = _pieces()
    assert len(pieces) > 500  # the whole runtime was read
    too_long = [(n, where) for n, kind, where in pieces
                if n > (MAX_CLASS_LINES if kind == "class" else MAX_FUNCTION_LINES)]
    assert too_long == []
