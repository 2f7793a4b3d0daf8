"""Helpers shared by the integration tests: fresh topics per test, reading topics back."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
import warnings
from pathlib import Path
from typing import NoReturn

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from connectors.kafka import create_topics, make_admin
from worker.settings import Settings

REPO = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "worker.commands.cli"]


class CountingModel:
    """A model that counts the texts reaching it, in front of the real one (the cache tests); the
    canary a worker embeds once at start-up (``worker.embedding.canary``) is counted apart."""

    def __init__(self, model) -> None:
        self._model = model
        self.texts = 0
        self.canaries = 0

    def __getattr__(self, name):
        return getattr(self._model, name)

    def embed(self, texts):
        from worker.embedding.canary import CANARY_TEXTS

        if tuple(texts) == CANARY_TEXTS:
            self.canaries += 1
        else:
            self.texts += len(texts)
        return self._model.embed(texts)

    def embed_prepared(self, prepared):  # the worker's call (texts made ready off its thread)
        self.texts += len(prepared)
        return self._model.embed_prepared(prepared)


def fresh_settings(env: dict[str, str], partitions: int = 6, compacted_input: bool = False,
                   topic_config: dict[str, dict[str, str]] | None = None, **overrides) -> Settings:
    """Settings pointing at the local stack with new topics, group and collection for one test (the
    input topic compacted on ``compacted_input``, as `dev up` makes it; ``topic_config`` by role,
    ``input`` / ``output`` / ``dlq``, e.g. a ``max.message.bytes``)."""
    tag = uuid.uuid4().hex[:8]
    values = dict(
        kafka_bootstrap_servers=env["EMBEDSTREAM_KAFKA_BOOTSTRAP_SERVERS"],
        redis_url=env["EMBEDSTREAM_REDIS_URL"],
        milvus_uri=env["EMBEDSTREAM_MILVUS_URI"],
        kafka={"session.timeout.ms": env["EMBEDSTREAM_KAFKA__SESSION_TIMEOUT_MS"]},
        input_topic=f"docs-{tag}",
        output_topic=f"emb-{tag}",
        dlq_topic=f"dlq-{tag}",
        group_id=f"grp-{tag}",
        milvus_collection=f"c_{tag}",
        metrics_port=0,
    )
    s = Settings(**{**values, **overrides})
    config = {s.input_topic: {"cleanup.policy": "compact"}} if compacted_input else {}
    for role, extra in (topic_config or {}).items():
        topic = {"input": s.input_topic, "output": s.output_topic, "dlq": s.dlq_topic}[role]
        config[topic] = {**config.get(topic, {}), **extra}
    create_topics(make_admin(s.kafka_common()), [s.input_topic, s.output_topic, s.dlq_topic], partitions,
                  config=config)
    return s


def settings_env(s: Settings) -> dict[str, str]:
    """The environment that makes a subprocess `embedstream` see the same settings as ``s``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMBEDSTREAM_")}
    env.update(s.environment())
    env["HF_HUB_OFFLINE"] = "1"
    return env


def run_cli(args: list[str], env: dict[str, str], timeout: float = 300, *, cold: bool = False,
            **kw) -> subprocess.CompletedProcess:
    """``embedstream *args`` in ``env`` to its end: ``subprocess.run``'s result, text captured. Taken
    ready-imported from the fault harness's warm pool (``tests.faults.harness.warm_cli``: the 2 s of
    imports done while the test before ran) where the pool has a process for ``env``; started from
    nothing where ``cold`` (the start itself is what is tested), where ``kw`` (stdin) is given, or
    where the pool has none."""
    if not cold and not kw:
        from tests.faults.harness import warm_cli

        done = warm_cli(args, env, timeout)
        if done is not None:
            return done
    return subprocess.run([*CLI, *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout, **kw)


#: Set by .ci/run: a test that cannot run for a missing tool fails instead of skipping, so a CI run that
#: quietly lost Helm's engine, promtool, ``unshare`` or the release history cannot pass.
STRICT_TOOLS = os.environ.get("SUITE_STRICT_TOOLS") == "1"


def missing_tool(reason: str, *, module: bool = False) -> NoReturn:
    """Skip for a tool this host lacks (``reason`` says which setup step installs it); under
    ``SUITE_STRICT_TOOLS=1`` (CI) fail instead. ``module``: called at a module's top level."""
    import pytest

    if STRICT_TOOLS:
        pytest.fail(f"a tool the suite needs is missing (SUITE_STRICT_TOOLS=1): {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=module)


def avro_long(n: int) -> bytes:
    """``n`` as Avro writes a long (zig-zag varint): for records built byte by byte."""
    z, out = (n << 1) ^ (n >> 63), bytearray()
    while z & ~0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def read_topic(s: Settings, topic: str, expect: int | None = None, idle: float = 3.0,
               deadline: float = 60.0, isolation: str = "read_committed") -> list:
    """Every message of ``topic`` from the beginning to its partitions' end offsets (the high-water
    mark; the last stable offset under read_committed), as the broker says them when the reader gets
    there: exact, with no wait past them. With ``expect``, reads on until that many are in (records
    still being written) and then to the end offsets, so extras already there are counted. ``idle``:
    where a partition never reports its end, how long nothing new may arrive before the read stops.
    ``isolation="read_uncommitted"`` shows the records of open and aborted transactions too."""
    c = Consumer({**s.kafka_common(), "group.id": f"reader-{uuid.uuid4().hex[:6]}", "enable.auto.commit": False,
                  "enable.partition.eof": True, "isolation.level": isolation})
    meta = c.list_topics(topic, timeout=10).topics[topic]
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in meta.partitions])
    out = []
    at_end: set[int] = set()
    end = time.monotonic() + deadline
    last = time.monotonic()
    try:
        while time.monotonic() < end:
            msgs = c.consume(500, 0.2)
            for m in msgs:
                if m.error():
                    if m.error().code() != KafkaError._PARTITION_EOF:
                        raise RuntimeError(m.error())
                    at_end.add(m.partition())
                    continue
                at_end.discard(m.partition())
                out.append(m)
                last = time.monotonic()
            enough = expect is None or len(out) >= expect
            if enough and len(at_end) == len(meta.partitions):
                break
            if enough and time.monotonic() - last > idle:
                break
    finally:
        c.close()
    if expect is not None and len(out) < expect:  # a wrong count costs the whole deadline: say so
        warnings.warn(f"read_topic({topic}): {len(out)} of the {expect} records expected, after {deadline:.0f} s",
                      stacklevel=2)
    return out


CHUNK_ROW_FIELDS = ("id", "doc_id", "chunk_index", "chunk_count", "span_start", "span_end", "source_offset",
                    "content_hash", "metadata", "vector")


def documents_in_milvus(s: Settings) -> dict[str, list[dict]]:
    """Every document in the collection: its chunk rows in chunk order. Asserts each document holds
    exactly the chunks of one version (indexes 0..count-1, one count, one source offset)."""
    from connectors.milvus import MilvusReader

    store = MilvusReader(s.milvus_uri, s.milvus_collection, timeout=30, options=s.milvus_options())
    rows = store.query_ids(fields=CHUNK_ROW_FIELDS)
    store.close()
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)), "a Milvus id appears twice"
    docs: dict[str, list[dict]] = {}
    for r in sorted(rows, key=lambda r: (r["doc_id"], r["chunk_index"])):
        docs.setdefault(r["doc_id"], []).append(r)
    for doc, chunks in docs.items():
        assert [r["chunk_index"] for r in chunks] == list(range(chunks[0]["chunk_count"])), \
            f"{doc}: chunks {[r['chunk_index'] for r in chunks]} of {chunks[0]['chunk_count']}"
        assert len({(r["chunk_count"], r["source_offset"]) for r in chunks}) == 1, f"{doc}: chunks of two versions"
    return docs


def check_bm25_texts(s: Settings, docs: dict[str, list[dict]], texts: dict[str, str]) -> None:
    """With ``EMBEDSTREAM_SPARSE=bm25``: the collection holds a ``text`` for exactly the rows of
    ``docs`` (``documents_in_milvus``), each its chunk's span of the document's newest text
    (``texts``, before normalisation) as BM25 indexes it (``bm25_text``), so BM25 scores what the
    dense vector embeds."""
    from connectors.milvus import MilvusReader
    from connectors.milvus.schema import bm25_text
    from worker.core.records import normalise_text

    reader = MilvusReader(s.milvus_uri, s.milvus_collection, timeout=30)
    try:
        assert reader.sparse_kind() == "bm25"
        held = {r["id"]: r["text"] for r in reader.query_ids(("id", "text"))}
    finally:
        reader.close()
    assert len(held) == sum(len(c) for c in docs.values()), "a text row without its chunk row, or one missing"
    for doc, chunks in docs.items():
        text = normalise_text(texts[doc])
        wrong = [r["id"] for r in chunks if held[r["id"]] != bm25_text(text[r["span_start"]:r["span_end"]])]
        assert not wrong, f"{doc}: the text of {wrong} is not its chunk's"


def cosine_floor(precision: str) -> float:
    """The least cosine a worker's vector keeps to a direct fp32/encode of the same text at this
    precision: fp32 the same computation, bf16/fp16 rounding, int8 the gate of ``worker.embedding.int8``."""
    from worker.embedding.int8 import MIN_COSINE

    return {"fp32": 0.999, "int8": MIN_COSINE}.get(precision, 0.995)


_FP32_TWINS: dict[str, object] = {}


def reference_model(model):
    """What a worker's vectors are compared with: the model itself, or for int8 its float32 twin (int8
    is gated against float32, and quantizes activations per batch: two int8 encodes of one text in
    other batches can differ by more than either differs from float32)."""
    if getattr(model, "precision", None) != "int8":
        return model
    from worker.embedding.sentence import SentenceTransformerEmbedder

    key = str(model.model_path)
    if key not in _FP32_TWINS:
        _FP32_TWINS[key] = SentenceTransformerEmbedder(key, "fp32", "cpu")
    return _FP32_TWINS[key]


def rows_not_at(docs: dict[str, list[dict]], texts: dict[str, str]) -> list[str]:
    """The documents of ``docs`` (``documents_in_milvus``) with a row whose ``content_hash`` is not the
    hash of its span of ``texts[doc]`` (the text as produced): a row of another version. Exact where a
    cosine is not: versions that differ by a word embed within any usable threshold of each other."""
    from worker.core.records import content_hash, normalise_text

    clean = {d: normalise_text(texts[d]) for d in docs}
    return sorted({r["doc_id"] for chunks in docs.values() for r in chunks
                   if r["content_hash"] != content_hash(clean[r["doc_id"]][r["span_start"]:r["span_end"]])})


def min_cosine_to_direct_encode(model, docs: dict[str, list[dict]], texts: dict[str, str]) -> float:
    """The lowest cosine between a row's vector and a direct encode of its span of the document's
    text (``texts``: document id → the text as produced) by ``reference_model(model)``."""
    import numpy as np

    from tools.reference import encode_reference
    from worker.core.records import normalise_text

    rows = [r for chunks in docs.values() for r in chunks]
    assert rows, "no rows to compare: a similarity of nothing would pass any threshold"
    clean = {d: normalise_text(texts[d]) for d in docs}
    got = np.array([r["vector"] for r in rows], dtype=np.float32)
    spans = [clean[r["doc_id"]][r["span_start"]:r["span_end"]] for r in rows]
    # The fault scenarios stream the same texts (``short_docs``): each is encoded once a session.
    reference = reference_model(model)
    memo: dict[str, np.ndarray] = reference.__dict__.setdefault("_direct_encodes", {})
    new = list(dict.fromkeys(t for t in spans if t not in memo))
    if new:
        memo.update(zip(new, encode_reference(reference, new)))
    ref = np.stack([memo[t] for t in spans])
    cos = (got * ref).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(ref, axis=1)
    return float(cos.min())


def document_schema_with(**field) -> str:
    """``document.avsc`` evolved by one added field (e.g. an optional one: a BACKWARD-compatible v2)."""
    import json

    from schemas.codec import DOCUMENT_SCHEMA_TEXT

    schema = json.loads(DOCUMENT_SCHEMA_TEXT)
    schema["fields"].append(field)
    return json.dumps(schema)


def registry_serializer(client, schema: str, topic: str, key: bool = False):
    """confluent-kafka's own ``AvroSerializer`` for ``topic`` (topic-name subject strategy), as a
    function of one record."""
    from confluent_kafka.schema_registry import topic_subject_name_strategy
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    ser = AvroSerializer(client, schema, conf={"subject.name.strategy": topic_subject_name_strategy})
    ctx = SerializationContext(topic, MessageField.KEY if key else MessageField.VALUE)
    return lambda obj: ser(obj, ctx)


def ask(port: int, path: str) -> int | str:
    """One GET of a worker's ``path`` (``/healthz``, ``/readyz``) on ``port``: its status, or the
    name of the error when there was no answer (the server gone, or too busy to answer within 2 s)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as reply:
            return reply.status
    except urllib.error.HTTPError as refused:
        return refused.code
    except Exception as exc:
        return type(exc).__name__


class Trickle:
    """``clients`` connections to ``port`` that each send a byte every ``every`` seconds (slow loris,
    reconnecting when closed), and a probe of ``/healthz`` every ``probe_every`` seconds; ``probes``
    holds each probe's status (or the error's name). :meth:`stop` ends both."""

    def __init__(self, port: int, clients: int = 40, every: float = 5.0, probe_every: float = 0.5) -> None:
        self.port, self.clients, self.every, self.probe_every = port, clients, every, probe_every
        self.probes: list[int | str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._attack, daemon=True),
                         threading.Thread(target=self._probe, daemon=True)]
        for t in self._threads:
            t.start()

    def _attack(self) -> None:
        socks: list[socket.socket] = []
        while not self._stop.is_set():
            while len(socks) < self.clients:
                try:
                    socks.append(socket.create_connection(("127.0.0.1", self.port), timeout=2))
                except OSError:
                    break
            for s in list(socks):
                try:
                    s.send(b"G")
                except OSError:
                    socks.remove(s)
                    s.close()
            self._stop.wait(self.every)
        for s in socks:
            s.close()

    def _probe(self) -> None:
        while not self._stop.is_set():
            self.probes.append(ask(self.port, "/healthz"))
            self._stop.wait(self.probe_every)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(10)
