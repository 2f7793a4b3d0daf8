"""The command line: complete help in an 80-column terminal, explicit overrides, clear errors."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from worker.commands.cli import app
from worker.settings import Settings

ENV_SETTINGS = ["kafka_bootstrap_servers", "input_topic", "output_topic", "dlq_topic", "group_id",
                "group_instance_id", "group_protocol", "group_type", "model", "precision", "device", "max_batch_size",
                "max_batch_tokens", "max_batch_wait_ms", "cache_ttl_seconds", "milvus_uri",
                "milvus_collection", "milvus_alias", "milvus_db_name",
                "metrics_port", "metrics_host", "schema_registry_url", "output_format", "key_field",
                "document_prompt", "query_prompt", "truncate_dim", "sparse", "models", "model_memory_mb",
                "backfill_model", "backfill_share", "backfill_output_topic", "delivery", "processes",
                "chunking", "chunk_tokens", "chunk_overlap", "max_chunks", "max_inflight_batches", "log_format",
                "log_level", "forward_headers"]


def test_run_help_in_80_columns_shows_every_variable_whole_with_its_default():
    out = CliRunner().invoke(app, ["run", "--help"], terminal_width=80, env={"COLUMNS": "80"}).output
    assert "…" not in out
    for name in ENV_SETTINGS:
        assert f"EMBEDSTREAM_{name.upper()}" in out, name
        assert f"--{name.replace('_', '-')}" in out, name
    assert f"default: {Settings.model_fields['max_batch_size'].default}]" in out
    assert max(len(line) for line in out.splitlines() if "EMBEDSTREAM_" in line) <= 80


def test_run_passes_exactly_its_flags_as_settings(monkeypatch):
    import worker.commands.cli.run as cli

    seen = {}

    def fake_settings(overrides, **more):
        seen.update(overrides, **more)
        raise SystemExit(0)

    monkeypatch.setattr(cli, "settings_or_exit", fake_settings)
    CliRunner().invoke(app, ["run", "--group-id", "g", "--stop-when-idle", "3"])
    assert seen["group_id"] == "g" and "stop_when_idle" not in seen
    assert set(seen) == set(ENV_SETTINGS)


COMMANDS = ["run", "produce", "tail", "search", "lag", "bench", "demo", "dev", "dlq", "erase", "migrate", "config"]


def test_the_list_below_is_every_command():
    names = {c.name or c.callback.__name__ for c in app.registered_commands} | {g.name for g in app.registered_groups}
    assert names == set(COMMANDS)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help(command):
    result = CliRunner().invoke(app, [command, "--help"])
    assert result.exit_code == 0 and re.search(r"Usage: .*" + command, result.output)


def test_erase_and_the_rollback_say_what_they_do_in_their_help():
    erase = " ".join(CliRunner().invoke(app, ["erase", "--help"], terminal_width=200).output.split())
    assert "ID..." in erase and "receipt" in erase and "--timeout" in erase and "--json" in erase
    migrate = " ".join(CliRunner().invoke(app, ["migrate", "--help"], terminal_width=200).output.split())
    assert "--rollback" in migrate and "catches up" in migrate


def test_a_bad_setting_exits_2_naming_the_variable(monkeypatch):
    monkeypatch.setenv("EMBEDSTREAM_MAX_BATCH_SIZE", "zero")
    result = CliRunner().invoke(app, ["run"])
    assert result.exit_code == 2 and "EMBEDSTREAM_MAX_BATCH_SIZE" in result.output


def test_search_weights_are_two_numbers_from_zero_to_one():
    from worker.commands.cli.search import parse_weights

    assert parse_weights(None) is None and parse_weights("0.7,0.3") == (0.7, 0.3)
    for bad in ("0.7", "a,b", "2,0"):
        with pytest.raises(ValueError, match="--weights"):
            parse_weights(bad)


def test_a_given_model_takes_the_sparse_setting_unless_it_needs_a_model_it_was_not_loaded_with():
    from schemas.errors import ConfigError
    from tools.fake_embedder import FakeEmbedder
    from worker.assembly.runner import with_sparse

    model = FakeEmbedder()
    assert with_sparse(model, "off") is model
    bm25 = with_sparse(model, "bm25")
    assert bm25.sparse.setting == "bm25" and model.sparse.setting == "off" and bm25.space_id == "fake-model+bm25"
    learned = FakeEmbedder(sparse="org/splade")
    assert with_sparse(learned, "off") is learned and with_sparse(learned, "org/splade") is learned
    with pytest.raises(ConfigError, match="loaded without that sparse model"):
        with_sparse(model, "org/splade")


def test_a_dead_consumer_ends_the_run_with_what_to_do():
    from confluent_kafka import KafkaError, KafkaException

    from worker.commands.cli.app import consumer_died

    fenced = KafkaException(KafkaError(KafkaError._FATAL, "Fatal error: Broker: Static consumer fenced by other "
                                       "consumer with same group.instance.id"))
    assert consumer_died(fenced).exit_code == 4
    assert consumer_died(KafkaException(KafkaError(KafkaError._FATAL, "something else"))).exit_code == 1
    assert consumer_died(KafkaException(KafkaError(KafkaError._TRANSPORT, "down"))) is None
    assert consumer_died(RuntimeError("not Kafka's")) is None


def test_version_prints_the_installed_version():
    from importlib.metadata import version

    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"embedstream {version('embedstream')}"


def test_config_shows_each_setting_masked_with_where_it_came_from(monkeypatch):
    import json
    import os

    for key in [k for k in os.environ if k.startswith("EMBEDSTREAM_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("EMBEDSTREAM_MAX_BATCH_SIZE", "5")
    monkeypatch.setenv("EMBEDSTREAM_KAFKA__SASL_PASSWORD", "hunter2")
    monkeypatch.setenv("EMBEDSTREAM_KAFKA__SASL_MECHANISM", "PLAIN")
    monkeypatch.setenv("EMBEDSTREAM_REDIS_URL", "redis://user:secret@cache:6379/0")
    result = CliRunner().invoke(app, ["config", "--json"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    assert shown["EMBEDSTREAM_MAX_BATCH_SIZE"] == {"value": 5, "from": "environment"}
    assert shown["EMBEDSTREAM_INPUT_TOPIC"] == {"value": "documents", "from": "default"}
    assert shown["EMBEDSTREAM_KAFKA__<PROPERTY>"] == {"value": {"sasl.password": "***", "sasl.mechanism": "PLAIN"},
                                                     "from": "environment"}
    assert shown["EMBEDSTREAM_REDIS_URL"]["value"] == "***" and "hunter2" not in result.output
    plain = [n for n in Settings.model_fields if n not in ("kafka", "schema_registry")]
    assert set(shown) >= {f"EMBEDSTREAM_{n.upper()}" for n in plain}
    table = CliRunner().invoke(app, ["config"])
    assert table.exit_code == 0 and "EMBEDSTREAM_MAX_BATCH_SIZE" in table.output and "secret" not in table.output


def test_config_with_a_bad_setting_exits_2_as_run_would(monkeypatch):
    monkeypatch.setenv("EMBEDSTREAM_MAX_BATCH_SIZ", "5")
    result = CliRunner().invoke(app, ["config"])
    assert result.exit_code == 2 and "EMBEDSTREAM_MAX_BATCH_SIZE" in result.output


def test_json_logs_carry_an_iso_8601_timestamp_with_its_zone():
    import datetime
    import json
    import logging

    from worker.process.logs import JsonFormatter

    record = logging.LogRecord("worker.core.loop", logging.INFO, __file__, 1, "assigned %s", ([0, 1],), None)
    line = json.loads(JsonFormatter().format(record))
    ts = datetime.datetime.fromisoformat(line["ts"])
    assert ts.tzinfo is not None and ts.utcoffset() == datetime.timedelta(0)
    assert abs(ts.timestamp() - record.created) < 0.001
    assert (line["level"], line["logger"], line["message"]) == ("INFO", "worker.core.loop", "assigned [0, 1]")
    assert line["process"] == 0 and json.loads(JsonFormatter(process=3).format(record))["process"] == 3


def test_lag_of_a_share_group_refuses_what_it_cannot_read(monkeypatch):
    monkeypatch.setenv("EMBEDSTREAM_KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:1")
    monkeypatch.setenv("EMBEDSTREAM_GROUP_TYPE", "share")
    monkeypatch.setenv("EMBEDSTREAM_KAFKA__SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("EMBEDSTREAM_KAFKA__SASL_MECHANISM", "OAUTHBEARER")
    result = CliRunner().invoke(app, ["lag"])
    assert result.exit_code == 2 and "OAUTHBEARER" in result.output and "SCRAM" in result.output


@pytest.mark.parametrize("argv", [["lag"], ["tail", "--max", "1"], ["produce", "-"], ["lag", "--keda-version", "2.x"]])
def test_a_setting_to_fix_exits_2_from_every_command(monkeypatch, argv):
    """As run and migrate do: a missing broker address (or a flag it cannot read) is a setting to fix."""
    monkeypatch.delenv("EMBEDSTREAM_KAFKA_BOOTSTRAP_SERVERS", raising=False)
    result = CliRunner().invoke(app, argv, input="")
    assert result.exit_code == 2, result.output
    assert ("EMBEDSTREAM_KAFKA_BOOTSTRAP_SERVERS" if "--keda-version" not in argv else "2.21") in result.output
