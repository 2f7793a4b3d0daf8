"""The local Apache Kafka node: what it needs (Java 17+, Maven once), and how it is configured."""

from __future__ import annotations

import subprocess

import pytest

from tools import kafka_broker
from tools.kafka_broker import KafkaSetupError


def _java_says(monkeypatch, text: str) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setattr(kafka_broker.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(kafka_broker.subprocess, "run",
                        lambda *a, **k: subprocess.CompletedProcess(a, 0, "", text))


def test_java_17_or_later_is_taken(monkeypatch):
    _java_says(monkeypatch, 'openjdk version "17.0.15" 2025-04-15')
    assert kafka_broker.java_bin() == "/usr/bin/java"
    _java_says(monkeypatch, 'openjdk version "25" 2025-09-16')
    assert kafka_broker.java_bin() == "/usr/bin/java"


@pytest.mark.parametrize("banner", ['java version "1.8.0_402"', 'openjdk version "11.0.2" 2019-01-15'])
def test_an_older_java_is_one_line_that_says_what_to_install(monkeypatch, banner):
    _java_says(monkeypatch, banner)
    with pytest.raises(KafkaSetupError, match=r"needs Java 17 or later") as err:
        kafka_broker.java_bin()
    assert "\n" not in str(err.value) and "--broker tansu" in str(err.value)


def test_no_java_and_no_maven_each_say_what_to_install(monkeypatch, tmp_path):
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setattr(kafka_broker.shutil, "which", lambda name: None)
    with pytest.raises(KafkaSetupError, match=r"no `java` found: install Java 17"):
        kafka_broker.java_bin()
    monkeypatch.setenv("EMBEDSTREAM_KAFKA_CACHE", str(tmp_path))
    with pytest.raises(KafkaSetupError, match=r"no `mvn` found .* install Maven"):
        kafka_broker.kafka_classpath()


def test_resolved_jars_are_reused_without_maven(monkeypatch, tmp_path):
    monkeypatch.setenv("EMBEDSTREAM_KAFKA_CACHE", str(tmp_path))
    lib = tmp_path / kafka_broker.KAFKA_VERSION / "lib"
    lib.mkdir(parents=True)
    (lib.parent / ".complete").write_text(kafka_broker.KAFKA_VERSION)
    monkeypatch.setattr(kafka_broker.shutil, "which", lambda name: None)  # no Maven needed now
    assert kafka_broker.kafka_classpath() == f"{lib}/*"


def test_the_node_is_one_kraft_process_with_a_single_replica_everywhere(tmp_path):
    props = dict(line.split("=", 1) for line in
                 kafka_broker.server_properties(tmp_path / "data", 9092, 9093).splitlines())
    assert props["process.roles"] == "broker,controller"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:9093"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:9092"
    for key in ("offsets.topic.replication.factor", "transaction.state.log.replication.factor",
                "transaction.state.log.min.isr", "share.coordinator.state.topic.replication.factor"):
        assert props[key] == "1", key
    assert int(props["group.min.session.timeout.ms"]) <= 2000  # the fault suite's 2 s sessions
    assert props["group.initial.rebalance.delay.ms"] == "0"
    assert len(kafka_broker.cluster_id()) == 22


def test_a_cluster_id_never_reads_as_an_option(monkeypatch):
    """An id drawn with a leading '-' (1 in 64) is drawn again: kafka-storage would take it for an option."""
    draws = iter([b"\xfb" + bytes(15), bytes(16)])  # base64 of 0xfb... starts with '-'
    monkeypatch.setattr(kafka_broker.os, "urandom", lambda n: next(draws))
    assert kafka_broker.cluster_id() == "AAAAAAAAAAAAAAAAAAAAAA"
