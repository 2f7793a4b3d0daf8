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
