"""Consumer-group lag, computed the way KEDA's Kafka scaler computes it.

Per partition: end offset (ListOffsets latest) − committed offset. A partition with no committed
offset counts, like KEDA, by ``offsetResetPolicy``: ``latest`` → 1 (0 with
``scaleToZeroOnInvalidOffset``), ``earliest`` → the end offset (0 with ``scaleToZeroOnInvalidOffset``).
KEDA then asks for ``ceil(total lag / lagThreshold)`` replicas, capped at the partition count (or at
the partitions with lag, with ``limitToPartitionsWithLag``).

Note: the local Tansu broker answers ListOffsets(latest) with the last batch's base offset + 1
(a bug of that broker); real Kafka and librdkafka's mock cluster answer with the log end.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

INVALID_OFFSET = -1001


@dataclass(frozen=True)
class PartitionLag:
    topic: str
    partition: int
    end_offset: int
    committed: int | None  # None: the group never committed this partition
    lag: int


def partition_lag(end: int, committed: int | None, offset_reset_policy: str = "latest",
                  scale_to_zero_on_invalid_offset: bool = False) -> int:
    """KEDA's lag for one partition."""
    if committed is None or committed < 0:
        if scale_to_zero_on_invalid_offset:
            return 0
        return 1 if offset_reset_policy == "latest" else end
    return end - committed


def group_lag(admin: AdminClient, group: str, topic: str, offset_reset_policy: str = "latest",
              scale_to_zero_on_invalid_offset: bool = False, timeout: float = 10.0) -> list[PartitionLag]:
    """Lag of ``group`` on every partition of ``topic``. Raises ``RuntimeError`` for a missing topic."""
    if offset_reset_policy not in ("latest", "earliest"):
        raise ValueError("offset_reset_policy must be 'latest' or 'earliest'")
    meta = admin.list_topics(topic, timeout=timeout).topics.get(topic)
    if meta is None or meta.error is not None or not meta.partitions:
        raise RuntimeError(f"topic {topic!r} does not exist")
    tps = [TopicPartition(topic, p) for p in sorted(meta.partitions)]
    ends = {tp.partition: f.result(timeout).offset for tp, f in
            admin.list_offsets({tp: OffsetSpec.latest() for tp in tps}, request_timeout=timeout).items()}
    fut = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group, tps)],
                                            request_timeout=timeout)[group]
    committed = {tp.partition: tp.offset for tp in fut.result(timeout).topic_partitions}
    out = []
    for tp in tps:
        c = committed.get(tp.partition, INVALID_OFFSET)
        c = None if c is None or c < 0 else c
        lag = partition_lag(ends[tp.partition], c, offset_reset_policy, scale_to_zero_on_invalid_offset)
        out.append(PartitionLag(topic, tp.partition, ends[tp.partition], c, lag))
    return out


def desired_replicas(lags: list[PartitionLag], lag_threshold: int, limit_to_partitions_with_lag: bool = False,
                     max_replicas: int | None = None) -> int:
    """The replica count KEDA's Kafka scaler aims for with this lag (before min/max clamping by HPA)."""
    total = sum(p.lag for p in lags)
    cap = sum(1 for p in lags if p.lag > 0) if limit_to_partitions_with_lag else len(lags)
    want = min(math.ceil(total / lag_threshold), cap)
    return min(want, max_replicas) if max_replicas is not None else want


def as_json(lags: list[PartitionLag]) -> dict:
    return {"partitions": [asdict(p) for p in lags], "total_lag": sum(p.lag for p in lags)}
