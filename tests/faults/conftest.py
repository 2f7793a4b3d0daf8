"""The fault suite's fixtures: the suite's local stack (whose parts its scenarios freeze, each for a
while), fresh topics and settings suited to faults, the fault table."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers import fresh_settings

PARTITIONS = 6


@pytest.fixture(scope="session")
def fault_stack(local_stack):
    """``(LocalStack, env)``: the suite's stack (``tests/conftest.py``), of ``PARTITIONS`` a topic."""
    return local_stack


@pytest.fixture()
def fs(fault_stack):
    """Fresh topics, group and collection on the fault stack, with settings suited to fault tests:
    small batches (so a kill loses little), a commit after every batch, and a 2 s group session
    (joins take ~1 s instead of ~3 s on Tansu, a killed member's partitions move on after 2 s). The
    scenarios that freeze a member past its session on purpose use ``fault_stack``'s 6 s."""
    from tools.dev import QUICK_JOIN_SESSION

    local, env = fault_stack
    return fresh_settings(env, partitions=PARTITIONS, max_batch_size=32, commit_interval_ms=0,
                          shutdown_grace_seconds=20, milvus_timeout_seconds=5, retry_backoff_max_seconds=2,
                          kafka=dict(QUICK_JOIN_SESSION))


@pytest.fixture(autouse=True)
def empty_cache(fault_stack):
    """Every scenario starts with the fault stack's Redis empty: what it finds in the cache never
    depends on which scenarios ran before it, or on their order."""
    import redis

    _, env = fault_stack
    redis.Redis.from_url(env["EMBEDSTREAM_REDIS_URL"], socket_timeout=5).flushdb()


@pytest.fixture(autouse=True)
def no_worker_left_behind():
    yield
    from tests.faults.harness import WorkerProcess

    WorkerProcess.kill_all()


@pytest.fixture()
def parts(fault_stack):
    """Pids of the fault stack's broker, Redis and Milvus."""
    local, _ = fault_stack
    return {name: p.pid for name, p in local.parts().items()}


_TABLE: list[str] = []  # the fault table's path, once a scenario has run


@pytest.fixture(scope="session", autouse=True)
def fault_table(tmp_path_factory):
    """Where each scenario writes its row (``record_row``); the rows show in the run's summary."""
    _TABLE.append(str(tmp_path_factory.mktemp("faults") / "table.tsv"))
    os.environ["EMBEDSTREAM_FAULT_TABLE"] = _TABLE[-1]


def pytest_terminal_summary(terminalreporter):
    """The fault table and the warm pool's count, after the results (a fixture's teardown prints
    into the last test's captured output, which a passing run never shows)."""
    if not _TABLE:  # no fault scenario ran
        return
    table = Path(_TABLE[-1])
    from tests.faults.harness import warm_starts

    terminalreporter.section("fault suite")
    terminalreporter.write_line("scenario | injected | documents | dead-lettered | duplicates on output | recovery s")
    if table.exists():
        for line in table.read_text().splitlines():
            terminalreporter.write_line(" | ".join(line.split("\t")))
    terminalreporter.write_line(f"warm pool: {warm_starts()}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed scenario shows the last lines of each of its workers' logs (CI keeps only the output)."""
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    from tests.faults.harness import WorkerProcess

    for w in WorkerProcess.live:
        try:
            tail = "\n".join(w.log().splitlines()[-25:])
        except OSError as e:  # a hook that raises is pytest's internal error: the whole run stops
            tail = f"(log unreadable: {e})"
        report.sections.append((f"{w.log_path.name} (last 25 lines)", tail))
