"""The pure parts of `embedstream migrate`: collection names, the retention warning, what is dropped."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace

import pytest

from worker.assembly.naming import backfill_group, fleet_group, versioned_name
from worker.commands.migrate import Plan, drop_old, retention_warnings
from worker.settings import Settings


def test_a_collection_per_vector_space_named_after_the_model():
    a = versioned_name("embeddings", "sentence-transformers/all-MiniLM-L6-v2", "all-MiniLM-L6-v2")
    assert a.startswith("embeddings__all_MiniLM_L6_v2_") and len(a.rsplit("_", 1)[1]) == 8
    assert a == versioned_name("embeddings", "sentence-transformers/all-MiniLM-L6-v2", "all-MiniLM-L6-v2")
    # another prompt or dimension is another space: another collection, same model name in it
    b = versioned_name("embeddings", "sentence-transformers/all-MiniLM-L6-v2", "all-MiniLM-L6-v2+dim-256")
    assert b != a and b.rsplit("_", 1)[0] == a.rsplit("_", 1)[0]
    assert versioned_name("e", "/models/odd name.v2/", "x").startswith("e__odd_name_v2_")
    assert versioned_name("e", "a__b", "s").count("__") == 1  # the family's mark, once
    assert all(c.isalnum() or c == "_" for c in versioned_name("e", "a/b-c.d", "s"))


class _Admin:
    def __init__(self, configs: dict[str, str] | Exception) -> None:
        self.configs = configs

    def describe_configs(self, resources, request_timeout=None):
        fut: Future = Future()
        if isinstance(self.configs, Exception):
            fut.set_exception(self.configs)
        else:
            fut.set_result({k: SimpleNamespace(value=v) for k, v in self.configs.items()})
        return {resources[0]: fut}


def test_a_backfill_group_is_named_after_the_fleets_first_group_however_many_migrations_ran():
    first = Settings(group_id="embedstream")
    handed = Settings(group_id=backfill_group(first, "docs__b_1"))  # the fleet after a first migration
    assert handed.group_id == "embedstream.migrate.docs__b_1"
    assert backfill_group(handed, "docs__c_2") == "embedstream.migrate.docs__c_2"  # not ….migrate.docs__b_1.migrate.…
    assert fleet_group(handed.group_id) == fleet_group(first.group_id) == "embedstream"


def test_retention_that_cannot_replay_every_document_is_warned_about():
    s = Settings(input_topic="docs")
    assert retention_warnings(s, _Admin({"cleanup.policy": "compact", "retention.ms": "604800000"})) == []
    assert retention_warnings(s, _Admin({"cleanup.policy": "compact,delete", "retention.ms": "1000"})) == []
    assert retention_warnings(s, _Admin({"cleanup.policy": "delete", "retention.ms": "-1",
                                         "retention.bytes": "-1"})) == []  # keeps everything for ever
    [warning] = retention_warnings(s, _Admin({"cleanup.policy": "delete", "retention.ms": "604800000"}))
    assert "retention.ms=604800000" in warning and "cleanup.policy=compact" in warning
    [warning] = retention_warnings(s, _Admin(RuntimeError("DescribeConfigs unsupported")))
    assert "could not read" in warning and "compacted" in warning


def test_drop_old_drops_the_alias_family_but_the_new_collection():
    dropped: list[str] = []
    names = ["docs__a_1", "docs__a_1_deleted", "docs__b_2", "docs__b_2_deleted"]
    admin = SimpleNamespace(drop_collection=dropped.append,
                            collections=lambda prefix: [n for n in names if n.startswith(prefix)])
    plan = Plan("docs", "docs__a_1", "a", "docs__b_2", "b", "g", "t", switched=True)
    assert drop_old(admin, plan) == ["docs__a_1", "docs__a_1_deleted"] == dropped


def test_a_lane_is_caught_up_at_a_zero_lag_and_its_bar_counts_from_the_first_reading():
    from worker.commands.migrate import BackfillLag, LaneWatch, lane_lag

    assert lane_lag(BackfillLag(0, False, True)) == BackfillLag(0, True, True)
    assert lane_lag(BackfillLag(0, False, False)).certain is True  # never committed, nothing owed: an empty topic
    assert lane_lag(BackfillLag(5, True, True)).certain is False
    watch = LaneWatch()
    assert [watch.done(lag) for lag in (100, 60, 80, 0)] == [0, 40, 20, 100]
    assert watch.ends() == {} and watch.alive and watch.error is None


def test_a_lane_whose_group_lost_every_member_is_taken_for_ended_and_never_waited_for():
    """Before its first member the lane may still be rolling out: waited for. Once it had members, a
    group empty for the grace (a worker's lane ended: a refusal, a crash; or the lane was unset) makes
    ``wait_caught_up`` raise LaneEnded, with the lag still above 0; a restart inside the grace does not."""
    from worker.commands.migrate import BackfillLag, LaneEnded, LaneWatch, wait_caught_up

    now = [0.0]
    members = iter([None, 0, 0, 2, 0, 1, 0, 0, 0, 0, 0])
    watch = LaneWatch(lambda: next(members), gone_s=10, clock=lambda: now[0])
    seen = []
    with pytest.raises(LaneEnded, match="no member for 10 s"):
        def lag() -> BackfillLag:
            now[0] += 3
            seen.append(now[0])
            return BackfillLag(500, True, True)
        wait_caught_up(lag, watch, lambda _: None, interval=0)
    # None, 0, 0 (never a member yet), 2, 0 (empty from t=12), 1 (back), then empty from t=18 to t=30
    assert seen[-1] == 30 and len(seen) == 10
