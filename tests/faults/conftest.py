"""The fault suite's fixtures: the suite's local stack (whose parts some scenarios freeze, each for a
while: those run alone), fresh topics and settings suited to faults, a Redis database of the
process's own. The fault table's file and summary are the root conftest's (xdist's controller reports)."""

from __future__ import annotations

import pytest

from tests.helpers import fresh_settings

PARTITIONS = 6


@pytest.fixture(scope="session")
def fault_stack(local_stack, worker_id):
    """``(LocalStack, env)``: the suite's stack (``tests/conftest.py``), of ``PARTITIONS`` a topic, with
    a Redis database of this pytest process's own (1 one at a time, 2 + N for xdist's worker N): a
    scenario empties it before it starts (``empty_cache``), which must never empty the cache of a test
    running beside it."""
    local, env = local_stack
    return local, {**env, "EMBEDSTREAM_REDIS_URL": own_database(env["EMBEDSTREAM_REDIS_URL"], worker_id)}


def own_database(url: str, worker_id: str) -> str:
    """``url`` (a Redis URL) with the database of the pytest process ``worker_id`` (``master`` or
    ``gwN``)."""
    from tools.dev import redis_database

    return redis_database(url, 1 if worker_id == "master" else 2 + int(worker_id.removeprefix("gw")))


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
