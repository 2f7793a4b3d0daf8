"""`embedstream dlq` on the real stack, as an operator uses it: records dead-lettered for a cause (a text
limit set too low) beside ones no fix can save (invalid UTF-8); `summary` and `show` say which and why;
the limit is fixed; `replay` sends back only what can now pass, as its producer wrote it, once; the
worker writes each of those documents to Milvus exactly once."""

from __future__ import annotations

import json

import pytest

from connectors.kafka import make_producer
from schemas.codec import Document, encode_document
from tests.faults.harness import run_worker
from tests.helpers import documents_in_milvus, fresh_settings, read_topic, run_cli, settings_env
from worker.core.records import content_hash, normalise_text

pytestmark = pytest.mark.integration


def test_dead_letters_are_summed_up_shown_and_replayed_once_after_the_fix(stack):
    s = fresh_settings(stack, partitions=2)
    long = {f"long-{i}": f"document {i}, " + "a longer text than the limit allows " * 8 for i in range(5)}
    short = {f"short-{i}": f"a short document {i}" for i in range(5)}
    producer = make_producer(s.kafka_common())
    for i, (doc_id, text) in enumerate(long.items()):  # a producer's headers, one under the worker's prefix
        producer.produce(s.input_topic, key=doc_id, value=encode_document(Document(doc_id, text)),
                         headers=[("traceparent", f"00-{i:032x}-{i:016x}-01".encode()),
                                  ("embedstream.team", b"search")])
    for doc_id, text in short.items():
        producer.produce(s.input_topic, key=doc_id, value=encode_document(Document(doc_id, text)))
    for i in range(2):
        producer.produce(s.input_topic, key=f"bad-{i}", value=b'{"id": "bad-%d", "text": "caf\xe9"}' % i)
    assert producer.flush(30) == 0
    limited = {"EMBEDSTREAM_MAX_TEXT_BYTES": "200"}
    first = run_worker(s, "--stop-when-idle", "0.5", timeout=300, **limited)
    assert first.returncode == 0, first.stderr[-3000:]
    assert set(documents_in_milvus(s)) == set(short)
    env = settings_env(s)

    summary = run_cli(["dlq", "summary", "--json"], env, timeout=120)
    assert summary.returncode == 0, summary.stderr
    by = json.loads(summary.stdout)
    assert {r: by[r]["count"] for r in by} == {"text_too_long": 5, "invalid_utf8": 2}
    assert by["text_too_long"]["replay"] is True and by["invalid_utf8"]["replay"] is False
    assert "EMBEDSTREAM_MAX_TEXT_BYTES" in by["text_too_long"]["fix"]
    table = run_cli(["dlq", "summary"], env, timeout=120)
    words = " ".join(table.stdout.split())
    assert table.returncode == 0 and "text_too_long" in words and "total" in words, table.stdout
    assert "text_too_long: the text is over EMBEDSTREAM_MAX_TEXT_BYTES. Fix: raise" in words, table.stdout

    shown = run_cli(["dlq", "show", "--reason", "text_too_long"], env, timeout=120)
    assert shown.returncode == 0, shown.stderr
    lines = [json.loads(line) for line in shown.stdout.splitlines()]
    assert sorted(x["key"] for x in lines) == sorted(long)
    assert all(x["source"]["topic"] == s.input_topic and x["document"]["id"] == x["key"]
               and x["document"]["text"] == long[x["key"]] for x in lines), lines[0]
    assert all(x["headers"]["embedstream.team"] == "search" and "traceparent" in x["headers"] for x in lines)
    bad = run_cli(["dlq", "show", "--key", "bad-0"], env, timeout=120)
    assert [json.loads(line)["reason"] for line in bad.stdout.splitlines()] == ["invalid_utf8"]

    # meanwhile its producer wrote a newer version of one: replaying the old one would put it on top
    newer = Document("long-4", "long-4, rewritten short")
    producer.produce(s.input_topic, key="long-4", value=encode_document(newer))
    assert producer.flush(30) == 0
    dry = run_cli(["dlq", "replay", "--dry-run"], env, timeout=120)
    assert dry.returncode == 0, dry.stderr
    said = " ".join(dry.stderr.split())
    assert "would replay 4 of 7" in said and "2 of a reason the same record cannot pass" in said, said
    assert "1 with a later record of their key" in said, said
    assert len(read_topic(s, s.input_topic)) == 13  # nothing produced

    # the cause fixed (the default limit), the dead letters sent back, the worker run again
    replayed = run_cli(["dlq", "replay"], env, timeout=120)
    assert replayed.returncode == 0 and "replayed 4 dead letters" in replayed.stdout, replayed.stderr
    again = run_cli(["dlq", "replay", "--reason", "text_too_long"], env, timeout=120)
    assert again.returncode == 0 and "4 already replayed: skipped" in " ".join(again.stderr.split()), again.stderr
    back = [m for m in read_topic(s, s.input_topic) if m.key().decode().startswith("long-")]
    assert len(back) == 10  # each long document as produced, the newer one, four replays
    replays = [dict(m.headers() or ()) for m in back if dict(m.headers() or ()).get("embedstream.replayed")]
    assert len(replays) == 4
    for headers in replays:  # as the producer wrote them, and the marker
        assert headers["embedstream.team"] == b"search" and headers["traceparent"].startswith(b"00-")
        assert headers["embedstream.replayed"].decode().startswith(f"{s.dlq_topic}:")
        assert not any(name.startswith("embedstream.error.") or name.startswith("embedstream.source.")
                       for name in headers)
    second = run_worker(s, "--stop-when-idle", "0.5", timeout=300)
    assert second.returncode == 0, second.stderr[-3000:]
    milvus = documents_in_milvus(s)
    assert set(milvus) == set(short) | set(long)  # each once (documents_in_milvus asserts one version each)
    assert milvus["long-4"][0]["content_hash"] == content_hash(normalise_text(newer.text))
    out = [m for m in read_topic(s, s.output_topic) if m.key().decode().startswith("long-")]
    assert sorted(m.key().decode() for m in out) == sorted(long)  # once each on the output topic too
    dlq = read_topic(s, s.dlq_topic)
    assert len(dlq) == 7  # nothing dead-lettered again
