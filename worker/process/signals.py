"""Graceful stop on SIGTERM/SIGINT: the first signal asks the loop to stop fetching, finish what is
in flight, commit and exit; a second one exits at once (nothing unfinished is committed)."""

from __future__ import annotations

import logging
import os
import signal

log = logging.getLogger(__name__)


class GracefulStop:
    """``requested`` turns True on the first signal; ``install`` must run on the main thread."""

    def __init__(self) -> None:
        self.requested = False
        self._count = 0

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)

    def _on_signal(self, signum, _frame) -> None:
        self._count += 1
        if self._count > 1:
            log.warning("second signal: exiting at once; unfinished batches are not committed")
            os._exit(128 + signum)
        log.info("signal %s: stop fetching, finish in-flight batches, commit, exit", signum)
        self.requested = True
