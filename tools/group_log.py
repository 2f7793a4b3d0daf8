"""What a worker's log says about its place in the consumer group: the partitions each rebalance
gave it or took away, read from the lines ``worker.core.loop.Worker`` writes (``assigned [..]``,
``revoked [..]``, ``lost [..]``). Shared by the fault suite and the bench's rebalance rows."""

from __future__ import annotations

import re

_REBALANCE = re.compile(r" (assigned|revoked|lost) \[([0-9, ]*)\]")


def rebalance_events(log: str) -> list[tuple[str, set[int]]]:
    """Each "assigned", "revoked" and "lost" line of a worker's log: (what, partitions), in order.
    Under the cooperative protocols an "assigned" line adds partitions, a revoke takes some away."""
    events = []
    for line in log.splitlines():
        m = _REBALANCE.search(line)
        if m:
            events.append((m[1], {int(p) for p in m[2].split(",") if p.strip()}))
    return events


def owned(log: str) -> set[int]:
    """The partitions a worker owns after the last rebalance its log shows."""
    now: set[int] = set()
    for what, partitions in rebalance_events(log):
        now = now | partitions if what == "assigned" else now - partitions
    return now


def owns_partitions(log: str) -> bool:
    """The worker owns at least one partition now (an ``assigned []`` line is not enough)."""
    return bool(owned(log))
