"""The broker rows on each broker in turn, in one run: R1, Rio, Reos and Rdup90 (each against its
denominator measured on that broker's stack, minutes apart), and how long partitions stand still
in a rebalance under each group protocol the broker serves (``tools.bench.rebalance``).

The model is loaded once; each broker gets a local stack of its own (its own Redis and Milvus too),
taken down before the next starts."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from tools.bench import measure, workloads
from tools.bench.rebalance import rebalance_stall
from tools.dev import LocalStack
from tools.fake_embedder import FakeEmbedder

#: The group protocols each local broker serves: Tansu has no KIP-848 (``group.protocol=consumer``).
PROTOCOLS = {"tansu": ("classic",), "kafka": ("classic", "consumer"), "mock": ("classic",)}
#: Documents of each workload when ``--docs`` is not given: R1 and Reos on S2, Rdup90 on S4, Rio on
#: the io texts (a CPU run of both brokers in about ten minutes here).
DEFAULT_DOCS = 1000


def run_brokers(*, brokers: list[str], docs: int | None, device: str, precision: str, state_dir: Path,
                say: Callable[[str], None], model: str | None = None) -> dict:
    """``{"machine", "model", "docs", "brokers": {name: rows}}``: see the module docstring."""
    from tools.bench.run import _machine, _stack_settings
    from worker.embedding.sentence import SentenceTransformerEmbedder
    from worker.process.logs import setup_logging

    n = docs or DEFAULT_DOCS
    say("loading the model")
    emb = SentenceTransformerEmbedder(model, precision, device)
    emb.warmup()
    texts = {"S2": workloads.mixed_texts(n), "io": workloads.io_texts(max(n, 4000))}
    out: dict = {"machine": _machine(",".join(brokers), emb.device), "model": emb.model_id,
                 "precision": emb.precision, "device": emb.device, "docs": n,
                 "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "brokers": {}}
    for broker in brokers:
        stack = LocalStack(state_dir / broker, broker=broker)
        say(f"{broker}: starting the local stack")
        env, _ = stack.up(partitions=6)
        try:
            base = _stack_settings(env, broker, device=device, precision=precision, model=model)
            setup_logging(base)
            out["brokers"][broker] = _rows(base, broker, emb, texts, n, state_dir / broker / "rebalance-logs",
                                           lambda m, b=broker: say(f"{b}: {m}"))
        finally:
            stack.down()
    return out


def _rows(base, broker: str, emb, texts: dict[str, list[str]], n: int, logs: Path,
          say: Callable[[str], None]) -> dict:
    stamp = int(time.time())
    say(f"raw encode of {len(texts['S2']):,} S2 texts")
    raw, _ = measure.raw_encode(emb, texts["S2"])
    say("S2: the worker end to end, at-least-once")
    alo = measure.worker_stream(base, emb, texts["S2"], f"s2-alo-{stamp}")
    say("S2: the worker end to end, exactly-once")
    eos = measure.worker_stream(base.model_copy(update={"delivery": "exactly-once"}), emb, texts["S2"],
                                f"s2-eos-{stamp}")
    say(f"io: {len(texts['io']):,} documents with an instant model")
    io = measure.worker_stream(base, FakeEmbedder(dim=emb.dim, model_id=f"instant-{broker}-{stamp}"), texts["io"],
                               f"io-{stamp}")
    say("io denominator: Milvus bulk upsert")
    upsert, _ = measure.milvus_bulk_upsert(base.milvus_uri or "", rows=2000, dim=emb.dim)
    repeats = {}
    for frac in (0.0, 0.9):
        say(f"S4: {frac:.0%} repeats")
        repeats[frac] = measure.worker_stream(base, emb, workloads.with_repeats(n, frac, seed=stamp % 1000),
                                              f"s4-{int(frac * 100)}-{stamp}")
    rebalance = {p: rebalance_stall(base, p, logs, say) for p in PROTOCOLS[broker]}
    return {"docs_per_s": {"raw_S2": raw, "S2": alo.docs_per_s, "S2_exactly_once": eos.docs_per_s,
                           "io": io.docs_per_s, "milvus_upsert_rows": upsert, "S4_0": repeats[0.0].docs_per_s,
                           "S4_90": repeats[0.9].docs_per_s},
            "docs_per_transaction": eos.docs_per_group,
            "ratios": {"R1": alo.docs_per_s / raw, "Rio": io.docs_per_s / upsert,
                       "Reos": eos.docs_per_s / alo.docs_per_s,
                       "Rdup90": repeats[0.9].docs_per_s / repeats[0.0].docs_per_s},
            "rebalance": rebalance}
