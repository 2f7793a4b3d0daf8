"""`embedstream run --check` on the real stack: every part reached and the model loaded (exit 0)
without joining the group or creating the collection; a missing topic is a failure (exit 2); Redis
not answering is a warning (the worker rides it out)."""

from __future__ import annotations

import pytest

from connectors.milvus import MilvusAdmin
from tests.helpers import fresh_settings, run_cli, settings_env
from tools.dev import free_port

pytestmark = pytest.mark.integration


def _env(s) -> dict[str, str]:
    return {**settings_env(s), "COLUMNS": "250"}  # the table's rows unwrapped


def _rows(stdout: str) -> dict[str, str]:
    """part → ok / fail / warn, read from the printed table."""
    rows = {}
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.split("│")]
        if len(cells) >= 4 and cells[2] in ("ok", "fail", "warn"):
            rows[cells[1]] = cells[2]
    return rows


def test_run_check_reaches_everything_and_changes_nothing(stack):
    s = fresh_settings(stack, partitions=2)
    res = run_cli(["run", "--check"], _env(s), timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]
    rows = _rows(res.stdout)
    assert {part: rows.get(part) for part in ("settings", "kafka", "topics", "model", "milvus", "redis",
                                             "schema registry")} == dict.fromkeys(
        ("settings", "kafka", "topics", "model", "milvus", "redis", "schema registry"), "ok"), res.stdout
    assert "does not exist yet" in res.stdout  # a fresh collection name: reported, not created
    admin = MilvusAdmin(s.milvus_uri, s.milvus_collection, timeout=30)
    assert admin.collections(s.milvus_collection) == [], "the check created a collection"
    admin.close()
    from connectors.kafka import make_admin

    groups = make_admin(s.kafka_common()).list_consumer_groups().result(30).valid
    assert s.group_id not in {g.group_id for g in groups}, "the check joined the group"


def test_run_check_fails_on_a_missing_topic_and_warns_on_redis_down(stack):
    s = fresh_settings(stack, partitions=1)
    missing = s.model_copy(update={"output_topic": "no-such-topic-here"})
    res = run_cli(["run", "--check"], _env(missing), timeout=300)
    assert res.returncode == 2, res.stdout + res.stderr[-3000:]
    assert _rows(res.stdout)["topics"] == "fail" and "no-such-topic-here" in res.stdout
    assert "topics" in res.stderr.splitlines()[-1]
    redis_down = fresh_settings(stack, partitions=1, redis_url=f"redis://127.0.0.1:{free_port()}/0")
    res = run_cli(["run", "--check"], _env(redis_down), timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]
    assert _rows(res.stdout)["redis"] == "warn"
