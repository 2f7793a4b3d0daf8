"""Records too large for the sink topics, on the real stack: the worker goes on.

The input topic allows 4 MB records, the DLQ topic has the broker's default (the worker's producer
then allows 1,000,000 bytes) and the output topic allows 40,000 bytes (the worker reads that from
the topic's configuration). A 1 MB key, a 2 MB value, a document whose metadata is over Milvus' JSON
limit and one whose metadata fits Milvus but makes its output record too large sit among good
documents on one partition."""

from __future__ import annotations

import hashlib

import pytest

from connectors.kafka import make_producer
from schemas.codec import Document, encode_document
from tests.faults.harness import run_worker
from tests.helpers import documents_in_milvus, fresh_settings, read_topic

pytestmark = pytest.mark.integration

OUTPUT_MAX = 40_000


def test_records_over_the_sink_topics_limits_are_dead_lettered_cut_to_fit(stack):
    s = fresh_settings(stack, partitions=1, topic_config={"input": {"max.message.bytes": "4194304"},
                                                          "output": {"max.message.bytes": str(OUTPUT_MAX)}})
    good = [Document(f"good-{i}", f"a short document about topic number {i}") for i in range(6)]
    # fits the output topic: its metadata is large, but well under its limit
    good.append(Document("good-meta", "metadata that still fits", metadata={"note": "n" * 20_000}))
    big_key = b"K" * 1_000_000
    big_value = encode_document(Document("big-value", "word " * 420_000))
    big_meta = encode_document(Document("big-meta", "a small text", metadata={"blob": "m" * 300_000}))
    # under the 65,536 bytes Milvus takes, over the output topic's limit
    wide_meta = encode_document(Document("wide-meta", "a small text", metadata={"blob": "w" * 60_000}))
    bad = {  # offset on the one partition -> (key, value, reason)
        3: (big_key, b"\x02not avro\xff" * 10, "decode_error"),
        4: (b"big-value", big_value, "text_too_long"),
        5: (b"big-meta", big_meta, "metadata_too_large"),
        6: (b"wide-meta", wide_meta, "output_too_large"),
    }
    producer = make_producer(s.kafka_common(), **{"message.max.bytes": 4_500_000})
    records = [(d.id.encode(), encode_document(d)) for d in good[:3]]
    records += [(k, v) for k, v, _ in bad.values()] + [(d.id.encode(), encode_document(d)) for d in good[3:]]
    for key, value in records:
        producer.produce(s.input_topic, key=key, value=value, headers=[("trace", b"t-" + key[:8])])
    assert producer.flush(30) == 0

    res = run_worker(s, "--stop-when-idle", "0.5", timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"largest records: {OUTPUT_MAX} bytes to {s.output_topic}, 1000000 to {s.dlq_topic}" in res.stderr

    assert set(documents_in_milvus(s)) == {d.id for d in good}
    out = read_topic(s, s.output_topic, expect=len(good))
    assert sorted(m.key().decode() for m in out) == sorted(d.id for d in good)

    dlq = {int(dict(m.headers())["embedstream.source.offset"]): m for m in read_topic(s, s.dlq_topic, expect=len(bad))}
    assert set(dlq) == set(bad)
    for offset, (key, value, reason) in bad.items():
        m = dlq[offset]
        h = dict(m.headers())
        assert h["embedstream.error.reason"].decode() == reason, (offset, h["embedstream.error.message"])
        assert h["trace"] == b"t-" + key[:8]  # the original headers travel
        assert key.startswith(m.key()) and value.startswith(m.value())
        assert len(m.key()) + len(m.value()) <= 1_000_000
        if len(key) + len(value) > 900_000:  # cut, and said so
            assert h["embedstream.error.original_key_size"] == str(len(key)).encode()
            assert h["embedstream.error.original_value_size"] == str(len(value)).encode()
            assert h["embedstream.error.original_value_sha256"] == hashlib.sha256(value).hexdigest().encode()
            assert h["embedstream.error.truncated"]
        else:  # a whole copy
            assert (m.key(), m.value()) == (key, value) and "embedstream.error.truncated" not in h
    assert dlq[3].headers() and dict(dlq[3].headers())["embedstream.error.truncated"] == b"key"
    assert dict(dlq[4].headers())["embedstream.error.truncated"] == b"value"
    assert b"65,536" in dict(dlq[5].headers())["embedstream.error.message"]
    assert b"40,000" in dict(dlq[6].headers())["embedstream.error.message"]
