"""Offsets and commits: the last step of the chain, and the only place that commits.

The delivery contract lives here: an offset is *stored* only once its batch has left the pipeline
(Milvus and the broker acknowledged it) and only for partitions this member still owns; stored
offsets are *committed* at most every ``interval`` seconds (0: after every store), and
synchronously on revoke and at shutdown. A failed commit leaves the stored offsets in place, so the
next commit carries them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Container, Mapping

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from worker.records import TopicPartitionKey

log = logging.getLogger(__name__)


class OffsetCommitter:
    """Stores the next offsets of finished batches in the consumer and commits them."""

    def __init__(self, consumer: Consumer, interval: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.consumer = consumer
        self.interval = interval
        self._clock = clock
        self._dirty = False
        self._last = clock()

    def store(self, offsets: Mapping[TopicPartitionKey, int], owned: Container[TopicPartitionKey]) -> None:
        """Store ``offsets`` (next offset per partition) of a finished batch; partitions not ``owned``
        any more (revoked or lost meanwhile) are skipped: their new owner redoes them."""
        mine = [TopicPartition(t, p, o) for (t, p), o in offsets.items() if (t, p) in owned]
        if mine:
            self.consumer.store_offsets(offsets=mine)
            self._dirty = True

    def tick(self) -> None:
        """Commit what is stored if the interval has passed (every call with interval 0)."""
        if self.interval == 0:
            self.commit(sync=True)
        elif self._clock() - self._last >= self.interval:
            self.commit(sync=False)

    def commit(self, sync: bool, attempts: int = 1) -> bool:
        """Commit the stored offsets; True when nothing is left uncommitted. A failure is retried by
        the next call (the stored offsets stay), or here up to ``attempts`` times, 0.5 s apart."""
        self._last = self._clock()
        for attempt in range(attempts):
            if not self._dirty:
                return True
            try:
                if sync:
                    self.consumer.commit(asynchronous=False)
                else:
                    self.consumer.commit(asynchronous=True)
                self._dirty = False
                return True
            except KafkaException as exc:
                if exc.args and exc.args[0].code() == KafkaError._NO_OFFSET:
                    self._dirty = False
                    return True
                last = attempt == attempts - 1
                log.log(logging.ERROR if last and attempts > 1 else logging.WARNING, "commit failed (%s)%s", exc,
                        "; the next commit retries it" if last else "; retrying")
                if not last:
                    time.sleep(0.5)
        return False
