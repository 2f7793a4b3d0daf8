"""The soak's judgement of a fault's recovery (``tests.faults.test_soak._recoveries``) and its
watch for milvus-lite's memtable flushes (``FlushWatch``): pure parts, checked without a stack."""

from __future__ import annotations

from pathlib import Path

from tests.faults.test_soak import FlushWatch, _recoveries

THRESHOLD = 1.0


def windows(values: dict[int, float], until: int = 200) -> list[tuple[float, float]]:
    """p99 windows ending every 10 s up to ``until``: 0.5 s unless ``values`` says otherwise."""
    return [(float(w), values.get(w, 0.5)) for w in range(10, until + 1, 10)]


def test_a_fault_is_back_once_no_later_window_is_over_the_threshold():
    [r] = _recoveries([(100.0, "kill -9 b")], windows({110: 9.0, 120: 4.0}), THRESHOLD, 300.0)
    assert r["back_after_s"] == 20.0 and r["worst_p99_s"] == 9.0 and r["flush_windows"] == 0


def test_a_window_over_the_threshold_late_in_the_span_means_not_back_in_time():
    [r] = _recoveries([(100.0, "c joins")], windows({110: 9.0, 160: 1.4}), THRESHOLD, 300.0)
    assert r["back_after_s"] == 60.0


def test_a_fault_still_over_the_threshold_when_the_next_comes_is_not_back():
    rs = _recoveries([(100.0, "c joins"), (130.0, "kill -9 b")], windows({120: 9.0, 130: 8.0}), THRESHOLD, 300.0)
    assert rs[0]["back_after_s"] is None and rs[1]["back_after_s"] == 0.0


def test_the_windows_a_flush_touched_are_set_aside_and_counted():
    # a flush seen at 157 s: the window it fell in (150, 160] and the next (160, 170] say nothing
    p99 = windows({110: 9.0, 160: 1.4, 170: 1.2})
    [r] = _recoveries([(100.0, "kill -9 b")], p99, THRESHOLD, 300.0, flushes=[157.0])
    assert r["back_after_s"] == 10.0 and r["flush_windows"] == 2 and r["worst_p99_s"] == 9.0
    # a window over the threshold that no flush touched still counts
    [r] = _recoveries([(100.0, "kill -9 b")], windows({110: 9.0, 150: 1.4}), THRESHOLD, 300.0, flushes=[175.0])
    assert r["back_after_s"] == 50.0


def test_a_flush_in_the_first_30_s_never_hides_the_faults_own_peak():
    [r] = _recoveries([(100.0, "kill -9 b")], windows({110: 9.0, 120: 12.0}), THRESHOLD, 300.0, flushes=[115.0])
    assert r["back_after_s"] == 20.0 and r["flush_windows"] == 0


def test_flushes_are_told_by_new_rows_past_the_last_not_by_compactions(tmp_path: Path):
    data = tmp_path / "collections" / "c_x" / "partitions" / "_default" / "data"
    data.mkdir(parents=True)
    watch = FlushWatch(tmp_path, clock=lambda: 0.0)
    watch.look()  # nothing yet: the first listing sets the mark
    (data / "data_000000_072000.parquet").touch()
    watch.look()
    (data / "data_000000_072000.parquet").rename(data / "data_000000_071990.parquet")  # compacted: no new rows
    watch.look()
    (data / "data_072001_144000.parquet").touch()
    watch.look()
    watch.look()
    assert len(watch.seen) == 2
