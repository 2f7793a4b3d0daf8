"""The ledger interface: what the polling thread does with a batch that has left the pipeline."""

from __future__ import annotations

import abc
import logging
import time

from confluent_kafka import KafkaException

from schemas.errors import TransientError
from worker.core.records import Batch, Written
from worker.process import metrics

log = logging.getLogger(__name__)


class Ledger(abc.ABC):
    """What becomes of the input of finished batches: offsets stored and committed, or records
    acknowledged. Every call runs on the polling thread (the consumers are not thread-safe); the
    sink thread never calls a ledger (a transaction's offsets reach it with the batch:
    ``Written.committed``)."""

    @abc.abstractmethod
    def finished(self, batch: Batch, written: Written) -> int:
        """``batch`` left the pipeline, with what the sink ``written`` of it: keep what its input owes
        (its written offsets, or an acknowledgement per record). Returns how many of its records go
        back to the group unwritten."""

    @abc.abstractmethod
    def tick(self) -> None:
        """Called every turn of the loop: send what is kept when it is due."""

    @abc.abstractmethod
    def _send(self, sync: bool) -> bool:
        """Send what is kept; True when nothing is left. Raises ``KafkaException`` or
        ``TransientError`` on a failure (what was kept stays for the next call)."""

    def flush(self, sync: bool, attempts: int = 1) -> bool:
        """Send what is kept; True when nothing is left. A failure is retried by the next call (what
        was kept stays), or here up to ``attempts`` times, 0.5 s apart."""
        for attempt in range(attempts):
            t0 = time.perf_counter()
            try:
                done = self._send(sync)
                metrics.COMMIT_SECONDS.labels("sync" if sync else "async").observe(time.perf_counter() - t0)
                return done
            except (KafkaException, TransientError) as exc:
                metrics.COMMIT_FAILURES.inc()
                last = attempt == attempts - 1
                log.log(logging.ERROR if last and attempts > 1 else logging.WARNING, "commit failed (%s)%s", exc,
                        "; the next commit retries it" if last else "; retrying")
                if not last:
                    time.sleep(0.5)
        return False
