"""The dead-letter circuit breaker: trips on a run of bad records and on a bad ratio, saying what to fix."""

from __future__ import annotations

import pytest

from worker.steps.dlq_limit import DlqLimit, DlqLimitExceeded


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
