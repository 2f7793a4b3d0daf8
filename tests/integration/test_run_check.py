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
    assert not _group_exists(s), "the check joined the group"


def _group_exists(s) -> bool:
    """Whether the broker knows the consumer group of ``s`` (the one group asked about: listing every
    group is the broker's slower question)."""
    from confluent_kafka import ConsumerGroupState, KafkaError, KafkaException

    from connectors.kafka import make_admin

    admin = make_admin(s.kafka_common())  # kept in a name: a collected admin client never answers its futures
    try:
        group = admin.describe_consumer_groups([s.group_id], request_timeout=30)[s.group_id].result(timeout=60)
    except KafkaException as exc:  # newer brokers answer a group nobody joined with an error
        if exc.args[0].code() == KafkaError.GROUP_ID_NOT_FOUND:
            return False
        raise
    return group.state != ConsumerGroupState.DEAD or bool(group.members)


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


#: Secrets a deployment hands the worker, each where a user would put it.
SECRETS = {
    "EMBEDSTREAM_KAFKA__SSL_KEYSTORE_PASSWORD": "ks-s3cr3t-1",
    "EMBEDSTREAM_KAFKA__SASL_OAUTHBEARER_CONFIG": "principal=me client_secret=oa-s3cr3t-2",
    "EMBEDSTREAM_KAFKA__SSL_KEY_PEM": "-----BEGIN PRIVATE KEY----- pem-s3cr3t-3",
    "EMBEDSTREAM_MILVUS_TOKEN": "root:tok-s3cr3t-4",
    "EMBEDSTREAM_REDIS_URL": "redis://cache:rd-s3cr3t-5@127.0.0.1:1/0",
    "EMBEDSTREAM_SCHEMA_REGISTRY__BASIC_AUTH_USER_INFO": "bob:sr-s3cr3t-6",
}


def test_no_secret_is_printed_by_config_or_run_check_even_when_everything_fails(stack):
    """`config` shows each secret masked; `run --check` against a Milvus URI with a password in it that
    nobody answers, Redis down and a refused Kafka login prints its table and its last line without a
    single secret (the URI's password included, which a client's own error would quote)."""
    s = fresh_settings(stack, partitions=1)
    env = {**_env(s), **SECRETS, "EMBEDSTREAM_MILVUS_URI": f"http://admin:uri-s3cr3t-7@127.0.0.1:{free_port()}"}
    for args in (["config"], ["config", "--json"], ["run", "--check"]):
        res = run_cli(args, env, timeout=300)
        out = res.stdout + res.stderr
        assert "s3cr3t" not in out, (args, [line for line in out.splitlines() if "s3cr3t" in line])
        if args[0] == "run":
            assert res.returncode == 2 and _rows(res.stdout)["milvus"] == "fail", out[-3000:]
            assert "127.0.0.1" in out  # the endpoint is still named, without its user info
        else:
            assert res.returncode == 0 and "***" in out, out[-3000:]
