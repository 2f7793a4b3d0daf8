"""The erasure receipt's arithmetic: where a version came from, and how long each topic keeps what
stays by design (the end-to-end erasure is tests/integration/test_erase.py)."""

from __future__ import annotations

from worker.commands.erase import ModelCopy, _partition_of, lifetime


def test_a_versions_partition_is_the_number_after_its_last_colon():
    assert _partition_of("Abc-topic-id:3") == 3 and _partition_of("docs:with:colons:12") == 12
    assert _partition_of(None) is None and _partition_of("no-partition") is None and _partition_of("t:") is None


def test_each_topic_says_how_long_it_keeps_records_and_tombstones():
    compacted = {"cleanup.policy": "compact", "delete.retention.ms": "86400000"}
    assert "until compaction keeps only the tombstone" in lifetime(compacted, "records")
    assert lifetime(compacted, "tombstones") == "the tombstone itself for 1 day after compaction"
    both = {"cleanup.policy": "compact,delete", "retention.ms": "259200000"}
    assert lifetime(both, "records").endswith("or for 3 days")
    assert lifetime({"cleanup.policy": "delete", "retention.ms": "7200000"}, "records").startswith("for 2 hours")
    assert lifetime({"cleanup.policy": "delete", "retention.ms": "-1"}, "records").startswith("for ever (")
    assert "DescribeConfigs" in lifetime(None, "records")


def test_a_copy_is_applied_only_with_no_row_left_and_the_deletes_version_kept():
    copy = ModelCopy("", "c")
    assert not copy.applied
    copy.rows_left, copy.version_kept = 0, None
    assert not copy.applied
    copy.version_kept = 41
    assert copy.applied
    copy.rows_left = 1
    assert not copy.applied


def test_each_tombstone_goes_to_its_versions_partition_and_its_offset_is_kept_for_the_receipt():
    from tools.mock_broker import MockCluster
    from worker.commands.erase import Erased, produce_tombstones
    from worker.settings import Settings

    with MockCluster() as mc:
        mc.create_topic("docs", 3)
        s = Settings(kafka_bootstrap_servers=mc.bootstraps, input_topic="docs")
        erased = [Erased("a"), Erased("b"), Erased("c")]
        produce_tombstones(s, erased, {"a": 2, "b": 2})  # c: no version known, the partitioner's choice
        assert [(e.partition, e.offset) for e in erased[:2]] == [(2, 0), (2, 1)]
        assert erased[2].partition in (0, 1, 2) and erased[2].offset >= 0
