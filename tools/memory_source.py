"""A worker fed from memory and writing nowhere: the pipeline's own ceiling (the bench's *instant
source* row), and the in-memory consumer the unit tests drive the loop with.

:class:`MemorySource` stands in for the group consumer of one topic: the first ``consume`` assigns
every partition (``on_assign``), then it hands out the records of the partitions not paused and an
end-of-partition event once a partition is exhausted; stores and commits are kept in dicts.
:class:`NullProducer` acknowledges every record at once.
"""

from __future__ import annotations

import time

from confluent_kafka import KafkaError, TopicPartition


class MemoryMessage:
    """What the loop reads of a consumed message (confluent-kafka's ``Message`` methods)."""

    def __init__(self, key, value, partition=0, offset=0, topic="docs", headers=None, ts=1_700_000_000_000,
                 deliveries=None):
        self._key, self._value, self._partition, self._offset = key, value, partition, offset
        self._topic, self._headers, self._ts = topic, headers, ts
        self._deliveries = deliveries

    def delivery_count(self):
        """How often a share group delivered it (None: read by a consumer group)."""
        return self._deliveries

    def key(self):
        return self._key

    def value(self):
        return self._value

    def partition(self):
        return self._partition

    def offset(self):
        return self._offset

    def topic(self):
        return self._topic

    def headers(self):
        return self._headers

    def timestamp(self):
        return (1, self._ts)

    def error(self):
        return None


class EndOfPartition(MemoryMessage):
    """The event librdkafka hands out when a partition reaches its end (``enable.partition.eof``)."""

    def error(self):
        return KafkaError(KafkaError._PARTITION_EOF)


class MemorySource:
    """An in-memory group consumer of one topic (the module doc). ``ends``: the offset a partition's
    end event carries (its log end; default -1, none)."""

    def __init__(self, records: dict[int, list], topic: str = "docs", ends: dict[int, int] | None = None) -> None:
        self.topic = topic
        self.ends = ends or {}
        self.pending = {p: list(msgs) for p, msgs in records.items()}
        self._next = {p: 0 for p in records}
        self.eof_sent: set[int] = set()
        self.assigned: list[TopicPartition] = []
        self.paused: set[int] = set()
        self.stored: dict[int, int] = {}
        self.committed_offsets: dict[int, int] = {}
        self.closed = False
        self._callbacks: dict = {}

    def subscribe(self, topics, on_assign, on_revoke, on_lost):
        self._callbacks = {"assign": on_assign, "revoke": on_revoke, "lost": on_lost}

    def consume(self, num_messages=1, timeout=-1):
        self._assign_once()
        return self._serve(num_messages, timeout)

    def _assign_once(self) -> None:
        if not self.assigned:
            self.assigned = [TopicPartition(self.topic, p) for p in sorted(self.pending)]
            self._callbacks["assign"](self, list(self.assigned))

    def _serve(self, num_messages: int, timeout: float) -> list:
        out: list = []
        for tp in self.assigned:
            p = tp.partition
            if p in self.paused or len(out) >= num_messages:
                continue
            queue, start = self.pending[p], self._next[p]
            taken = queue[start:start + num_messages - len(out)]
            self._next[p] = start + len(taken)
            out += taken
            if self._next[p] >= len(queue) and p not in self.eof_sent and len(out) < num_messages:
                self.eof_sent.add(p)
                out.append(EndOfPartition(None, None, p, self.ends.get(p, -1), self.topic))
        if not out and timeout and timeout > 0:
            time.sleep(min(timeout, 0.01))
        return out

    def assignment(self):
        return list(self.assigned)

    def memberid(self):
        return getattr(self, "member", "member-1")

    def pause(self, parts):
        self.paused |= {tp.partition for tp in parts}

    def resume(self, parts):
        self.paused -= {tp.partition for tp in parts}

    def store_offsets(self, offsets):
        for tp in offsets:
            self.stored[tp.partition] = tp.offset

    def commit(self, offsets=None, asynchronous=True):
        if offsets is None:
            self.committed_offsets.update(self.stored)
        else:
            self.committed_offsets.update({tp.partition: tp.offset for tp in offsets})

    def committed(self, partitions, timeout=None):
        return [TopicPartition(tp.topic, tp.partition, self.committed_offsets.get(tp.partition, -1001))
                for tp in partitions]

    def close(self):
        self.closed = True


class NullProducer:
    """A producer that acknowledges every record at once and keeps none."""

    def __init__(self) -> None:
        self.records = 0

    def produce(self, topic, value=None, key=None, headers=None, on_delivery=None):
        self.records += 1

    def poll(self, _timeout=0):
        return 0

    def flush(self, _timeout=None):
        return 0

    def purge(self):
        pass

    def close(self):
        pass
