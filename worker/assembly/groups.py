"""The group type and the delivery, asked once: one table (:data:`KINDS`) gives, for each
(``EMBEDSTREAM_GROUP_TYPE``, ``EMBEDSTREAM_DELIVERY``), the group's side (its consumer and its member's
loop) with the delivery and its ledger (the sink thread's half and the polling thread's:
``worker.core.delivery``, ``worker.core.ledger``). Nothing else in assembly asks which runs.

| group type | delivery      | consumer                  | delivery      | ledger              | member        |
|------------|---------------|---------------------------|---------------|---------------------|---------------|
| consumer   | at-least-once | joins while models load   | `AtLeastOnce` | `OffsetLedger`      | `Worker`      |
| consumer   | exactly-once  | joins while models load   | `ExactlyOnce` | `TransactionLedger` | `Worker`      |
| share      | at-least-once | a share consumer, later   | `AtLeastOnce` | `ShareLedger`       | `ShareWorker` |
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable
from typing import Any, NamedTuple, cast

from confluent_kafka import Consumer

from connectors.kafka import make_admin, make_consumer, make_output_producer, make_share_consumer, prepare_share_group
from connectors.transactions import Transactions, transactional_id
from schemas.errors import ConfigError
from worker.core.assignment import Assignment
from worker.core.delivery import AtLeastOnce, Delivery, ExactlyOnce
from worker.core.early_join import EarlyJoin
from worker.core.ledger import OffsetLedger, ShareLedger, TransactionLedger
from worker.core.loop import Worker
from worker.core.member import Chain, Member
from worker.core.share_loop import ShareWorker
from worker.core.stats import RunStats
from worker.process import metrics
from worker.process.startup import StartClock
from worker.settings import Settings

log = logging.getLogger(__name__)


class MemberParts(NamedTuple):
    """What every member's loop takes besides its chain and ledger."""

    health: metrics.Health
    max_inflight: int
    session_s: float
    startup: StartClock | None
    on_progress: Callable[[RunStats], None] | None
    stats: RunStats | None


def at_least_once(s: Settings, consumer: Consumer, delivery_timeout_s: float) -> tuple[Delivery, OffsetLedger]:
    """The idempotent producer, whose records may wait ``delivery_timeout_s`` in librdkafka (the
    fence's lease bounds it), and offsets the consumer commits."""
    return _producer(s, delivery_timeout_s), OffsetLedger(consumer, s.commit_interval_ms / 1000)


def exactly_once(s: Settings, consumer: Consumer, delivery_timeout_s: float) -> tuple[Delivery, OffsetLedger]:
    """One transaction a group, and every offset through the transactions (``delivery_timeout_s`` is
    not theirs: ``open_transactions``)."""
    txn = open_transactions(s)
    return ExactlyOnce(txn, s.kafka_timeout_seconds), TransactionLedger(consumer, s.commit_interval_ms / 1000, txn)


def _producer(s: Settings, delivery_timeout_s: float) -> AtLeastOnce:
    return AtLeastOnce(lambda: make_output_producer(s.kafka_common(), delivery_timeout_s), s.kafka_timeout_seconds)


class ConsumerGroup:
    """A consumer group's side: its member joins at once, while the models load
    (``worker.core.early_join``), and runs ``worker.core.loop.Worker``; ``durable`` makes its delivery
    and ledger (:func:`at_least_once` or :func:`exactly_once`)."""

    def __init__(self, s: Settings, health: metrics.Health,
                 durable: Callable[[Settings, Consumer, float], tuple[Delivery, OffsetLedger]]) -> None:
        self.early = EarlyJoin(open_consumer(s, health), s.input_topic)
        self._durable = durable
        #: A consumer group's records carry no delivery count.
        self.max_deliveries: int | None = None
        # EarlyJoin passes every call on to its consumer and keeps the loop's call-backs at subscribe
        self.consumer = cast(Consumer, self.early)
        self.ledger: OffsetLedger | None = None

    def durability(self, s: Settings, max_inflight: int, delivery_timeout_s: float) -> Delivery:
        """The delivery for the sink (its ledger kept for the member)."""
        delivery, self.ledger = self._durable(s, self.consumer, delivery_timeout_s)
        return delivery

    def member(self, s: Settings, chain: Chain, parts: MemberParts) -> Member:
        assert self.ledger is not None, "durability() comes first"
        max_poll_s = int(s.kafka.get("max.poll.interval.ms", 300_000)) / 1000
        # Hold a full pipeline at most a third of max.poll.interval before pausing; a member without
        # partitions waits two session timeouts (a rejoin) before it counts as idle.
        assignment = Assignment(pause_after=min(5.0, max_poll_s / 3), join_grace=max(10.0, 2 * parts.session_s))
        worker = Worker(self.consumer, s.input_topic, chain, self.ledger, assignment,
                        max_inflight=parts.max_inflight, **_common(s, parts))
        worker.rebalance.startup = parts.startup
        worker.leave_before_close = s.group_instance_id is None  # a static member keeps its partitions
        return worker

    def abandon(self) -> None:
        """A failed start: leave the group now rather than at the end of the session."""
        self.early.consumer.close()


class ShareGroup:
    """A share group's side (KIP-932): its member joins at its first poll and runs
    ``worker.core.share_loop.ShareWorker``; at-least-once's producer, each input record acknowledged."""

    def __init__(self, s: Settings, health: metrics.Health) -> None:
        self.health = health
        #: A record delivered more often becomes a dead letter (``delivery_count_exceeded``).
        self.max_deliveries: int | None = s.share_max_deliveries
        #: How long the broker locks a record to a member, in seconds (None: not known).
        self.lock_s: float | None = None
        self.consumer: Any = None
        self.ledger: ShareLedger | None = None

    def durability(self, s: Settings, max_inflight: int, delivery_timeout_s: float) -> Delivery:
        """Opens the share consumer of ``EMBEDSTREAM_GROUP_ID`` (a group that starts at the beginning
        of the topic; a poll acquires at most the batches allowed in flight) and its ledger."""
        try:
            self.lock_s = prepare_share_group(s.kafka_common(), s.group_id)
        except Exception as exc:  # an ACL, or a broker without share groups: say what that means
            log.warning("could not read or set share.auto.offset.reset=earliest on share group %s (%s): a new group "
                        "then starts at the end of the topic; set it with kafka-configs.sh --entity-type groups",
                        s.group_id, exc)
        self.consumer = make_share_consumer(s.kafka_common(), s.group_id, error_cb=self.health.on_kafka_error,
                                            **{"max.poll.records": max_inflight * s.max_batch_size})
        self.ledger = ShareLedger(self.consumer, s.kafka_timeout_seconds)
        return _producer(s, delivery_timeout_s)

    def member(self, s: Settings, chain: Chain, parts: MemberParts) -> Member:
        assert self.ledger is not None, "durability() comes first"
        share = ShareWorker(self.consumer, s.input_topic, chain, self.ledger, input_partitions(s), **_common(s, parts))
        share.startup = parts.startup
        share.lock_s = self.lock_s
        log.info("share group %s: records locked to a member for %s, up to %d records a poll", s.group_id,
                 "an unknown time" if share.lock_s is None else f"{share.lock_s:.1f}s",
                 parts.max_inflight * s.max_batch_size)
        return share

    def abandon(self) -> None:
        return None  # not joined yet


def _common(s: Settings, parts: MemberParts) -> dict[str, Any]:
    return dict(shutdown_grace=s.shutdown_grace_seconds, health=parts.health, backoff_max=s.retry_backoff_max_seconds,
                on_progress=parts.on_progress, stats=parts.stats)


Side = ConsumerGroup | ShareGroup

#: (EMBEDSTREAM_GROUP_TYPE, EMBEDSTREAM_DELIVERY) → the group's side, made with the settings and the
#: health before the models load (share with exactly-once is refused by the settings: share groups
#: have no transactions).
KINDS: dict[tuple[str, str], Callable[[Settings, metrics.Health], Side]] = {
    ("consumer", "at-least-once"): lambda s, health: ConsumerGroup(s, health, at_least_once),
    ("consumer", "exactly-once"): lambda s, health: ConsumerGroup(s, health, exactly_once),
    ("share", "at-least-once"): ShareGroup,
}


def join(s: Settings, health: metrics.Health) -> Side:
    """The side of :data:`KINDS` for ``s``, made now (a consumer group's member joins at once): the
    one place the group type and the delivery are asked."""
    try:
        kind = KINDS[(s.group_type, s.delivery)]
    except KeyError:
        raise ConfigError(f"EMBEDSTREAM_GROUP_TYPE={s.group_type} with EMBEDSTREAM_DELIVERY={s.delivery} is not "
                          f"served: choose one of {sorted(KINDS)}") from None
    return kind(s, health)


def open_transactions(s: Settings) -> Transactions:
    """Exactly-once: the worker's transactional producer, its ``transactional.id`` from the group and
    the static member id (the pod name under the chart), else host and process id (then a killed
    worker's open transaction ends only by the broker's ``transaction.timeout.ms``).

    Its records may wait ``EMBEDSTREAM_KAFKA_TIMEOUT_SECONDS``, longer than the fence's lease that
    bounds the at-least-once producer's: a zombie's records wake into a transaction that its commit
    check (ownership and lease, ``worker.steps.writing.sink``) aborts, so read_committed readers never see
    them; and a record that times out costs an epoch bump that a broker may refuse (Tansu does)."""
    member = s.group_instance_id or f"{socket.gethostname()}-{os.getpid()}"
    tid = transactional_id(s.group_id, member)
    log.info("exactly-once delivery: transactional.id %s", tid)
    txn_timeout_ms = int(s.kafka.get("transaction.timeout.ms", max(60.0, s.kafka_timeout_seconds) * 1000))
    # librdkafka refuses a transactional producer whose records may wait longer than its transaction
    delivery_timeout_s = min(s.kafka_timeout_seconds, txn_timeout_ms / 1000)
    conf = {"transactional.id": tid, "transaction.timeout.ms": txn_timeout_ms}
    return Transactions(lambda: make_output_producer(s.kafka_common(), delivery_timeout_s, **conf),
                        s.kafka_timeout_seconds, keep_open_s=txn_timeout_ms / 2000)


def input_partitions(s: Settings) -> list[tuple[str, int]]:
    """Every partition of the input topic (``check_topics`` made sure it exists)."""
    meta = make_admin(s.kafka_common()).list_topics(s.input_topic, timeout=s.kafka_timeout_seconds)
    return [(s.input_topic, p) for p in sorted(meta.topics[s.input_topic].partitions)]


def open_consumer(s: Settings, health: metrics.Health) -> Consumer:
    """The group's consumer, reporting lag to the gauge and its errors to ``health``."""
    return make_consumer(s.kafka_common(), s.group_id, s.group_instance_id, s.group_protocol, **{
        # the lag gauge's period: a passthrough value is taken (EMBEDSTREAM_KAFKA__STATISTICS_INTERVAL_MS)
        "statistics.interval.ms": int(s.kafka.get("statistics.interval.ms", 5000)),
        "stats_cb": metrics.record_lag_from_stats,
        "error_cb": health.on_kafka_error})
