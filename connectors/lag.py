"""Consumer-group lag, computed the way KEDA's Kafka scaler computes it.

Per partition: end offset (ListOffsets latest) − committed offset. A partition with no committed
offset counts, like KEDA, by ``offsetResetPolicy``: ``latest`` → 1 (0 with
``scaleToZeroOnInvalidOffset``); ``earliest`` → what a consumer starting there can still fetch, the
end offset − the log's start offset (KEDA 2.21 and later, kedacore/keda#7937: records that retention
deleted are not lag), or the end offset as KEDA before 2.21 counts it (``retained_only=False``);
0 with ``scaleToZeroOnInvalidOffset``.
KEDA then asks for ``ceil(total lag / lagThreshold)`` replicas, capped at the partition count (or at
the partitions with lag, with ``limitToPartitionsWithLag``).

Note: the local Tansu broker answers ListOffsets(latest) with the last batch's base offset + 1
(a bug of that broker); real Kafka and librdkafka's mock cluster answer with the log end.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec


@dataclass(frozen=True)
class PartitionLag:
    topic: str
    partition: int
    end_offset: int
    committed: int | None  # None: the group never committed this partition
    lag: int
    start_offset: int | None = None  # the log's start, read only where a missing commit counts from it


#: The first KEDA release that counts a missing commit under ``earliest`` from the log's start.
RETAINED_ONLY_SINCE = (2, 21)


def keda_counts_retained(version: str) -> bool:
    """Whether KEDA ``version`` ("2.21", "2.20.1", "v2.19") counts a partition without a commit
    under ``earliest`` as its retained records. Raises ``ValueError`` for a version it cannot read."""
    parts = version.strip().lstrip("v").split(".")
    try:
        major, minor = int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    except ValueError:
        raise ValueError(f"not a KEDA version: {version!r} (write it as 2.21 or 2.20.1)") from None
    return (major, minor) >= RETAINED_ONLY_SINCE


def partition_lag(end: int, committed: int | None, offset_reset_policy: str = "latest",
                  scale_to_zero_on_invalid_offset: bool = False, start: int = 0, retained_only: bool = True) -> int:
    """KEDA's lag for one partition; ``start`` is the log's start offset (used only under
    ``earliest`` without a commit, and only with ``retained_only``, KEDA 2.21's count)."""
    if committed is None or committed < 0:
        if scale_to_zero_on_invalid_offset:
            return 0
        if offset_reset_policy == "latest":
            return 1
        return max(end - start, 0) if retained_only else end
    return end - committed


class GroupOffsets:
    """A consumer group's committed offsets, read by a consumer of the group that never joins it
    (OffsetFetch through the group's coordinator, as KEDA reads them); one consumer for every read,
    closed by :meth:`close` (a reader polled twice a second, as ``migrate`` does, reconnects never).

    Not the admin client's ``list_consumer_group_offsets``: librdkafka crashes the process (SIGSEGV,
    librdkafka issue 5040, open) when that request's answer says the coordinator moved or is loading,
    which a long-running ``lag --serve`` meets on a young group or a broker restart; seen here on
    Apache Kafka 4.2 in two of three fresh starts of the exporter. A consumer has the group
    machinery that answer needs."""

    def __init__(self, props: Mapping[str, object], group: str) -> None:
        self.group = group
        self.consumer = Consumer({**props, "group.id": group, "enable.auto.commit": False})

    def committed(self, tps: list[TopicPartition], timeout: float = 10.0) -> dict[int, int | None]:
        """The committed offset of each of ``tps`` (None where the group has none)."""
        return {tp.partition: tp.offset if tp.offset >= 0 else None
                for tp in self.consumer.committed(tps, timeout=timeout)}

    def close(self) -> None:
        self.consumer.close()

    def __enter__(self) -> GroupOffsets:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def group_lag(admin: AdminClient, offsets: GroupOffsets, topic: str, offset_reset_policy: str = "latest",
              scale_to_zero_on_invalid_offset: bool = False, timeout: float = 10.0,
              retained_only: bool = True) -> list[PartitionLag]:
    """Lag of ``offsets.group`` on every partition of ``topic`` (``retained_only``: :func:`partition_lag`):
    the end offsets from ``admin``, the committed ones from ``offsets``. Raises ``RuntimeError`` for a
    missing topic."""
    if offset_reset_policy not in ("latest", "earliest"):
        raise ValueError("offset_reset_policy must be 'latest' or 'earliest'")
    meta = admin.list_topics(topic, timeout=timeout).topics.get(topic)
    if meta is None or meta.error is not None or not meta.partitions:
        raise RuntimeError(f"topic {topic!r} does not exist")
    tps = [TopicPartition(topic, p) for p in sorted(meta.partitions)]
    ends = {tp.partition: f.result(timeout).offset for tp, f in
            admin.list_offsets({tp: OffsetSpec.latest() for tp in tps}, request_timeout=timeout).items()}
    committed = {p: c for p, c in offsets.committed(tps, timeout).items() if c is not None}
    missing = [tp for tp in tps if tp.partition not in committed]
    starts: dict[int, int] = {}
    if missing and offset_reset_policy == "earliest" and retained_only and not scale_to_zero_on_invalid_offset:
        # as KEDA 2.21 does: the log's start is asked for only where a missing commit counts from it
        starts = {tp.partition: f.result(timeout).offset for tp, f in
                  admin.list_offsets({tp: OffsetSpec.earliest() for tp in missing}, request_timeout=timeout).items()}
    out = []
    for tp in tps:
        c, start = committed.get(tp.partition), starts.get(tp.partition)
        lag = partition_lag(ends[tp.partition], c, offset_reset_policy, scale_to_zero_on_invalid_offset,
                            start or 0, retained_only)
        out.append(PartitionLag(topic, tp.partition, ends[tp.partition], c, lag, start))
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
