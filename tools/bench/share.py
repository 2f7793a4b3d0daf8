"""Share scaling: docs/s at 1, 2, 4 and 8 consumers on a 2-partition topic, share groups against
consumer groups, on Apache Kafka.

The model is a stand-in for a GPU on this CPU machine: :class:`~tools.fake_embedder.FakeEmbedder`
with a fixed latency per forward pass (``--latency``) plus a latency per text in it
(``--latency-per-doc``: the worker hands the model several batches in one pass when they wait, so
a pass's cost must grow with its size, as a GPU's does once busy). A pass sleeps, so consumers do
not take CPU from each other while their "GPU" works. Each consumer is a whole worker (``build_worker``: its
Kafka client, pipeline, Redis cache and Milvus writes) on a thread of this process. A consumer
group gives each partition to one member, so past 2 members the rest stand idle; a share group hands
any member the records of any partition.

Each row: a fresh topic of 2 partitions, its workers started, a warm-up of ``16 × consumers``
documents drained (every member joined, its group settled), then ``--docs`` documents produced at
once (records batched by the producer in batches of ``--producer-batch``: a share group hands out
whole producer batches), timed from the first produced to the last finished (a consumer group's
committed offsets; a share group's backlog at 0, read as ``embedstream lag`` reads it).

``python -m tools.bench.share [--docs N] [--latency S] [--counts 1,2,4,8] [--output docs/bench]``
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tools.bench import workloads
from tools.bench.measure import bench_redis, drop_collection, flush_cache, fresh_topics
from tools.dev import LocalStack, quick_join_session
from tools.fake_embedder import FakeEmbedder
from worker.commands.produce import document_record, produce_records
from worker.settings import Settings

PARTITIONS = 2


def _produce(s: Settings, texts: list[str], prefix: str, batch: int) -> None:
    from schemas.codec import Document

    docs = (Document(f"{prefix}-{i}", t, None) for i, t in enumerate(texts))
    produce_records(s.kafka_common(), s.input_topic, (document_record(d) for d in docs),
                    **{"batch.num.messages": batch, "linger.ms": 5})


def _finished(s: Settings) -> Callable[[], int]:
    """A function returning how many input records the group has finished so far."""
    if s.group_type == "share":
        from connectors.kafka import make_admin
        from connectors.share_backlog import group_backlog

        admin, props = make_admin(s.kafka_common()), s.kafka_common()

        def by_backlog() -> int:
            found = group_backlog(admin, props, s.group_id, s.input_topic)
            return sum(p.end_offset for p in found) - sum(p.backlog for p in found)

        return by_backlog
    from confluent_kafka import Consumer, TopicPartition

    watcher = Consumer({**s.kafka_common(), "group.id": s.group_id})
    tps = [TopicPartition(s.input_topic, p) for p in range(PARTITIONS)]
    return lambda: sum(max(tp.offset, 0) for tp in watcher.committed(tps, timeout=10))


def _until(done: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} not finished after {timeout:.0f}s")
        time.sleep(0.1)


def one_row(base: Settings, group_type: str, consumers: int, texts: list[str], latency: tuple[float, float],
            producer_batch: int) -> dict:
    """Docs/s of ``consumers`` workers of ``group_type`` on a fresh 2-partition topic."""
    from worker.assembly.runner import build_worker

    s = fresh_topics(base, partitions=PARTITIONS, group_type=group_type, commit_interval_ms=0)
    flush_cache(s)
    per_pass, per_doc = latency
    workers = [build_worker(s, embedder=FakeEmbedder(384, "stand-in", delay_per_batch=per_pass,
                                                     delay_per_text=per_doc)) for _ in range(consumers)]
    threads = [threading.Thread(target=w.run, name=f"consumer-{i}", daemon=True) for i, w in enumerate(workers)]
    for t in threads:
        t.start()
    finished = _finished(s)
    try:
        warm_up = [f"{t} (warm-up)" for t in texts[:16 * consumers]]
        _produce(s, warm_up, "warm-up", producer_batch)
        _until(lambda: finished() >= len(warm_up), 300, "the warm-up")
        time.sleep(2.0)  # a consumer group's last rebalance settles
        started = time.monotonic()
        _produce(s, texts, "bench", producer_batch)
        _until(lambda: finished() >= len(warm_up) + len(texts), 600, "the documents")
        seconds = time.monotonic() - started
    finally:
        for w in workers:
            w.stop.requested = True
        for t in threads:
            t.join(60)
    drop_collection(s)
    return {"group_type": group_type, "consumers": consumers, "docs": len(texts), "seconds": round(seconds, 2),
            "docs_per_s": round(len(texts) / seconds, 1)}


def run(docs: int, latency: tuple[float, float], counts: list[int], batch_size: int, producer_batch: int,
        state_dir: Path, say: Callable[[str], None] = print) -> dict:
    """Every row, share and consumer mode alternated at each count, on one local Kafka stack."""
    stack = LocalStack(state_dir, broker="kafka")
    env, _ = stack.up(partitions=PARTITIONS)
    try:
        base = Settings(kafka_bootstrap_servers=env["EMBEDSTREAM_KAFKA_BOOTSTRAP_SERVERS"],
                        redis_url=bench_redis(env), milvus_uri=env["EMBEDSTREAM_MILVUS_URI"],
                        kafka=quick_join_session("kafka"), metrics_port=0, log_level="WARNING",
                        max_batch_size=batch_size, max_wait_ms=20)
        texts = workloads.short_texts(docs)
        rows = []
        for k in counts:
            for group_type in ("consumer", "share"):
                say(f"{group_type} group, {k} consumer(s), {docs:,} documents")
                rows.append(one_row(base, group_type, k, texts, latency, producer_batch))
                say(f"  {rows[-1]['docs_per_s']:,.1f} docs/s")
        one = batch_size / (latency[0] + batch_size * latency[1])
        return {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "cores": os.cpu_count(), "broker": "kafka 4.2.0",
                "partitions": PARTITIONS, "latency_per_pass_s": latency[0], "latency_per_doc_s": latency[1],
                "max_batch_size": batch_size, "producer_batch": producer_batch,
                "one_consumer_at_one_batch_a_pass_docs_per_s": round(one, 1), "rows": rows}
    finally:
        stack.down()


def table(result: dict) -> str:
    """A Markdown table: docs/s of each mode at each count, and each ÷ its mode's one consumer."""
    by = {(r["group_type"], r["consumers"]): r["docs_per_s"] for r in result["rows"]}
    counts = sorted({r["consumers"] for r in result["rows"]})
    lines = ["| consumers | consumer group docs/s | ×1 | share group docs/s | ×1 |", "|---|---|---|---|---|"]
    for k in counts:
        c, s = by[("consumer", k)], by[("share", k)]
        lines.append(f"| {k} | {c:,.0f} | {c / by[('consumer', counts[0])]:.2f} | {s:,.0f} | "
                     f"{s / by[('share', counts[0])]:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=2000)
    parser.add_argument("--latency", type=float, default=0.02, help="seconds every forward pass takes")
    parser.add_argument("--latency-per-doc", type=float, default=0.01, help="seconds a pass takes for each text")
    parser.add_argument("--counts", default="1,2,4,8")
    parser.add_argument("--batch-size", type=int, default=16, help="the workers' EMBEDSTREAM_MAX_BATCH_SIZE")
    parser.add_argument("--producer-batch", type=int, default=16, help="records in a producer's batch")
    parser.add_argument("--state-dir", type=Path, default=Path(".embedstream/bench-share"))
    parser.add_argument("--output", type=Path, default=None, help="a directory for the JSON")
    args = parser.parse_args()
    counts = [int(c) for c in args.counts.split(",")]
    result = run(args.docs, (args.latency, args.latency_per_doc), counts, args.batch_size, args.producer_batch,
                 args.state_dir)
    print(table(result))
    if args.output:
        args.output.mkdir(parents=True, exist_ok=True)
        path = args.output / f"share-scaling-{time.strftime('%Y%m%d-%H%M')}.json"
        path.write_text(json.dumps(result, indent=2) + "\n")
        print(f"written: {path}")


if __name__ == "__main__":
    main()
