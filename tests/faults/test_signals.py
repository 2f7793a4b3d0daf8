"""How `embedstream run` stops, through the command itself: a second signal exits at once, and
SIGTERM to `run --processes N` stops every process the way it stops one (finish, commit, exit 0)."""

from __future__ import annotations

import re
import signal
import time

import pytest

from schemas.codec import Document
from tests.faults.conftest import PARTITIONS
from tests.faults.harness import (
    Expected,
    WorkerProcess,
    check_nothing_lost,
    committed_total,
    frozen,
    produce_docs,
    record_row,
    short_docs,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.faults]

GIVEN = re.compile(r" assigned \[\d")  # a rebalance that gave a process partitions (not ``assigned []``)
DONE = re.compile(r"done: (\d+) embedded")


def test_a_second_signal_exits_at_once_and_commits_nothing_more(fs, model, parts, tmp_path):
    """Milvus frozen, so the batches in flight cannot finish: the first SIGTERM waits for them (its
    grace is 20 s), the second ends the process at once with 128 + 15, committing nothing more. A
    restart then does what the stopped worker left, and nothing is lost."""
    expected = Expected()
    produce_docs(fs, short_docs(400, "second-signal", unseen=True), expected)
    w = WorkerProcess(fs, tmp_path, "w")
    wait_until(lambda: committed_total(fs, PARTITIONS) >= 0.1 * expected.records, 180, what="10% committed",
               running=(w,))
    with frozen(parts["milvus"]):
        time.sleep(1.0)  # the batches in flight reach the sink and wait on Milvus
        w.terminate()
        wait_until(lambda: "stop fetching" in w.log(), 15, what="the first signal taken")
        time.sleep(2.0)
        assert w.proc.poll() is None, f"the first signal did not wait for the batches in flight:\n{w.log()[-2000:]}"
        at_second = committed_total(fs, PARTITIONS)
        assert at_second < expected.records, "everything was committed: nothing was in flight"
        t0 = time.monotonic()
        w.terminate()
        code = w.wait(15)
        took = time.monotonic() - t0
    assert code == 128 + signal.SIGTERM, w.log()[-2000:]
    assert took < 5, f"the second signal took {took:.1f}s to end the process"
    assert "second signal: exiting at once" in w.log()
    assert committed_total(fs, PARTITIONS) == at_second, "offsets were committed after the second signal"
    w2 = WorkerProcess(fs, tmp_path, "w2", ("--stop-when-idle", "0.5"))
    assert w2.wait(300) == 0, w2.log()[-3000:]
    report = check_nothing_lost(fs, model, expected, PARTITIONS)
    record_row("second signal", f"Milvus frozen, second SIGTERM ended it in {took:.1f}s", report, took)


def test_sigterm_to_run_processes_stops_each_process_cleanly(fs, model, tmp_path):
    """`run --processes 2` under load: the two processes split the partitions and each embeds; SIGTERM
    to the parent reaches both; each finishes its batches in flight and commits; the parent exits 0;
    a restart repeats nothing, and every document ends at its newest version (a tenth were edited)."""
    expected = Expected()
    docs = short_docs(1200, "processes-term", unseen=True)
    produce_docs(fs, docs, expected)
    produce_docs(fs, [Document(d.id, d.text + " (edited)", None, d.metadata) for d in docs[::10]], expected)
    w = WorkerProcess(fs, tmp_path, "w", EMBEDSTREAM_PROCESSES="2")
    wait_until(lambda: len(GIVEN.findall(w.log())) >= 2 and committed_total(fs, PARTITIONS) >= 0.3 * expected.records,
               240, what="both processes given partitions, 30% committed", running=(w,))
    t0 = time.monotonic()
    w.terminate()
    at_stop = committed_total(fs, PARTITIONS)
    assert at_stop < expected.records, "everything was committed before the stop: nothing was in flight"
    assert w.wait(fs.shutdown_grace_seconds + 30) == 0, w.log()[-4000:]
    stop_s = time.monotonic() - t0
    log = w.log()
    assert "started 2 worker processes" in log, log[-4000:]
    assert log.count("stop fetching, finish in-flight batches") == 2, log[-4000:]
    embedded = [int(n) for n in DONE.findall(log)]
    assert len(embedded) == 2 and all(embedded), f"each process's done line, with work done: {embedded}"
    w2 = WorkerProcess(fs, tmp_path, "w2", ("--stop-when-idle", "0.5"))
    assert w2.wait(300) == 0, w2.log()[-3000:]
    report = check_nothing_lost(fs, model, expected, PARTITIONS)
    assert report.duplicates == 0, (report, log[-4000:])
    record_row("SIGTERM, 2 processes", f"SIGTERM at 30%, both stopped in {stop_s:.1f}s", report, stop_s)
