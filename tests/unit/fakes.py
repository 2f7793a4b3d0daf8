"""Small fakes for unit tests: Kafka messages, a Milvus client, a producer."""

from __future__ import annotations

from confluent_kafka import TIMESTAMP_CREATE_TIME


class FakeMessage:
    def __init__(self, key, value, partition=0, offset=0, topic="docs", headers=None, ts=1_700_000_000_000):
        self._k, self._v, self._p, self._o = key, value, partition, offset
        self._t, self._h, self._ts = topic, headers, ts

    def key(self):
        return self._k

    def value(self):
        return self._v

    def partition(self):
        return self._p

    def offset(self):
        return self._o

    def topic(self):
        return self._t

    def headers(self):
        return self._h

    def timestamp(self):
        return (TIMESTAMP_CREATE_TIME, self._ts)

    def error(self):
        return None


class RecordingMilvusClient:
    """Records every call; never inserts, so a test can assert the sink used upsert."""

    def __init__(self, fail_upserts: int = 0):
        self.calls: list[tuple[str, object]] = []
        self.fail_upserts = fail_upserts  # the first N upserts time out, as a frozen server's would

    def upsert(self, collection, rows, timeout=None):
        assert timeout is not None, "every Milvus call needs a timeout"
        self.calls.append(("upsert", rows))
        if self.fail_upserts:
            self.fail_upserts -= 1
            raise TimeoutError("deadline exceeded")

    def insert(self, collection, rows, timeout=None):
        self.calls.append(("insert", rows))

    def delete(self, collection, ids, timeout=None):
        assert timeout is not None
        self.calls.append(("delete", ids))


class RecordingProducer:
    def __init__(self, fail: bool = False):
        self.records: list[tuple[str, object, object, object]] = []
        self._callbacks = []
        self.fail = fail

    def produce(self, topic, value=None, key=None, headers=None, on_delivery=None):
        self.records.append((topic, key, value, headers))
        self._callbacks.append(on_delivery)

    def poll(self, _t=0):
        return 0

    def flush(self, _t=None):
        for cb in self._callbacks:
            cb("broker down" if self.fail else None, None)
        self._callbacks.clear()
        return 0
