"""librdkafka properties of the worker's clients: defaults, then the user's, then the caller's overrides."""

from __future__ import annotations

from connectors.kafka import OUTPUT_COMPRESSION, OUTPUT_DEFAULTS, producer_conf


def test_output_records_go_uncompressed_unless_the_user_says_otherwise():
    """Float32 vectors do not compress: the sink's producers default to none; texts (the produce
    command) to lz4; a user's compression.type wins over either, and an override over everything."""
    common = {"bootstrap.servers": "b:9092", "session.timeout.ms": "6000"}
    assert OUTPUT_COMPRESSION == "none"
    assert producer_conf(common, defaults=OUTPUT_DEFAULTS)["compression.type"] == "none"
    assert producer_conf(common)["compression.type"] == "lz4"
    mine = {**common, "compression.type": "zstd"}
    assert producer_conf(mine, defaults=OUTPUT_DEFAULTS)["compression.type"] == "zstd"
    conf = producer_conf(mine, 12.5, defaults=OUTPUT_DEFAULTS,
                         **{"compression.type": "gzip", "transactional.id": "t"})
    assert conf["compression.type"] == "gzip" and conf["transactional.id"] == "t"
    assert conf["message.timeout.ms"] == 12_500 and "session.timeout.ms" not in conf  # consumer-only: left out


def test_output_producers_linger_until_the_flush_unless_the_user_says_otherwise(monkeypatch):
    """The sink's producers wait OUTPUT_LINGER_MS (the group's flush sends earlier) uncompressed;
    the produce command keeps a short linger; the user's linger.ms wins, transactional overrides pass."""
    import connectors.kafka as kafka

    made: list[dict] = []
    monkeypatch.setattr(kafka, "Producer", lambda conf: made.append(conf) or conf)
    common = {"bootstrap.servers": "b:9092"}
    kafka.make_output_producer(common, 12.0, **{"transactional.id": "t"})
    kafka.make_output_producer({**common, "linger.ms": "2"})
    kafka.make_producer(common)
    assert kafka.OUTPUT_LINGER_MS >= 50
    assert made[0]["linger.ms"] == kafka.OUTPUT_LINGER_MS and made[0]["compression.type"] == OUTPUT_COMPRESSION
    assert made[0]["transactional.id"] == "t" and made[0]["message.timeout.ms"] == 12_000
    assert made[1]["linger.ms"] == "2"
    assert made[2]["linger.ms"] == 5 and made[2]["compression.type"] == "lz4"


def test_kip_848_leaves_out_what_librdkafka_refuses_there(caplog):
    import logging

    import pytest
    from confluent_kafka import Consumer, KafkaException

    from connectors.kafka import CLASSIC_ONLY, consumer_conf

    common = {"bootstrap.servers": "127.0.0.1:1", "session.timeout.ms": "6000", "heartbeat.interval.ms": "1000"}
    classic = consumer_conf(common, "g")
    assert classic["partition.assignment.strategy"] == "cooperative-sticky" and "group.protocol" not in classic
    assert classic["session.timeout.ms"] == "6000"
    with caplog.at_level(logging.WARNING, logger="connectors.kafka"):
        kip848 = consumer_conf(common, "g", "pod-0", "consumer")
    assert kip848["group.protocol"] == "consumer" and kip848["group.instance.id"] == "pod-0"
    assert not set(CLASSIC_ONLY) & set(kip848)
    assert "heartbeat.interval.ms, session.timeout.ms left out" in caplog.text
    Consumer(kip848).close()  # librdkafka takes it ...
    with pytest.raises(KafkaException):  # ... and refuses the classic properties under KIP-848
        Consumer({**kip848, "session.timeout.ms": "6000"})


def test_a_transaction_timeout_below_the_kafka_timeout_makes_a_producer_librdkafka_accepts(monkeypatch):
    """EMBEDSTREAM_KAFKA__TRANSACTION_TIMEOUT_MS under EMBEDSTREAM_KAFKA_TIMEOUT_SECONDS: records may
    wait no longer than the transaction (librdkafka refuses the producer otherwise: found on Kafka)."""
    import worker.assembly.groups as runner
    from worker.settings import Settings

    made = {}
    monkeypatch.setattr(runner, "Transactions", lambda new_producer, timeout, keep_open_s: made.update(
        producer=new_producer(), keep_open_s=keep_open_s))
    s = Settings(kafka_bootstrap_servers="127.0.0.1:1", delivery="exactly-once", kafka_timeout_seconds=30,
                 kafka={"transaction.timeout.ms": "10000"})
    runner.open_transactions(s)  # the real librdkafka producer: refused before, with a traceback
    assert made["keep_open_s"] == 5.0
    made["producer"].purge()
