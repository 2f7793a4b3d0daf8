"""`embedstream erase` on the real stack, as an operator answers an erasure request: a running worker
with the Redis cache; two documents erased (one of several chunks); the receipt says each copy is
gone, and each is checked apart from it: no chunk row in Milvus, the delete's version kept, no cache
entry of their texts (the other documents' entries kept), a tombstone on the output topic, the input
topic's and DLQ's lifetimes named."""

from __future__ import annotations

import json

import pytest
import redis

from connectors.kafka import make_producer
from connectors.milvus import MilvusStore
from schemas.codec import Document, encode_document
from schemas.errors import TransientError
from tests.faults.harness import WorkerProcess, wait_until
from tests.helpers import documents_in_milvus, fresh_settings, read_topic, run_cli, settings_env

pytestmark = pytest.mark.integration


def _cached(client: redis.Redis, hashes: set[str]) -> set[str]:
    """Which of ``hashes`` some model's cache holds (``embedstream:v1:<cache id>:<hash>``)."""
    return {h for h in hashes if any(True for _ in client.scan_iter(match=f"embedstream:v1:*:{h}", count=1000))}


def test_an_erased_document_leaves_no_row_no_cache_entry_and_a_tombstone_and_the_receipt_says_so(stack, tmp_path):
    s = fresh_settings(stack, partitions=2, compacted_input=True)
    texts = {f"keep-{i}": f"a document to keep, number {i}" for i in range(6)}
    texts["gone-long"] = " ".join(f"sentence {k} of a long private note about someone." for k in range(400))
    texts["gone-short"] = "a short private note"
    worker = WorkerProcess(s, tmp_path, "worker")
    producer = make_producer(s.kafka_common())
    for doc_id, text in texts.items():
        producer.produce(s.input_topic, key=doc_id, value=encode_document(Document(doc_id, text)))
    assert producer.flush(30) == 0
    def all_written() -> bool:
        try:
            return set(documents_in_milvus(s)) == set(texts)
        except TransientError:  # the worker has not made its collection yet
            return False

    wait_until(all_written, 180, what="every document in Milvus", running=(worker,))
    before = documents_in_milvus(s)
    gone = {d: {r["content_hash"] for r in before[d]} for d in ("gone-long", "gone-short")}
    kept = {r["content_hash"] for d in texts if d.startswith("keep-") for r in before[d]}
    assert len(before["gone-long"]) > 3  # several chunks, each its own cache entry
    cache = redis.Redis.from_url(stack["EMBEDSTREAM_REDIS_URL"])
    assert _cached(cache, set().union(*gone.values())) == set().union(*gone.values())  # the worker cached them

    produced = {m.key().decode(): m.partition() for m in read_topic(s, s.input_topic)}
    done = run_cli(["erase", "gone-long", "gone-short", "--json"], settings_env(s), timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    receipt = json.loads(done.stdout)
    assert receipt["complete"] is True
    by_id = {e["id"]: e for e in receipt["ids"]}
    for doc, hashes in gone.items():
        e, [m] = by_id[doc], by_id[doc]["models"]
        assert e["applied"] and e["output_tombstone"] is not None, e
        assert (m["chunk_rows_before"], m["chunk_rows_left"]) == (len(before[doc]), 0), m
        assert m["version_kept"] == e["tombstone"]["offset"], m
        assert (m["cache_entries_before"], m["cache_entries_left"]) == (len(hashes), 0), m
        assert m["cache_entries_removed_by_erase"] == 0  # the worker removed them itself
        # the tombstone went to the partition of the document's version, so it is applied after it
        assert e["tombstone"]["partition"] == produced[doc]
    assert receipt["stays"]["input_topic"]["cleanup.policy"] == "compact"
    assert "retention.ms" in receipt["stays"]["dlq_topic"]

    # each copy, apart from the receipt
    after = documents_in_milvus(s)
    assert set(after) == set(texts) - set(gone)
    alias = MilvusStore(s.milvus_uri, s.milvus_collection, timeout=30, options=s.milvus_options())
    store = MilvusStore.sharing(alias, alias.alias_target(s.milvus_collection))  # the deletes' companion is its
    versions, counts = store.versions(list(gone))
    store.close()
    assert not counts and all(versions[d][1] == by_id[d]["tombstone"]["offset"] for d in gone)
    assert _cached(cache, set().union(*gone.values())) == set()
    assert _cached(cache, kept) == kept  # the other documents' texts stay cached
    out = read_topic(s, s.output_topic)
    tombstones = {m.key().decode(): (m.partition(), m.offset()) for m in out if m.value() is None}
    assert tombstones == {d: (by_id[d]["output_tombstone"]["partition"], by_id[d]["output_tombstone"]["offset"])
                          for d in gone}

    table = run_cli(["erase", "gone-short"], settings_env(s), timeout=300)  # again: harmless, and a table
    print(table.stdout)
    words = " ".join(table.stdout.split())
    assert table.returncode == 0, table.stdout + table.stderr[-3000:]
    assert "erasure receipt" in words and "What stays by design" in words and "until compaction" in words, words
    worker.terminate()
    assert worker.wait(60) == 0, worker.log()[-3000:]
