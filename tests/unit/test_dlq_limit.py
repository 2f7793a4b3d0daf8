"""The dead-letter circuit breaker: trips on a run of bad records and on a bad ratio, saying what to fix,
and only on the reasons that point at the worker (a producer alone can never trip it)."""

from __future__ import annotations

import threading

import pytest

from worker.steps.polling.dlq_limit import HINTS, WORKER_REASONS, DlqLimit, DlqLimitExceeded


def test_dlq_limit_trips_on_a_run_and_on_a_ratio():
    run = DlqLimit(max_consecutive=3, max_ratio=1.0, window=10)
    run.record("milvus_rejected", "x")
    run.record(None)
    run.record("output_rejected", "m")
    run.record("output_rejected", "m")
    with pytest.raises(DlqLimitExceeded, match="3 records in a row.*output_rejected.*output topic"):
        run.record("output_rejected", "m")

    ratio = DlqLimit(max_consecutive=100, max_ratio=0.5, window=10)
    for i in range(10):
        ratio.record("milvus_rejected" if i % 2 else None)  # exactly half: allowed
    with pytest.raises(DlqLimitExceeded, match="6 of the last 10"):
        ratio.record("milvus_rejected")  # the window slides: 6 bad of the last 10


@pytest.mark.parametrize("before", [[], ["milvus_rejected"], ["milvus_rejected", None, "output_rejected"],
                                    ["milvus_rejected"] * 4])
def test_record_processed_is_record_none_n_times(before):
    """A chunk of good records at once leaves the breaker as one record(None) each would, dead
    letters in the window counted out as they leave it (the next bad records trip it alike)."""
    def limit() -> DlqLimit:
        d = DlqLimit(max_consecutive=5, max_ratio=0.3, window=6)
        for reason in before:
            d.record(reason)
        return d

    for n in range(0, 9):
        one, many = limit(), limit()
        for _ in range(n):
            one.record(None)
        many.record_processed(n)
        assert (list(many._recent), many._bad_in_window, many._run) == (list(one._recent), one._bad_in_window, one._run)
        assert trips_after(one) == trips_after(many)


def trips_after(breaker: DlqLimit) -> int:
    """How many bad records in a row trip ``breaker``."""
    for n in range(1, 100):
        try:
            breaker.record("milvus_rejected")
        except DlqLimitExceeded:
            return n
    raise AssertionError("never tripped")


def test_a_late_dead_letter_turns_a_processed_record_bad_once_counted_on_the_polling_thread():
    breaker = DlqLimit(max_consecutive=3, max_ratio=0.5, window=6)
    breaker.record_processed(6)
    threads = [threading.Thread(target=breaker.record_late, args=("output_rejected", "would yield 900 chunks"))
               for _ in range(3)]  # from the embed and sink threads: nothing counted yet
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    breaker.record_late("delivery_count_exceeded", "its output record would be 2,000,000 bytes")
    assert breaker._bad_in_window == 0
    with pytest.raises(DlqLimitExceeded, match="4 of the last 6.*output_rejected"):
        breaker.count_late()
    assert list(breaker._recent) == [False, False, True, True, True, True]  # the newest processed ones turned


def test_late_dead_letters_under_the_ratio_leave_the_breaker_as_record_would():
    late, direct = DlqLimit(100, 0.5, 6), DlqLimit(100, 0.5, 6)
    late.record_processed(6)
    late.record_late("output_rejected")
    late.count_late()
    for reason in [None] * 5 + ["output_rejected"]:
        direct.record(reason)
    assert late._bad_in_window == direct._bad_in_window == 1
    late.count_late()  # nothing new: nothing changes
    assert late._bad_in_window == 1 and trips_after(late) == trips_after(direct)


@pytest.mark.parametrize("reason", sorted(WORKER_REASONS))
def test_every_reason_that_points_at_the_worker_trips_with_a_hint(reason):
    breaker = DlqLimit(max_consecutive=1, max_ratio=1.0, window=10)
    with pytest.raises(DlqLimitExceeded) as tripped:
        breaker.record(reason, "why")
    assert HINTS[reason] in str(tripped.value) and len(HINTS[reason]) > 20


@pytest.mark.parametrize("reason", sorted(set(HINTS) - WORKER_REASONS) + ["some_new_reason"])
def test_a_reason_a_record_alone_can_cause_never_trips_nor_breaks_a_run(reason):
    """One producer's flood (any number of them in a row, or all of a window) passes at full speed; it
    neither counts against the window nor hides a run of worker-pointing reasons between its records."""
    d = DlqLimit(max_consecutive=3, max_ratio=0.5, window=10)
    for _ in range(10_000):
        d.record(reason, "a producer's garbage")
    d.record_late(reason, "late")
    d.count_late()
    d.record("milvus_rejected", "collection refused it")
    d.record(reason, "between")
    d.record("milvus_rejected", "collection refused it")
    with pytest.raises(DlqLimitExceeded, match="3 records in a row.*milvus_rejected"):
        d.record("milvus_rejected", "collection refused it")


def test_every_reason_has_a_hint():
    assert all(len(hint) > 20 for hint in HINTS.values()) and WORKER_REASONS <= set(HINTS)


def test_the_halting_line_names_the_most_frequent_reason_with_its_own_last_message():
    d = DlqLimit(max_consecutive=5, max_ratio=1.0, window=100)
    d.record("milvus_rejected", "not Avro at all")
    for name in ("a", "b", "c"):
        d.record("output_rejected", f"record asks for model {name!r}")
    with pytest.raises(DlqLimitExceeded) as tripped:
        d.record("milvus_rejected", "truncated Avro")
    line = str(tripped.value)
    assert "5 records in a row" in line
    assert "most often output_rejected: record asks for model 'c'" in line and HINTS["output_rejected"] in line
    assert "truncated" not in line and "None" not in line


def test_bad_records_leaving_the_window_are_counted_out():
    d = DlqLimit(max_consecutive=100, max_ratio=0.5, window=4)
    for reason in ("milvus_rejected", "milvus_rejected", None, None, None, None):  # the two bad ones slide out
        d.record(reason)
    d.record("milvus_rejected")
    d.record("milvus_rejected")  # 2 of the last 4: allowed
    with pytest.raises(DlqLimitExceeded, match="3 of the last 4"):
        d.record("milvus_rejected")


def test_late_dead_letters_exactly_at_the_ratio_are_allowed_and_one_more_trips():
    d = DlqLimit(max_consecutive=100, max_ratio=0.5, window=4)
    d.record_processed(4)
    d.record_late("output_rejected", "a log file as one document")
    d.record_late("output_rejected", "a log file as one document")
    d.count_late()  # 2 of 4: allowed
    d.record_late("delivery_count_exceeded", "metadata of 2 MB")
    with pytest.raises(DlqLimitExceeded, match="3 of the last 4"):
        d.count_late()


def test_a_late_dead_letter_turns_even_the_oldest_processed_record_of_the_window():
    d = DlqLimit(max_consecutive=100, max_ratio=0.9, window=3)
    d.record(None)  # the only processed record, the oldest of the window
    d.record("milvus_rejected")
    d.record("milvus_rejected")
    d.record_late("output_rejected", "x")
    with pytest.raises(DlqLimitExceeded, match="3 of the last 3"):
        d.count_late()


def test_a_late_dead_letter_with_no_processed_record_left_in_the_window_is_only_counted():
    d = DlqLimit(max_consecutive=100, max_ratio=1.0, window=2)
    d.record("milvus_rejected")
    d.record("milvus_rejected")
    d.record_late("output_rejected", "x")
    d.count_late()  # nothing left to turn bad: no error
    assert d._reasons["output_rejected"] == 1


def test_an_empty_poll_between_dead_letters_does_not_break_their_run():
    d = DlqLimit(max_consecutive=3, max_ratio=1.0, window=100)
    d.record("milvus_rejected", "x")
    d.record_processed(0)  # a poll that processed nothing
    d.record("milvus_rejected", "x")
    with pytest.raises(DlqLimitExceeded, match="3 records in a row"):
        d.record("milvus_rejected", "x")


def test_late_dead_letters_count_once_each_toward_the_most_frequent_reason():
    d = DlqLimit(max_consecutive=100, max_ratio=0.5, window=6)
    d.record_processed(3)
    for _ in range(3):
        d.record("milvus_rejected", "not Avro")
    d.record_late("output_rejected", "a log file")
    d.record_late("output_rejected", "a whole book")
    with pytest.raises(DlqLimitExceeded) as tripped:  # 5 of the last 6
        d.count_late()
    # 3 decode errors against 2 late ones: the late ones count once each, not more
    assert "most often milvus_rejected: not Avro" in str(tripped.value)
    assert d._reasons == {"milvus_rejected": 3, "output_rejected": 2}


def test_the_halting_line_says_nothing_past_the_bad_run_was_committed_and_names_the_limits():
    d = DlqLimit(max_consecutive=1, max_ratio=1.0, window=100)
    with pytest.raises(DlqLimitExceeded) as tripped:
        d.record("milvus_rejected", "text is empty")
    line = str(tripped.value)
    assert "Nothing after the first unprocessed record was committed: fix the cause and restart." in line
    assert line.endswith("(Limits: EMBEDSTREAM_DLQ_MAX_CONSECUTIVE, EMBEDSTREAM_DLQ_MAX_RATIO.)")


def test_a_late_reason_that_is_the_most_frequent_is_quoted_with_its_own_last_message():
    d = DlqLimit(max_consecutive=100, max_ratio=0.5, window=4)
    d.record_processed(4)
    for message in ("a log file", "a whole book", "a database dump"):
        d.record_late("output_rejected", message)
    with pytest.raises(DlqLimitExceeded) as tripped:
        d.count_late()
    assert "most often output_rejected: a database dump)" in str(tripped.value)
