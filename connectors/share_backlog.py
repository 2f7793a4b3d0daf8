"""A share group's backlog: the records of its topic it has not yet finished, per partition.

A share group commits no offsets, so the consumer-group lag (:mod:`connectors.lag`) means nothing for
it. The broker keeps, per partition, the share-partition start offset (below it every record is
acknowledged or archived) and, from Apache Kafka 4.2 (KIP-1226), the lag past it: records not yet
acknowledged, in flight included. ``DescribeShareGroupOffsets`` (v1) reads both; it is sent to the
group's coordinator over :mod:`connectors.kafka_wire`.

A partition the group has not started on (a new group, or the broker not yet knowing its lag) counts
as everything from where the worker starts a share group: the earliest offset
(``share.auto.offset.reset=earliest``, which the worker sets on a new group), or its start offset.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass

from connectors.kafka_wire import Connection, WireError, Writer, bootstrap_addresses

FIND_COORDINATOR = 10
DESCRIBE_SHARE_GROUP_OFFSETS = 90
#: The group is unknown to the broker: no member has joined it yet.
GROUP_ID_NOT_FOUND = 69
#: Errors that pass when the coordinator settles (moved, loading, starting): asked again next time.
COORDINATOR_ERRORS = {14: "COORDINATOR_LOAD_IN_PROGRESS", 15: "COORDINATOR_NOT_AVAILABLE", 16: "NOT_COORDINATOR"}


@dataclass(frozen=True)
class PartitionBacklog:
    topic: str
    partition: int
    end_offset: int
    start_offset: int | None  # None: the group has not started on this partition
    backlog: int


@dataclass(frozen=True)
class ShareOffsets:
    """What the broker says of one partition: start offset and lag (-1 where it does not know)."""

    start_offset: int
    lag: int


def find_coordinator(conn: Connection, group: str) -> tuple[str, int]:
    """The host and port of ``group``'s coordinator (FindCoordinator v4, key type group)."""
    body = Writer().int8(0).compact_len(1).compact_string(group).tags()
    reply = conn.call(FIND_COORDINATOR, 4, bytes(body.buf))
    reply.int32()  # throttle
    found = None
    for _ in range(reply.compact_len()):
        reply.compact_string()
        reply.int32()  # node id
        host, port, code, message = reply.compact_string(), reply.int32(), reply.int16(), reply.compact_string()
        reply.tags()
        if code:
            raise WireError(f"no coordinator for group {group!r}: {message or COORDINATOR_ERRORS.get(code, code)}",
                            retriable=code in COORDINATOR_ERRORS)
        found = (str(host), port)
    if found is None:
        raise WireError(f"the broker named no coordinator for group {group!r}")
    return found


def describe_share_offsets(conn: Connection, group: str, topic: str,
                           partitions: list[int]) -> dict[int, ShareOffsets] | None:
    """``group``'s start offset and lag on ``partitions`` of ``topic``; None when the broker does not
    know the group (no member joined it yet). Raises :class:`WireError`."""
    body = Writer().compact_len(1).compact_string(group).compact_len(1).compact_string(topic)
    body.compact_len(len(partitions))
    for p in partitions:
        body.int32(p)
    body.tags().tags().tags()  # the topic's, the group's, the request's
    reply = conn.call(DESCRIBE_SHARE_GROUP_OFFSETS, 1, bytes(body.buf))
    reply.int32()  # throttle
    out: dict[int, ShareOffsets] = {}
    for _ in range(reply.compact_len()):
        reply.compact_string()
        for _ in range(reply.compact_len()):
            reply.compact_string()
            reply.raw(16)  # topic id
            for _ in range(reply.compact_len()):
                partition, start, _epoch, lag = reply.int32(), reply.int64(), reply.int32(), reply.int64()
                code, message = reply.int16(), reply.compact_string()
                reply.tags()
                if code:
                    raise WireError(f"share group {group!r} on {topic}[{partition}]: {message or f'error {code}'}")
                out[partition] = ShareOffsets(start, lag)
            reply.tags()
        code, message = reply.int16(), reply.compact_string()
        reply.tags()
        if code == GROUP_ID_NOT_FOUND:
            return None
        if code in COORDINATOR_ERRORS:
            raise WireError(f"share group {group!r}: {COORDINATOR_ERRORS[code]}", retriable=True)
        if code:
            raise WireError(f"share group {group!r}: {message or f'error {code}'}")
    return out


def read_share_offsets(props: Mapping[str, str], group: str, topic: str, partitions: list[int],
                       timeout: float = 10.0) -> dict[int, ShareOffsets] | None:
    """Ask a bootstrap broker for the coordinator, then the coordinator for the offsets; the first
    bootstrap broker that answers is used, and a coordinator still settling is asked again (0.2 s
    apart) until ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        errors: list[WireError] = []
        for host, port in bootstrap_addresses(str(props["bootstrap.servers"])):
            try:
                with Connection(host, port, props, timeout) as conn:
                    coordinator = find_coordinator(conn, group)
                with Connection(*coordinator, props, timeout) as conn:
                    return describe_share_offsets(conn, group, topic, partitions)
            except WireError as exc:
                errors.append(exc)
            except (struct.error, IndexError, ValueError, UnicodeDecodeError) as exc:  # an answer that does not parse
                errors.append(WireError(f"{host}:{port} answered what this client cannot read "
                                        f"({type(exc).__name__}: {exc})", retriable=True))
        if not all(e.retriable for e in errors) or time.monotonic() >= deadline:
            raise WireError("; ".join(map(str, errors)))
        time.sleep(0.2)


def partition_backlog(end: int, earliest: int, offsets: ShareOffsets | None) -> tuple[int | None, int]:
    """(start offset or None, backlog) of one partition, from its watermarks and the broker's offsets."""
    if offsets is None or offsets.start_offset < 0:
        return None, max(end - earliest, 0)
    if offsets.lag >= 0:
        return offsets.start_offset, offsets.lag
    return offsets.start_offset, max(end - max(offsets.start_offset, earliest), 0)


def group_backlog(admin, props: Mapping[str, str], group: str, topic: str,
                  timeout: float = 10.0) -> list[PartitionBacklog]:
    """The backlog of share group ``group`` on every partition of ``topic``; ``admin`` (an
    ``AdminClient``) reads the watermarks. Raises ``RuntimeError`` (a missing topic, or
    :class:`WireError`)."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import OffsetSpec

    meta = admin.list_topics(topic, timeout=timeout).topics.get(topic)
    if meta is None or meta.error is not None or not meta.partitions:
        raise RuntimeError(f"topic {topic!r} does not exist")
    tps = [TopicPartition(topic, p) for p in sorted(meta.partitions)]

    def offsets(spec) -> dict[int, int]:
        found = admin.list_offsets({tp: spec for tp in tps}, request_timeout=timeout)
        return {tp.partition: f.result(timeout).offset for tp, f in found.items()}

    ends, earliest = offsets(OffsetSpec.latest()), offsets(OffsetSpec.earliest())
    known = read_share_offsets(props, group, topic, sorted(ends), timeout) or {}
    out = []
    for tp in tps:
        start, backlog = partition_backlog(ends[tp.partition], earliest[tp.partition], known.get(tp.partition))
        out.append(PartitionBacklog(topic, tp.partition, ends[tp.partition], start, backlog))
    return out


def as_json(backlog: list[PartitionBacklog]) -> dict:
    return {"partitions": [asdict(p) for p in backlog], "backlog": sum(p.backlog for p in backlog)}
