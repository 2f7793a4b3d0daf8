"""The bench's outputs: the ratio table (rich), bench.json and a PNG chart."""

from __future__ import annotations

import json
import math
from pathlib import Path

from rich.table import Table

from tools.bench.rebalance import STALL_S
from tools.bench.run import CPU_US_PER_DOC_GOAL, GOALS


def _fmt(x, digits: int = 2) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return f"{x:,.{digits}f}"


def ratio_table(out: dict) -> Table:
    r, w, d = out["ratios"], out["workloads"], out["denominators"]
    t = Table("ratio", "value", "goal", "measured as", title=f"[bold]embedstream bench[/] — {out['model']} "
              f"{out['precision']} on {out['device']}{' (quick)' if out['quick'] else ''}", title_justify="left")

    def row(name: str, value, goal_text: str, how: str, ok: bool | None) -> None:
        mark = "" if ok is None else (" [green]✓[/]" if ok else " [red]✗[/]")
        t.add_row(name, _fmt(value) + mark, goal_text, how)

    def met(name: str):
        return None if r.get(name) is None else r[name] >= GOALS[name]

    row("R1", r["R1"], "≥ 0.90", f"worker {_fmt(w['S2']['docs_per_s'], 1)} ÷ raw encode "
        f"{_fmt(d['raw_S2']['docs_per_s'], 1)} docs/s (S2)", met("R1"))
    if r.get("R1_S2_chunks"):
        row("R1 (S2, same chunks)", r["R1_S2_chunks"], "", f"worker ÷ raw encode of the {d['raw_S2_chunks']['chunks']} "
            f"chunks the worker embeds ({_fmt(d['raw_S2_chunks']['docs_per_s'], 1)} docs/s): raw encode truncates "
            "long texts", None)
    if r.get("R1_S2_registry"):
        row("R1 (S2, registry)", r["R1_S2_registry"], "≈ R1", f"worker {_fmt(w['S2_registry']['docs_per_s'], 1)} "
            "docs/s with registry-framed Avro in and avro-registry out ÷ the same raw encode", None)
    if r.get("Rmix"):
        tm = w["two_models"]
        row("Rmix (two models)", r["Rmix"], "≥ 0.90", f"50/50 interleaved {_fmt(tm['docs_per_s'], 1)} docs/s ÷ "
            f"harmonic mix {_fmt(tm['harmonic_docs_per_s'], 1)} of MiniLM {_fmt(tm['minilm_docs_per_s'], 1)} and "
            f"MiniLM+projection {_fmt(tm['proj_docs_per_s'], 1)} alone", met("Rmix"))
    row("R1 (S1 short)", r["R1_S1"], "", f"worker {_fmt(w['S1']['docs_per_s'], 1)} ÷ raw "
        f"{_fmt(d['raw_S1']['docs_per_s'], 1)} docs/s", None)
    row("Rpeer", r["Rpeer"], "≥ 1.3", "worker ÷ infinity-emb engine (S2)" if r["Rpeer"] else
        "peer not run (--peer-python)", met("Rpeer"))
    row("Rdup90", r["Rdup90"], "≥ 6", f"{_fmt(w['S4_90']['docs_per_s'], 1)} ÷ {_fmt(w['S4_0']['docs_per_s'], 1)} "
        "docs/s (90% vs 0% repeats)", met("Rdup90"))
    if r.get("Rdup90_cluster"):
        row("Rdup90 (Redis Cluster)", r["Rdup90_cluster"], "≈ Rdup90", f"{_fmt(w['S4_90_cluster']['docs_per_s'], 1)} ÷ "
            f"{_fmt(w['S4_0_cluster']['docs_per_s'], 1)} docs/s, the cache on 3 masters", None)
    row("Rio", r["Rio"], "≥ 0.7", f"instant model {_fmt(w['io']['docs_per_s'], 0)} docs/s ÷ MilvusClient.upsert "
        f"{_fmt(d['milvus_upsert_rows_per_s'], 0)} rows/s", met("Rio"))
    if r.get("Rio_columnar"):
        row("Rio (columnar)", r["Rio_columnar"], "", "the same ÷ the worker's own columnar upsert "
            f"{_fmt(d['milvus_upsert_columnar_rows_per_s'], 0)} rows/s", None)
    for name, by_cache in out.get("cpu_per_doc", {}).items():
        for cache, us in by_cache.items():
            ok = us <= CPU_US_PER_DOC_GOAL
            gauge = out.get("cpu_gauge_ns", {}).get(name, {}).get(cache)
            t.add_row(f"CPU/doc ({name}, {cache.replace('_', ' ')})", _fmt(us, 0) + " µs" +
                      (" [green]✓[/]" if ok else " [red]✗[/]"), f"≤ {CPU_US_PER_DOC_GOAL:.0f} µs",
                      "worker-process CPU seconds ÷ documents, first record to last batch done, instant model "
                      "(the stack runs in other processes)" + (f"; host gauge {_fmt(gauge, 0)} ns" if gauge else "")
                      + ("; after an unmeasured warm-up run" if out.get("warm_up_docs") else ""))
    if w.get("io_registry", {}).get("cpu_us_per_doc"):
        t.add_row("CPU/doc (io, registry)", _fmt(w["io_registry"]["cpu_us_per_doc"], 0) + " µs", "",
                  "the same with registry-framed Avro in and avro-registry out")
    row("Rpad", r["Rpad"], "≥ 0.85", "real ÷ padded tokens in the model (S2)", met("Rpad"))
    if "long" in w:
        lw = w["long"]
        row("R1 (long docs)", r.get("R1_long"), "≥ 0.90", f"worker {_fmt(lw['chunks_per_s'], 1)} ÷ raw encode "
            f"{_fmt(d['raw_long_chunks_per_s']['chunks_per_s'], 1)} chunks/s ({lw['docs']} documents, "
            f"{lw['words']:,} words, {lw['chunks']} chunks; {_fmt(lw['docs_per_s'], 2)} docs/s)", met("R1_long"))
        t.add_row("cache on an edit", f"{lw['edit_cache_hit_rate']:.0%}", "", "chunks served by the cache when "
                  "each long document is produced again with one paragraph changed")
    q = out.get("quality")
    if q:
        t.add_row(f"quality ({out['precision']})", _fmt(q["min_cosine"], 4), "", f"cosine to {q['vs']} on "
                  f"{q['texts']} S2 texts: min {_fmt(q['min_cosine'], 4)}, mean {_fmt(q['mean_cosine'], 5)}")
    for lat in out["latency"]:
        row(f"latency @ {lat['load']:.0%}", None, "", f"p50 {_fmt(lat['p50_s'], 3)} s, p99 {_fmt(lat['p99_s'], 3)} s "
            f"at {_fmt(lat['rate'], 0)} docs/s ({lat['n']} docs)", None)
    t.add_row("p99 @ 50%", _fmt(r["p99_at_50pct_s"], 3) + (" [green]✓[/]" if r["p99_goal_met"] else " [red]✗[/]"),
              f"≤ {_fmt(out['latency_bound_s'], 3)} s", "max wait + 3 × one batch's compute")
    dl = out.get("delivery")
    if dl:
        row("Reos (S2)", r.get("Reos"), "≥ 0.90", f"exactly-once {_fmt(dl['S2']['exactly_once'], 1)} ÷ at-least-once "
            f"{_fmt(dl['S2']['at_least_once'], 1)} docs/s, back to back (one transaction per group of batches: "
            f"{_fmt(dl['S2'].get('docs_per_transaction', 0), 0)} documents each)", met("Reos"))
        row("Reos (io)", r.get("Reos_io"), "≥ 0.90", f"the same with an instant model: "
            f"{_fmt(dl['io']['exactly_once'], 0)} ÷ {_fmt(dl['io']['at_least_once'], 0)} docs/s "
            f"({_fmt(dl['io'].get('docs_per_transaction', 0), 0)} documents per transaction)", met("Reos_io"))
        p99 = dl["p99_at_50pct_s"]
        t.add_row("p99 @ 50%, exactly-once", _fmt(p99["exactly_once"], 3), "",
                  f"vs {_fmt(p99['at_least_once'], 3)} s at-least-once; p50 {_fmt(p99['p50_exactly_once'], 3)} s "
                  f"({p99['n']} docs)")
    hyb = out.get("hybrid")
    if hyb:
        cost, rec = hyb["bm25_cost"], hyb["recall"]
        row("R1 bm25", r.get("R1_bm25"), "≥ 0.90", f"S2 end to end with EMBEDSTREAM_SPARSE=bm25 ÷ off, alternated: "
            f"{' / '.join(_fmt(x, 1) for x in cost['bm25_docs_per_s'])} ÷ "
            f"{' / '.join(_fmt(x, 1) for x in cost['off_docs_per_s'])} docs/s", met("R1_bm25"))
        for name, label in (("identifiers", "identifier"), ("natural_language", "natural-language")):
            got = rec[name]
            goal = "≥ 0.90, ≥ dense" if name == "identifiers" else "≥ dense"
            ok = got["hybrid"] >= got["dense"] and (name != "identifiers" or got["hybrid"] >= GOALS[
                "recall10_identifiers_hybrid"])
            row(f"recall@10 {label}", got["hybrid"], goal, f"hybrid (RRF); dense {_fmt(got['dense'])}, sparse (BM25) "
                f"{_fmt(got['sparse'])}; {rec['queries']} queries over {rec['documents']} functions", ok)
    prec = out.get("precisions", {})
    for name, p in prec.items():
        label = f"precision {name}" + (f" ({p['engine']})" if p.get("engine") else "")
        t.add_row(label, _fmt(p["docs_per_s"], 1) + " docs/s", "",
                  f"worker on S2; vs fp32: cosine mean {p['mean_cosine']:.4f} min {p['min_cosine']:.4f}, "
                  f"top-10 overlap {p['top10_overlap']:.2f} ({p['queries']} queries)")
    if "Rint8" in r:
        row("Rint8", r["Rint8"], "≥ 1.5", "int8 ÷ the best of fp32 and bf16 (docs/s, the rows above)", met("Rint8"))
    for name in ("S1", "S2"):
        if f"{name}_instant_sink" in w:
            fast, raw = w[f"{name}_instant_sink"], d[f"raw_{name}"]["docs_per_s"]
            t.add_row(f"instant sink ({name})", _fmt(fast["docs_per_s"], 0) + " docs/s", "",
                      f"the worker without Redis and Milvus (R1 {_fmt(fast['docs_per_s'] / raw)}"
                      f"; raw encode {_fmt(raw, 0)} docs/s; "
                      f"{_fmt(fast.get('cpu_us_per_doc', 0), 0)} µs CPU/doc)")
        if f"{name}_instant_source" in w:
            mem, raw = w[f"{name}_instant_source"], d[f"raw_{name}"]["docs_per_s"]
            t.add_row(f"instant source ({name})", _fmt(mem["docs_per_s"], 0) + " docs/s", "",
                      f"fed from memory, writing nowhere: the pipeline's ceiling (R1 {_fmt(mem['docs_per_s'] / raw)}"
                      f"; {_fmt(mem.get('tokens_per_s', 0), 0)} tokens/s)")
    tflops = out.get("achieved_tflops")
    if tflops:
        t.add_row("TFLOP/s", " / ".join(_fmt(v) for v in tflops.values()), "",
                  "real tokens/s × 2 × parameters on S2: " + " / ".join(tflops))
    return t


#: Columns of the CPU table, in pipeline order (any other thread comes before "other").
_THREAD_ORDER = ("polling", "prepare", "embed", "sink", "milvus-write", "grpc")


def cpu_table(out: dict) -> Table:
    """``run_cpu``'s figures, a column a run: its CPU per document while busy, against the goal, then
    each thread's share over the whole run (start-up included, so the shares add up to a little more)."""
    runs = [(name, cache) for name, by_cache in out["cpu_per_doc"].items() for cache in by_cache]
    names: list[str] = []
    for name, cache in runs:
        names += [n for n in out["cpu_threads"][name][cache] if n not in names]
    known = [n for n in _THREAD_ORDER if n in names]
    rest = sorted(n for n in names if n not in _THREAD_ORDER and n != "other")
    t = Table("µs a document", *(f"{name}, {cache.replace('_', ' ')}" for name, cache in runs),
              title=f"[bold]embedstream bench --cpu[/] — instant model, {out['docs']:,} documents a run",
              title_justify="left", caption="busy: the worker process, first record to last batch done (the "
              f"bench's CPU/doc row; goal ≤ {CPU_US_PER_DOC_GOAL:.0f} µs); the threads: each over the whole run; "
              "other: librdkafka's threads, and the worker's that outlived the run; host gauge: the median CPU a step "
              "of a fixed Python loop timed in a process of its own during the run (how fast this host ran)"
              + (f"; after a warm-up run of {out['warm_up_docs']:,} documents, not counted" if out.get("warm_up_docs")
                 else ""),
              caption_justify="left")
    busy = [out["cpu_per_doc"][name][cache] for name, cache in runs]
    t.add_row("busy", *(_fmt(us, 1) + (" [green]✓[/]" if us <= CPU_US_PER_DOC_GOAL else " [red]✗[/]") for us in busy))
    for thread in [*known, *rest, *(["other"] if "other" in names else [])]:
        t.add_row(thread, *(_fmt(out["cpu_threads"][name][cache].get(thread), 1) for name, cache in runs))
    if "cpu_gauge_ns" in out:
        t.add_row("host gauge, ns", *(_fmt(out["cpu_gauge_ns"][name][cache], 0) for name, cache in runs),
                  style="dim")
    return t


#: R1 a GPU worker should reach at its best process count.
R1_GPU_GOAL = 0.9


def processes_table(out: dict) -> Table:
    """``run_processes``' figures, a row a run: docs/s end to end, R1 against the raw encode of the
    same texts, tokens/s and the GPU's utilisation."""
    gpu = out["machine"].get("gpu")
    t = Table("set", "processes", "cache", "docs/s", "R1", "tokens/s", "TFLOP/s", "GPU busy % (mean / max)",
              title=f"[bold]embedstream bench --processes[/] — {out['docs']:,} documents a run, {out['model']} "
                    f"{out['precision']} on {gpu or out['device']}",
              title_justify="left", caption="docs/s: from the first document produced to the last committed, after a "
              "warm-up (start-up and join left out); R1: ÷ the raw encode of the same texts in this run (" + ", ".join(
                  f"{n} {_fmt(r['docs_per_s'], 0)} docs/s at batch {r['batch_size']}" for n, r in out["raw"].items())
              + f"); goal ≥ {R1_GPU_GOAL} at the best count", caption_justify="left")
    for r in out["runs"]:
        ok = r["r1"] is not None and r["r1"] >= R1_GPU_GOAL
        busy = "—" if r["gpu_busy_mean"] is None else f"{r['gpu_busy_mean']:.0f} / {r['gpu_busy_max']:.0f}"
        t.add_row(r["set"], str(r["processes"]), "on" if r["cache"] else "off", _fmt(r["docs_per_s"], 0),
                  _fmt(r["r1"]) + (" [green]✓[/]" if ok else " [red]✗[/]"), _fmt(r["tokens_per_s"], 0),
                  _fmt(r.get("tflops"), 2), busy)
    return t


def brokers_table(out: dict) -> Table:
    """``run_brokers``' figures, a column a broker: the four ratios against their goals, then each
    rebalance's worst latency and the partitions it stalled, by group protocol."""
    names = list(out["brokers"])
    t = Table("", *names, "goal", title=f"[bold]embedstream bench --brokers[/] — {out['model']} {out['precision']} "
              f"on {out['device']}, {out['docs']:,} documents a workload", title_justify="left",
              caption="rebalance: a second worker joins (1 → 2), then leaves by SIGTERM (2 → 1), while 4 documents a "
              "second go to each of 6 partitions; the largest produce-to-output latency of the records produced from "
              "its start (or SIGTERM) until the group settled, and how many partitions had a record wait "
              f"{STALL_S} s or more past the steady p99", caption_justify="left")
    for name in ("R1", "Rio", "Reos", "Rdup90"):
        values = [out["brokers"][b]["ratios"][name] for b in names]
        t.add_row(name, *(_fmt(v) + (" [green]✓[/]" if v >= GOALS[name] else " [red]✗[/]") for v in values),
                  f"≥ {GOALS[name]:.2f}")
    t.add_row("docs a transaction", *(_fmt(out["brokers"][b]["docs_per_transaction"], 0) for b in names), "",
              style="dim")
    protocols = [p for b in names for p in out["brokers"][b]["rebalance"]]
    for protocol in dict.fromkeys(protocols):
        runs = [out["brokers"][b]["rebalance"].get(protocol) for b in names]
        t.add_row(f"steady p99, {protocol}", *(_fmt(r["steady"]["p99_s"]) + " s" if r else "not served" for r in runs),
                  "", style="dim")
        for event in ("join", "leave"):
            t.add_row(f"{event}, {protocol}", *(
                f"{_fmt(r[event]['max_s'])} s, {r[event]['stalled']} of {r['partitions']} stalled"
                + (f", {r['missing']} missing" if r["missing"] else "") if r else "not served" for r in runs), "")
    return t


#: The backfill lane's goals (``tools.bench.lanes``), by load up to which they hold: live p99 with the
#: lane ÷ alone, at most; the backfill's docs/s ÷ the capacity the live lane leaves, at least (None: no
#: goal); and the live p99 may instead grow by up to ``LANE_P99_SLACK_S`` where that is larger.
LANE_GOALS = ((0.5, 1.2, 0.8), (1.0, 1.5, None))
LANE_P99_SLACK_S = 0.05


def lane_goals(load: float) -> tuple[float, float | None]:
    """The goals at ``load`` (a share of capacity): (p99 ratio at most, backfill share at least or None)."""
    return next((p99, share) for upto, p99, share in LANE_GOALS if load <= upto + 1e-9)


def lane_p99_met(row: dict) -> bool:
    """Whether a row's live p99 with the lane holds its goal: the ratio, or the slack where larger."""
    alone, lane = row["alone"]["p99_s"], row["with_lane"]["p99_s"]
    return lane <= max(alone * lane_goals(row["load"])[0], alone + LANE_P99_SLACK_S)


def lanes_table(out: dict) -> Table:
    """``run_lanes``' figures, a row a workload and load: the live lane's latency alone and with a
    backfill beside it, and the backfill's docs/s against the capacity the live lane leaves."""
    t = Table("workload", "load", "capacity docs/s", "live p50 / p99 alone (s)", "with the lane (s)",
              "p99 ratio (goal)", "backfill docs/s", "of capacity left (goal)", "batches, waited s",
              title=f"[bold]embedstream bench --lanes[/] — {out['model']} {out['precision']} on {out['device']}: the "
                    f"live lane for {_fmt(out['seconds'], 0)} s after {_fmt(out['warmup_s'], 0)} s of warm-up, alone "
                    "and with a backfill lane beside it", title_justify="left",
              caption=f"goals: p99 ratio at most the goal, or the p99 at most {LANE_P99_SLACK_S * 1000:.0f} ms more; "
                      "the backfill's batches through the model and the seconds it waited for the live lane",
              caption_justify="left")
    for r in out["rows"]:
        alone, lane = r["alone"], r["with_lane"]
        p99_goal, share_goal = lane_goals(r["load"])
        share = r["backfill_share_of_left"]
        t.add_row(r["workload"], f"{r['load']:.0%}", _fmt(r["peak_docs_per_s"], 0),
                  f"{_fmt(alone['p50_s'], 3)} / {_fmt(alone['p99_s'], 3)}",
                  f"{_fmt(lane['p50_s'], 3)} / {_fmt(lane['p99_s'], 3)}",
                  f"{_fmt(r['p99_ratio'])} (≤ {p99_goal})" + (" [green]✓[/]" if lane_p99_met(r) else " [red]✗[/]"),
                  _fmt(lane["backfill_docs_per_s"], 0),
                  _fmt(share) + ("" if share_goal is None else f" (≥ {share_goal})"
                                 + (" [green]✓[/]" if share >= share_goal else " [red]✗[/]")),
                  f"{lane['backfill_batches']:,}, {_fmt(lane['backfill_waited_s'], 1)}")
    return t


def write_json(out: dict, path: Path) -> None:
    path.write_text(json.dumps(out, indent=2, default=float))


def write_chart(out: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    w, d = out["workloads"], out["denominators"]
    fig, (ax1, ax3, ax2) = plt.subplots(1, 3, figsize=(15, 4.5), gridspec_kw={"width_ratios": [3, 1.4, 2.2]})
    names = ["S1", "S2", "S4_0", "S4_50", "S4_90"]
    worker = [w[n]["docs_per_s"] for n in names]
    raw = [d["raw_S1"]["docs_per_s"], d["raw_S2"]["docs_per_s"], d["raw_S2"]["docs_per_s"],
           d["raw_S2"]["docs_per_s"], d["raw_S2"]["docs_per_s"]]
    x = range(len(names))
    ax1.bar([i - 0.2 for i in x], worker, width=0.4, label="embedstream (end to end)")
    ax1.bar([i + 0.2 for i in x], raw, width=0.4, label="raw encode", alpha=0.6)
    if d.get("peer_docs_per_s"):
        ax1.axhline(d["peer_docs_per_s"], color="tab:red", linestyle="--", label="infinity-emb (S2)")
    ax1.set_xticks(list(x), ["S1 short", "S2 mixed", "S4 0%", "S4 50%", "S4 90%"])
    ax1.set_ylabel("docs/s")
    ax1.set_title(f"Throughput — {out['precision']} on {out['device']}")
    ax1.legend()
    io_bars = [("worker,\ninstant model", w["io"]["docs_per_s"]),
               ("MilvusClient\n.upsert", d["milvus_upsert_rows_per_s"])]
    if d.get("milvus_upsert_columnar_rows_per_s"):
        io_bars.append(("columnar\nupsert", d["milvus_upsert_columnar_rows_per_s"]))
    ax3.bar(range(len(io_bars)), [v for _, v in io_bars], color=["tab:blue", "tab:grey", "tab:grey"][:len(io_bars)])
    ax3.set_xticks(range(len(io_bars)), [n for n, _ in io_bars])
    ax3.set_ylabel("docs/s (rows/s)")
    ax3.set_title("I/O path (Rio)")
    loads = [lat["load"] * 100 for lat in out["latency"]]
    ax2.plot(loads, [lat["p50_s"] for lat in out["latency"]], marker="o", label="p50")
    ax2.plot(loads, [lat["p99_s"] for lat in out["latency"]], marker="o", label="p99")
    ax2.axhline(out["latency_bound_s"], color="grey", linestyle=":", label="p99 goal")
    ax2.set_xlabel("load (% of peak)")
    ax2.set_ylabel("end-to-end latency (s)")
    ax2.set_title("Latency vs load (S5)")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
