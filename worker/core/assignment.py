"""What this member owns: its partitions, which are at their end, whether they are paused, and
since when it has had none. Lives on the polling thread (rebalance callbacks run there too).

Pausing: a full pipeline first only stops consuming (``Worker``); after ``pause_after`` seconds
full, the whole assignment is paused, and resumed once a batch slot frees. librdkafka keeps the
pause state per partition object across revoke/lost and reassignment (a partition lost while
paused comes back paused), so the state is re-applied to the whole assignment after each assign.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from connectors.kafka import access_refused
from worker.core.records import TopicPartitionKey
from worker.process import metrics

log = logging.getLogger(__name__)


class Assignment:
    """``add`` / ``remove`` partitions, track their ends and the pause state; ``drained`` says when
    the input is done (for ``--stop-when-idle``)."""

    def __init__(self, pause_after: float, join_grace: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.pause_after = pause_after
        #: A member without partitions counts as drained only once it has had none this long.
        self.join_grace = join_grace
        self._clock = clock
        self.partitions: set[TopicPartitionKey] = set()
        self._at_end: dict[TopicPartitionKey, bool] = {}
        self._ends: dict[TopicPartitionKey, int] = {}
        self.paused = False
        self.pauses = 0
        self._full_since: float | None = None
        self._reapply = False
        self._unassigned_since: float | None = clock()
        self._idle_since: float | None = None
        #: The group member id under which the partitions were assigned (librdkafka's, at each assign).
        self.member_id: str | None = None
        #: When a rebalance last changed the assignment after the first one (None: none has).
        self._rebalanced_at: float | None = None
        self._assigned_once = False

    def __contains__(self, tp: object) -> bool:
        return tp in self.partitions

    def __len__(self) -> int:
        return len(self.partitions)

    def add(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.member_id = consumer.memberid()
        if self._assigned_once:
            self._rebalanced_at = self._clock()
        self._assigned_once = True
        for p in partitions:
            self.partitions.add((p.topic, p.partition))
            self._at_end[(p.topic, p.partition)] = False
        if self.paused and partitions:
            consumer.pause(partitions)
        self._reapply = True  # once the library has assigned them (after the callback returns)
        # An assignment (even an empty one) ends any wait for a rejoin.
        if self.partitions:
            self._unassigned_since = None
        elif self._unassigned_since is None:
            self._unassigned_since = self._clock()

    def remove(self, tps: Iterable[TopicPartitionKey], lost: bool) -> None:
        self._rebalanced_at = self._clock()
        for tp in tps:
            self.partitions.discard(tp)
            self._at_end.pop(tp, None)
        if lost:
            # Lost partitions come back through a rejoin: never take their absence for the end of input.
            self._unassigned_since = None
        elif not self.partitions:
            self._unassigned_since = self._clock()

    def same_member(self, consumer: Consumer) -> bool:
        """Whether the consumer is still the group member its partitions were assigned to. A member
        evicted (a freeze past the session timeout) rejoins under a new member id; until the
        rebalance callbacks of that rejoin have been served, what it believes it owns is void.
        True when it owns nothing (there is nothing to write)."""
        if not self.partitions:
            return True
        try:
            return self.member_id is not None and consumer.memberid() == self.member_id
        except RuntimeError:  # the consumer is closed
            return False

    def at_end(self, tp: TopicPartitionKey, yes: bool) -> None:
        """A record (``yes=False``) or the end of the partition (``yes=True``) was seen on ``tp``."""
        self._at_end[tp] = yes

    def ends_reached(self) -> dict[TopicPartitionKey, int]:
        """The partitions at their end now, with that end offset (from the partition-end event, i.e.
        the broker's fetch answer, which Tansu gets right where its ListOffsets answers short).
        Called from other threads (``worker.commands.migrate``): it reads copies."""
        at_end, ends = dict(self._at_end), dict(self._ends)
        return {tp: off for tp, off in ends.items() if at_end.get(tp)}

    def records(self, msgs: list) -> list:
        """The records among what the consumer handed out: partition ends are noted, a fatal error
        is raised (``KafkaException``), other errors are logged (librdkafka retries them)."""
        good = []
        for m in msgs:
            err = m.error()
            if err is None:
                self._at_end[(m.topic(), m.partition())] = False
                good.append(m)
            elif err.code() == KafkaError._PARTITION_EOF:
                self._at_end[(m.topic(), m.partition())] = True
                self._ends[(m.topic(), m.partition())] = m.offset()
            elif (denied := access_refused(err, "reading its input (Read on the input topic and on the group)")):
                raise denied
            elif err.fatal() or err.code() == KafkaError._FATAL:
                # librdkafka's _FATAL event (a static member fenced by another with its id) does not
                # carry the fatal flag: the consumer is dead either way.
                raise KafkaException(err)
            else:
                log.warning("consumer: %s", err)
        return good

    def idle_for(self, seconds: float, quiet: bool, last_error: float) -> bool:
        """``quiet`` (nothing batching or in flight) and the input drained for ``seconds`` in a row. A
        cluster error (broker down) within ``seconds`` is never taken for the end of the input."""
        now = self._clock()
        if quiet and self.drained() and now - last_error >= seconds:
            if self._idle_since is None:
                self._idle_since = now
            return now - self._idle_since >= seconds
        self._idle_since = None
        return False

    def drained(self) -> bool:
        """Every owned partition is at its end; with none owned, none for ``join_grace`` seconds; and
        no rebalance within ``join_grace``. (After members join and leave, partitions they gave up
        can stay unowned for a while, as the coordinator holds the next join: a member whose own
        partitions were drained stopped 8 s after two members left, before the coordinator handed
        it theirs, and their records stayed behind.)"""
        if self._rebalanced_at is not None and self._clock() - self._rebalanced_at <= self.join_grace:
            return False
        if not self.partitions:
            since = self._unassigned_since
            return since is not None and self._clock() - since > self.join_grace
        return all(self._at_end.get(tp, False) for tp in self.partitions)

    def update_pause(self, consumer: Consumer, full: bool) -> None:
        """Pause the assignment once the pipeline has been ``full`` for ``pause_after`` s; resume when
        it is not; re-apply the state after an assignment."""
        now = self._clock()
        if not full:
            self._full_since = None
        elif self._full_since is None:
            self._full_since = now
        pause = self._full_since is not None and now - self._full_since >= self.pause_after
        if pause == self.paused and not self._reapply:
            return
        self._reapply = False
        parts = consumer.assignment()
        if parts:
            (consumer.pause if pause else consumer.resume)(parts)
        self.pauses += pause and not self.paused
        self.paused = pause
        metrics.PAUSED_PARTITIONS.set(len(parts) if pause else 0)
