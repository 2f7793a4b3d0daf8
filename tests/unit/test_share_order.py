"""A share group's write order (``worker.steps.writing.ordering``): two members holding two versions
of one document, their reads and writes interleaved in the orders that let the older version land
last, on one Milvus stand-in. Milvus ends at the newest version every time, and no claim is left."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from connectors.milvus import MilvusStore
from worker.core.fence import Fence
from worker.core.records import Batch, Chunk, Delete, Item, Source
from worker.steps.writing.ordering import ShareOrder
from worker.steps.writing.sink import SinkStep
from worker.steps.writing.targets import ModelTarget
from worker.steps.writing.versions import VersionGuard

from .fakes import RecordingMilvusClient, RecordingProducer, at_least_once

EXPIRY_S = 8.0


class Clock:
    """Wall-clock seconds both members read; ``sleep`` moves it on (and hands control over first)."""

    def __init__(self) -> None:
        self.now = 1_000_000.0
        self.sleeps = 0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        self.now += seconds


def share_item(doc: str, offset: int, chunks: int = 1) -> Item:
    texts = [f"{doc} version {offset} part {k}" for k in range(chunks)]
    return Item(Source("docs", 0, offset), doc, " ".join(texts), f"h{offset}", 3, {"v": str(offset)},
                [Chunk(k, 0, len(t), t, f"h{offset}.{k}", np.full(4, offset, np.float32)) for k, t in enumerate(texts)])


def member(client: RecordingMilvusClient | MilvusStore, clock: Clock, claims: bool = True) -> SinkStep:
    """A share member's sink on ``client`` (the stand-in; or a real store, whose client it shares)."""
    fence = Fence(lease_s=60)
    fence.publish({("docs", 0)})
    guard = VersionGuard({"docs": "T1"})
    order = ShareOrder(guard.source, EXPIRY_S, clock=clock, sleep=clock.sleep) if claims else None
    store = (MilvusStore.sharing(client) if isinstance(client, MilvusStore)
             else MilvusStore("fake", "c", timeout=5.0, client=client))
    return SinkStep({"": ModelTarget(store, "m", 4)}, at_least_once(producer=RecordingProducer()), fence=fence,
                    guard=guard, output_topic="embeddings", dlq_topic="documents.dlq", delivery_timeout_s=5,
                    order=order)


def _group(entry) -> list[Batch]:
    batch = Batch()
    batch.add(entry)
    return [batch]


def held(sink: SinkStep, doc: str) -> tuple[int | None, int | None]:
    """The offset of the version ``doc``'s rows hold (None: no rows) and of its delete (None: none), as
    ``sink``'s collection holds them."""
    deleted, rows, _ = sink.targets[""].store.version_parts([doc])
    return rows.get(doc, (None, None))[1], deleted.get(doc, (None, None))[1]


def older_lands_last(older: SinkStep, newer: SinkStep, old_entry, new_entry) -> None:
    """Both plan (the older first: neither sees a row), the newer writes, then the older: the order in
    which a read-then-write guard lets the older version win. With claims, the newer member's settle
    waits for the older one's write; the older writes while it waits."""
    old_plan, new_plan = older.plan(_group(old_entry)), newer.plan(_group(new_entry))
    assert not getattr(old_entry, "superseded", False) and not getattr(new_entry, "superseded", False)
    if newer.order is None:
        newer._write_milvus(new_plan)
        older._write_milvus(old_plan)
        return
    waiting, older_done = threading.Event(), threading.Event()

    def sleep(seconds: float) -> None:  # the newer member's wait: the older writes meanwhile
        waiting.set()
        assert older_done.wait(10)

    assert newer.order is not None
    newer.order._sleep = sleep
    failed: list[BaseException] = []
    thread = threading.Thread(target=lambda: _run(newer, new_plan, failed))
    thread.start()
    assert waiting.wait(10), "the newer member did not wait for the older version's write"
    older._write_milvus(old_plan)
    older_done.set()
    thread.join(10)
    assert not thread.is_alive() and not failed, failed


def _run(sink: SinkStep, planned, failed: list[BaseException]) -> None:
    try:
        sink._write_milvus(planned)
    except BaseException as exc:  # the assertion in the main thread reports it
        failed.append(exc)


def test_without_claims_the_older_version_lands_last_and_wins():
    """What the claims are for: the same interleaving with the version guard alone."""
    client, clock = RecordingMilvusClient(), Clock()
    older, newer = member(client, clock, claims=False), member(client, clock, claims=False)
    older_lands_last(older, newer, share_item("d", 1), share_item("d", 2))
    assert held(newer, "d") == (1, None)


@pytest.mark.parametrize("chunks", [(1, 1), (3, 1), (1, 3)], ids=["same length", "older longer", "newer longer"])
def test_an_older_version_that_lands_last_is_written_over_again(chunks):
    client, clock = RecordingMilvusClient(), Clock()
    older, newer = member(client, clock), member(client, clock)
    older_lands_last(older, newer, share_item("d", 1, chunks[0]), share_item("d", 2, chunks[1]))
    assert held(newer, "d") == (2, None)
    assert sorted(client.rows) == [f"d#{k}" for k in range(chunks[1])]  # no chunk of the older version left
    assert {r["source_offset"] for r in client.rows.values()} == {2}
    assert client.claims == {}


def test_an_older_upsert_that_lands_after_a_newer_delete_is_deleted_again():
    client, clock = RecordingMilvusClient(), Clock()
    older, newer = member(client, clock), member(client, clock)
    older_lands_last(older, newer, share_item("d", 1, 2), Delete(Source("docs", 0, 2), "d"))
    assert held(newer, "d") == (None, 2) and client.rows == {}
    assert client.claims == {}


def test_an_older_version_that_reads_the_newer_claim_is_superseded_and_writes_nothing(caplog):
    """... without the warning of a record older than Milvus holds, nor a look-up of the topic ids
    (a claim is no sign of a re-created topic)."""
    client, clock = RecordingMilvusClient(), Clock()
    older, newer = member(client, clock), member(client, clock)
    looked: list[int] = []
    older.planner.guard._lookup = lambda: looked.append(1) or {"docs": "T1"}
    new_plan = newer.plan(_group(new := share_item("d", 2)))
    with caplog.at_level("WARNING"):
        old_plan = older.plan(_group(old := share_item("d", 1)))  # the newer version is claimed, not yet written
    assert old.superseded and not new.superseded
    assert not looked and "older than what Milvus holds" not in caplog.text
    older._write_milvus(old_plan)
    assert client.rows == {} and [c["source_offset"] for c in client.claims.values()] == [2]
    newer._write_milvus(new_plan)
    assert held(newer, "d") == (2, None) and client.claims == {}


def test_the_claim_of_a_member_that_died_before_writing_runs_out():
    """An older version claimed by a member killed before its write: the newer member waits for the
    claim's expiry, then finds its own rows in place; the dead claim is removed."""
    client, clock = RecordingMilvusClient(), Clock()
    dead, newer = member(client, clock), member(client, clock)
    dead.plan(_group(share_item("d", 1)))
    start = clock.now
    newer._write_milvus(newer.plan(_group(share_item("d", 2))))
    assert EXPIRY_S <= clock.now - start <= EXPIRY_S + 1
    assert held(newer, "d") == (2, None) and client.claims == {}


def test_a_claim_that_ran_out_supersedes_nothing():
    """A newer version whose member died before writing: its record is delivered again, so the older
    version is written meanwhile rather than dropped (were the newer one dead-lettered, the older
    would still stand)."""
    client, clock = RecordingMilvusClient(), Clock()
    dead, older = member(client, clock), member(client, clock)
    dead.plan(_group(share_item("d", 2)))
    clock.now += EXPIRY_S + 1
    older._write_milvus(older.plan(_group(old := share_item("d", 1))))
    assert not old.superseded and held(older, "d") == (1, None)
