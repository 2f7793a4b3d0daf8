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
