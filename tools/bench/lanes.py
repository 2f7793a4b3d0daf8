"""The backfill lane's rows (``embedstream bench --lanes``): what a backfill beside the live lane costs
live traffic, and how much of the capacity the live lane leaves it takes, on short texts (S1) and
long ones (S2), at several loads. One model loaded for the live lane, a second (the packaged one with
a projection added: the same cost a document, another vector space) for the backfill; one local
stack, writing its Milvus.

For each workload:

1. **Capacity**: the workload end to end with one lane, from a backlog: the worker's docs/s.
2. For each load (``LOADS``, a share of that capacity), in turn:
   - **alone**: a fresh worker, an open-loop stream at the load for ``warmup_s`` (not measured), then
     for ``seconds``; the measured records' p50 and p99 from their produce to their output record;
   - **with the lane**: a topic holding a backlog that the live group has already consumed (its
     offsets at the end), a worker with both lanes, the backfill reading that backlog from its start,
     and the same stream (warm-up, then measured). The live records' p50 and p99 again, and the
     backfill's docs/s over the measured window.

Every stream's texts are distinct (no cache hit makes a phase cheaper). Goals
(``tools.bench.report.lane_goals``): at 25 and 50 % of capacity, live p99 with the lane ≤ 1.2 × alone
(or ≤ alone + 50 ms, where that is larger) and the backfill ≥ 0.8 of the capacity left,
(1 − load) × capacity; at 75 %, live p99 ≤ 1.5 × alone.
"""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tools.bench import measure, workloads

#: The live stream's rates, as shares of the measured capacity.
LOADS = (0.25, 0.5, 0.75)
#: The workloads: name → texts for ``n`` documents (distinct past the corpus).
WORKLOADS: dict[str, Callable[[int], list[str]]] = {
    "S1": lambda n: workloads.distinct(workloads.short_texts(min(n, 1500)), n),
    "S2": lambda n: workloads.distinct(workloads.mixed_texts(min(n, 3000)), n),
}
#: How long each phase's stream runs before it is measured (the worker's batches reach their size).
WARMUP_S = 5.0


def run_lanes(*, docs: int, seconds: float, device: str, precision: str, state_dir: Path,
              say: Callable[[str], None], model: str | None = None, broker: str = "tansu",
              loads: tuple[float, ...] = LOADS, warmup_s: float = WARMUP_S) -> dict:
    """The rows (the module doc) as the ``lanes.json`` dict; ``docs``: the capacity run's documents."""
    from tools.bench.run import _machine, stack_and_model
    from tools.derived_models import projected_model

    with stack_and_model(state_dir, broker, device, precision, model, say) as (_, base, emb, broker):
        out: dict = {"machine": _machine(broker, emb.device), "model": emb.model_id, "precision": emb.precision,
                     "device": emb.device, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "seconds": seconds,
                     "warmup_s": warmup_s, "rows": []}
        with tempfile.TemporaryDirectory() as tmp:
            new_model = str(projected_model(Path(tmp) / "backfill-model", dim=emb.dim))
            for name, texts_for in WORKLOADS.items():
                say(f"{name}: capacity end to end, {docs:,} documents")
                peak = measure.worker_stream(base, emb, texts_for(docs), f"peak-{int(time.time())}").docs_per_s
                for load in loads:
                    say(f"{name} at {load:.0%} of {peak:.0f} docs/s: alone, then with a backfill lane")
                    row = _pair(base, emb, texts_for, peak, load, seconds, warmup_s, new_model)
                    out["rows"].append({"workload": name, "load": load, **row})
        return out


def _pair(base, emb, texts_for: Callable[[int], list[str]], peak: float, load: float, seconds: float,
          warmup_s: float, new_model: str) -> dict:
    """One load of the module doc's step 2: alone, then with the lane."""
    rate = load * peak
    stream = texts_for(int(rate * (seconds + warmup_s)) + 1)
    alone = _alone(base, emb, stream, rate, seconds, warmup_s)
    lane = _with_lane(base, emb, stream, texts_for(int(peak * (seconds + warmup_s)) + 1), rate, seconds, warmup_s,
                      new_model)
    left = (1 - load) * peak
    return {"peak_docs_per_s": peak, "rate": rate, "alone": alone, "with_lane": lane,
            "p99_ratio": lane["p99_s"] / alone["p99_s"] if alone["p99_s"] else float("nan"),
            "backfill_share_of_left": lane["backfill_docs_per_s"] / left if left else float("nan")}


def _stream(s, texts: list[str], rate: float, seconds: float, warmup_s: float,
            measuring: Callable[[], None] = lambda: None) -> dict[str, int]:
    """The open-loop stream: ``warmup_s`` of ``texts`` at ``rate`` unmeasured, then (``measuring()``
    called) ``seconds`` measured, of the texts after the warm-up's: the measured records' id → event time."""
    warm = int(rate * warmup_s)
    if warm:
        measure.open_loop(s, texts[:warm], rate, warmup_s, f"warm-{int(time.time())}")
    measuring()
    return measure.open_loop(s, texts[warm:], rate, seconds, f"live-{int(time.time())}")


def _alone(base, emb, texts: list[str], rate: float, seconds: float, warmup_s: float) -> dict:
    """The live lane alone on a fresh topic: its measured records' p50, p99 and count."""
    from worker.assembly.runner import build_worker

    s = measure.fresh_topics(base)
    measure.flush_cache(s)
    worker = build_worker(s, embedder=emb)
    joined = measure.on_first_assignment(worker)
    runner = threading.Thread(target=lambda: worker.run(stop_when_idle=1.0))
    runner.start()
    joined.wait(60)  # joined first: the stream is not measured against the join
    sent = _stream(s, texts, rate, seconds, warmup_s)
    runner.join()
    measure.drop_collection(s)
    p50, p99, n = measure.latencies(s, sent)
    return {"p50_s": p50, "p99_s": p99, "n": n}


def _with_lane(base, emb, texts: list[str], backlog: list[str], rate: float, seconds: float, warmup_s: float,
               new_model: str) -> dict:
    """The same stream with a backfill of ``backlog`` beside it: the live records' p50/p99 and the
    backfill's docs/s over the measured window (the gate's counts besides)."""
    from worker.assembly.lanes import build_lanes

    s = measure.fresh_topics(base)
    measure.flush_cache(s)
    measure.produce_texts(s, backlog, "backlog")
    measure.commit_at_end(s)  # the live group has consumed the backlog; the backfill reads it from the start
    lanes = build_lanes(s.model_copy(update={"backfill_model": new_model}), embedder=emb)
    joined = measure.on_first_assignment(lanes.live)
    runner = threading.Thread(target=lanes.run)
    runner.start()
    joined.wait(60)
    backfill, start = lanes.backfill.stats, []
    sent = _stream(s, texts, rate, seconds, warmup_s, lambda: start.extend((backfill.done, time.monotonic())))
    done0, t0 = start
    done1, t1 = backfill.done, time.monotonic()
    time.sleep(2.0)  # the stream's last batches through the live lane
    lanes.stop.requested = True
    runner.join(300)
    p50, p99, n = measure.latencies(s, sent, model=emb.model_id)
    measure.drop_collection(s)
    measure.drop_collection(s.model_copy(update={"milvus_collection": lanes.collection}))
    return {"p50_s": p50, "p99_s": p99, "n": n, "backlog": len(backlog),
            "backfill_docs": done1 - done0, "backfill_docs_per_s": (done1 - done0) / (t1 - t0),
            "backfill_waited_s": lanes.gate.backfill_waited_s, "backfill_batches": lanes.gate.backfill_batches,
            "backfill_drained": done1 >= len(backlog)}
