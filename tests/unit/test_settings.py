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
