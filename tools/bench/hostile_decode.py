"""The polling thread's time on the records built to hold it: each worst input at 1 MB (the default
``EMBEDSTREAM_MAX_TEXT_BYTES``), validated as the worker validates it, against an ordinary 1 MB JSON
document in the same run (the ratio is the figure: a linear decoder keeps it near 1).

The nesting check of earlier releases (a backtracking pattern, kept here to be measured against) is
timed on the same input at 24 KB, 48 KB and 96 KB, where its time grows with the square of the length.
Run it as ``python -m tools.bench.hostile_decode``; it prints a table and writes nothing.
"""

from __future__ import annotations

import json
import re
import time

from tools.memory_source import MemoryMessage
from worker.steps.polling.validate import Validator

SIZE = 1_000_000
#: The nesting check before it was made linear: a string that fails to close is tried again from every
#: later quote.
OLD_PATTERN = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def _old_nests_deeper(text: str, limit: int = 100) -> bool:
    depth = 0
    for m in OLD_PATTERN.finditer(text):
        c = m.group()
        if c in "[{":
            depth += 1
            if depth > limit:
                return True
        elif c in "]}":
            depth -= 1
    return False


def _fill(head: bytes, unit: bytes, tail: bytes, size: int = SIZE) -> bytes:
    return head + unit * ((size - len(head) - len(tail)) // len(unit)) + tail


def worst_inputs(size: int = SIZE) -> dict[str, bytes]:
    """The inputs, each about ``size`` bytes."""
    return {
        "ordinary JSON document (baseline)": json.dumps({"id": "k", "text": "word " * (size // 5 - 10)}).encode(),
        "escaped quotes, then 101 '['": _fill(b'{"id": "k", "text": "', b'\\"', b"[" * 101, size),
        "quotes that never close, then '['": _fill(b'{"text": ', b'"', b"[" * 101, size),
        "'[]' pairs": _fill(b'{"m": ', b"[]", b"}", size),
        "nested 500,000 deep": b"[" * (size // 2) + b"]" * (size // 2),
        "lone-surrogate escapes": _fill(b'{"id": "k", "text": "', b"\\ud800", b'"}', size),
        "integer of 5,000 digits, padded": _fill(b'{"id": "k", "text": "', b"x", b'", "event_time": '
                                                 + b"9" * 5_000 + b"}", size),
    }


def timed(fn, repeat: int = 3) -> float:
    """The best of ``repeat`` runs of ``fn``, in seconds."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    validator = Validator(2 * SIZE, lambda name: "m")
    rows = []
    for name, value in worst_inputs().items():
        msg = MemoryMessage(b"k", value)
        entry = validator.validate(msg)
        seconds = timed(lambda msg=msg: validator.validate(msg))
        rows.append((name, len(value), seconds, getattr(entry, "reason", type(entry).__name__)))
    base = rows[0][2]
    print(f"{'input':42} {'bytes':>10} {'ms':>8} {'× baseline':>10}  outcome")
    for name, size, seconds, outcome in rows:
        print(f"{name:42} {size:>10,} {seconds * 1000:>8.1f} {seconds / base:>10.2f}  {outcome}")
    print("\nthe earlier nesting check on escaped quotes, then 101 '[':")
    for size in (24_000, 48_000, 96_000):
        text = _fill(b'{"id": "k", "text": "', b'\\"', b"[" * 101, size).decode()
        print(f"  {size:>7,} bytes: {timed(lambda text=text: _old_nests_deeper(text), repeat=1):7.2f} s")


if __name__ == "__main__":
    main()
