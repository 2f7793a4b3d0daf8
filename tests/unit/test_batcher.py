"""The batcher's three closing rules, and the offsets a batch carries."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from worker.core.records import Delete, Item, Source
from worker.steps.polling.batcher import Batcher

from .fakes import Clock


def item(p: int, o: int, tokens: int = 10, topic: str = "t") -> Item:
    return Item(Source(topic, p, o), f"id-{p}-{o}", "text", "h", tokens, {})


def test_closes_at_max_size():
    b = Batcher(max_size=3, max_tokens=10_000, max_wait=60, max_bytes=1 << 24, clock=Clock())
    assert b.add(item(0, 0)) == [] and b.add(item(0, 1)) == []
    closed = b.add(item(0, 2))
    assert len(closed) == 1 and len(closed[0]) == 3 and len(b) == 0


def test_closes_before_token_budget_is_exceeded():
    b = Batcher(max_size=100, max_tokens=100, max_wait=60, max_bytes=1 << 24, clock=Clock())
    assert b.add(item(0, 0, 60)) == []
    closed = b.add(item(0, 1, 50))  # 110 > 100: the open batch closes first, the newcomer opens the next
    assert [len(x) for x in closed] == [1] and closed[0].tokens == 60
    assert len(b) == 1


def test_item_alone_over_the_budget_forms_its_own_batch():
    b = Batcher(max_size=100, max_tokens=100, max_wait=60, max_bytes=1 << 24, clock=Clock())
    closed = b.add(item(0, 0, 500))
    assert [x.tokens for x in closed] == [500] and len(b) == 0


def test_closes_at_deadline_of_oldest_record():
    clock = Clock()
    b = Batcher(max_size=100, max_tokens=10_000, max_wait=0.5, max_bytes=1 << 24, clock=clock)
    b.add(item(0, 0))
    clock.now += 0.3
    b.add(item(0, 1))
    assert b.poll() == []
    clock.now += 0.25  # oldest waited 0.55 s
    closed = b.poll()
    assert len(closed) == 1 and len(closed[0]) == 2


def test_batch_carries_next_offset_per_partition():
    b = Batcher(max_size=5, max_tokens=10_000, max_wait=60, max_bytes=1 << 24, clock=Clock())
    b.add(item(0, 7))
    b.add(item(1, 3))
    b.add(Delete(Source("t", 0, 8), "x"))
    b.add(item(2, 0, topic="u"))
    closed = b.add(item(1, 4))
    assert closed[0].offsets == {("t", 0): 9, ("t", 1): 5, ("u", 2): 1}


def test_tombstones_cost_no_tokens_and_flush_returns_partial_batch():
    b = Batcher(max_size=10, max_tokens=10, max_wait=60, max_bytes=1 << 24, clock=Clock())
    for o in range(4):
        assert b.add(Delete(Source("t", 0, o), str(o))) == []
    [batch] = b.flush()
    assert len(batch) == 4 and batch.tokens == 0 and b.flush() == []


def test_drop_removes_revoked_partitions_only():
    b = Batcher(max_size=10, max_tokens=10_000, max_wait=60, max_bytes=1 << 24, clock=Clock())
    for p in (0, 1, 0, 2):
        b.add(item(p, len(b)))
    assert b.drop({("t", 0)}) == 2
    [batch] = b.flush()
    assert {e.source.partition for e in batch.entries} == {1, 2}
    assert set(batch.offsets) == {("t", 1), ("t", 2)}


def test_closes_at_byte_budget_and_counts_dead_letters():
    from worker.core.records import DeadLetter, Source

    b = Batcher(max_size=100, max_tokens=10_000, max_wait=60, max_bytes=1000, clock=Clock())
    big = Item(Source("t", 0, 0), "a", "x" * 600, "h", 5, {})
    assert b.add(big) == []
    closed = b.add(DeadLetter(Source("t", 0, 1), b"k", b"y" * 500, None, "text_too_long", "m"))
    assert len(closed) == 1 and closed[0].size == 1100


@given(st.lists(st.tuples(st.sampled_from(["item", "delete"]), st.integers(0, 2), st.integers(1, 90)), max_size=60),
       st.integers(0, 20))
@settings(max_examples=150, deadline=None)
def test_add_many_closes_the_batches_that_one_add_at_a_time_does(entries, split):
    """The polling thread adds a consumed chunk at once: the same batches, the same boundaries."""
    def made(kind: str, p: int, n: int, o: int):
        return item(p, o, n) if kind == "item" else Delete(Source("t", p, o), f"id-{p}-{o}")

    def batcher() -> Batcher:
        return Batcher(max_size=7, max_tokens=200, max_wait=60, max_bytes=1 << 24, clock=Clock())

    one, many = batcher(), batcher()
    singly = [b for o, e in enumerate(entries) for b in one.add(made(*e, o))]
    made_all = [made(*e, o) for o, e in enumerate(entries)]
    chunked = many.add_many(made_all[:split]) + many.add_many(made_all[split:])
    shape = lambda bs: [([x.id for x in b.entries], b.offsets, b.tokens) for b in bs]  # noqa: E731
    assert shape(chunked) == shape(singly)
    assert len(many) == len(one)
