"""librdkafka properties of the worker's clients: defaults, then the user's, then the caller's overrides."""

from __future__ import annotations

from connectors.kafka import OUTPUT_COMPRESSION, producer_conf


def test_output_records_go_uncompressed_unless_the_user_says_otherwise():
    """Float32 vectors do not compress: the sink's producers default to none; texts (the produce
    command) to lz4; a user's compression.type wins over either, and an override over everything."""
    common = {"bootstrap.servers": "b:9092", "session.timeout.ms": "6000"}
    assert OUTPUT_COMPRESSION == "none"
    assert producer_conf(common, compression=OUTPUT_COMPRESSION)["compression.type"] == "none"
    assert producer_conf(common)["compression.type"] == "lz4"
    mine = {**common, "compression.type": "zstd"}
    assert producer_conf(mine, compression=OUTPUT_COMPRESSION)["compression.type"] == "zstd"
    conf = producer_conf(mine, 12.5, compression=OUTPUT_COMPRESSION,
                         **{"compression.type": "gzip", "transactional.id": "t"})
    assert conf["compression.type"] == "gzip" and conf["transactional.id"] == "t"
    assert conf["message.timeout.ms"] == 12_500 and "session.timeout.ms" not in conf  # consumer-only: left out
