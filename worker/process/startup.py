"""Where a worker's start-up went: the time from the process's start to its first assignment, by phase.

A scaled-out pod and a restarted worker pay all of it before they take a record, so the worker says
it once, when it is first assigned partitions (``/readyz`` then answers 200)::

    started in 4.6s: python and imports 0.9s, models 2.8s, Milvus and Redis 0.4s, joining the group 0.5s

Phases are marked in order (:meth:`StartClock.mark`); each one runs from the previous mark (the
first from the process's own start, read from ``/proc`` where there is one).
"""

from __future__ import annotations

import os
import time


def process_age() -> float:
    """Seconds since this process started (0.0 where the system does not say)."""
    try:
        with open(f"/proc/{os.getpid()}/stat") as f:
            started_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - started_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


class StartClock:
    """Phases of one start-up; :meth:`account` reads them out once everything is marked."""

    def __init__(self) -> None:
        self._begun = time.monotonic() - process_age()
        self._last = self._begun
        self.phases: list[tuple[str, float]] = []
        self.told = False

    def mark(self, phase: str) -> None:
        """``phase`` ends now (it began at the previous mark)."""
        now = time.monotonic()
        self.phases.append((phase, now - self._last))
        self._last = now

    def account(self) -> str:
        """``started in <total>s: <phase> <seconds>s, …`` (the module doc)."""
        total = self._last - self._begun
        return f"started in {total:.1f}s: " + ", ".join(f"{p} {s:.1f}s" for p, s in self.phases)
