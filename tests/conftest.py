"""Fixtures: the real local stack, started once per session through the code of `embedstream dev up`."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# No per-example deadline: on a busy 2-core host (the suite beside a broker and Milvus) an example's
# time says nothing about the code, and a deadline made its failures depend on the load.
settings.register_profile("suite", deadline=None)
settings.load_profile("suite")


#: Set by a tool that runs the suite many times (``tools/switch_offs.py``): the state dir of a local
#: stack already running (`dev up --state-dir`), used by every session and left up, and a cache
#: directory every session shares (one int8 export for all).
SHARED_STACK, SHARED_CACHE = "SUITE_STACK_DIR", "SUITE_CACHE_DIR"


@pytest.fixture(scope="session", autouse=True)
def _cache_home(tmp_path_factory):
    """What the worker derives from a model once (the int8 export that ``auto`` picks on CPUs without
    bf16) goes to the session's own cache (or ``SUITE_CACHE_DIR``), shared by every test and
    subprocess, never the user's."""
    old = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = os.environ.get(SHARED_CACHE) or str(tmp_path_factory.getbasetemp() / "xdg-cache")
    yield
    if old is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = old


#: The broker the integration tests and the fault suite run on: Apache Kafka, where the promises live
#: (EMBEDSTREAM_TEST_BROKER=tansu runs them on Tansu instead). The demo path keeps Tansu honest on its
#: own (``tests/integration/test_dev_stack.py``), and the broker errors only the mock cluster injects
#: run there (``tests/faults/test_broker_errors.py``).
TEST_BROKER = os.environ.get("EMBEDSTREAM_TEST_BROKER", "kafka")


@pytest.fixture(scope="session")
def local_stack(tmp_path_factory):
    """The suite's one local stack (broker, Redis, Milvus, registry on free ports), started on first use
    through the code of `dev up` and stopped at the end: ``(LocalStack, env)``. One for the whole
    session: a second idle broker beside it took CPU from every test on this 2-core host. Every test
    makes its own topics, group and collection (``fresh_settings``); the fault suite only ever freezes
    a part for a while (SIGSTOP, then SIGCONT). With ``SUITE_STACK_DIR``, the stack running there
    instead, left up."""
    from tools.dev import LocalStack

    shared = os.environ.get(SHARED_STACK)
    if shared:
        local = LocalStack(shared)
        assert local.is_up(), f"{SHARED_STACK}={shared}: no local stack is running there"
        yield local, local.env()
        return
    local = LocalStack(tmp_path_factory.mktemp("stack"), broker=TEST_BROKER)
    env, started = local.up(partitions=6)
    assert started
    yield local, env
    local.down()


@pytest.fixture(scope="session")
def stack(local_stack):
    """The local stack's KEY=VALUE env of `dev up`."""
    return local_stack[1]


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory):
    """A Redis Cluster of three masters on free ports (``tools.redis_cluster``), for the session."""
    from tools.redis_cluster import RedisCluster

    with RedisCluster(tmp_path_factory.mktemp("redis-cluster")) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def model():
    """The real model (packaged all-MiniLM-L6-v2) at the worker's default precision, loaded once."""
    from worker.embedding.sentence import SentenceTransformerEmbedder

    return SentenceTransformerEmbedder()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """``fast`` marks the tests of ``make test-fast`` (tests/unit and tests/connectors without the stack)
    and ``alone`` every test that freezes a part of the shared stack (it asks for the ``parts``
    fixture), beside the ones marked so by hand (``tools/suite.py`` runs those one at a time), before
    ``-m`` selects, so that ``make test`` runs them first and everything else after. The soak runs
    only when the -m expression names it (``make soak``): ``-m faults`` or ``-m integration`` would
    otherwise start its half hour. The tests behind the core promises (``guarantee``) run first, so
    that one session (one stack, one int8 export, one warm pool) shows a break in them soonest; the
    order within each part is kept (modules stay together)."""
    fast_dirs = (config.rootpath / "tests" / "unit", config.rootpath / "tests" / "connectors")
    for item in items:
        if any(item.path.is_relative_to(d) for d in fast_dirs) and item.get_closest_marker("integration") is None:
            item.add_marker(pytest.mark.fast)
        if "parts" in getattr(item, "fixturenames", ()):  # a frozen broker or Milvus stalls every test beside it
            item.add_marker(pytest.mark.alone)
    items.sort(key=lambda item: item.get_closest_marker("guarantee") is None)  # stable: guarantees first
    if "soak" in (config.option.markexpr or ""):
        return
    soak = [item for item in items if item.get_closest_marker("soak") is not None]
    if soak:
        config.hook.pytest_deselected(items=soak)
        items[:] = [item for item in items if item.get_closest_marker("soak") is None]


#: Where each fault scenario writes its row (``tests.faults.harness.record_row``).
FAULT_TABLE = "EMBEDSTREAM_FAULT_TABLE"


def pytest_configure(config):
    """The fault table's file, made by the process that reports (one session, or xdist's controller,
    which starts its workers after this and so hands it to them); the rows show in its summary."""
    if not hasattr(config, "workerinput"):
        fd, path = tempfile.mkstemp(prefix="embedstream-faults-", suffix=".tsv")
        os.close(fd)
        os.environ[FAULT_TABLE] = path


def pytest_unconfigure(config):
    if not hasattr(config, "workerinput"):
        Path(os.environ.pop(FAULT_TABLE, "")).unlink(missing_ok=True)


def pytest_terminal_summary(terminalreporter):
    """The fault table, after the results (a fixture's teardown prints into the last test's captured
    output, which a passing run never shows), and how many worker starts the warm pool served here."""
    table = Path(os.environ.get(FAULT_TABLE, ""))
    rows = table.read_text().splitlines() if table.is_file() else []
    if not rows:  # no fault scenario ran
        return
    from tests.faults.harness import warm_starts

    terminalreporter.section("fault suite")
    terminalreporter.write_line("scenario | injected | documents | dead-lettered | duplicates on output | recovery s")
    for line in rows:
        terminalreporter.write_line(" | ".join(line.split("\t")))
    terminalreporter.write_line(f"warm pool (this process): {warm_starts()}")
