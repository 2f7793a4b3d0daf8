"""The dead-letter circuit breaker: trips on a run of bad records and on a bad ratio, saying what to fix."""

from __future__ import annotations

import threading

import pytest

from worker.steps.polling.dlq_limit import HINTS, DlqLimit, DlqLimitExceeded


def test_dlq_limit_trips_on_a_run_and_on_a_ratio():
    run = DlqLimit(max_consecutive=3, max_ratio=1.0, window=10)
    run.record("decode_error", "x")
    run.record(None)
    run.record("unknown_model", "m")
    run.record("unknown_model", "m")
    with pytest.raises(DlqLimitExceeded, match="3 records in a row.*unknown_model.*EMBEDSTREAM_MODEL"):
        run.record("unknown_model", "m")

    ratio = DlqLimit(max_consecutive=100, max_ratio=0.5, window=10)
    for i in range(10):
        ratio.record("empty_text" if i % 2 else None)  # exactly half: allowed
    with pytest.raises(DlqLimitExceeded, match="6 of the last 10"):
        ratio.record("empty_text")  # the window slides: 6 bad of the last 10


@pytest.mark.parametrize("before", [[], ["empty_text"], ["empty_text", None, "decode_error"], ["empty_text"] * 4])
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
            breaker.record("empty_text")
        except DlqLimitExceeded:
            return n
    raise AssertionError("never tripped")


def test_a_late_dead_letter_turns_a_processed_record_bad_once_counted_on_the_polling_thread():
    breaker = DlqLimit(max_consecutive=3, max_ratio=0.5, window=6)
    breaker.record_processed(6)
    threads = [threading.Thread(target=breaker.record_late, args=("too_many_chunks", "would yield 900 chunks"))
               for _ in range(3)]  # from the embed and sink threads: nothing counted yet
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    breaker.record_late("output_too_large", "its output record would be 2,000,000 bytes")
    assert breaker._bad_in_window == 0
    with pytest.raises(DlqLimitExceeded, match="4 of the last 6.*output_too_large|4 of the last 6.*too_many_chunks"):
        breaker.count_late()
    assert list(breaker._recent) == [False, False, True, True, True, True]  # the newest processed ones turned


def test_late_dead_letters_under_the_ratio_leave_the_breaker_as_record_would():
    late, direct = DlqLimit(100, 0.5, 6), DlqLimit(100, 0.5, 6)
    late.record_processed(6)
    late.record_late("too_many_chunks")
    late.count_late()
    for reason in [None] * 5 + ["too_many_chunks"]:
        direct.record(reason)
    assert late._bad_in_window == direct._bad_in_window == 1
    late.count_late()  # nothing new: nothing changes
    assert late._bad_in_window == 1 and trips_after(late) == trips_after(direct)


@pytest.mark.parametrize("reason", ["decode_error", "empty_text", "invalid_utf8", "text_too_long", "unknown_model",
                                    "too_many_chunks", "unknown_schema", "incompatible_schema", "id_mismatch",
                                    "output_too_large"])
def test_every_dead_letter_reason_trips_with_a_hint(reason):
    breaker = DlqLimit(max_consecutive=1, max_ratio=1.0, window=10)
    with pytest.raises(DlqLimitExceeded) as tripped:
        breaker.record(reason, "why")
    assert HINTS[reason] in str(tripped.value) and len(HINTS[reason]) > 20


def test_the_halting_line_names_the_most_frequent_reason_with_its_own_last_message():
    d = DlqLimit(max_consecutive=5, max_ratio=1.0, window=100)
    d.record("decode_error", "not Avro at all")
    for name in ("a", "b", "c"):
        d.record("unknown_model", f"record asks for model {name!r}")
    with pytest.raises(DlqLimitExceeded) as tripped:
        d.record("decode_error", "truncated Avro")
    line = str(tripped.value)
    assert "5 records in a row" in line
    assert "most often unknown_model: record asks for model 'c'" in line and HINTS["unknown_model"] in line
    assert "truncated" not in line and "None" not in line


def test_a_reason_without_a_hint_still_says_what_to_do():
    d = DlqLimit(max_consecutive=2, max_ratio=1.0, window=100)
    d.record("some_new_reason", "why")
    with pytest.raises(DlqLimitExceeded) as tripped:
        d.record("some_new_reason", "why")
    line = str(tripped.value)
    assert "most often some_new_reason: why). " in line and "None" not in line and "fix the cause" in line


def test_bad_records_leaving_the_window_are_counted_out():
    d = DlqLimit(max_consecutive=100, max_ratio=0.5, window=4)
    for reason in ("empty_text", "empty_text", None, None, None, None):  # the two bad ones slide out
        d.record(reason)
    d.record("empty_text")
    d.record("empty_text")  # 2 of the last 4: allowed
    with pytest.raises(DlqLimitExceeded, match="3 of the last 4"):
        d.record("empty_text")


def test_late_dead_letters_exactly_at_the_ratio_are_allowed_and_one_more_trips():
    d = DlqLimit(max_consecutive=100, max_ratio=0.5, window=4)
    d.record_processed(4)
    d.record_late("too_many_chunks", "a log file as one document")
    d.record_late("too_many_chunks", "a log file as one document")
    d.count_late()  # 2 of 4: allowed
    d.record_late("output_too_large", "metadata of 2 MB")
    with pytest.raises(DlqLimitExceeded, match="3 of the last 4"):
        d.count_late()


def test_a_late_dead_letter_turns_even_the_oldest_processed_record_of_the_window():
    d = DlqLimit(max_consecutive=100, max_ratio=0.9, window=3)
    d.record(None)  # the only processed record, the oldest of the window
    d.record("empty_text")
    d.record("empty_text")
    d.record_late("too_many_chunks", "x")
    with pytest.raises(DlqLimitExceeded, match="3 of the last 3"):
        d.count_late()


def test_a_late_dead_letter_with_no_processed_record_left_in_the_window_is_only_counted():
    d = DlqLimit(max_consecutive=100, max_ratio=1.0, window=2)
    d.record("empty_text")
    d.record("empty_text")
    d.record_late("too_many_chunks", "x")
    d.count_late()  # nothing left to turn bad: no error
    assert d._reasons["too_many_chunks"] == 1


def test_an_empty_poll_between_dead_letters_does_not_break_their_run():
    d = DlqLimit(max_consecutive=3, max_ratio=1.0, window=100)
    d.record("decode_error", "x")
    d.record_processed(0)  # a poll that processed nothing
    d.record("decode_error", "x")
    with pytest.raises(DlqLimitExceeded, match="3 records in a row"):
        d.record("decode_error", "x")


def test_late_dead_letters_count_once_each_toward_the_most_frequent_reason():
    d = DlqLimit(max_consecutive=100, max_ratio=0.5, window=6)
    d.record_processed(3)
    for _ in range(3):
        d.record("decode_error", "not Avro")
    d.record_late("too_many_chunks", "a log file")
    d.record_late("too_many_chunks", "a whole book")
    with pytest.raises(DlqLimitExceeded) as tripped:  # 5 of the last 6
        d.count_late()
    # 3 decode errors against 2 late ones: the late ones count once each, not more
    assert "most often decode_error: not Avro" in str(tripped.value)
    assert d._reasons == {"decode_error": 3, "too_many_chunks": 2}


def test_the_halting_line_says_nothing_past_the_bad_run_was_committed_and_names_the_limits():
    d = DlqLimit(max_consecutive=1, max_ratio=1.0, window=100)
    with pytest.raises(DlqLimitExceeded) as tripped:
        d.record("empty_text", "text is empty")
    line = str(tripped.value)
    assert "Nothing after the first unprocessed record was committed: fix the cause and restart." in line
    assert line.endswith("(Limits: EMBEDSTREAM_DLQ_MAX_CONSECUTIVE, EMBEDSTREAM_DLQ_MAX_RATIO.)")


def test_a_late_reason_that_is_the_most_frequent_is_quoted_with_its_own_last_message():
    d = DlqLimit(max_consecutive=100, max_ratio=0.5, window=4)
    d.record_processed(4)
    for message in ("a log file", "a whole book", "a database dump"):
        d.record_late("too_many_chunks", message)
    with pytest.raises(DlqLimitExceeded) as tripped:
        d.count_late()
    assert "most often too_many_chunks: a database dump)" in str(tripped.value)
