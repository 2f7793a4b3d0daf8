"""The bench's rebalance rows: how a stream's latencies become the stall figures, and the broker list."""

from __future__ import annotations

import pytest
import typer

from tools.bench.rebalance import STALL_S, _windows
from worker.commands.cli.bench import _broker_list


def test_a_partition_stalls_when_a_record_waits_past_the_steady_p99():
    # two partitions, a record each 0.25 s for 30 s; partition 1 stands still from 10 s to 12 s (its
    # records produced meanwhile come out at 12 s), partition 0 never does
    sent, out = {}, {}
    for i in range(120):
        at = i * 0.25
        for p in (0, 1):
            doc = f"p{p}-{i}"
            sent[doc] = (p, at)
            out[doc] = (12.0 if p == 1 and 10.0 <= at < 12.0 else at) + 0.1
    figures = _windows(sent, out, {"join": 8.0, "join_end": 16.0, "leave": 20.0, "leave_end": 30.0})
    assert figures["steady"]["p99_s"] == pytest.approx(0.1)
    assert figures["join"]["stalled"] == 1
    assert figures["join"]["max_s"] == pytest.approx(2.1)
    assert figures["leave"]["stalled"] == 0 and figures["leave"]["max_s"] == pytest.approx(0.1)
    assert figures["join"]["n"] == 64  # records produced in the window that came out


def test_a_wait_just_under_the_threshold_is_not_a_stall():
    sent = {f"p0-{i}": (0, float(i)) for i in range(20)}
    out = {d: at + 0.1 for d, (_, at) in sent.items()}
    out["p0-12"] = 12 + 0.1 + STALL_S * 0.9
    marks = {"join": 10.0, "join_end": 15.0, "leave": 15.0, "leave_end": 20.0}
    assert _windows(sent, out, marks)["join"]["stalled"] == 0
    out["p0-12"] = 12 + 0.1 + STALL_S * 1.1
    assert _windows(sent, out, marks)["join"]["stalled"] == 1


def test_the_broker_list_takes_known_names_and_refuses_others():
    assert _broker_list("tansu, kafka") == ["tansu", "kafka"]
    for bad in ("", "kafka,redpanda"):
        with pytest.raises(typer.Exit):
            _broker_list(bad)
