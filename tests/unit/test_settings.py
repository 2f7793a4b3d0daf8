"""Settings: the passthrough of librdkafka properties, required settings, secrets never shown."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from worker.settings import Settings, kafka_passthrough, load_settings


def test_kafka_passthrough_maps_underscores_to_dots():
    env = {"EMBEDSTREAM_KAFKA__SASL_MECHANISM": "PLAIN", "EMBEDSTREAM_KAFKA__": "x", "OTHER": "y"}
    assert kafka_passthrough(env) == {"sasl.mechanism": "PLAIN"}


def test_kafka_common_carries_bootstrap_and_passthrough():
    s = Settings(kafka_bootstrap_servers="b:9092", kafka={"security.protocol": "SASL_SSL"})
    assert s.kafka_common() == {"bootstrap.servers": "b:9092", "security.protocol": "SASL_SSL"}


def test_require_names_the_variable_to_set():
    with pytest.raises(ValueError, match="EMBEDSTREAM_MILVUS_URI"):
        Settings().require("milvus_uri")


def test_secrets_are_masked():
    s = Settings(redis_url="redis://:s3cr3t-r@h:6379/0", milvus_token="s3cr3t-m", kafka={"sasl.password": "s3cr3t-k"})
    shown = s.redacted()
    assert shown["redis_url"] == shown["milvus_token"] == "***" and shown["kafka"]["sasl.password"] == "***"
    assert "s3cr3t" not in repr(s) and "s3cr3t" not in str(shown)


def test_registry_credentials_pass_through_and_are_masked(monkeypatch):
    monkeypatch.setenv("EMBEDSTREAM_SCHEMA_REGISTRY_URL", "https://bob:s3cr3t-u@sr:8081")
    monkeypatch.setenv("EMBEDSTREAM_SCHEMA_REGISTRY__BASIC_AUTH_USER_INFO", "bob:s3cr3t-p")
    monkeypatch.setenv("EMBEDSTREAM_SCHEMA_REGISTRY__SSL_CA_LOCATION", "/ca.crt")
    s = load_settings()
    assert s.schema_registry == {"basic.auth.user.info": "bob:s3cr3t-p", "ssl.ca.location": "/ca.crt"}
    shown = s.redacted()
    assert "s3cr3t" not in str(shown) and "s3cr3t" not in repr(s)
    assert shown["schema_registry"]["ssl.ca.location"] == "/ca.crt"


def test_registry_output_needs_a_registry():
    with pytest.raises(ValidationError, match="EMBEDSTREAM_SCHEMA_REGISTRY_URL"):
        Settings(output_format="avro-registry")
    s = Settings(output_format="avro-registry", schema_registry_url="http://sr:8081")
    assert s.output_format == "avro-registry"
    with pytest.raises(ValidationError):
        Settings(output_format="protobuf")


def test_topics_must_differ_and_blank_is_unset():
    with pytest.raises(ValidationError, match="three different topics"):
        Settings(input_topic="a", output_topic="a")
    assert Settings(redis_url="  ").redis_url is None


def test_flags_override_the_environment_and_none_means_not_given(monkeypatch):
    monkeypatch.setenv("EMBEDSTREAM_GROUP_ID", "from-env")
    monkeypatch.setenv("EMBEDSTREAM_MAX_BATCH_SIZE", "64")
    s = load_settings({"group_id": "from-flag", "max_batch_size": None})
    assert s.group_id == "from-flag" and s.max_batch_size == 64


def test_each_setting_is_declared_once_in_one_section_with_what_it_means():
    from worker.settings import SECTIONS

    declared = [name for section in SECTIONS for name in section.model_fields]
    assert len(declared) == len(set(declared)) == len(Settings.model_fields) > 40
    assert declared == list(Settings.model_fields)  # the sections' order is the settings' order
    assert all(Settings.model_fields[n].description for n in declared)


def test_a_section_holds_its_settings_and_only_them(monkeypatch):
    from worker.settings import BatchingSettings, ChunkingSettings

    monkeypatch.setenv("EMBEDSTREAM_MAX_BATCH_SIZE", "7")
    s = load_settings({"chunk_overlap": 3})
    batching, chunking = s.section(BatchingSettings), s.section(ChunkingSettings)
    assert type(batching) is BatchingSettings and batching.max_batch_size == 7 and chunking.chunk_overlap == 3
    assert not hasattr(batching, "chunk_overlap") and not hasattr(chunking, "max_batch_size")


def test_every_flag_is_derived_from_its_settings_declaration():
    from typer.testing import CliRunner

    from worker.commands.cli import app
    from worker.commands.options import FLAGGED

    out = CliRunner().invoke(app, ["run", "--help"], terminal_width=200, env={"COLUMNS": "200"}).output
    for name in FLAGGED:
        description = Settings.model_fields[name].description
        assert f"--{name.replace('_', '-')}" in out and description.split()[0] in out, name


def _run(monkeypatch, env: dict[str, str]):
    """``embedstream run`` under ``env`` (the stack is never reached: these fail before it)."""
    from typer.testing import CliRunner

    from worker.commands.cli import app

    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return CliRunner().invoke(app, ["run"])


@pytest.mark.parametrize(("env", "says"), [
    ({"EMBEDSTREAM_MAX_BATCH_SIZ": "5"}, "unknown variable EMBEDSTREAM_MAX_BATCH_SIZ: did you mean "
                                         "EMBEDSTREAM_MAX_BATCH_SIZE?"),
    ({"EMBEDSTREAM_KAFKA_SASL_MECHANISM": "PLAIN"}, "two underscores: EMBEDSTREAM_KAFKA__SASL_MECHANISM"),
    ({"EMBEDSTREAM_LOG_LEVEL": "LOUD"}, "EMBEDSTREAM_LOG_LEVEL: Input should be"),
    ({"EMBEDSTREAM_KAFKA__ENABLE_AUTO_COMMIT": "true"}, "EMBEDSTREAM_KAFKA__ENABLE_AUTO_COMMIT=true is refused: "
                                                        "offsets are committed only once"),
    ({"EMBEDSTREAM_KAFKA__ENABLE_IDEMPOTENCE": "false"}, "a retried produce never duplicates"),
    ({"EMBEDSTREAM_METRICS_PORT": "70000"}, "EMBEDSTREAM_METRICS_PORT: '70000' is not a port: give a port (1-65535)"),
    ({"EMBEDSTREAM_METRICS_PORT": "any"}, "EMBEDSTREAM_METRICS_PORT: 'any' is not a port"),
    ({"EMBEDSTREAM_FORWARD_HEADERS": "traceparent,embedstream.model"},
     "EMBEDSTREAM_FORWARD_HEADERS: embedstream.model: the worker writes the embedstream.* headers"),
    ({"EMBEDSTREAM_DELIVERY": "exactly-once", "EMBEDSTREAM_KAFKA__TRANSACTIONAL_ID": "mine"},
     "EMBEDSTREAM_KAFKA__TRANSACTIONAL_ID=mine is refused: exactly-once derives it"),
])
def test_a_setting_to_fix_is_one_line_and_exit_2(monkeypatch, env, says):
    """A misspelt variable, a bad value, a property a guarantee rests on: one line, exit 2, never a
    traceback, never ignored."""
    result = _run(monkeypatch, env)
    assert result.exit_code == 2, result.output
    assert says in " ".join(result.output.split()), result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) <= 2, result.output


def test_guarded_properties_pass_at_the_workers_own_values_and_tools_variables_pass(monkeypatch):
    from worker.settings import unknown_variables

    s = Settings(kafka={"enable.auto.commit": "False", "enable.idempotence": "true"}, log_level="debug")
    assert s.log_level == "DEBUG"
    env = {"EMBEDSTREAM_TEST_BROKER": "kafka", "EMBEDSTREAM_SOAK_MINUTES": "5", "EMBEDSTREAM_KAFKA__ACKS": "all",
           "EMBEDSTREAM_SCHEMA_REGISTRY__SSL_CA_LOCATION": "/ca", "EMBEDSTREAM_MODEL": "m", "OTHER": "x"}
    assert unknown_variables(Settings.model_fields, env) == []


def test_a_property_librdkafka_refuses_is_one_line_and_exit_2(monkeypatch):
    from confluent_kafka import KafkaError, KafkaException

    import worker.assembly.runner as runner

    def refuse(_s, **_kw):
        raise KafkaException(KafkaError(KafkaError._INVALID_ARG, 'No such configuration property: "sasl.mechanizm"'))

    monkeypatch.setattr(runner, "build_worker", refuse)
    result = _run(monkeypatch, {"EMBEDSTREAM_KAFKA__SASL_MECHANIZM": "PLAIN"})
    assert result.exit_code == 2, result.output
    assert "sasl.mechanizm" in result.output and "EMBEDSTREAM_KAFKA__" in result.output


def test_the_metrics_port_is_a_number_off_or_auto(monkeypatch):
    from worker.settings import Settings

    assert Settings(metrics_port="auto").metrics_port == "auto"
    monkeypatch.setenv("EMBEDSTREAM_METRICS_PORT", "9500")
    assert Settings().metrics_port == 9500
    monkeypatch.setenv("EMBEDSTREAM_METRICS_PORT", "auto")
    assert Settings().metrics_port == "auto"


def test_every_property_named_as_a_secret_and_every_urls_user_info_is_masked():
    s = Settings(kafka={"ssl.keystore.password": "s3cr3t-1", "sasl.oauthbearer.config": "client_secret=s3cr3t-2",
                        "ssl.key.pem": "s3cr3t-3", "sasl.username": "alice", "ssl.truststore.location": "/t.jks"},
                 schema_registry={"bearer.auth.token": "s3cr3t-4"},
                 milvus_uri="https://root:s3cr3t-5@milvus.example:19530", milvus_token="s3cr3t-6")
    shown = s.redacted()
    assert "s3cr3t" not in str(shown)
    assert shown["kafka"]["sasl.username"] == "alice" and shown["kafka"]["ssl.truststore.location"] == "/t.jks"
    assert shown["milvus_uri"] == "https://***@milvus.example:19530"
    assert {f"s3cr3t-{n}" for n in range(1, 7)} <= {part for secret in s.secrets() for part in
                                                     (secret, *secret.split("="))}


def test_a_line_that_quotes_a_secret_is_masked_wherever_it_comes_from(caplog):
    """A client library's error may quote the URL it was given, a traceback the value that failed: every
    line the process writes goes through the mask."""
    import logging

    from schemas.redact import MaskingFilter, mask, remember

    remember(["tok-s3cr3t-9", None, "ab"])  # too short a value is never masked inside text
    assert mask("connect to http://u:tok-s3cr3t-9@h:1 failed; token tok-s3cr3t-9") == \
        "connect to http://***@h:1 failed; token ***"
    assert mask("grab a cab") == "grab a cab"
    record = logging.LogRecord("pymilvus", logging.ERROR, __file__, 1, "cannot reach %s", ("http://x:pw-1@h",), None)
    try:
        raise ValueError("bad token tok-s3cr3t-9")
    except ValueError:
        import sys

        record.exc_info = sys.exc_info()
    MaskingFilter().filter(record)
    text = logging.Formatter().format(record)
    assert "tok-s3cr3t-9" not in text and "pw-1" not in text and "cannot reach http://***@h" in text


def test_json_logs_print_tracebacks_masked_too():
    """The JSON formatter prints the traceback the masking filter left, never a fresh one in clear."""
    import json
    import logging
    import sys

    from schemas.redact import MaskingFilter, remember
    from worker.process.logs import JsonFormatter

    remember(["json-s3cr3t-7"])
    record = logging.LogRecord("pymilvus", logging.ERROR, __file__, 1, "failed", (), None)
    try:
        raise ValueError("uri http://root:json-s3cr3t-7@milvus:19530 refused")
    except ValueError:
        record.exc_info = sys.exc_info()
    MaskingFilter().filter(record)
    line = JsonFormatter().format(record)
    assert "json-s3cr3t-7" not in line and "ValueError" in json.loads(line)["exc"]


def test_a_tokens_password_part_and_a_urls_query_password_are_masked_alone():
    from schemas.redact import mask, remember, without_userinfo

    s = Settings(milvus_token="root:tokpart-s3cr3t", redis_url="redis://cache:6379/0?password=q-s3cr3t-8&db=1")
    remember(s.secrets())
    assert "tokpart-s3cr3t" in s.secrets() and "q-s3cr3t-8" in s.secrets()
    assert mask("authentication failed: password tokpart-s3cr3t is wrong") == \
        "authentication failed: password *** is wrong"
    assert mask("cannot reach redis://other:6379?password=never-remembered-1") == \
        "cannot reach redis://other:6379?password=***"
    assert without_userinfo("redis://cache:6379/0?password=q-s3cr3t-8&db=1") == "redis://cache:6379/0?password=***&db=1"
    assert "q-s3cr3t-8" not in str(s.redacted())


def test_no_secret_setting_is_a_flag():
    """A flag's value is on the command line, which every user of the host reads (ps)."""
    from worker.commands.options import FLAGGED

    secret = {n for n, f in Settings.model_fields.items() if "SecretStr" in str(f.annotation)}
    assert secret >= {"redis_url", "milvus_token"} and not secret & set(FLAGGED), secret & set(FLAGGED)


def test_text_from_outside_is_shown_as_the_characters_it_holds():
    from rich.console import Console

    from worker.commands.shown import shown

    console = Console(record=True, width=200, color_system=None)
    hostile = "model [/x] asked [bold]x\x1b]0;pwned\x07 \x1b[31m"
    console.print(f"[red]error:[/] {shown(hostile)}")
    out = console.export_text()
    assert "model [/x] asked [bold]x]0;pwned [31m" in out and "\x1b" not in out
