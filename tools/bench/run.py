"""Run every workload and denominator in one process, minutes apart at most, and compute the ratios."""

from __future__ import annotations

import math
import os
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from tools.bench import hybrid, measure, workloads
from tools.dev import LocalStack, quick_join_session
from tools.fake_embedder import FakeEmbedder
from worker.settings import Settings

GOALS = {"R1": 0.90, "Rpeer": 1.3, "Rdup90": 6.0, "Rio": 0.7, "Rpad": 0.85, "R1_long": 0.90, "Rmix": 0.90,
         "Rint8": 1.5, "Reos": 0.90, "Reos_io": 0.90, "R1_bm25": 0.90, "recall10_identifiers_hybrid": 0.90}
#: Worker-process CPU per document with an instant model, at most (one process then feeds a device
#: 30,000+ docs/s).
CPU_US_PER_DOC_GOAL = 30.0


def _flops_per_token(embedder) -> float:
    """~2 × parameters per token for a forward pass (attention's share is small at these lengths)."""
    params = sum(p.numel() for p in embedder.sentence_transformer.parameters())
    return 2.0 * params


def _stack_settings(env: dict[str, str], broker: str, **extra) -> Settings:
    """The bench's settings on the local stack ``env`` (its groups join with the broker's quick
    session: some twenty workers join a group in a run; its cache in a database of its own), plus
    ``extra``."""
    return Settings(kafka_bootstrap_servers=env["EMBEDSTREAM_KAFKA_BOOTSTRAP_SERVERS"],
                    redis_url=measure.bench_redis(env), milvus_uri=env["EMBEDSTREAM_MILVUS_URI"],
                    kafka=quick_join_session(broker), metrics_port=0, log_level="WARNING", **extra)


@contextmanager
def local_stack(state_dir: Path, broker: str, say: Callable[[str], None] = lambda _m: None
                ) -> Iterator[tuple[dict[str, str], str]]:
    """The local stack in ``state_dir``: ``(env, the broker it runs)``. Started here (``broker``) and
    stopped on the way out; or, where one already runs there (`embedstream dev up --state-dir`),
    used as it is, whatever its broker, and left up: every workload makes its own topics, group and
    collection."""
    stack = LocalStack(state_dir, broker=broker)
    env, started = stack.up(partitions=6)
    if not started:
        broker = stack.broker_kind()
        say(f"using the {broker} stack already running in {state_dir} (left up)")
    try:
        yield env, broker
    finally:
        if started:
            stack.down()


@contextmanager
def stack_and_model(state_dir: Path, broker: str, device: str, precision: str, model: str | None,
                    say: Callable[[str], None]) -> Iterator[tuple[dict[str, str], Settings, Any, str]]:
    """The local stack in ``state_dir`` (``local_stack``), the bench's settings on it (logging set up)
    and the model loaded and warmed up: ``(env, base, embedder, the stack's broker)``."""
    from worker.embedding.sentence import SentenceTransformerEmbedder
    from worker.process.logs import setup_logging

    with local_stack(state_dir, broker, say) as (env, broker):
        base = _stack_settings(env, broker, device=device, precision=precision, model=model)
        setup_logging(base)
        say("loading the model")
        emb = SentenceTransformerEmbedder(model, precision, device)
        emb.warmup()
        yield env, base, emb, broker


def _machine(broker: str, device: str) -> dict:
    """What the run ran on: Python, CPU, cores, broker, and the GPU's name on CUDA."""
    machine: dict = {"python": platform.python_version(), "cpu": platform.processor() or platform.machine(),
                     "cores": os.cpu_count(), "broker": broker}
    if device == "cuda":
        import torch

        machine["gpu"] = torch.cuda.get_device_name()
    return machine


def run_bench(*, quick: bool, device: str, precision: str, peer_python: str | None, docs: int | None,
              latency_seconds: float | None, state_dir: Path, say: Callable[[str], None],
              model: str | None = None, broker: str = "tansu") -> dict:
    """All measurements of docs/benchmarks.md on the local stack in ``state_dir`` (``stack_and_model``;
    ``broker``: tansu, or mock where Tansu cannot run); returns the bench.json dict. ``model``:
    EMBEDSTREAM_MODEL (None: the packaged MiniLM). On CUDA the raw encode tries larger batches, and
    the worker also runs with an instant sink (its own ceiling in front of the device)."""
    sizes = dict(workloads.QUICK if quick else workloads.FULL)
    if docs:  # the recall sets scale too, with enough documents that a top 10 is a choice
        sizes.update(S1=docs, S2=docs, S4=docs, io=docs, recall_docs=max(docs, 100),
                     recall_queries=min(sizes["recall_queries"], max(docs, 100) // 2))
    if latency_seconds:
        sizes["S5_seconds"] = latency_seconds
    with stack_and_model(state_dir, broker, device, precision, model, say) as (env, base, emb, broker):
        if emb.device == "cuda":
            sizes["raw_batch_sizes"] = (128, 256, 512)
        texts = {"S1": workloads.short_texts(sizes["S1"]), "S2": workloads.mixed_texts(sizes["S2"])}
        machine = _machine(broker, emb.device)
        out: dict = {"machine": machine,
                     "model": emb.model_id, "precision": emb.precision, "device": emb.device, "quick": quick,
                     "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "workloads": {}, "denominators": {}}
        say("quality gate: cosine to fp32 on the S2 texts")
        out["quality"] = quality_gate(emb, texts["S2"][:sizes["quality_texts"]], model)
        _throughput(out, base, emb, texts, sizes, say)
        _io_path(out, base, emb.dim, sizes, say)
        _registry(out, base, emb, texts["S2"], sizes, env["EMBEDSTREAM_SCHEMA_REGISTRY_URL"], say)
        _two_models(out, base, texts["S2"][:sizes["two_models"]], state_dir, say, model)
        _repeats(out, base, emb, sizes, say)
        _long(out, base, emb, sizes, say)
        out["denominators"]["peer_docs_per_s"] = _peer(peer_python, emb, texts["S2"], say)
        _latency(out, base, emb, texts["S2"], sizes, say)
        _delivery(out, base, emb, texts["S2"], sizes, say)
        out["hybrid"] = {"recall": hybrid.recall(base, emb, sizes["recall_docs"], sizes["recall_queries"], say),
                         "bm25_cost": hybrid.bm25_cost(base, emb, texts["S2"], say)}
        if emb.device == "cpu":
            _precisions(out, base, emb, texts["S2"], sizes, say, model)
        out["achieved_tflops"] = _tflops(out, emb, texts["S2"])
        out["ratios"] = ratios(out)
        return out


def _tflops(out: dict, emb, s2_texts: list[str]) -> dict[str, float]:
    """Achieved TFLOP/s on S2 (real tokens/s × 2 × parameters): the worker end to end, with the
    instant sink, and the raw encode (its tokens counted as the worker's tokenizer counts them)."""
    from worker.core.records import normalise_text

    flops = _flops_per_token(emb)
    w, d = out["workloads"], out["denominators"]
    raw_tokens = sum(len(ids) for ids in emb.tokenize([normalise_text(t) for t in s2_texts]))
    result = {"raw_S2": d["raw_S2"]["docs_per_s"] * raw_tokens / len(s2_texts) * flops / 1e12}
    for name in ("S2", "S2_instant_sink", "S2_instant_source"):
        if w.get(name, {}).get("seconds"):
            result[f"worker_{name}"] = w[name]["tokens_real"] / w[name]["seconds"] * flops / 1e12
    return result


def _chunks(base: Settings, emb, texts: list[str]) -> list[str]:
    """The chunk texts the worker embeds for ``texts`` (its own chunk step, same settings)."""
    from worker.assembly.chain import chunker_for
    from worker.core.records import normalise_text

    clean = [normalise_text(t) for t in texts]
    return [t[a:b] for t, spans in zip(clean, chunker_for(base, emb).spans(clean)) for a, b in spans]


def _throughput(out: dict, base: Settings, emb, texts: dict, sizes: dict, say: Callable[[str], None]) -> None:
    """S1 and S2: raw encode (the R1 denominator) and the worker end to end on the same texts. A raw
    encode truncates a text longer than the model takes, where the worker embeds every chunk: on S2
    the raw encode of the very chunks the worker embeds is measured too (the same work)."""
    for name in ("S1", "S2"):
        say(f"{name}: raw encode on {len(texts[name])} texts")
        raw, bs = measure.raw_encode(emb, texts[name], batch_sizes=sizes["raw_batch_sizes"])
        if name == "S2":
            chunks = _chunks(base, emb, texts[name])
            say(f"{name}: raw encode of the {len(chunks)} chunks the worker embeds")
            chunk_rate, _ = measure.raw_encode(emb, chunks, batch_sizes=sizes["raw_batch_sizes"])
            out["denominators"]["raw_S2_chunks"] = {"docs_per_s": chunk_rate * len(texts[name]) / len(chunks),
                                                   "chunks": len(chunks)}
        say(f"{name}: worker end to end")
        res = measure.worker_stream(base, emb, texts[name], f"{name.lower()}-{int(time.time())}")
        out["denominators"][f"raw_{name}"] = {"docs_per_s": raw, "batch_size": bs}
        out["workloads"][name] = {"docs": res.docs, "docs_per_s": res.docs_per_s, "seconds": res.seconds,
                                  "cached": res.cached, "tokens_real": res.tokens_real,
                                  "tokens_padded": res.tokens_padded,
                                  "tokens_per_s": res.tokens_real / res.seconds if res.seconds else 0.0,
                                  "cpu_us_per_doc": res.cpu_us_per_doc}
        say(f"{name}: worker fed from memory, writing nowhere (instant source)")
        mem = measure.memory_stream(base, emb, texts[name], f"{name.lower()}-m-{int(time.time())}")
        out["workloads"][f"{name}_instant_source"] = {
            "docs": mem.docs, "docs_per_s": mem.docs_per_s, "seconds": mem.seconds, "tokens_real": mem.tokens_real,
            "tokens_per_s": mem.tokens_real / mem.seconds if mem.seconds else 0.0,
            "cpu_us_per_doc": mem.cpu_us_per_doc}
        if emb.device == "cuda":
            say(f"{name}: worker with an instant sink (no Redis, a Milvus that keeps nothing)")
            fast = measure.worker_stream(base, emb, texts[name], f"{name.lower()}-i-{int(time.time())}",
                                         instant_sink=True)
            out["workloads"][f"{name}_instant_sink"] = {
                "docs": fast.docs, "docs_per_s": fast.docs_per_s, "seconds": fast.seconds,
                "tokens_real": fast.tokens_real,
                "cpu_us_per_doc": fast.cpu_us_per_doc}


def warm_up_docs(docs: int) -> int:
    """Documents of the unmeasured run before CPU/doc runs of ``docs`` each: a tenth, at most 2,000."""
    return min(2_000, docs // 10)


def _cpu_per_doc(base: Settings, dim: int, texts: dict[str, list[str]], say: Callable[[str], None],
                 threads: bool = False) -> tuple[dict, dict, dict[str, measure.StreamResult], dict]:
    """The worker with an instant model on each of ``texts`` (by workload name), with the cache and
    without: its CPU per document (``{name: {"cache" | "no_cache": µs}}``), the same by thread when
    ``threads`` (µs a document over the whole run, start-up included), each run's result, and the
    host's speed during each run (``measure.host_gauge``'s median, ns, keyed as the CPU figures).
    First an unmeasured run of the first texts (:func:`warm_up_docs`): the first instant-model run
    of a process, or on a fresh stack, read 33-37 µs where the runs after it read 24-29 (2026-11-25,
    five runs), a once-only cost rather than a document's (not pinned down: the heap's first pages
    for megabyte groups and the stack's first topics and collection at this rate are candidates)."""
    first = next(iter(texts.values()))
    first = first[:warm_up_docs(len(first))]
    if first:
        say(f"warm-up: {len(first):,} documents with an instant model, not counted")
        measure.worker_stream(base, FakeEmbedder(dim=dim, model_id=f"instant-warm-up-{int(time.time())}"), first,
                              f"io-warm-up-{int(time.time())}")
    cpu: dict[str, dict[str, float]] = {}
    by_thread: dict[str, dict[str, dict[str, float]]] = {}
    results: dict[str, measure.StreamResult] = {}
    gauge: dict[str, dict[str, float]] = {}
    for name, wl_texts in texts.items():
        for cache in (True, False):
            key = "cache" if cache else "no_cache"
            say(f"io: {len(wl_texts)} {name}, {key.replace('_', ' ')} with an instant model")
            fake = FakeEmbedder(dim=dim, model_id=f"instant-{name.lower()}-{int(cache)}-{int(time.time())}")
            s = base if cache else base.model_copy(update={"redis_url": None})
            speeds: list[float] = []
            with measure.host_gauge(speeds):
                res = measure.worker_stream(s, fake, wl_texts, f"io-{name.lower()}-{int(cache)}", threads=threads)
            gauge.setdefault(name, {})[key] = statistics.median(speeds) if speeds else 0.0
            cpu.setdefault(name, {})[key] = res.cpu_us_per_doc
            results[f"{name}_{key}"] = res
            if threads:
                by_thread.setdefault(name, {})[key] = {t: 1e6 * v / max(1, res.docs) for t, v in res.thread_cpu.items()}
    return cpu, by_thread, results, gauge


def _io_path(out: dict, base: Settings, dim: int, sizes: dict, say: Callable[[str], None]) -> None:
    """The worker with an instant model: its docs/s against Milvus bulk upserts (the Rio
    denominators), and its own CPU per document (``cpu_per_doc``) on S1 and S2 texts, with the cache
    and without it (the S2 run with the cache is the ``io`` row)."""
    texts = {"S2": workloads.io_texts(sizes["io"]),
             "S1": workloads.distinct(workloads.short_texts(min(sizes["io"], 4000)), sizes["io"])}
    out["cpu_per_doc"], _, results, out["cpu_gauge_ns"] = _cpu_per_doc(base, dim, texts, say)
    out["warm_up_docs"] = warm_up_docs(len(texts["S2"]))
    res = results["S2_cache"]
    out["workloads"]["io"] = {"docs": res.docs, "docs_per_s": res.docs_per_s, "seconds": res.seconds,
                              "cpu_us_per_doc": res.cpu_us_per_doc,
                              "cpu_us_per_doc_whole_run": 1e6 * res.cpu_run_seconds / max(1, res.docs)}
    say("io denominator: milvus-lite bulk upsert")
    rows, columnar = measure.milvus_bulk_upsert(base.milvus_uri or "", rows=sizes["upsert_rows"], dim=dim)
    out["denominators"]["milvus_upsert_rows_per_s"] = rows
    out["denominators"]["milvus_upsert_columnar_rows_per_s"] = columnar


def run_cpu(*, docs: int, state_dir: Path, say: Callable[[str], None], broker: str = "tansu",
            dim: int = 384) -> dict:
    """Only the CPU/doc rows, with each thread's share: an instant model (no model is loaded) on
    ``docs`` distinct S1 and S2 texts, with the cache and without, on the local stack in ``state_dir``
    (``local_stack``)."""
    from worker.process.logs import setup_logging

    with local_stack(state_dir, broker, say) as (env, broker):
        base = _stack_settings(env, broker)
        setup_logging(base)
        texts = {"S2": workloads.io_texts(docs), "S1": workloads.distinct(workloads.short_texts(4000), docs)}
        cpu, by_thread, _, gauge = _cpu_per_doc(base, dim, texts, say, threads=True)
        return {"machine": _machine(broker, "cpu"),
                "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "docs": docs, "warm_up_docs": warm_up_docs(docs),
                "cpu_per_doc": cpu, "cpu_threads": by_thread, "cpu_gauge_ns": gauge}


def _registry(out: dict, base: Settings, emb, texts: list[str], sizes: dict, url: str,
              say: Callable[[str], None]) -> None:
    """S2 and io again, the input framed by a schema registry and the output ``avro-registry``: what
    reading by schema id and framing the output cost (the R1 and CPU/doc of the plain runs beside)."""
    say("S2 with registry-framed Avro in and out")
    res = measure.worker_stream(base, emb, texts, f"s2r-{int(time.time())}", registry_url=url)
    out["workloads"]["S2_registry"] = {"docs": res.docs, "docs_per_s": res.docs_per_s, "seconds": res.seconds}
    say("io with registry-framed Avro in and out (instant model)")
    fake = FakeEmbedder(dim=emb.dim, model_id=f"instant-r-{int(time.time())}")
    io = measure.worker_stream(base, fake, workloads.io_texts(sizes["io"]), "io-r", registry_url=url)
    out["workloads"]["io_registry"] = {"docs": io.docs, "docs_per_s": io.docs_per_s, "seconds": io.seconds,
                                       "cpu_us_per_doc": io.cpu_us_per_doc}


def _two_models(out: dict, base: Settings, texts: list[str], state_dir: Path, say: Callable[[str], None],
                model: str | None = None) -> None:
    """Two models in one worker: the packaged MiniLM and one derived from it with a projection layer
    (256 dimensions), each alone on the S2 texts, then both on them interleaved 50/50. The ratio is
    the mixed docs/s over the harmonic mix of the two single rates (what two workers, one per model,
    would do on the same stream); both models stay loaded, so what it shows is switching per group."""
    import json

    from tools.derived_models import projected_model

    proj = state_dir / "bench-projected-model"
    if not (proj / "modules.json").exists():
        say("two models: deriving a second model (MiniLM + a 256-dim projection)")
        projected_model(proj, source=model)
    models = {"minilm": {"precision": base.precision, "device": base.device, "default": True,
                         **({"path": model} if model else {})},
              "proj": {"path": str(proj), "precision": base.precision, "device": base.device}}
    rates = {}
    for name, use in (("minilm", ["minilm"]), ("proj", ["proj"]), ("mixed", ["minilm", "proj"])):
        say(f"two models: {name} on {len(texts)} S2 texts")
        s = base.model_copy(update={"models": json.dumps({n: models[n] for n in use})})
        res = measure.worker_stream(s, None, texts, f"m-{name}-{int(time.time())}", models=use)
        rates[name] = res.docs_per_s
    # A run that embedded nothing (seen on a GPU with the mock broker) leaves the row without a
    # ratio, and says so, rather than dividing by zero.
    empty = [name for name, rate in rates.items() if not rate]
    if empty:
        say(f"two models: the {', '.join(empty)} run embedded nothing: no Rmix")
    harmonic = None if empty else 2 / (1 / rates["minilm"] + 1 / rates["proj"])
    out["workloads"]["two_models"] = {"docs": len(texts), "docs_per_s": rates["mixed"],
                                      "minilm_docs_per_s": rates["minilm"], "proj_docs_per_s": rates["proj"],
                                      "harmonic_docs_per_s": harmonic}


def _repeats(out: dict, base: Settings, emb, sizes: dict, say: Callable[[str], None]) -> None:
    """S4: the same stream with 0, 50 and 90 % repeated texts (the cache at work)."""
    # One seed for the three streams: the distinct texts of the 50 % and 90 % streams are the first
    # of the 0 % stream's (each run starts with an empty cache), so the tokens they cost compare.
    seed = int(time.time()) % 1000
    for frac in (0.0, 0.5, 0.9):
        say(f"S4: {frac:.0%} repeats")
        s4_texts = workloads.with_repeats(sizes["S4"], frac, seed=seed)
        res = measure.worker_stream(base, emb, s4_texts, f"s4-{int(frac * 100)}-{int(time.time())}")
        out["workloads"][f"S4_{int(frac * 100)}"] = {"docs": res.docs, "docs_per_s": res.docs_per_s,
                                                     "seconds": res.seconds, "cached": res.cached,
                                                     "tokens_real": res.tokens_real}
    _repeats_on_a_cluster(out, base, emb, sizes, seed, say)


def _repeats_on_a_cluster(out: dict, base: Settings, emb, sizes: dict, seed: int, say: Callable[[str], None]) -> None:
    """S4 at 0 and 90 % repeats again with the cache on a Redis Cluster of three masters (the cache
    sends each node its keys' commands as one pipeline): Rdup90 there, beside the single server's."""
    from tools.redis_cluster import RedisCluster

    state = Path(tempfile.mkdtemp(prefix="bench-redis-cluster-"))
    with RedisCluster(state) as cluster:
        on_cluster = base.model_copy(update={"redis_url": SecretStr(cluster.url)})
        for frac in (0.0, 0.9):
            say(f"S4: {frac:.0%} repeats, the cache on a Redis Cluster of 3 masters")
            res = measure.worker_stream(on_cluster, emb, workloads.with_repeats(sizes["S4"], frac, seed=seed),
                                        f"s4c-{int(frac * 100)}-{int(time.time())}")
            out["workloads"][f"S4_{int(frac * 100)}_cluster"] = {"docs": res.docs, "docs_per_s": res.docs_per_s,
                                                                 "seconds": res.seconds, "cached": res.cached}
    shutil.rmtree(state, ignore_errors=True)


def _long(out: dict, base: Settings, emb, sizes: dict, say: Callable[[str], None]) -> None:
    """Long documents: raw encode of the very chunks the worker makes (the denominator), the worker
    end to end (documents/s and chunks/s), then the same documents edited in one paragraph each
    (the share of chunks the cache serves)."""
    texts = workloads.long_texts(sizes["long"])
    chunks = _chunks(base, emb, texts)
    words = sum(len(t.split()) for t in texts)
    say(f"long: raw encode of the {len(chunks)} chunks of {len(texts)} documents ({words:,} words)")
    raw, bs = measure.raw_encode(emb, chunks, batch_sizes=sizes["raw_batch_sizes"])
    say("long: worker end to end")
    res = measure.worker_stream(base, emb, texts, f"long-{int(time.time())}")
    say("long: the same documents, one paragraph of each edited")
    hits0, misses0 = measure.cache_counts()
    measure.worker_stream(base, emb, [workloads.edited(t) for t in texts], f"long-edit-{int(time.time())}",
                          cold=False)
    hits1, misses1 = measure.cache_counts()
    out["denominators"]["raw_long_chunks_per_s"] = {"chunks_per_s": raw, "batch_size": bs}
    out["workloads"]["long"] = {"docs": res.docs, "words": words, "chunks": len(chunks), "docs_per_s": res.docs_per_s,
                                "chunks_per_s": len(chunks) / res.seconds if res.seconds else 0.0,
                                "seconds": res.seconds,
                                "edit_cache_hit_rate": (hits1 - hits0) / max(1.0, hits1 - hits0 + misses1 - misses0)}


def _peer(peer_python: str | None, emb, texts: list[str], say: Callable[[str], None]) -> float | None:
    """infinity-emb's engine on the S2 texts, when a virtualenv with it is given."""
    if not peer_python:
        return None
    say("peer: infinity-emb in-process engine")
    from worker.embedding.base import resolve_model_path

    with tempfile.TemporaryDirectory() as tmp:
        return measure.peer_engine(peer_python, resolve_model_path(None)[1], texts, emb.device, emb.precision,
                                   Path(tmp))


def _latency(out: dict, base: Settings, emb, texts: list[str], sizes: dict, say: Callable[[str], None]) -> None:
    """S5: open-loop streams at 25, 50 and 80 % of the measured S2 peak, and the p99 bound."""
    peak = out["workloads"]["S2"]["docs_per_s"]
    batch_compute = base.max_batch_size / max(out["denominators"]["raw_S2"]["docs_per_s"], 1e-9)
    out["latency"] = []
    for load in (0.25, 0.5, 0.8):
        say(f"S5: {load:.0%} of peak ({peak * load:.0f} docs/s) for {sizes['S5_seconds']:.0f}s")
        p50, p99, n = measure.latency_run(base, emb, texts, peak * load, sizes["S5_seconds"],
                                          f"s5-{int(load * 100)}-{int(time.time())}")
        out["latency"].append({"load": load, "rate": peak * load, "p50_s": p50, "p99_s": p99, "n": n})
    out["latency_bound_s"] = base.max_batch_wait_ms / 1000 + 3 * batch_compute


def _delivery(out: dict, base: Settings, emb, texts: list[str], sizes: dict, say: Callable[[str], None]) -> None:
    """The cost of exactly-once: S2 end to end and the instant-model io run, each in both modes back to
    back (a pair measured minutes apart differed by more than the cost: 0.87 on 400 S2 texts, 1.00 paired
    on 1,500), and p99 at 50 % of the S2 peak with ``EMBEDSTREAM_DELIVERY=exactly-once`` beside the
    at-least-once row of the same run. Default batch settings: one transaction per group of batches
    reaching the sink; ``docs_per_transaction`` says how large they were."""
    eos = base.model_copy(update={"delivery": "exactly-once"})
    io_texts = workloads.io_texts(sizes["io"])
    pairs = {}
    for name, model, docs in (("S2", emb, texts), ("io", None, io_texts)):
        runs = {}
        for mode, s in (("at_least_once", base), ("exactly_once", eos)):
            say(f"{mode.replace('_', '-')}: {name} worker end to end" + (" (instant model)" if model is None else ""))
            m = model or FakeEmbedder(dim=emb.dim, model_id=f"instant-{mode}-{int(time.time())}")
            runs[mode] = measure.worker_stream(s, m, docs, f"{name.lower()}-{mode}-{int(time.time())}")
        pairs[name] = {"at_least_once": runs["at_least_once"].docs_per_s,
                       "exactly_once": runs["exactly_once"].docs_per_s, "docs": runs["exactly_once"].docs,
                       "docs_per_transaction": runs["exactly_once"].docs_per_group}
    peak = out["workloads"]["S2"]["docs_per_s"]
    say(f"exactly-once: S5 at 50% of peak for {sizes['S5_seconds']:.0f}s")
    p50, p99, n = measure.latency_run(eos, emb, texts, peak * 0.5, sizes["S5_seconds"], f"s5-eos-{int(time.time())}")
    alo_p99 = next(lat["p99_s"] for lat in out["latency"] if lat["load"] == 0.5)
    out["delivery"] = {**pairs, "p99_at_50pct_s": {"at_least_once": alo_p99, "exactly_once": p99, "n": n,
                                                   "p50_exactly_once": p50}}


def _precisions(out: dict, base: Settings, emb, texts: list[str], sizes: dict, say: Callable[[str], None],
                model: str | None) -> None:
    """On a CPU: the worker end to end on the S2 texts at each precision this CPU runs (fp32, bf16
    where it has bf16 instructions, int8 where an int8 engine is installed), in the same run, each with
    its quality against fp32 (``precision_quality``; measured on texts the int8 export was not
    calibrated on). The run's own precision reuses its S2 row."""
    from worker.embedding import int8
    from worker.embedding.sentence import SentenceTransformerEmbedder, cpu_has_bf16

    wanted = ["fp32", *(["bf16"] if cpu_has_bf16() else []), *(["int8"] if int8.available() else [])]
    ref = emb if emb.precision == "fp32" else SentenceTransformerEmbedder(model, "fp32", "cpu")
    queries = workloads.short_texts(sizes["precision_queries"], seed=11)
    calibrated = set(int8.calibration_texts())
    docs = [t for t in texts if t not in calibrated][:sizes["quality_texts"]]
    rows = out["precisions"] = {}
    ref_vectors = reference_vectors(ref, docs, queries)
    for precision in wanted:
        say(f"precision {precision}: quality against fp32, then the worker on {len(texts)} S2 texts")
        this = emb if precision == emb.precision else ref if precision == "fp32" else \
            SentenceTransformerEmbedder(model, precision, "cpu")
        if this is emb:
            rate = out["workloads"]["S2"]["docs_per_s"]
        else:
            rate = measure.worker_stream(base, this, texts, f"p-{precision}-{int(time.time())}").docs_per_s
        rows[precision] = {"docs_per_s": rate, **precision_quality(this, ref_vectors, docs, queries),
                           **({"engine": int8.engine()} if precision == "int8" else {})}


def precision_quality(emb, ref_vectors: tuple, texts: list[str], queries: list[str], k: int = 10) -> dict:
    """``emb`` against the same model in fp32 (its vectors of ``texts`` and ``queries``, as
    :func:`reference_vectors` gives them): cosine of their vectors of ``texts`` (mean, min), and how
    many of each query's ``k`` nearest texts they agree on (mean share)."""
    import numpy as np

    b, qb = ref_vectors
    a = emb.embed(texts)
    cos = (a * b).sum(1)  # both L2-normalised
    qa = emb.embed_query(queries)
    near_a = np.argsort(-(qa @ a.T), axis=1)[:, :k]
    near_b = np.argsort(-(qb @ b.T), axis=1)[:, :k]
    overlap = float(np.mean([len(set(x) & set(y)) / k for x, y in zip(near_a, near_b)]))
    return {"mean_cosine": float(cos.mean()), "min_cosine": float(cos.min()), "top10_overlap": overlap,
            "texts": len(texts), "queries": len(queries)}


def reference_vectors(ref, texts: list[str], queries: list[str]) -> tuple:
    """``ref``'s vectors of ``texts`` and of ``queries``: computed once for every precision compared."""
    return ref.embed(texts), ref.embed_query(queries)


def quality_gate(emb, texts: list[str], model: str | None = None) -> dict:
    """Cosine of the worker's vectors (its precision) to fp32 vectors of the same model and texts."""
    import numpy as np

    from worker.embedding.sentence import SentenceTransformerEmbedder

    if emb.precision == "fp32":
        return {"vs": "fp32", "texts": len(texts), "min_cosine": 1.0, "mean_cosine": 1.0}
    ref = SentenceTransformerEmbedder(model, "fp32", emb.device)
    a, b = emb.embed(texts), ref.embed(texts)
    cos = (a * b).sum(1)  # both L2-normalised
    del ref
    return {"vs": "fp32", "texts": len(texts), "min_cosine": float(np.min(cos)), "mean_cosine": float(np.mean(cos))}


def ratios(out: dict) -> dict:
    w, d = out["workloads"], out["denominators"]
    s2 = w["S2"]
    r = {
        "R1": s2["docs_per_s"] / d["raw_S2"]["docs_per_s"],
        "R1_S1": w["S1"]["docs_per_s"] / d["raw_S1"]["docs_per_s"],
        "Rpeer": (s2["docs_per_s"] / d["peer_docs_per_s"]) if d.get("peer_docs_per_s") else None,
        "Rdup90": w["S4_90"]["docs_per_s"] / w["S4_0"]["docs_per_s"],
        "Rdup90_cluster": (w["S4_90_cluster"]["docs_per_s"] / w["S4_0_cluster"]["docs_per_s"]
                           if "S4_90_cluster" in w else None),
        "Rio": w["io"]["docs_per_s"] / d["milvus_upsert_rows_per_s"],
        "Rio_columnar": (w["io"]["docs_per_s"] / d["milvus_upsert_columnar_rows_per_s"]
                         if d.get("milvus_upsert_columnar_rows_per_s") else None),
        "Rpad": s2["tokens_real"] / s2["tokens_padded"] if s2["tokens_padded"] else None,
    }
    if "two_models" in w and w["two_models"]["harmonic_docs_per_s"]:
        r["Rmix"] = w["two_models"]["docs_per_s"] / w["two_models"]["harmonic_docs_per_s"]
    if "S2_registry" in w:
        r["R1_S2_registry"] = w["S2_registry"]["docs_per_s"] / d["raw_S2"]["docs_per_s"]
    if "raw_S2_chunks" in d:
        r["R1_S2_chunks"] = s2["docs_per_s"] / d["raw_S2_chunks"]["docs_per_s"]
    if "long" in w:
        r["R1_long"] = w["long"]["chunks_per_s"] / d["raw_long_chunks_per_s"]["chunks_per_s"]
    prec = out.get("precisions", {})
    if "int8" in prec:
        r["Rint8"] = prec["int8"]["docs_per_s"] / max(prec[p]["docs_per_s"] for p in ("fp32", "bf16") if p in prec)
    delivery = out.get("delivery")
    if delivery:  # exactly-once ÷ at-least-once docs/s: a cost of at most 10 %
        r["Reos"] = delivery["S2"]["exactly_once"] / delivery["S2"]["at_least_once"]
        r["Reos_io"] = delivery["io"]["exactly_once"] / delivery["io"]["at_least_once"]
    hyb = out.get("hybrid")
    if hyb:  # bm25 ÷ off docs/s; recall@10 of hybrid on identifiers, and hybrid over dense on each set
        r["R1_bm25"] = hyb["bm25_cost"]["ratio"]
        rec = hyb["recall"]
        r["recall10_identifiers_hybrid"] = rec["identifiers"]["hybrid"]
        r["hybrid_ge_dense"] = all(rec[q]["hybrid"] >= rec[q]["dense"] for q in ("identifiers", "natural_language"))
    half = next((x for x in out["latency"] if x["load"] == 0.5), None)
    r["p99_at_50pct_s"] = half["p99_s"] if half else None
    r["p99_goal_met"] = bool(half and not math.isnan(half["p99_s"]) and half["p99_s"] <= out["latency_bound_s"])
    return r


def run_processes(*, counts: list[int], docs: int, device: str, precision: str, state_dir: Path,
                  say: Callable[[str], None], model: str | None = None, broker: str = "tansu") -> dict:
    """R1 at several processes a machine (one Python process does not keep a GPU busy): for
    S1 and S2, the raw encode of the texts (the denominator, in this process), then ``embedstream run
    --processes K`` for each K of ``counts`` on the same texts end to end on the local stack (cold
    cache; ``measure.processes_stream``: timed from the first document produced to the last
    committed, after a warm-up), and at the best K of S2 once more without Redis.
    The GPU's utilisation is sampled during each run; tokens/s counts each text's tokens (chunks
    whole)."""
    from worker.embedding.sentence import SentenceTransformerEmbedder
    from worker.process.logs import setup_logging

    logs = state_dir / "processes-logs"
    logs.mkdir(parents=True, exist_ok=True)
    with local_stack(state_dir, broker, say) as (env, broker):
        base = _stack_settings(env, broker, device=device, precision=precision, model=model)
        setup_logging(base)
        say("loading the model (for the raw encode)")
        emb = SentenceTransformerEmbedder(model, precision, device)
        emb.warmup()
        texts = {"S1": workloads.short_texts(docs), "S2": workloads.mixed_texts(docs)}
        machine = _machine(broker, emb.device)
        batch_sizes = (128, 256, 512, 1024) if emb.device == "cuda" else (32, 64, 128)
        out: dict = {"machine": machine, "model": emb.model_id, "precision": emb.precision, "device": emb.device,
                     "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "docs": docs, "raw": {}, "runs": [],
                     "flops_per_token": _flops_per_token(emb)}
        for name, wl in texts.items():
            say(f"{name}: raw encode on {len(wl):,} texts")
            raw, bs = measure.raw_encode(emb, wl, batch_sizes=batch_sizes)
            tokens = sum(len(o) + emb.special_tokens for o in emb.token_offsets(wl))
            out["raw"][name] = {"docs_per_s": raw, "batch_size": bs, "tokens": tokens}
            for k in counts:
                out["runs"].append(_processes_run(base, name, wl, k, raw, tokens, logs, say))
        s2 = [r for r in out["runs"] if r["set"] == "S2"]
        best = max(s2, key=lambda r: r["docs_per_s"])["processes"]
        out["runs"].append(_processes_run(base.model_copy(update={"redis_url": None}), "S2", texts["S2"], best,
                                          out["raw"]["S2"]["docs_per_s"], out["raw"]["S2"]["tokens"], logs, say,
                                          cache=False))
        for r in out["runs"]:  # achieved TFLOP/s: tokens/s × ~2 × parameters a token
            r["tflops"] = r["tokens_per_s"] * out["flops_per_token"] / 1e12
        return out


def _processes_run(base: Settings, name: str, texts: list[str], k: int, raw: float, tokens: int, logs: Path,
                   say: Callable[[str], None], cache: bool = True) -> dict:
    say(f"{name}: `run --processes {k}`{'' if cache else ', no cache'}, {len(texts):,} documents")
    res = measure.processes_stream(base, texts, f"{name.lower()}-p{k}-{int(time.time())}", k,
                                   log_path=logs / f"{name}-p{k}{'' if cache else '-no-cache'}.log")
    busy = res.gpu_busy
    return {"set": name, "processes": k, "cache": cache, "docs": res.docs, "seconds": res.seconds,
            "docs_per_s": res.docs_per_s, "r1": res.docs_per_s / raw if raw else None,
            "tokens_per_s": tokens * res.docs_per_s / len(texts) if texts else 0.0,
            "gpu_busy_mean": statistics.mean(busy) if busy else None, "gpu_busy_max": max(busy) if busy else None}
