"""One measurement each: raw encode, the worker end to end, Milvus bulk upsert, a peer engine, latency."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from prometheus_client import REGISTRY

from connectors.kafka import create_topics, make_admin
from connectors.milvus import MilvusAdmin, MilvusStore
from connectors.milvus.schema import ChunkRows
from schemas.codec import Document, encode_document
from worker.commands.produce import document_record, produce_records
from worker.core.records import Batch, Written, normalise_text
from worker.core.stats import RunStats
from worker.embedding.base import Embedder
from worker.settings import Settings


def cache_counts() -> tuple[float, float]:
    """``(hits, misses)`` of the cache so far in this process (its metric: distinct texts per group)."""
    get = REGISTRY.get_sample_value
    return (get("embedstream_cache_requests_total", {"result": "hit"}) or 0.0,
            get("embedstream_cache_requests_total", {"result": "miss"}) or 0.0)


@dataclass
class CpuRunStats(RunStats):
    """The run's counters, plus this process's CPU clock (``time.process_time``) when the first
    record arrived and when the last batch finished: CPU per document while busy, without the
    start-up and the group join (the CPU/doc rows). Handed to the worker (``build_worker(stats=)``)."""

    first_record_cpu: float | None = None
    last_done_cpu: float | None = None

    def arrived(self) -> None:
        if self.first_record_at is None:
            self.first_record_cpu = time.process_time()
        super().arrived()

    def account(self, batch: Batch, written: Written) -> None:
        super().account(batch, written)
        self.last_done_cpu = time.process_time()

    @property
    def busy_cpu_seconds(self) -> float:
        """CPU seconds of this process (all its threads) over :attr:`busy_seconds`."""
        started, ended = self.first_record_cpu, self.last_done_cpu
        return ended - started if started is not None and ended is not None else 0.0


@dataclass
class StreamResult:
    docs: int
    seconds: float
    cached: int
    tokens_real: int = 0
    tokens_padded: int = 0
    #: CPU seconds of this process (the worker's threads; the stack runs in its own processes) from
    #: the first record to the last batch done: the per-document cost, start-up and group join left out.
    cpu_seconds: float = 0.0
    #: The same over the whole run (start-up, group join and the idle wait at the end included).
    cpu_run_seconds: float = 0.0
    #: Groups of batches the sink wrote (with exactly-once: transactions with records).
    sink_groups: int = 0
    #: ``worker_stream(threads=True)``: CPU seconds of the run by thread (``thread_cpu``): "polling"
    #: (the loop's own thread), each thread of the worker that ended, and "other" (the rest of the
    #: process: librdkafka's and gRPC's threads, and the worker's that outlived the run).
    thread_cpu: dict[str, float] = field(default_factory=dict)

    @property
    def docs_per_s(self) -> float:
        return self.docs / self.seconds if self.seconds > 0 else 0.0

    @property
    def cpu_us_per_doc(self) -> float:
        return 1e6 * self.cpu_seconds / self.docs if self.docs else 0.0

    @property
    def docs_per_group(self) -> float:
        return self.docs / self.sink_groups if self.sink_groups else 0.0


def _thread_group(name: str, module: str = "") -> str:
    """``milvus-write_0`` → ``milvus-write``; ``Thread-3 (serve_forever)`` → ``serve_forever``; a
    thread whose target is gRPC's (``module``) → ``grpc``."""
    if module.startswith("grpc"):
        return "grpc"
    m = re.fullmatch(r"Thread-\d+ \((.*)\)", name)
    return m.group(1) if m else re.sub(r"[_-]\d+$", "", name)


@contextmanager
def thread_cpu(into: dict[str, float]) -> Iterator[None]:
    """Add to ``into`` the CPU seconds of each thread that ends inside the block, by
    ``_thread_group`` of its name, read by the thread itself as it ends (``time.thread_time``):
    ``Thread.run`` is wrapped while the block runs (a measuring tool's patch, never the worker's)."""
    original, lock = threading.Thread.run, threading.Lock()

    def run(thread: threading.Thread) -> None:
        module = getattr(getattr(thread, "_target", None), "__module__", "") or ""  # run() deletes _target
        try:
            original(thread)
        finally:
            with lock:
                group = _thread_group(thread.name, module)
                into[group] = into.get(group, 0.0) + time.thread_time()

    threading.Thread.run = run  # type: ignore[method-assign]
    try:
        yield
    finally:
        threading.Thread.run = original  # type: ignore[method-assign]


#: A probe of the host's speed (``host_gauge``): a fixed pure-Python loop of small objects, a dict and a
#: str (the kind of code the worker's per-record path is), timed in CPU every ``period`` seconds.
_GAUGE_SCRIPT = r"""
import sys, time
steps, period = int(sys.argv[1]), float(sys.argv[2])
while True:
    t0 = time.process_time()
    table = {}
    for i in range(steps):
        table[i & 1023] = (i, str(i))
    print(round(1e9 * (time.process_time() - t0) / steps, 1), flush=True)
    time.sleep(period)
"""


@contextmanager
def host_gauge(into: list[float], steps: int = 20_000, period: float = 0.1) -> Iterator[None]:
    """While the block runs, a process of its own times a fixed Python loop every ``period`` seconds
    (~4 ms of one core each) and appends its nanoseconds a step to ``into``: how fast this host runs
    Python during the block. This project's hosts differ by half from one session to the next, and
    one host switches between a fast and a slow speed (~110 and ~170-230 ns here, 2026-11-25) for
    tenths of a second at a time, so a CPU figure moves with the share of its run spent slow; the
    gauge's median beside it says which host, and which phase, it came from."""
    probe = subprocess.Popen([sys.executable, "-c", _GAUGE_SCRIPT, str(steps), str(period)],
                             stdout=subprocess.PIPE, text=True)
    try:
        yield
    finally:
        probe.terminate()
        out, _ = probe.communicate(timeout=10)
        into.extend(float(line) for line in out.split())


@contextmanager
def library_encode_at_int8(embedder):
    """While open, ``embedder.sentence_transformer.encode`` runs the embedder's int8 transformer when
    it has one (its first module's ``forward`` shadowed on the instance: the library still tokenizes,
    batches and pools), so the raw encode is taken at the worker's own precision."""
    int8_module = getattr(embedder, "int8_transformer", None)
    if int8_module is None:
        yield
        return
    first = embedder.sentence_transformer[0]
    first.forward = lambda features, **_kwargs: int8_module(features)
    try:
        yield
    finally:
        del first.forward


def raw_encode(embedder, texts: list[str], batch_sizes=(32, 64, 128)) -> tuple[float, int]:
    """``SentenceTransformer.encode`` docs/s at its best batch size (after one warm-up pass), at the
    embedder's precision (int8: through its int8 transformer, ``library_encode_at_int8``)."""
    model = embedder.sentence_transformer
    clean = [normalise_text(t) for t in texts]
    with library_encode_at_int8(embedder):
        model.encode(clean[:64], batch_size=32)
        best, best_bs = 0.0, batch_sizes[0]
        for bs in batch_sizes:
            t0 = time.perf_counter()
            model.encode(clean, batch_size=bs, convert_to_numpy=True, normalize_embeddings=True)
            rate = len(clean) / (time.perf_counter() - t0)
            if rate > best:
                best, best_bs = rate, bs
    return best, best_bs


def fresh_topics(base: Settings, partitions: int = 6, **overrides) -> Settings:
    tag = uuid.uuid4().hex[:8]
    s = base.model_copy(update={"input_topic": f"bench-in-{tag}", "output_topic": f"bench-out-{tag}",
                                "dlq_topic": f"bench-dlq-{tag}", "group_id": f"bench-{tag}",
                                "milvus_collection": f"bench_{tag}", **overrides})
    create_topics(make_admin(s.kafka_common()), [s.input_topic, s.output_topic, s.dlq_topic], partitions)
    return s


def commit_at_end(s: Settings) -> None:
    """``s.group_id``'s offsets at the end of every partition of the input topic, as a group's that has
    consumed what is there: a worker of that group waits for new records (a backfill beside it reads
    the topic from its start)."""
    from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, TopicPartition

    c = Consumer({**s.kafka_common(), "group.id": f"end-offsets-{uuid.uuid4().hex[:6]}"})
    try:
        partitions = c.list_topics(s.input_topic, timeout=10).topics[s.input_topic].partitions
        ends = [TopicPartition(s.input_topic, p, c.get_watermark_offsets(TopicPartition(s.input_topic, p), 10)[1])
                for p in partitions]
    finally:
        c.close()
    admin = make_admin(s.kafka_common())
    for future in admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(s.group_id, ends)]).values():
        future.result(30)


def produce_texts(s: Settings, texts: list[str], prefix: str,
                  encode: Callable[[Document], bytes] = encode_document, models: list[str] | None = None) -> None:
    """Produce ``texts`` as documents ``<prefix>-<i>``, stamped with the time they were produced
    (asking for ``models`` in turn, when given)."""
    docs = (Document(f"{prefix}-{i}", t, models[i % len(models)] if models else None) for i, t in enumerate(texts))
    produce_records(s.kafka_common(), s.input_topic, (document_record(d, encode=encode) for d in docs))


def model_tokens() -> tuple[float, float]:
    """``(real, padded)`` tokens the model has run so far in this process (its metric)."""
    get = REGISTRY.get_sample_value
    return (get("embedstream_model_tokens_total", {"kind": "real"}) or 0.0,
            get("embedstream_model_tokens_total", {"kind": "padded"}) or 0.0)


#: The Redis database the bench caches in, on the stack's server: it empties it before each workload
#: (:func:`flush_cache`), which must never empty the cache of a worker on the same stack (`dev up`'s
#: database 0, which the worker uses unless told otherwise).
BENCH_REDIS_DB = 15


def bench_redis(env: dict[str, str]) -> str:
    """The local stack's Redis URL (``env``: `dev up`'s) with the bench's own database."""
    from tools.dev import redis_database

    return redis_database(env["EMBEDSTREAM_REDIS_URL"], BENCH_REDIS_DB)


def flush_cache(s: Settings) -> None:
    """Empty the bench's own Redis, so each workload starts cold (repeats inside it still hit)."""
    if s.redis_url is not None:
        import redis

        server = redis.Redis.from_url(s.redis_url.get_secret_value(), socket_timeout=5)
        if int(server.info("cluster").get("cluster_enabled", 0)):  # every master's share
            redis.RedisCluster.from_url(s.redis_url.get_secret_value()).flushdb(target_nodes=redis.RedisCluster.PRIMARIES)
        else:
            server.flushdb()


def drop_collection(s: Settings) -> None:
    """Drop a finished run's collection: later runs should not share milvus-lite with its rows."""
    admin = MilvusAdmin(s.milvus_uri, s.milvus_collection, timeout=30)
    admin.drop()
    admin.close()


class InstantStore(MilvusStore):
    """A Milvus store that keeps nothing and answers at once (``worker_stream(instant_sink=True)``):
    what the worker does without Milvus' cost. Every id reads as new."""

    def __init__(self, *_args, **_kwargs) -> None:
        self.collection = "instant"

    def upsert_chunks(self, rows: ChunkRows, model: str, updated_at: int) -> None:
        pass

    def versions(self, doc_ids: list[str]):
        return {}, {}

    def record_deletes(self, doc_ids, versions, updated_at: int) -> None:
        pass

    def content_hashes(self, ids: list[str]) -> set[str]:
        return set()

    def delete(self, ids: list[str]) -> None:
        pass

    def close(self) -> None:
        pass


def worker_stream(base: Settings, embedder: Embedder | None, texts: list[str], prefix: str,
                  cold: bool = True, registry_url: str | None = None, models: list[str] | None = None,
                  instant_sink: bool = False, threads: bool = False) -> StreamResult:
    """Backlog ``texts`` on a fresh topic, then run the worker until drained: docs/s end to end.
    ``cold``: empty the cache first. ``registry_url``: the input framed by confluent-kafka's
    ``AvroSerializer`` and the output ``avro-registry`` (the registry user's path). ``embedder``
    None: the models of ``base.models``, the texts asking for ``models`` in turn. ``instant_sink``:
    no Redis and a Milvus that keeps nothing (the worker's own ceiling: broker in, model, output
    topic out). ``threads``: also each thread's CPU (``StreamResult.thread_cpu``)."""
    from worker.assembly.runner import build_worker
    from worker.commands.wire import document_encoder

    registry = {"schema_registry_url": registry_url, "output_format": "avro-registry"} if registry_url else {}
    if instant_sink:
        registry["redis_url"] = None
    s = fresh_topics(base, **registry)
    if cold:
        flush_cache(s)
    produce_texts(s, texts, prefix, document_encoder("avro-registry" if registry_url else "avro", s, s.input_topic),
                  models)
    real0, pad0 = model_tokens()
    by_thread: dict[str, float] = {}
    with thread_cpu(by_thread) if threads else nullcontext():
        worker = build_worker(s, embedder=embedder, store_factory=InstantStore if instant_sink else None,
                              stats=CpuRunStats())
        cpu0, polling0 = time.process_time(), time.thread_time()
        # The backlog was produced before the worker started, so the input is at its end (every
        # partition at EOF) once drained: a short idle ends the run (busy time is measured: the idle
        # is not in docs/s).
        stats = worker.run(stop_when_idle=0.3)
        cpu, polling = time.process_time() - cpu0, time.thread_time() - polling0
    if texts and not stats.done:  # never a silent 0 docs/s in the table
        raise RuntimeError(f"the worker embedded none of {len(texts)} documents on {s.input_topic}: it was never "
                           "assigned a partition (a group session the broker refuses?) or read nothing")
    if threads:
        by_thread = {"polling": polling, **by_thread}
        by_thread["other"] = max(0.0, cpu - sum(by_thread.values()))
    if not instant_sink:
        drop_collection(s)
    real1, pad1 = model_tokens()
    groups = sum(stage.groups for stage in worker.chain.pipeline.stages if stage.name == "sink")
    return StreamResult(stats.done, stats.busy_seconds, stats.cached, int(real1 - real0), int(pad1 - pad0),
                        stats.busy_cpu_seconds, cpu, groups, by_thread)


def memory_stream(base: Settings, embedder: Embedder, texts: list[str], prefix: str,
                  partitions: int = 6) -> StreamResult:
    """The worker fed from memory, writing nowhere (the *instant source* row): records on
    ``partitions`` in-memory partitions (``tools.memory_source``), no Redis, a Milvus that keeps
    nothing, an output producer that acknowledges at once. What is left is the worker's own work:
    decoding, batching, the model, encoding: its ceiling, with the broker's and the sinks' shares out."""
    from tools.memory_source import MemoryMessage, MemorySource, NullProducer
    from worker.assembly.chain import build_chain
    from worker.assembly.runner import inflight_limit, load_models
    from worker.core.assignment import Assignment
    from worker.core.delivery import AtLeastOnce
    from worker.core.fence import Fence
    from worker.core.ledger import OffsetLedger
    from worker.core.loop import Worker
    from worker.process.metrics import Health

    s = base.model_copy(update={"redis_url": None})
    records: dict[int, list] = {p: [] for p in range(partitions)}
    now = int(time.time() * 1000)
    for i, text in enumerate(texts):
        doc = Document(f"{prefix}-{i}", text)
        queue = records[i % partitions]
        queue.append(MemoryMessage(doc.id.encode(), encode_document(doc), i % partitions, len(queue),
                                   s.input_topic, None, now))
    consumer = MemorySource(records, topic=s.input_topic)
    models = load_models(s, embedder)
    stores: dict[str, MilvusStore] = {name: InstantStore() for name in models.handles}
    real0, pad0 = model_tokens()
    delivery = AtLeastOnce(NullProducer, s.kafka_timeout_seconds)  # type: ignore[arg-type]
    chain = build_chain(s, delivery, models, {name: None for name in models.handles},  # type: ignore[arg-type]
                        stores, Fence(lease_s=60.0), {})
    ledger = OffsetLedger(consumer, s.commit_interval_ms / 1000)  # type: ignore[arg-type]
    worker = Worker(consumer, s.input_topic, chain, ledger, Assignment(pause_after=5.0, join_grace=0.1),  # type: ignore[arg-type]
                    max_inflight=inflight_limit(s, models), shutdown_grace=s.shutdown_grace_seconds, health=Health(),
                    stats=CpuRunStats())
    cpu0 = time.process_time()
    stats = worker.run(stop_when_idle=0.3)
    real1, pad1 = model_tokens()
    return StreamResult(stats.done, stats.busy_seconds, stats.cached, int(real1 - real0), int(pad1 - pad0),
                        stats.busy_cpu_seconds, time.process_time() - cpu0)


def milvus_bulk_upsert(uri: str, rows: int = 10_000, dim: int = 384, batch: int = 1000) -> tuple[float, float]:
    """Rows/s of plain batched upserts of new rows (the io denominator): ``(rows/s with pymilvus'
    ``MilvusClient.upsert`` of dict rows, rows/s with the worker's columnar request)``, each into a
    fresh collection (re-upserting existing ids costs the server more)."""
    rng = np.random.default_rng(0)
    vecs = rng.standard_normal((rows, dim)).astype(np.float32)
    ids = [f"r{j}" for j in range(rows)]

    def rate(write) -> float:
        admin = MilvusAdmin(uri, f"bench_upsert_{uuid.uuid4().hex[:8]}", timeout=60)
        admin.ensure_collection(dim)
        store = MilvusStore.sharing(admin)
        t0 = time.perf_counter()
        for i in range(0, rows, batch):
            write(store, i, min(batch, rows - i))
        took = time.perf_counter() - t0
        admin.drop()
        admin.close()
        return rows / took

    from pymilvus import MilvusClient

    client = MilvusClient(uri=uri, timeout=60, dedicated=True)  # pymilvus' own packing of dict rows
    row_rate = rate(lambda store, i, n: client.upsert(store.collection, [
        {"id": f"{ids[j]}#0", "doc_id": ids[j], "chunk_index": 0, "chunk_count": 1, "span_start": 0, "span_end": 1,
         "excerpt": "x", "vector": vecs[j], "model": "m", "content_hash": "h", "metadata": {}, "updated_at": 0,
         "source": "bench:0", "source_offset": j}
        for j in range(i, i + n)], timeout=60))
    columnar_rate = rate(lambda store, i, n: store.upsert_chunks(ChunkRows(
        doc_ids=ids[i:i + n], chunk_index=[0] * n, chunk_count=[1] * n, span_start=[0] * n, span_end=[1] * n,
        excerpts=["x"] * n, vectors=vecs[i:i + n], hashes=["h"] * n, metadata=[{}] * n, sources=["bench:0"] * n,
        offsets=list(range(i, i + n))), "m", 0))
    client.close()
    return row_rate, columnar_rate


PEER_SCRIPT = r"""
import asyncio, json, sys, time
from infinity_emb import AsyncEmbeddingEngine, EngineArgs
texts = json.load(open(sys.argv[1]))
args = EngineArgs(model_name_or_path=sys.argv[2], engine="torch", device=sys.argv[3], dtype=sys.argv[4])
async def main():
    engine = AsyncEmbeddingEngine.from_args(args)
    async with engine:
        await engine.embed(sentences=texts[:32])
        t0 = time.perf_counter()
        await asyncio.gather(*[engine.embed(sentences=texts[i:i + 32]) for i in range(0, len(texts), 32)])
        print(json.dumps({"docs_per_s": len(texts) / (time.perf_counter() - t0)}))
asyncio.run(main())
"""

_PEER_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def peer_dtype(precision: str) -> str:
    """infinity's dtype for the worker's ``precision``; for int8, its best on this CPU (bfloat16 where
    the CPU has it, else float32): its ONNX engine, the int8 one, does not install beside it here."""
    from worker.embedding.sentence import fallback_precision

    return _PEER_DTYPES[fallback_precision() if precision == "int8" else precision]


def peer_engine(peer_python: str, model_path: str, texts: list[str], device: str, precision: str,
                workdir: Path) -> float | None:
    """infinity-emb's in-process engine in its own virtualenv; None when it is not runnable."""
    data = workdir / "peer-texts.json"
    data.write_text(json.dumps([normalise_text(t) for t in texts]))
    script = workdir / "peer.py"
    script.write_text(PEER_SCRIPT)
    try:
        out = subprocess.run([peer_python, str(script), str(data), model_path, device, peer_dtype(precision)],
                             capture_output=True, text=True, timeout=900, env={"HF_HUB_OFFLINE": "1",
                                                                               "PATH": "/usr/bin:/bin"})
    except (OSError, subprocess.TimeoutExpired) as exc:
        print(f"peer not run: {exc}", file=sys.stderr)
        return None
    if out.returncode != 0:
        print(f"peer failed: {out.stderr[-1500:]}", file=sys.stderr)
        return None
    return float(json.loads(out.stdout.strip().splitlines()[-1])["docs_per_s"])


def latency_run(base: Settings, embedder: Embedder, texts: list[str], rate: float, seconds: float,
                prefix: str, instant_sink: bool = False) -> tuple[float, float, int]:
    """Open-loop stream at ``rate`` docs/s for ``seconds`` while the worker runs: (p50, p99) in seconds.
    ``instant_sink``: a Milvus that keeps nothing (``InstantStore``)."""
    from worker.assembly.runner import build_worker

    s = fresh_topics(base)
    flush_cache(s)
    worker = build_worker(s, embedder=embedder, store_factory=InstantStore if instant_sink else None)
    joined = on_first_assignment(worker)
    runner = threading.Thread(target=lambda: worker.run(stop_when_idle=1.0))
    runner.start()
    joined.wait(60)  # join first, so that the open-loop stream is not measured against the join
    sent = open_loop(s, texts, rate, seconds, prefix)
    runner.join()
    if not instant_sink:
        drop_collection(s)
    return latencies(s, sent)


def on_first_assignment(worker) -> threading.Event:
    """An event set once ``worker`` (a consumer group's member) is first assigned partitions."""
    joined = threading.Event()
    worker.on_progress = None
    orig_assign = worker.rebalance.on_assign

    def on_assign(consumer, partitions):
        orig_assign(consumer, partitions)
        joined.set()

    worker.rebalance.on_assign = on_assign
    return joined


def open_loop(s: Settings, texts: list[str], rate: float, seconds: float, prefix: str) -> dict[str, int]:
    """Produce ``rate`` × ``seconds`` documents ``<prefix>-<i>`` at ``rate`` docs/s, each stamped with
    its event time: id → event time (ms)."""
    n = max(1, int(rate * seconds))
    sent: dict[str, int] = {}

    def stamped():
        for i in range(n):
            doc = Document(f"{prefix}-{i}", texts[i % len(texts)], None, {}, int(time.time() * 1000))
            sent[doc.id] = doc.event_time or 0
            yield document_record(doc)

    produce_records(s.kafka_common(), s.input_topic, stamped(), rate=rate, **{"linger.ms": 0})
    return sent


def latencies(s: Settings, sent: dict[str, int], model: str | None = None) -> tuple[float, float, int]:
    """(p50, p99, n) in seconds from each of ``sent``'s event time to its output record's timestamp
    (``model``: only records of that model id)."""
    from worker.commands.tail import tail_records

    lat = [(rec["timestamp"] - sent[rec["id"]]) / 1000
           for rec in tail_records(s, from_beginning=True, timeout=1.0)
           if rec.get("id") in sent and rec.get("timestamp", 0) > 0 and (model is None or rec.get("model") == model)]
    if not lat:
        return float("nan"), float("nan"), 0
    return float(np.percentile(lat, 50)), float(np.percentile(lat, 99)), len(lat)


@dataclass
class ProcessesResult:
    """A run of ``embedstream run --processes K`` on a backlog: docs/s from the group's commits, and
    the GPU's utilisation (NVML, % of time a kernel ran) sampled meanwhile (empty without a GPU)."""

    docs: int
    seconds: float
    gpu_busy: list[float] = field(default_factory=list)

    @property
    def docs_per_s(self) -> float:
        return self.docs / self.seconds if self.seconds else 0.0


@contextmanager
def gpu_utilisation(into: list[float], period: float = 0.2) -> Iterator[None]:
    """Samples of the first GPU's utilisation (%, NVML) into ``into`` while the block runs; none where
    NVML (``nvidia-ml-py``) or a GPU is missing."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    except Exception:  # no NVML, no driver, no device: nothing to sample
        yield
        return
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(period):
            into.append(float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu))

    thread = threading.Thread(target=sample, name="gpu-sampler", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def processes_stream(base: Settings, texts: list[str], prefix: str, processes: int, partitions: int = 8,
                     log_path: Path | None = None, timeout_s: float = 600.0) -> ProcessesResult:
    """``embedstream run --processes N`` (each process a member of the group, loading the model of
    ``base``) on a fresh topic of ``max(partitions, processes)`` partitions, end to end: first a
    warm-up of other texts (every process joined, its model loaded and run), then ``texts``
    produced at once, timed from the first one produced until the group has committed the last
    (each batch committed: ``EMBEDSTREAM_COMMIT_INTERVAL_MS=0``; the group's offsets read every
    0.1 s). Cold cache. The processes stop by SIGTERM; their output goes to ``log_path``."""
    from confluent_kafka import Consumer, TopicPartition

    n = max(partitions, processes)
    s = fresh_topics(base, partitions=n, commit_interval_ms=0)
    flush_cache(s)
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMBEDSTREAM_")}
    env.update(s.environment())
    env.update(EMBEDSTREAM_PROCESSES=str(processes), EMBEDSTREAM_METRICS_PORT="0")
    log = log_path.open("ab") if log_path else subprocess.DEVNULL
    proc = subprocess.Popen([sys.executable, "-m", "worker.commands.cli", "run"], env=env, stdout=log,
                            stderr=subprocess.STDOUT)
    watcher = Consumer({**s.kafka_common(), "group.id": s.group_id})
    tps = [TopicPartition(s.input_topic, p) for p in range(n)]
    deadline = time.monotonic() + timeout_s

    def drained(total: int, what: str) -> None:
        while sum(max(tp.offset, 0) for tp in watcher.committed(tps, timeout=10)) < total:
            if proc.poll() is not None:
                raise RuntimeError(f"`run --processes {processes}` exited ({proc.returncode}) during {what}"
                                   + (f": see {log_path}" if log_path else ""))
            if time.monotonic() > deadline:
                raise RuntimeError(f"`run --processes {processes}`: {what} not committed after {timeout_s:.0f}s")
            time.sleep(0.1)

    samples: list[float] = []
    try:
        warm_up = [f"{t} (warm-up)" for t in texts[:max(16 * n, 200)]]
        produce_texts(s, warm_up, f"{prefix}-warm-up")
        drained(len(warm_up), "the warm-up")
        with gpu_utilisation(samples):
            started = time.monotonic()
            produce_texts(s, texts, prefix)
            drained(len(warm_up) + len(texts), "the backlog")
            seconds = time.monotonic() - started
        proc.send_signal(signal.SIGTERM)
        if proc.wait(120) != 0:
            raise RuntimeError(f"`run --processes {processes}` exited {proc.returncode} on SIGTERM")
    finally:
        watcher.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        if log_path:
            log.close()  # type: ignore[union-attr]
    drop_collection(s)
    return ProcessesResult(len(texts), seconds, samples)
