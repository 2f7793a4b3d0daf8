"""``embedstream dlq``: the dead-letter topic read, summed up by reason, shown, and replayed.

A dead letter is the record the worker could not process, as it came (key, value and headers; a
producer's ``embedstream.*`` headers renamed ``embedstream.original.*``), plus the worker's own
headers: ``embedstream.error.reason`` and ``.message``, ``embedstream.source.topic``, ``.partition``
and ``.offset`` (``worker.steps.writing.fit``).

Reading never joins a consumer group and commits nothing: the topic's partitions are assigned and
read from their first offset to the end offsets seen at the start (read_committed), so a read ends.

**Replay** re-produces selected dead letters to the input topic once their cause is fixed: the key,
value and headers the producer wrote (the worker's headers dropped, a producer's renamed ones given
their names back), plus ``embedstream.replayed`` = ``<dlq topic>:<partition>:<offset>``, the dead
letter it came from. At most once a dead letter: the input topic is read first, from the time of the
oldest selected dead letter, for the markers of earlier replays, and a dead letter already replayed
is skipped. So is one whose key has a later record on the input topic (an update or a delete that
came after it): replayed, the older version would land on top. Refused unless forced: a dead letter
of a record that was itself a replay (it failed again: its ``embedstream.original.replayed`` header),
and the reasons the same bytes can never pass (:data:`REASONS`' ``replay`` False: a fix upstream
makes a new record, not a replay).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaError, TopicPartition

from connectors.kafka import logged, make_producer
from worker.settings import Settings
from worker.steps.writing.fit import OWN_PREFIX as OWN
from worker.steps.writing.fit import RENAMED_PREFIX as RENAMED

#: The marker a replayed record carries: the dead letter it came from.
REPLAYED = "embedstream.replayed"


@dataclass(frozen=True)
class Reason:
    cause: str
    fix: str
    #: Whether the same record can succeed once the cause is fixed on the worker's side (a setting,
    #: the registry, the collection, the topic), so that a replay makes sense.
    replay: bool


#: Every reason a dead letter gives: what causes it, how to fix it, whether to replay after the fix.
REASONS: dict[str, Reason] = {
    "decode_error": Reason("the value is neither the document schema's Avro nor a JSON object (or the topic is "
                           "not a documents topic)", "fix the producer's serializer; check EMBEDSTREAM_INPUT_TOPIC",
                           False),
    "invalid_utf8": Reason("the text is not valid UTF-8", "encode text as UTF-8 in the producer", False),
    "empty_text": Reason("the text is empty or only whitespace", "send a tombstone to delete a document", False),
    "text_too_long": Reason("the text is over EMBEDSTREAM_MAX_TEXT_BYTES", "raise EMBEDSTREAM_MAX_TEXT_BYTES, or "
                            "split the text upstream", True),
    "id_too_long": Reason("the document id is over the collection's id length", "use a document id, not the "
                          "content, as the id", False),
    "id_mismatch": Reason("the record's key is not its document's id", "key each record by its id, or set "
                          "EMBEDSTREAM_KEY_FIELD for a structured key", True),
    "unknown_model": Reason("the record asks for a model this worker does not serve", "serve it "
                            "(EMBEDSTREAM_MODELS), or fix the producers' model field", True),
    "unknown_schema": Reason("the registry does not know the record's schema id", "point "
                             "EMBEDSTREAM_SCHEMA_REGISTRY_URL at the producers' registry", True),
    "incompatible_schema": Reason("the writer's schema drops or retypes the id or the text field, or is one the "
                                  "worker refuses to read", "fix the producers' schema; records written with it "
                                  "stay unreadable", False),
    "too_many_chunks": Reason("the text makes more chunks than EMBEDSTREAM_MAX_CHUNKS", "raise "
                              "EMBEDSTREAM_MAX_CHUNKS, or split the document upstream", True),
    "output_too_large": Reason("the output record would be over the output topic's size limit", "raise the output "
                               "topic's max.message.bytes (and EMBEDSTREAM_KAFKA__MESSAGE_MAX_BYTES)", True),
    "metadata_too_large": Reason("the metadata is over what a Milvus row takes (64 KB of JSON) or has too many "
                                 "entries", "trim the metadata upstream", False),
    "milvus_rejected": Reason("Milvus refused the document (the message carries its answer)", "fix the collection "
                              "(`embedstream migrate` makes a new one) or the document", True),
    "output_rejected": Reason("the broker refused the output record (the message carries its answer)", "fix the "
                              "output topic's configuration", True),
    "delivery_count_exceeded": Reason("a share group delivered the record too often without an answer (workers "
                                      "crashed or stalled on it, or an outage outlasted its locks)", "find what "
                                      "stalled; raise the group's share.delivery.count.limit", True),
}


@dataclass(frozen=True)
class DeadLetter:
    """One record of the DLQ topic."""

    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()

    def header(self, name: str) -> str | None:
        for k, v in self.headers:
            if k == name:
                return (v or b"").decode("utf-8", "replace")
        return None

    @property
    def reason(self) -> str:
        return self.header("embedstream.error.reason") or "unknown"

    @property
    def message(self) -> str:
        return self.header("embedstream.error.message") or ""

    @property
    def source(self) -> tuple[str, int, int] | None:
        """``(topic, partition, offset)`` of the input record it was."""
        topic, part, off = (self.header(f"embedstream.source.{n}") for n in ("topic", "partition", "offset"))
        try:
            return (topic or "", int(part or ""), int(off or ""))
        except ValueError:
            return None

    @property
    def replay_of(self) -> str | None:
        """The marker of the replay this record was, when it was one (it failed again)."""
        return self.header(RENAMED + REPLAYED.removeprefix(OWN))

    def original_headers(self) -> list[tuple[str, bytes | None]]:
        """The producer's headers as it wrote them: the worker's dropped, a renamed one given its
        name back (``embedstream.original.x`` → ``embedstream.x``), an earlier replay marker dropped."""
        out = []
        for name, value in self.headers:
            if name.lower().startswith(RENAMED):
                name = OWN + name[len(RENAMED):]
                if name.lower() == REPLAYED:
                    continue
            elif name.lower().startswith(OWN):
                continue
            out.append((name, value))
        return out

    def marker(self, topic: str) -> str:
        return f"{topic}:{self.partition}:{self.offset}"


@dataclass(frozen=True)
class Selection:
    """Which dead letters: by reason, by key, by partition and offset range (inclusive); empty
    means any."""

    reasons: frozenset[str] = frozenset()
    keys: frozenset[str] = frozenset()
    partition: int | None = None
    first: int | None = None
    last: int | None = None

    def __call__(self, d: DeadLetter) -> bool:
        key = (d.key or b"").decode("utf-8", "replace")
        return ((not self.reasons or d.reason in self.reasons) and (not self.keys or key in self.keys)
                and (self.partition is None or d.partition == self.partition)
                and (self.first is None or d.offset >= self.first) and (self.last is None or d.offset <= self.last))


def parse_offsets(text: str) -> tuple[int | None, int | None]:
    """``A-B``, ``A-`` or ``-B`` (inclusive) → ``(A, B)``; a single ``N`` is ``(N, N)``. ValueError
    naming the form when it is none of those."""
    first, dash, last = text.partition("-")
    try:
        if not dash:
            return int(first), int(first)
        return (int(first) if first else None), (int(last) if last else None)
    except ValueError:
        raise ValueError(f"--offsets {text!r}: give A-B, A- or -B (DLQ offsets, inclusive)") from None


def _consumer(s: Settings) -> Consumer:
    return Consumer(logged({**s.kafka_common(), "group.id": f"embedstream-dlq-{uuid.uuid4().hex[:8]}",
                            "enable.auto.commit": False, "enable.partition.eof": True,
                            "isolation.level": "read_committed"}))


def read_records(s: Settings, topic: str, since_ms: int | None = None,
                 starts: dict[int, int] | None = None) -> Iterator:
    """Every record of ``topic`` up to the end offsets seen at the start: confluent-kafka messages,
    in each partition's order. From the first offset; or, per partition, from the first record at or
    after ``since_ms`` and no later than ``starts[partition]``."""
    consumer = _consumer(s)
    try:
        meta = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if meta is None or meta.error is not None:
            raise RuntimeError(f"topic {topic!r} not found on {s.kafka_bootstrap_servers}")
        parts = sorted(meta.partitions)
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts}
        first = {p: 0 for p in parts}
        if since_ms is not None:
            found = consumer.offsets_for_times([TopicPartition(topic, p, since_ms) for p in parts], timeout=10)
            first = {tp.partition: tp.offset if tp.offset >= 0 else ends[tp.partition] for tp in found}
            first = {p: min(o, (starts or {}).get(p, o)) for p, o in first.items()}
        todo = {p for p in parts if first[p] < ends[p]}
        consumer.assign([TopicPartition(topic, p, first[p]) for p in parts if p in todo])
        while todo:
            for msg in consumer.consume(num_messages=500, timeout=1.0):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        todo.discard(msg.partition())
                        continue
                    raise RuntimeError(f"reading {topic}: {err}")
                offset = msg.offset() or 0
                if offset >= ends[msg.partition()]:
                    todo.discard(msg.partition())
                    continue
                yield msg
                if offset + 1 >= ends[msg.partition()]:
                    todo.discard(msg.partition())
    finally:
        consumer.close()


def dead_letters(s: Settings, select: Callable[[DeadLetter], bool] = lambda _d: True) -> Iterator[DeadLetter]:
    """The DLQ topic's dead letters that ``select`` takes."""
    for msg in read_records(s, s.dlq_topic):
        d = DeadLetter(msg.partition(), msg.offset(), msg.timestamp()[1], msg.key(), msg.value(),
                       tuple(msg.headers() or ()))
        if select(d):
            yield d


@dataclass
class ReasonSummary:
    count: int = 0
    first: DeadLetter | None = None
    last: DeadLetter | None = None
    source_partitions: set[int] = field(default_factory=set)

    def add(self, d: DeadLetter) -> None:
        self.count += 1
        if self.first is None or d.timestamp_ms < self.first.timestamp_ms:
            self.first = d
        if self.last is None or d.timestamp_ms >= self.last.timestamp_ms:
            self.last = d
        if d.source is not None:
            self.source_partitions.add(d.source[1])


def summarise(letters: Iterable[DeadLetter]) -> dict[str, ReasonSummary]:
    """By reason, most frequent first."""
    by: dict[str, ReasonSummary] = {}
    for d in letters:
        by.setdefault(d.reason, ReasonSummary()).add(d)
    return dict(sorted(by.items(), key=lambda kv: (-kv[1].count, kv[0])))


@dataclass
class InputScan:
    """What the input topic holds since the selected dead letters: the replay markers on it, and the
    last offset of each key in each partition."""

    markers: set[str] = field(default_factory=set)
    last: dict[tuple[int, bytes | None], int] = field(default_factory=dict)

    def newer(self, d: DeadLetter, input_topic: str) -> bool:
        """Whether a later record of ``d``'s key came after the input record ``d`` was (an update or a
        delete): replaying ``d`` would then write an older version over it."""
        src = d.source
        return src is not None and src[0] == input_topic and self.last.get((src[1], d.key), -1) > src[2]


def scan_input(s: Settings, letters: list[DeadLetter]) -> InputScan:
    """The input topic read from the oldest selected dead letter's time, and in each partition from
    the first input record those dead letters were, if earlier (``InputScan``)."""
    scan = InputScan()
    if not letters:
        return scan
    starts: dict[int, int] = {}
    for d in letters:
        src = d.source
        if src is not None and src[0] == s.input_topic:
            starts[src[1]] = min(starts.get(src[1], src[2]), src[2])
    for msg in read_records(s, s.input_topic, since_ms=min(d.timestamp_ms for d in letters), starts=starts):
        scan.last[(msg.partition(), msg.key())] = msg.offset()
        for name, value in msg.headers() or ():
            if name == REPLAYED and value:
                scan.markers.add(value.decode("utf-8", "replace"))
    return scan


@dataclass
class ReplayPlan:
    """What a replay produces (``send``) and what it leaves, by why."""

    send: list[DeadLetter] = field(default_factory=list)
    already: list[DeadLetter] = field(default_factory=list)
    superseded: list[DeadLetter] = field(default_factory=list)
    failed_again: list[DeadLetter] = field(default_factory=list)
    never: list[DeadLetter] = field(default_factory=list)


def plan_replay(s: Settings, letters: list[DeadLetter], force: bool = False) -> ReplayPlan:
    """Sort ``letters`` into what to replay and what not (the module doc). ``force`` replays the ones
    that failed again and the reasons that cannot pass; never one already replayed, nor one whose key
    has a later record on the input topic (a replay would put the older version back on top)."""
    plan = ReplayPlan()
    scan = scan_input(s, letters)
    for d in letters:
        reason = REASONS.get(d.reason)
        if d.marker(s.dlq_topic) in scan.markers:
            plan.already.append(d)
        elif scan.newer(d, s.input_topic):
            plan.superseded.append(d)
        elif d.replay_of is not None and not force:
            plan.failed_again.append(d)
        elif (reason is None or not reason.replay) and not force:
            plan.never.append(d)
        else:
            plan.send.append(d)
    return plan


def replay(s: Settings, letters: list[DeadLetter]) -> int:
    """Produce each of ``letters`` to the input topic as its producer wrote it, with its replay
    marker; returns how many the broker acknowledged (raises RuntimeError on a refusal)."""
    producer = make_producer(s.kafka_common())
    failures: list[str] = []

    def acked(err, msg) -> None:
        if err is not None:
            failures.append(str(err))

    for d in letters:
        headers: list[tuple[str, str | bytes | None]] = [*d.original_headers(),
                                                         (REPLAYED, d.marker(s.dlq_topic).encode())]
        producer.produce(s.input_topic, key=d.key, value=d.value, headers=headers, on_delivery=acked)
        producer.poll(0)
    left = producer.flush(60)
    if failures or left:
        raise RuntimeError(f"{len(failures) + left} of {len(letters)} replayed records were not acknowledged: "
                           f"{failures[:1] or ['timed out']}")
    return len(letters)


def as_text(data: bytes | None, limit: int = 2000) -> str:
    """Bytes for display: the text where they are UTF-8, else their size and first bytes in hex."""
    if data is None:
        return "(none)"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return f"({len(data):,} bytes, not UTF-8) {data[:48].hex()}"
    return text if len(text) <= limit else text[:limit] + f"… ({len(text):,} characters)"


def as_document(key: bytes | None, value: bytes | None) -> dict | None:
    """The dead letter's value read as a document (JSON or the schema's Avro; registry-framed values
    are not read: no registry is asked), for display: ``{"id", "text", "model", "metadata"}``; None
    where it does not read as one."""
    from schemas.codec import Document, decode_document

    try:
        doc = decode_document(key, value)
    except Exception:  # display only: whatever made it a dead letter may make it unreadable here too
        return None
    if not isinstance(doc, Document):
        return None
    return {"id": doc.id, "text": as_text(doc.text.encode()), "model": doc.model, "metadata": doc.metadata}
