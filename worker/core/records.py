"""What travels through the worker: one entry per input record, and batches that carry their offsets.

Every consumed record becomes exactly one entry — :class:`Item` (to embed), :class:`Delete`
(a tombstone) or :class:`DeadLetter` (can never succeed) — and every entry rides in a batch with
its partition and offset, so a batch knows, per partition, the next offset to commit once it is
done (arroyo's habit: offsets travel with the data; only the commit step turns them into commits).
"""

from __future__ import annotations

import hashlib
import time
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

TopicPartitionKey = tuple[str, int]
Headers = Sequence[tuple[str, bytes | None]]

#: Bytes a Kafka record header costs beyond its name and value (two varints of up to 5 bytes each).
HEADER_OVERHEAD = 10


def headers_size(headers: Headers | None) -> int:
    """The bytes ``headers`` take in a record, over-estimated by a little (never under)."""
    return sum(len(name.encode()) + len(value or b"") + HEADER_OVERHEAD for name, value in headers or ())


def normalise_text(text: str) -> str:
    """The text the model sees and the cache key hashes: Unicode NFC, outer whitespace stripped."""
    return unicodedata.normalize("NFC", text).strip()


def content_hash(text: str) -> str:
    """sha256 (hex) of a normalised text: the cache key's suffix and the ``content_hash`` field."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(slots=True)
class Source:
    """Where a record came from."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int | None = None

    @property
    def tp(self) -> TopicPartitionKey:
        return (self.topic, self.partition)


@dataclass(slots=True)
class Chunk:
    """A window of a document's text that the model takes whole: ``text == doc.text[start:end]``.
    ``vector`` and ``cached`` are filled by the embed step, and ``sparse`` (``(indices, values)``)
    where the model has a learned sparse side; ``hash`` is its cache key's suffix."""

    index: int
    start: int
    end: int
    text: str
    hash: str
    vector: np.ndarray | None = None
    cached: bool = False
    sparse: tuple[np.ndarray, np.ndarray] | None = None


@dataclass(slots=True)
class Item:
    """A document to embed: split into ``chunks`` by the chunk step (one chunk when it fits the
    model), whose vectors the embed step fills."""

    source: Source
    id: str
    text: str
    hash: str
    tokens: int
    metadata: dict[str, str]
    chunks: list[Chunk] = field(default_factory=list)
    #: Written nowhere: Milvus already held a newer version of this id (``worker.steps.writing.versions``).
    superseded: bool = False
    #: The original key, value and headers: any item may still be dead-lettered whole (too many
    #: chunks, an output record over the topic's limit, a value Milvus refuses), and a dead letter
    #: carries the bytes that came. References to the consumed message's buffers, not copies.
    original: tuple[bytes | None, bytes | None, list | None] | None = None
    #: Whether the record is large enough (its text, or key, value and forwarded headers) that its
    #: output record might not fit the output topic: only such a one is measured before it is written.
    large: bool = False
    #: The name of the model that embeds it (``worker.embedding.models``; "" when the worker runs one).
    model: str = ""
    #: When the document happened upstream (epoch ms): its ``event_time``, else the record's CreateTime.
    event_time: int | None = None
    #: The input headers its output records carry (``EMBEDSTREAM_FORWARD_HEADERS``); None: none.
    headers: list[tuple[str, bytes]] | None = None


@dataclass(slots=True)
class Delete:
    """A tombstone: delete ``id`` from Milvus and forward a tombstone to the output topic."""

    source: Source
    id: str
    #: Written nowhere: Milvus already held a newer version of this id (``worker.steps.writing.versions``).
    superseded: bool = False
    #: The input headers its output tombstone carries (``EMBEDSTREAM_FORWARD_HEADERS``); None: none.
    headers: list[tuple[str, bytes]] | None = None


@dataclass(slots=True)
class DeadLetter:
    """A record that can never succeed, with the original bytes and the reason (contract DLQ headers)."""

    source: Source
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]] | None
    reason: str
    message: str


Entry = Item | Delete | DeadLetter


def entry_size(entry: Item | Delete | DeadLetter) -> int:
    """Approximate bytes an entry holds: its text or original value."""
    if isinstance(entry, Item):
        return len(entry.text)
    if isinstance(entry, DeadLetter):
        return len(entry.value or b"")
    return 0


#: What the prepare stage hands the embed stage with a batch: what its chunks still need of each
#: model, by model name, then chunk hash (``Embedder.prepare``: token ids).
Pending = dict[str, dict[str, object]]
#: What the embed stage hands the sink with a batch: the vectors the models computed for it (the sink
#: fills each model's cache with them), by model name, then chunk hash; with a learned sparse side,
#: ``(vector, sparse vector)``.
Fresh = dict[str, dict[str, "np.ndarray | tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]"]]


@dataclass
class Batch:
    """Entries in consumption order, plus the next offset to commit per partition they touched.

    A batch is held by one thread at a time: the polling thread fills it, then each stage in turn
    (the pipeline's queues hand it on), then the polling thread again once it is completed. Its
    entries are the records as they are worked on: each stage fills in its part (chunks, vectors, a
    dead letter put in an entry's place, ``superseded``). What a stage decides about the batch as a
    whole is not written on it: it is handed on beside it as a value (``worker.core.pipeline``:
    :data:`Pending`, :data:`Fresh`, then :class:`Written` to the polling thread)."""

    entries: list[Entry] = field(default_factory=list)
    offsets: dict[TopicPartitionKey, int] = field(default_factory=dict)
    tokens: int = 0
    #: Bytes of the record values in the batch (bounds the memory a batch holds).
    size: int = 0
    opened_at: float = field(default_factory=time.monotonic)
    #: The sink thread's own memory across the retries of the batch's group (no other thread reads
    #: it): its output and dead-letter records were acknowledged, so a retry for Milvus skips them.
    delivered: bool = False
    #: Written by the polling thread when the batch closes (``Fence.stamp``), read by the sink thread:
    #: per partition, the fence's tenure the records were read in; None: never stamped.
    tenure: dict[TopicPartitionKey, int] | None = None

    def add(self, entry: Entry) -> None:
        self.entries.append(entry)
        src = entry.source
        self.offsets[src.tp] = max(self.offsets.get(src.tp, 0), src.offset + 1)
        if isinstance(entry, Item):
            self.tokens += entry.tokens
        self.size += entry_size(entry)

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def items(self) -> list[Item]:
        return [e for e in self.entries if isinstance(e, Item)]


@dataclass(frozen=True, slots=True)
class Written:
    """What the sink step hands back with a finished batch, for the polling thread (its ledger and
    counters)."""

    #: Partitions whose entries the sink left unwritten, because this member no longer owns them (or
    #: owns them again, in another tenure than the batch was read in): their offsets are not stored,
    #: their records are read again, here or by their next owner.
    fenced: frozenset[TopicPartitionKey] = frozenset()
    #: The offsets a transaction committed with the batch's group (exactly-once; empty otherwise).
    committed: dict[TopicPartitionKey, int] = field(default_factory=dict)

    def offsets(self, batch: Batch) -> dict[TopicPartitionKey, int]:
        """The next offset per partition of ``batch``'s written entries (its ``fenced`` ones left out)."""
        if not self.fenced:
            return dict(batch.offsets)
        return {tp: o for tp, o in batch.offsets.items() if tp not in self.fenced}


@dataclass
class Share:
    """One model's part of a group (:func:`split_by_model`): its items, each with the index of its
    batch in the group and the position it sits at there (a step may put a dead letter in its place),
    and the whole group (a step hands on one value per batch of it)."""

    model: str
    group: list[Batch]
    places: list[tuple[int, int, Item]] = field(default_factory=list)

    @property
    def items(self) -> list[Item]:
        return [it for _, _, it in self.places]


def split_by_model(group: list[Batch]) -> dict[str, Share]:
    """The group's items by model (``Item.model``), in one pass: each model's steps see only their
    share. A model without items in the group has no share."""
    shares: dict[str, Share] = {}
    for i, batch in enumerate(group):
        for pos, e in enumerate(batch.entries):
            if isinstance(e, Item):
                share = shares.get(e.model)
                if share is None:
                    share = shares[e.model] = Share(e.model, group)
                share.places.append((i, pos, e))
    return shares
