"""The backfill lane's row (``embedstream bench --lanes``): what a backfill beside the live lane costs
live traffic, and how much of the capacity the live lane leaves it takes. One model loaded for the
live lane, a second (the packaged one with a projection added: the same cost a document, another
vector space) for the backfill; one local stack. Each step runs twice: writing milvus-lite, and with an
instant sink.

1. **Capacity**: S2 end to end with one lane, from a backlog: the peak docs/s.
2. **Alone**: an open-loop S2 stream at ``LOAD`` × the peak for ``seconds``; the live records' p50 and
   p99 from event time to output record.
3. **With the lane**: a topic whose backlog the live group has already consumed (the live collection
   holds it); a worker with both lanes, the backfill reading that backlog from the start, while the
   same open-loop stream runs. The live records' p99 again, and the backfill's docs/s meanwhile.

Goals (``docs/benchmarks.md``): p99 with ÷ p99 alone ≤ 1.2; the backfill's docs/s ÷ the capacity the
live lane leaves, (1 − ``LOAD``) × the peak, ≥ 0.8.
"""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tools.bench import measure, workloads

#: The live stream's rate, as a share of the measured peak.
LOAD = 0.5


def run_lanes(*, docs: int, seconds: float, device: str, precision: str, state_dir: Path,
              say: Callable[[str], None], model: str | None = None, broker: str = "tansu") -> dict:
    """The row (the module doc) as the ``lanes.json`` dict: once writing milvus-lite, once with an
    instant sink (a Milvus that keeps nothing: milvus-lite on the same cores is a writer both lanes
    share, which a Milvus of its own is not)."""
    from tools.bench.run import _machine, stack_and_model
    from tools.derived_models import projected_model

    with stack_and_model(state_dir, broker, device, precision, model, say) as (_, base, emb, broker):
        texts = workloads.mixed_texts(docs)
        out: dict = {"machine": _machine(broker, emb.device), "model": emb.model_id, "precision": emb.precision,
                     "device": emb.device, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "load": LOAD,
                     "seconds": seconds, "sinks": {}}
        with tempfile.TemporaryDirectory() as tmp:
            new_model = str(projected_model(Path(tmp) / "backfill-model", dim=emb.dim))
            for sink, instant in (("milvus-lite", False), ("instant", True)):
                out["sinks"][sink] = _pair(base, emb, texts, seconds, new_model, instant,
                                           lambda m, sink=sink: say(f"{sink}: {m}"))
        return out


def _pair(base, emb, texts: list[str], seconds: float, new_model: str, instant: bool,
          say: Callable[[str], None]) -> dict:
    """Steps 1-3 of the module doc on one sink."""
    say(f"capacity: S2 end to end, {len(texts):,} documents")
    peak = measure.worker_stream(base, emb, texts, f"peak-{int(time.time())}", instant_sink=instant).docs_per_s
    rate = LOAD * peak
    say(f"alone: the live lane at {LOAD:.0%} of {peak:.0f} docs/s for {seconds:.0f} s")
    alone = measure.latency_run(base, emb, texts, rate, seconds, f"alone-{int(time.time())}", instant_sink=instant)
    say(f"with the lane: the same stream, a backfill of {int(peak * seconds):,} documents beside it")
    lane = _with_lane(base, emb, texts, rate, seconds, new_model, int(peak * seconds), instant)
    left = (1 - LOAD) * peak
    return {"peak_docs_per_s": peak, "rate": rate, "alone": {"p50_s": alone[0], "p99_s": alone[1], "n": alone[2]},
            "with_lane": lane, "p99_ratio": lane["p99_s"] / alone[1] if alone[1] else float("nan"),
            "backfill_share_of_left": lane["backfill_docs_per_s"] / left if left else float("nan")}


def _with_lane(base, emb, texts: list[str], rate: float, seconds: float, new_model: str, backlog: int,
               instant: bool) -> dict:
    """Step 3 of the module doc: the live lane's p50/p99 and the backfill's docs/s while the stream ran."""
    from worker.assembly.lanes import build_lanes
    from worker.assembly.runner import build_worker

    store = measure.InstantStore if instant else None
    s = measure.fresh_topics(base)
    measure.flush_cache(s)
    measure.produce_texts(s, workloads.mixed_texts(backlog), "backlog")
    build_worker(s, embedder=emb, store_factory=store).run(stop_when_idle=0.3)  # the live group at the end
    measure.flush_cache(s)  # the stream's texts are the backlog's: not cached by it, as alone
    lanes = build_lanes(s.model_copy(update={"backfill_model": new_model}), embedder=emb, store_factory=store)
    joined = measure.on_first_assignment(lanes.live)
    runner = threading.Thread(target=lanes.run)
    runner.start()
    joined.wait(60)
    backfill = lanes.backfill.stats
    done0, t0 = backfill.done, time.monotonic()
    sent = measure.open_loop(s, texts, rate, seconds, f"live-{int(time.time())}")
    time.sleep(2.0)  # the stream's last batches through the live lane
    done1, t1 = backfill.done, time.monotonic()
    lanes.stop.requested = True
    runner.join(300)
    p50, p99, n = measure.latencies(s, sent, model=emb.model_id)
    if not instant:
        measure.drop_collection(s)
        measure.drop_collection(s.model_copy(update={"milvus_collection": lanes.collection}))
    return {"p50_s": p50, "p99_s": p99, "n": n, "backlog": backlog,
            "backfill_docs": done1 - done0, "backfill_docs_per_s": (done1 - done0) / (t1 - t0),
            "backfill_waited_s": lanes.gate.backfill_waited_s, "backfill_batches": lanes.gate.backfill_batches,
            "backfill_drained": done1 >= backlog}
